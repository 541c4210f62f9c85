//! Watches: from a resourceVersion and from now, selectors, bookmarks, streaming lists,
//! `timeoutSeconds`, 410 Gone past the history window, and kube-runtime's watcher recovering
//! from it with a re-list.

mod support;

use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{json, Value};

use support::cluster::{published_by_the_control_plane, Options, TestCluster};

/// The ConfigMap a real control plane publishes in every namespace (left out of these tests'
/// watches).
const ROOT_CA: &str = "kube-root-ca.crt";

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
        .expect("configmap")
}

/// Creates [`cm`] `name` with `labels` through `cms`; panics when it is refused.
async fn create_cm(cms: &Api<ConfigMap>, name: &str, labels: Value) -> ConfigMap {
    cms.create(&PostParams::default(), &cm(name, labels))
        .await
        .expect("create")
}

fn rv(o: &ConfigMap) -> u64 {
    o.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .expect("integer resourceVersion")
}

async fn next<S, T>(stream: &mut S) -> T
where
    S: Stream<Item = T> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("an event within 20 s")
        .expect("the stream goes on")
}

fn describe(e: &WatchEvent<ConfigMap>) -> (String, String) {
    match e {
        WatchEvent::Added(o) => ("ADDED".into(), o.metadata.name.clone().unwrap_or_default()),
        WatchEvent::Modified(o) => (
            "MODIFIED".into(),
            o.metadata.name.clone().unwrap_or_default(),
        ),
        WatchEvent::Deleted(o) => (
            "DELETED".into(),
            o.metadata.name.clone().unwrap_or_default(),
        ),
        WatchEvent::Bookmark(_) => ("BOOKMARK".into(), String::new()),
        WatchEvent::Error(s) => ("ERROR".into(), s.reason.clone()),
    }
}

#[tokio::test]
async fn watch_from_a_resource_version_sees_each_later_change_in_order() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let start = cms.list(&ListParams::default()).await.expect("list");
    let from = start.metadata.resource_version.expect("list rv");
    let wp = WatchParams::default().disable_bookmarks();
    let mut events = cms.watch(&wp, &from).await.expect("watch").boxed();

    let created = create_cm(&cms, "a", json!({})).await;
    let patched = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "v"}})),
        )
        .await
        .expect("patch");
    cms.delete("a", &DeleteParams::default())
        .await
        .expect("delete");

    let mut seen = Vec::new();
    let mut rvs = Vec::new();
    for _ in 0..3 {
        let e = next(&mut events).await.expect("event");
        if let WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) = &e {
            rvs.push(rv(o));
        }
        seen.push(describe(&e));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "a".into()),
            ("MODIFIED".into(), "a".into()),
            ("DELETED".into(), "a".into())
        ]
    );
    assert_eq!(rvs[0], rv(&created));
    assert_eq!(rvs[1], rv(&patched));
    assert!(
        rvs[2] > rvs[1],
        "the DELETED event carries the deletion's resourceVersion"
    );
}

#[tokio::test]
async fn changes_made_before_the_watch_started_are_delivered_at_once() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let from = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    create_cm(&cms, "early", json!({})).await;
    let wp = WatchParams::default().disable_bookmarks();
    let mut events = cms.watch(&wp, &from).await.expect("watch").boxed();
    let first = tokio::time::timeout(Duration::from_secs(2), events.next())
        .await
        .expect("delivered without waiting for another change")
        .expect("an event")
        .expect("not an error");
    assert_eq!(describe(&first), ("ADDED".into(), "early".into()));
}

#[tokio::test]
async fn watch_from_now_starts_with_every_existing_object() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    for n in ["a", "b"] {
        create_cm(&cms, n, json!({})).await;
    }
    let wp = WatchParams::default()
        .fields(&format!("metadata.name!={ROOT_CA}"))
        .disable_bookmarks();
    let mut events = cms.watch(&wp, "0").await.expect("watch").boxed();
    let mut first = vec![
        describe(&next(&mut events).await.expect("e")),
        describe(&next(&mut events).await.expect("e")),
    ];
    first.sort();
    assert_eq!(
        first,
        [("ADDED".into(), "a".into()), ("ADDED".into(), "b".into())]
    );
    create_cm(&cms, "c", json!({})).await;
    assert_eq!(
        describe(&next(&mut events).await.expect("e")),
        ("ADDED".into(), "c".into())
    );
}

#[tokio::test]
async fn selectors_apply_to_watch_events_and_leaving_the_selection_is_a_delete() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let wp = WatchParams::default().labels("app=web").disable_bookmarks();
    let from = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let mut events = cms.watch(&wp, &from).await.expect("watch").boxed();

    create_cm(&cms, "other", json!({"app": "db"})).await;
    create_cm(&cms, "web", json!({"app": "web"})).await;
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    cms.patch("web", &PatchParams::default(), &relabel("db"))
        .await
        .expect("out");
    cms.patch("web", &PatchParams::default(), &relabel("web"))
        .await
        .expect("back");
    cms.patch("other", &PatchParams::default(), &relabel("db2"))
        .await
        .expect("unrelated");
    cms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .expect("data");

    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(describe(&next(&mut events).await.expect("event")));
    }
    assert_eq!(
        seen,
        [
            ("ADDED".into(), "web".into()),
            ("DELETED".into(), "web".into()),
            ("ADDED".into(), "web".into()),
            ("MODIFIED".into(), "web".into()),
        ]
    );
}

#[tokio::test]
async fn bookmarks_arrive_when_asked_for() {
    // kube-apiserver sends a watch bookmark about once a minute, on no schedule a client
    // can set; the 200 ms interval is the embedded server's test knob.
    let options = Options {
        bookmark_interval_ms: Some(200),
        ..Default::default()
    };
    let skipped = "bookmarks_arrive_when_asked_for: embedded server only (bookmark interval)";
    let Some(c) = TestCluster::embedded_only(options, skipped).await else {
        return;
    };
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let created = create_cm(&cms, "a", json!({})).await;
    let mut events = cms
        .watch(&WatchParams::default(), &rv(&created).to_string())
        .await
        .expect("watch")
        .boxed();
    let mark = match next(&mut events).await.expect("event") {
        WatchEvent::Bookmark(b) => b,
        other => panic!("unexpected {:?}", describe(&other)),
    };
    let at: u64 = mark.metadata.resource_version.parse().expect("integer");
    assert!(at >= rv(&created));
    assert_eq!(mark.types.kind, "ConfigMap");
}

#[tokio::test]
async fn streaming_list_ends_its_initial_events_with_an_annotated_bookmark() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let mut last = String::new();
    for n in ["a", "b"] {
        let created = create_cm(&cms, n, json!({})).await;
        last = created.metadata.resource_version.unwrap_or_default();
    }
    // From the last create's resourceVersion (streaming lists ask for `NotOlderThan`): from
    // "0" kube-apiserver may serve its watch cache before it has the second create.
    let mut events = cms
        .watch(&WatchParams::streaming_lists(), &last)
        .await
        .expect("watch")
        .boxed();
    let mut names = Vec::new();
    let end = loop {
        match next(&mut events).await.expect("event") {
            WatchEvent::Added(o) => names.push(o.metadata.name.unwrap_or_default()),
            WatchEvent::Bookmark(b)
                if b.metadata
                    .annotations
                    .contains_key("k8s.io/initial-events-end") =>
            {
                break b
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {:?}", describe(&other)),
        }
    };
    names.retain(|n| !published_by_the_control_plane(n));
    names.sort();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        end.metadata
            .annotations
            .get("k8s.io/initial-events-end")
            .map(String::as_str),
        Some("true")
    );

    // kube-runtime's watcher in streaming-list mode.
    let mut w = watcher(cms.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut init = Vec::new();
    loop {
        match next(&mut w).await.expect("watcher event") {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => init.push(o.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    init.retain(|n| !published_by_the_control_plane(n));
    init.sort();
    assert_eq!(init, ["a", "b"]);
    create_cm(&cms, "c", json!({})).await;
    match next(&mut w).await.expect("watcher event") {
        watcher::Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("c")),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn timeout_seconds_ends_the_stream() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let wp = WatchParams::default()
        .fields(&format!("metadata.name!={ROOT_CA}"))
        .timeout(1)
        .disable_bookmarks();
    let started = std::time::Instant::now();
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(20),
        cms.watch(&wp, "0")
            .await
            .expect("watch")
            .try_collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ends")
    .expect("no error");
    assert!(events.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn a_resource_version_older_than_the_history_gets_410_gone() {
    let options = Options {
        watch_history: Some(5),
        ..Default::default()
    };
    let skipped = "a_resource_version_older_than_the_history_gets_410_gone: not on a real cluster: a test of agentrt dev's --watch-history (kube-apiserver's window is etcd compaction, minutes long)";
    let Some(c) = TestCluster::embedded_only(options, skipped).await else {
        return;
    };
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let first = create_cm(&cms, "first", json!({})).await;
    for i in 0..10 {
        create_cm(&cms, &format!("n{i}"), json!({})).await;
    }
    let wp = WatchParams::default().disable_bookmarks();
    let mut events = cms
        .watch(&wp, &rv(&first).to_string())
        .await
        .expect("watch")
        .boxed();
    match next(&mut events).await.expect("event") {
        WatchEvent::Error(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
            assert!(
                status
                    .message
                    .starts_with(&format!("too old resource version: {} (", rv(&first))),
                "{}",
                status.message
            );
        }
        other => panic!("expected 410, got {:?}", describe(&other)),
    }
    assert!(tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("ends")
        .is_none());
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_410_and_keeps_seeing_changes() {
    let options = Options {
        watch_history: Some(5),
        ..Default::default()
    };
    let skipped = "kube_runtime_watcher_relists_after_410_and_keeps_seeing_changes: not on a real cluster: a test of agentrt dev's --watch-history (a 410 cannot be provoked on demand from kube-apiserver)";
    let Some(c) = TestCluster::embedded_only(options, skipped).await else {
        return;
    };
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    create_cm(&cms, "before", json!({})).await;
    let mut w = watcher(cms.clone(), watcher::Config::default()).boxed();
    loop {
        if let watcher::Event::InitDone = next(&mut w).await.expect("watcher event") {
            break;
        }
    }
    // The watcher has listed; before it starts watching, push its resourceVersion out of the
    // history window.
    for i in 0..10 {
        create_cm(&cms, &format!("n{i}"), json!({})).await;
    }
    match next(&mut w).await {
        Err(watcher::Error::WatchError(status)) => assert_eq!(status.code, 410),
        other => panic!("expected the watch to fail with 410, got {other:?}"),
    }
    let mut relisted = Vec::new();
    loop {
        match next(&mut w).await.expect("watcher event") {
            watcher::Event::Init => {}
            watcher::Event::InitApply(o) => relisted.push(o.metadata.name.unwrap_or_default()),
            watcher::Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(relisted.len(), 11, "{relisted:?}");
    assert!(relisted.contains(&"n9".to_string()));
    create_cm(&cms, "after", json!({})).await;
    loop {
        match next(&mut w).await.expect("watcher event") {
            watcher::Event::Apply(o) if o.metadata.name.as_deref() == Some("after") => break,
            watcher::Event::Apply(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}
