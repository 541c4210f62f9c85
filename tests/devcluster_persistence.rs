//! `agentrt dev --data-dir`: objects and the resourceVersion survive a restart, a corrupt
//! state file is refused rather than emptied, and `--crds-dir` installs CRDs at start.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use support::cluster::{Options, TestCluster};
use support::fixtures;

fn yaml(text: &str) -> serde_yaml::Value {
    serde_yaml::from_str(text).expect("kubectl printed YAML")
}

#[tokio::test]
async fn objects_and_the_resource_version_survive_a_restart() {
    let data = tempfile::tempdir().expect("tempdir");
    let Some(mut c) = TestCluster::embedded_only(
        Options::data_dir(data.path()),
        "objects_and_the_resource_version_survive_a_restart: not on a real cluster: a test of agentrt dev's --data-dir across a restart",
    )
    .await
    else {
        return;
    };
    c.apply_test_crds();
    c.kubectl_ok(&[
        "apply",
        "-f",
        &fixtures::devcluster("widgets.yaml").to_string_lossy(),
    ]);
    c.merge_patch_status_ok("widget", "red-one", r#"{"status":{"phase":"Ready"}}"#);
    let before = yaml(&c.kubectl_ok(&["get", "widget", "red-one", "-o", "yaml"]));
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let list_rv: u64 = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .and_then(|r| r.parse().ok())
        .expect("rv");

    c.restart().await.expect("restarts");

    let after = yaml(&c.kubectl_ok(&["get", "widget", "red-one", "-o", "yaml"]));
    assert_eq!(after, before, "the object is exactly as it was");
    let table = c.kubectl_ok(&["get", "widgets"]);
    assert!(
        table.lines().next().unwrap_or("").contains("PHASE"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 4, "{table}");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let created = cms
        .create(&PostParams::default(), &named_cm("later"))
        .await
        .expect("the namespace survived too");
    let rv: u64 = created
        .metadata
        .resource_version
        .and_then(|r| r.parse().ok())
        .expect("rv");
    assert!(rv > list_rv, "resourceVersion continues ({rv} > {list_rv})");
}

/// A ConfigMap named `name`, nothing else set.
fn named_cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}})).expect("cm")
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("a numeric resourceVersion")
}

#[tokio::test]
async fn after_a_kill_the_resource_version_never_goes_back_and_older_watches_get_410() {
    let data = tempfile::tempdir().expect("tempdir");
    let Some(mut c) = TestCluster::embedded_only(
        Options::data_dir(data.path()),
        "after_a_kill_the_resource_version_never_goes_back_and_older_watches_get_410: not on a real cluster: a test of agentrt dev's --data-dir across a kill",
    )
    .await
    else {
        return;
    };
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let created = cms
        .create(&PostParams::default(), &named_cm("counter"))
        .await
        .expect("create");
    let mut highest = rv_of(&created);
    // The namespace and the ConfigMap are in a snapshot by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Writes up to the kill: the last of them are newer than any snapshot.
    for n in 0..40 {
        let patched = cms
            .patch(
                "counter",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"n": n.to_string()}})),
            )
            .await
            .expect("patch");
        highest = highest.max(rv_of(&patched));
    }
    c.kill_and_restart(Duration::ZERO).await.expect("restarts");

    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let later = cms
        .create(&PostParams::default(), &named_cm("later"))
        .await
        .expect("create after the restart");
    assert!(
        rv_of(&later) > highest,
        "the resourceVersion never goes back: {} after {highest} before the kill",
        rv_of(&later)
    );
    let listed = cms.list(&ListParams::default()).await.expect("list");
    let list_rv: u64 = listed
        .metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("list rv");
    assert!(list_rv > highest, "{list_rv} after {highest}");

    // A watch from before the restart is answered with 410 at once, so its client relists.
    let first = tokio::time::timeout(Duration::from_secs(2), async {
        let mut events = cms
            .watch(&WatchParams::default(), &highest.to_string())
            .await
            .expect("the watch starts")
            .boxed();
        events.next().await
    })
    .await
    .expect("an answer within 2 s");
    match first {
        Some(Ok(WatchEvent::Error(status))) => assert_eq!(status.code, 410, "{status:?}"),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn a_corrupt_state_file_is_refused_and_left_in_place() {
    let data = tempfile::tempdir().expect("tempdir");
    let options = Options {
        data_dir: Some(data.path().to_path_buf()),
        no_namespace: true,
        ..Default::default()
    };
    let skipped = "a_corrupt_state_file_is_refused_and_left_in_place: not on a real cluster: a test of agentrt dev's state file";
    let Some(mut c) = TestCluster::embedded_only(options.clone(), skipped).await else {
        return;
    };
    c.kubectl_ok(&["create", "configmap", "keep-me", "-n", "default"]);
    c.stop();
    let state = data.path().join("state.json");
    let bytes = std::fs::read(&state).expect("state written at shutdown");
    assert!(String::from_utf8_lossy(&bytes).contains("keep-me"));
    let torn = &bytes[..bytes.len() / 2];
    std::fs::write(&state, torn).expect("tear it");

    let err = c
        .try_spawn_other(&options)
        .expect_err("a torn state file is refused");
    assert!(err.contains(&state.display().to_string()), "{err}");
    assert!(err.contains("corrupt"), "{err}");
    assert_eq!(
        std::fs::read(&state).expect("still there"),
        torn,
        "never emptied"
    );
}

#[tokio::test]
async fn crds_dir_installs_the_crds_at_start() {
    let options = Options {
        crds_dir: Some(fixtures::path("devcluster")),
        ..Default::default()
    };
    let skipped = "crds_dir_installs_the_crds_at_start: not on a real cluster: a test of agentrt dev's --crds-dir";
    let Some(c) = TestCluster::embedded_only(options, skipped).await else {
        return;
    };
    let out = c.kubectl_ok(&["get", "crd", "-o", "name"]);
    assert!(
        out.contains("widgets.example.dev") && out.contains("gizmos.example.dev"),
        "{out}"
    );
    c.kubectl_ok(&[
        "apply",
        "-f",
        &fixtures::devcluster("widgets.yaml").to_string_lossy(),
    ]);
    let table = c.kubectl_ok(&["get", "wd"]);
    assert_eq!(table.lines().count(), 4, "{table}");
}

#[tokio::test]
async fn a_write_that_was_answered_survives_a_kill() {
    let data = tempfile::tempdir().expect("tempdir");
    let Some(mut c) = TestCluster::embedded_only(
        Options::data_dir(data.path()),
        "a_write_that_was_answered_survives_a_kill: not on a real cluster: a test of agentrt dev's --data-dir across a kill",
    )
    .await
    else {
        return;
    };
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    // Created, changed and deleted right before the kill, well inside the snapshot's debounce:
    // only the journal has them.
    for name in ["kept", "gone"] {
        cms.create(&PostParams::default(), &named_cm(name))
            .await
            .expect("create");
    }
    cms.patch(
        "kept",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"paid": "yes"}})),
    )
    .await
    .expect("patch");
    cms.delete("gone", &Default::default())
        .await
        .expect("delete");
    c.kill_and_restart(Duration::ZERO).await.expect("restarts");

    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let kept = cms
        .get("kept")
        .await
        .expect("the answered create and patch survive");
    assert_eq!(
        kept.data
            .unwrap_or_default()
            .get("paid")
            .map(String::as_str),
        Some("yes")
    );
    assert!(
        cms.get_opt("gone").await.expect("get").is_none(),
        "the answered delete survives"
    );
    // And again after a graceful stop, which snapshots and sets the journal aside.
    c.restart().await.expect("restarts");
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    assert!(cms.get_opt("kept").await.expect("get").is_some());
    assert!(cms.get_opt("gone").await.expect("get").is_none());
}
