//! The devcluster library API the rest of agentrt uses in-process: `DevServer::start`,
//! `client`, `kubeconfig_yaml`, `shutdown`, and the refusals at start.

use agentrt::devcluster::{read_crds_dir, DevClusterError, DevServer, DevServerConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

fn fixtures() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/devcluster")
}

#[tokio::test]
async fn an_in_process_server_serves_its_crds_and_stops_on_shutdown() {
    let crds = read_crds_dir(&fixtures()).expect("fixtures readable");
    assert_eq!(crds.len(), 2, "only the CRD documents are taken");
    let server = DevServer::start(DevServerConfig {
        crds,
        ..Default::default()
    })
    .await
    .expect("starts");
    let addr = server.addr();
    assert!(addr.ip().is_loopback() && addr.port() != 0);
    assert!(server.kubeconfig_yaml().contains(&format!("http://{addr}")));

    let client = server.client().await.expect("client");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.dev", "v1", "Widget"),
        "widgets",
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let w: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.dev/v1",
        "kind": "Widget", "metadata": {"name": "w"}, "spec": {"color": "red"}}))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &w)
        .await
        .expect("the CRD is served at once");

    server.shutdown().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    assert!(
        cms.list(&Default::default()).await.is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test]
async fn a_non_loopback_address_is_refused() {
    let err = DevServer::start(DevServerConfig {
        addr: "0.0.0.0:0".parse().expect("addr"),
        ..Default::default()
    })
    .await
    .err()
    .expect("refused");
    assert!(matches!(err, DevClusterError::NotLoopback(_)));
    assert!(
        err.to_string().contains("only listens on loopback"),
        "{err}"
    );
}

#[tokio::test]
async fn two_servers_cannot_share_a_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = DevServerConfig {
        data_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let first = DevServer::start(config.clone())
        .await
        .expect("first starts");
    let err = DevServer::start(config.clone())
        .await
        .err()
        .expect("second refused");
    assert!(matches!(err, DevClusterError::DataDirLocked(_)), "{err}");
    first.shutdown().await;
    DevServer::start(config)
        .await
        .expect("free again after shutdown")
        .shutdown()
        .await;
}

#[tokio::test]
async fn a_crd_the_server_refuses_fails_the_start() {
    let bad = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "wrong.example.dev"},
        "spec": {"group": "example.dev", "scope": "Namespaced",
                 "names": {"plural": "things", "kind": "Thing"},
                 "versions": [{"name": "v1", "served": true, "storage": true}]}});
    let err = DevServer::start(DevServerConfig {
        crds: vec![bad],
        ..Default::default()
    })
    .await
    .err()
    .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("wrong.example.dev") && text.contains("metadata.name"),
        "{text}"
    );
}
