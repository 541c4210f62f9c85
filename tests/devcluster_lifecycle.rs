//! Object lifecycles: finalizers and `deletionTimestamp`, garbage collection through
//! `ownerReferences`, namespace termination, and the bearer token.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use support::cluster::{eventually, Options, TestCluster};

fn object<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn gone(api: &Api<ConfigMap>, name: &str) -> Option<()> {
    match api.get(name).await {
        Err(kube::Error::Api(s)) if s.is_not_found() => Some(()),
        _ => None,
    }
}

#[tokio::test]
async fn delete_waits_for_the_last_finalizer() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let cm: ConfigMap = object(
        json!({"metadata": {"name": "held", "finalizers": ["example.dev/a", "example.dev/b"]}}),
    );
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("created");

    let answer = cms
        .delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = answer
        .left()
        .expect("the object comes back while finalizers hold it");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    let still = cms.get("held").await.expect("still there");
    assert!(still.metadata.deletion_timestamp.is_some());

    // No new finalizers on an object being deleted.
    let add = Patch::Merge(
        json!({"metadata": {"finalizers": ["example.dev/a", "example.dev/b", "example.dev/c"]}}),
    );
    let status = api_error(cms.patch("held", &PatchParams::default(), &add).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(
        status.message.contains("no new finalizers can be added"),
        "{}",
        status.message
    );

    let one_left = Patch::Merge(json!({"metadata": {"finalizers": ["example.dev/b"]}}));
    cms.patch("held", &PatchParams::default(), &one_left)
        .await
        .expect("drop one");
    assert!(
        cms.get("held").await.is_ok(),
        "one finalizer still holds it"
    );
    let none_left = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    cms.patch("held", &PatchParams::default(), &none_left)
        .await
        .expect("drop the last");
    assert!(
        gone(&cms, "held").await.is_some(),
        "removed with its last finalizer"
    );

    // Without finalizers delete is immediate and answers with a success Status.
    let cm: ConfigMap = object(json!({"metadata": {"name": "free"}}));
    let created = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("created");
    let status = cms
        .delete("free", &DeleteParams::default())
        .await
        .expect("delete")
        .right()
        .expect("a Status");
    assert!(status.is_success());
    let details = status.details.expect("details");
    assert_eq!(details.name, "free");
    assert_eq!(Some(details.uid), created.metadata.uid);
}

#[tokio::test]
async fn kubectl_delete_of_a_finalized_object_returns_at_once_and_it_stays() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let cm: ConfigMap =
        object(json!({"metadata": {"name": "held", "finalizers": ["example.dev/a"]}}));
    cms.create(&PostParams::default(), &cm)
        .await
        .expect("created");
    c.kubectl_ok(&["delete", "configmap", "held", "--wait=false"]);
    let still = cms.get("held").await.expect("still there");
    assert!(still.metadata.deletion_timestamp.is_some());
    c.kubectl_ok(&[
        "patch",
        "configmap",
        "held",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    assert!(gone(&cms, "held").await.is_some());
}

fn owned_by(name: &str, owner: &ConfigMap) -> ConfigMap {
    object(json!({"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "name": owner.metadata.name, "uid": owner.metadata.uid,
    }]}}))
}

/// Creates ConfigMap `owner` and ConfigMap `child` owned by it ([`owned_by`]); panics when
/// either is refused.
async fn create_owner_and_child(cms: &Api<ConfigMap>) -> ConfigMap {
    let pp = PostParams::default();
    let owner = cms
        .create(&pp, &object(json!({"metadata": {"name": "owner"}})))
        .await
        .expect("owner");
    cms.create(&pp, &owned_by("child", &owner))
        .await
        .expect("child");
    owner
}

#[tokio::test]
async fn dependents_of_a_deleted_owner_are_garbage_collected() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let pp = PostParams::default();
    create_owner_and_child(&cms).await;
    let grandchild_owner = cms.get("child").await.expect("child");
    cms.create(&pp, &owned_by("grandchild", &grandchild_owner))
        .await
        .expect("grandchild");
    cms.create(&pp, &object(json!({"metadata": {"name": "bystander"}})))
        .await
        .expect("bystander");

    cms.delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    eventually("the child to be collected", Duration::from_secs(30), || {
        gone(&cms, "child")
    })
    .await;
    eventually(
        "the grandchild to be collected",
        Duration::from_secs(30),
        || gone(&cms, "grandchild"),
    )
    .await;
    assert!(cms.get("bystander").await.is_ok());
}

#[tokio::test]
async fn a_dependent_whose_owner_never_existed_is_collected() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let ghost: ConfigMap = object(json!({"metadata": {"name": "ghost-owner",
        "uid": "00000000-0000-0000-0000-000000000000"}}));
    cms.create(&PostParams::default(), &owned_by("orphan", &ghost))
        .await
        .expect("created");
    eventually(
        "the orphan to be collected",
        Duration::from_secs(60),
        || gone(&cms, "orphan"),
    )
    .await;
}

#[tokio::test]
async fn orphan_propagation_keeps_dependents_and_drops_their_owner_reference() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    create_owner_and_child(&cms).await;
    cms.delete("owner", &DeleteParams::orphan())
        .await
        .expect("delete");
    let child = eventually(
        "the reference to be dropped",
        Duration::from_secs(30),
        || async {
            let child = cms.get("child").await.ok()?;
            child
                .metadata
                .owner_references
                .as_ref()
                .is_none_or(Vec::is_empty)
                .then_some(child)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        cms.get("child").await.is_ok(),
        "{child:?} was orphaned, not collected"
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_objects_and_refuses_new_ones_meanwhile() {
    let c = TestCluster::start().await;
    let namespaces: Api<Namespace> = Api::all(c.client());
    let name = format!("{}-extra", c.namespace());
    let ns: Namespace = object(json!({"metadata": {"name": name}}));
    let created = namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("ns");
    assert_eq!(
        created.status.and_then(|s| s.phase).as_deref(),
        Some("Active")
    );
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), &name);
    cms.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "plain"}})),
    )
    .await
    .expect("plain");
    cms.create(
        &PostParams::default(),
        &object(json!({"metadata": {"name": "held", "finalizers": ["example.dev/a"]}})),
    )
    .await
    .expect("held");

    namespaces
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete ns");
    eventually("the plain configmap to go", Duration::from_secs(60), || {
        gone(&cms, "plain")
    })
    .await;
    let terminating = namespaces.get(&name).await.expect("held by the finalizer");
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    let status = api_error(
        cms.create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "late"}})),
        )
        .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(
        status.message.contains("because it is being terminated"),
        "{}",
        status.message
    );

    let none_left = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    cms.patch("held", &PatchParams::default(), &none_left)
        .await
        .expect("release");
    eventually("the namespace to go", Duration::from_secs(60), || async {
        match namespaces.get(&name).await {
            Err(kube::Error::Api(s)) if s.is_not_found() => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn requests_without_the_bearer_token_are_unauthorized() {
    let options = Options {
        token: Some("let-me-in".into()),
        ..Default::default()
    };
    let skipped = "requests_without_the_bearer_token_are_unauthorized: not on a real cluster: a test of agentrt dev's --token";
    let Some(c) = TestCluster::embedded_only(options, skipped).await else {
        return;
    };
    // The kubeconfig carries the token: the client and kubectl work.
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    cms.list(&Default::default()).await.expect("authorized");
    c.kubectl_ok(&["get", "configmaps"]);

    let http = reqwest::Client::new();
    let url = format!("http://{}/api/v1/namespaces", c.address());
    let wrong_prefix = format!("http://{}/token/wrong/api/v1/namespaces", c.address());
    for (url, auth) in [
        (&url, None),
        (&url, Some("Bearer wrong")),
        (&wrong_prefix, None),
    ] {
        let mut req = http.get(url);
        if let Some(a) = auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send().await.expect("answered");
        assert_eq!(resp.status().as_u16(), 401);
        let body: Value = resp.json().await.expect("a Status");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "Unauthorized");
        assert_eq!(body["code"], 401);
    }
    let resp = http
        .get(&url)
        .header("Authorization", "Bearer let-me-in")
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status().as_u16(), 200);
    let by_path = format!("http://{}/token/let-me-in/api/v1/namespaces", c.address());
    let resp = http.get(&by_path).send().await.expect("answered");
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test]
async fn deleting_a_crd_deletes_its_resources_then_stops_serving_them() {
    let c = TestCluster::start().await;
    let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: sprockets.lifecycle.example.dev}
spec:
  group: lifecycle.example.dev
  scope: Namespaced
  names: {plural: sprockets, kind: Sprocket}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
"#;
    c.apply(crd);
    c.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "crd/sprockets.lifecycle.example.dev",
    ]);
    let sprocket = |name: &str, finalizers: &str| {
        format!(
            "apiVersion: lifecycle.example.dev/v1\nkind: Sprocket\nmetadata: {{name: {name}, finalizers: {finalizers}}}\n"
        )
    };
    let out = c.apply(&sprocket("held", "[example.dev/a]"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.apply(&sprocket("free", "[]"));

    c.kubectl_ok(&[
        "delete",
        "crd",
        "sprockets.lifecycle.example.dev",
        "--wait=false",
    ]);
    eventually(
        "the free sprocket to go",
        Duration::from_secs(60),
        || async {
            let out = c.kubectl(&["get", "sprockets", "free"]);
            (!out.status.success()).then_some(())
        },
    )
    .await;
    let refused = c.kubectl_stdin(&["create", "-f", "-"], &sprocket("late", "[]"));
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("create not allowed while custom resource definition is terminating"),
        "{err}"
    );

    c.merge_patch_ok("sprocket", "held", r#"{"metadata":{"finalizers":null}}"#);
    eventually("the CRD to go", Duration::from_secs(60), || async {
        let out = c.kubectl(&["get", "crd", "sprockets.lifecycle.example.dev"]);
        (!out.status.success()).then_some(())
    })
    .await;
    let out = c.kubectl(&["get", "sprockets"]);
    assert!(!out.status.success(), "no longer served");
}
