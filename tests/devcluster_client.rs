//! The kube-rs client against the API server: compare-and-set updates, leases, errors as
//! `Status` objects, generation and the status subresource, generateName, selectors, both
//! event APIs, dry runs, deletecollection and list pagination (`limit`/`continue`, an expired
//! continue token).

mod support;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

use support::cluster::{published_by_the_control_plane, TestCluster};

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("example.dev", "v1", kind), plural)
}

fn widgets(c: &TestCluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client(), c.namespace(), &resource("Widget", "widgets"))
}

fn object<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    object(json!({"apiVersion": "example.dev/v1", "kind": "Widget",
                  "metadata": {"name": name}, "spec": spec}))
}

fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn stale_resource_version_update_is_a_conflict() {
    let c = TestCluster::start_with_test_crds().await;
    let api = widgets(&c);
    let pp = PostParams::default();
    api.create(&pp, &widget("w", json!({"color": "red", "size": 2})))
        .await
        .expect("created");
    let first = api.get("w").await.expect("read");
    let mut newer = first.clone();
    newer.data["spec"]["size"] = json!(3);
    let newer = api
        .replace("w", &pp, &newer)
        .await
        .expect("CAS with the latest rv");
    assert_ne!(
        newer.metadata.resource_version,
        first.metadata.resource_version
    );

    let mut stale = first.clone();
    stale.data["spec"]["size"] = json!(4);
    let status = api_error(api.replace("w", &pp, &stale).await);
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on widgets.example.dev \"w\": the object has been \
         modified; please apply your changes to the latest version and try again"
    );
    let details = status.details.expect("details");
    assert_eq!(
        (details.name.as_str(), details.group.as_str()),
        ("w", "example.dev")
    );
    assert_eq!(details.kind, "widgets");

    // Without a resourceVersion: kube-apiserver allows no unconditional update of a custom
    // resource.
    stale.metadata.resource_version = None;
    let status = api_error(api.replace("w", &pp, &stale).await);
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "widgets.example.dev \"w\" is invalid: metadata.resourceVersion: Invalid value: 0: \
         must be specified for an update"
    );
    let causes = status.details.expect("details").causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].field, "metadata.resourceVersion");
}

#[tokio::test]
async fn lease_compare_and_set_lets_exactly_one_writer_win() {
    let c = TestCluster::start().await;
    let leases: Api<Lease> = Api::namespaced(c.client(), c.namespace());
    let pp = PostParams::default();
    let lease: Lease = object(json!({
        "metadata": {"name": "run-1"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 30,
                 "renewTime": "2025-01-01T00:00:00.000000Z"}
    }));
    let created = leases.create(&pp, &lease).await.expect("created");

    let mut by_b = created.clone();
    if let Some(spec) = by_b.spec.as_mut() {
        spec.holder_identity = Some("b".into());
    }
    let mut by_c = created.clone();
    if let Some(spec) = by_c.spec.as_mut() {
        spec.holder_identity = Some("c".into());
    }
    leases.replace("run-1", &pp, &by_b).await.expect("b wins");
    let status = api_error(leases.replace("run-1", &pp, &by_c).await);
    assert!(status.is_conflict(), "{status:?}");
    let now = leases.get("run-1").await.expect("read");
    let spec = now.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_duration_seconds, Some(30));
    assert!(spec.renew_time.is_some(), "MicroTime survives");

    let table = c.kubectl_ok(&["get", "leases"]);
    assert!(
        table.lines().next().unwrap_or("").contains("HOLDER"),
        "{table}"
    );
    assert!(table.contains("run-1") && table.contains(" b "), "{table}");
}

#[tokio::test]
async fn create_of_an_existing_name_and_get_of_a_missing_one_are_status_errors() {
    let c = TestCluster::start_with_test_crds().await;
    let api = widgets(&c);
    let pp = PostParams::default();
    api.create(&pp, &widget("w", json!({"color": "red"})))
        .await
        .expect("created");
    let status = api_error(api.create(&pp, &widget("w", json!({"color": "red"}))).await);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );
    assert_eq!(status.message, "widgets.example.dev \"w\" already exists");

    let status = api_error(api.get("nope").await);
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, "widgets.example.dev \"nope\" not found");

    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let status = api_error(cms.get("nope").await);
    assert_eq!(status.message, "configmaps \"nope\" not found");
}

#[tokio::test]
async fn generation_counts_spec_changes_and_each_endpoint_ignores_the_other_half() {
    let c = TestCluster::start_with_test_crds().await;
    let api = widgets(&c);
    let pp = PostParams::default();
    let mut w = widget("w", json!({"color": "red", "size": 2}));
    w.data["status"] = json!({"phase": "Injected"});
    let created = api.create(&pp, &w).await.expect("created");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );

    // Main endpoint: a status-only change is ignored (and writes nothing).
    let mut status_only = created.clone();
    status_only.data["status"] = json!({"phase": "Ignored"});
    let same = api.replace("w", &pp, &status_only).await.expect("replace");
    assert!(same.data.get("status").is_none());
    assert_eq!(
        same.metadata.resource_version,
        created.metadata.resource_version
    );

    // Status endpoint: only status is taken.
    let mut both = created.clone();
    both.data["status"] = json!({"phase": "Ready"});
    both.data["spec"]["size"] = json!(99);
    let after = api.replace_status("w", &pp, &both).await.expect("status");
    assert_eq!(after.data["status"]["phase"], "Ready");
    assert_eq!(after.data["spec"]["size"], 2);
    assert_eq!(after.metadata.generation, Some(1));

    // Metadata changes do not bump generation; spec changes do.
    let labelled = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(labelled.metadata.generation, Some(1));
    let bigger = api
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}})),
        )
        .await
        .expect("spec");
    assert_eq!(bigger.metadata.generation, Some(2));
    assert_eq!(bigger.data["status"]["phase"], "Ready", "status kept");

    // Without a status subresource, status is ordinary content and bumps generation.
    let gizmos: Api<DynamicObject> = Api::all_with(c.client(), &resource("Gizmo", "gizmos"));
    let name = format!("gizmo-{}", c.namespace());
    let g: DynamicObject = object(json!({"apiVersion": "example.dev/v1", "kind": "Gizmo",
        "metadata": {"name": name}, "spec": {"a": 1}, "status": {"s": "x"}}));
    let g = gizmos.create(&pp, &g).await.expect("gizmo");
    assert_eq!(g.data["status"]["s"], "x");
    let g = gizmos
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"s": "y"}})),
        )
        .await
        .expect("gizmo status");
    assert_eq!(g.metadata.generation, Some(2));
    gizmos
        .delete(&name, &DeleteParams::default())
        .await
        .expect("cleanup");
}

#[tokio::test]
async fn generate_name_picks_a_fresh_name() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let cm: ConfigMap = object(json!({"metadata": {"generateName": "cfg-"}}));
    let a = cms.create(&PostParams::default(), &cm).await.expect("a");
    let b = cms.create(&PostParams::default(), &cm).await.expect("b");
    let (a, b) = (
        a.metadata.name.expect("name"),
        b.metadata.name.expect("name"),
    );
    assert!(a.starts_with("cfg-") && a.len() == 9, "{a}");
    assert_ne!(a, b);
}

#[tokio::test]
async fn selectors_filter_lists_and_unknown_fields_are_refused() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "web"})),
        ("c", json!({"app": "db"})),
    ] {
        let cm: ConfigMap = object(json!({"metadata": {"name": name, "labels": labels}}));
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("created");
    }
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        let mut v: Vec<String> = list
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .filter(|n| !published_by_the_control_plane(n))
            .collect();
        v.sort();
        v
    };
    let lp = |labels: &str| ListParams::default().labels(labels);
    assert_eq!(
        names(cms.list(&lp("app=web")).await.expect("list")),
        ["a", "b"]
    );
    assert_eq!(
        names(cms.list(&lp("app==web,tier")).await.expect("list")),
        ["a"]
    );
    assert_eq!(names(cms.list(&lp("app!=web")).await.expect("list")), ["c"]);
    assert_eq!(
        names(cms.list(&lp("app notin (web)")).await.expect("list")),
        ["c"]
    );
    assert_eq!(
        names(cms.list(&lp("!tier,app in (web,db)")).await.expect("list")),
        ["b", "c"]
    );
    let by_name = ListParams::default().fields("metadata.name=b");
    assert_eq!(names(cms.list(&by_name).await.expect("list")), ["b"]);
    let by_ns = ListParams::default().fields(&format!("metadata.namespace={}", c.namespace()));
    assert_eq!(names(cms.list(&by_ns).await.expect("list")).len(), 3);

    let status = api_error(cms.list(&ListParams::default().fields("data.x=1")).await);
    assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
    assert!(
        status
            .message
            .contains(r#""data.x" is not a known field selector"#),
        "{}",
        status.message
    );
    let list = cms.list(&ListParams::default()).await.expect("list");
    assert!(list
        .metadata
        .resource_version
        .is_some_and(|rv| rv.parse::<u64>().is_ok()));
}

#[tokio::test]
async fn both_event_apis_read_the_same_events() {
    let c = TestCluster::start().await;
    let events: Api<Event> = Api::namespaced(c.client(), c.namespace());
    let event: Event = object(json!({
        "metadata": {"name": "run-1.started"},
        "eventTime": "2025-01-01T00:00:00.000000Z",
        "reportingController": "agentrt.dev/controller",
        "reportingInstance": "agentrt-0",
        "action": "Started",
        "reason": "RunStarted",
        "type": "Normal",
        "note": "run started",
        "regarding": {"kind": "ConfigMap", "name": "x", "namespace": c.namespace()},
    }));
    events
        .create(&PostParams::default(), &event)
        .await
        .expect("created");
    let core: Api<CoreEvent> = Api::namespaced(c.client(), c.namespace());
    let seen = core
        .get("run-1.started")
        .await
        .expect("read as a core event");
    assert_eq!(seen.message.as_deref(), Some("run started"));
    assert_eq!(seen.reason.as_deref(), Some("RunStarted"));
    assert_eq!(seen.involved_object.name.as_deref(), Some("x"));
    assert_eq!(
        seen.reporting_component.as_deref(),
        Some("agentrt.dev/controller")
    );
    let out = c.kubectl_ok(&["get", "events"]);
    assert!(
        out.contains("RunStarted") && out.contains("configmap/x"),
        "{out}"
    );
}

#[tokio::test]
async fn dry_run_stores_nothing_and_deletecollection_honours_selectors() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let cm = |name: &str, keep: bool| -> ConfigMap {
        object(json!({"metadata": {"name": name, "labels": {"keep": keep.to_string()}}}))
    };
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let answer = cms.create(&dry, &cm("ghost", true)).await.expect("dry run");
    assert_eq!(answer.metadata.name.as_deref(), Some("ghost"));
    assert!(api_error(cms.get("ghost").await).is_not_found());

    for (name, keep) in [("a", true), ("b", false), ("c", false)] {
        cms.create(&PostParams::default(), &cm(name, keep))
            .await
            .expect("created");
    }
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("keep=false"),
    )
    .await
    .expect("deletecollection");
    let left: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .filter(|n| !published_by_the_control_plane(n))
        .collect();
    assert_eq!(left, ["a"]);
}

#[tokio::test]
async fn configmap_lists_page_with_kube_rs_list_params() {
    let c = TestCluster::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    for name in ["page-1", "page-2", "page-3"] {
        let cm: ConfigMap = object(json!({"metadata": {"name": name, "labels": {"paged": "yes"}}}));
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("created");
    }
    let mut names = Vec::new();
    let mut params = ListParams::default().labels("paged=yes").limit(2);
    let mut pages = 0;
    loop {
        let page = cms.list(&params).await.expect("page");
        pages += 1;
        names.extend(page.items.iter().filter_map(|cm| cm.metadata.name.clone()));
        // With a selector no remainingItemCount is given.
        assert_eq!(page.metadata.remaining_item_count, None);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(names, ["page-1", "page-2", "page-3"]);
    assert_eq!(pages, 2);
}

/// Embedded only: a real server keeps old snapshots for minutes, so its 410 cannot be provoked
/// on demand.
#[tokio::test]
async fn a_continue_token_older_than_the_history_is_expired_with_a_fresh_token() {
    let c = TestCluster::start_with(support::cluster::Options {
        watch_history: Some(3),
        ..Default::default()
    })
    .await;
    if !c.is_embedded() {
        return;
    }
    let cms: Api<ConfigMap> = Api::namespaced(c.client(), c.namespace());
    let create = |name: &'static str| {
        let cms = cms.clone();
        async move {
            let cm: ConfigMap = object(json!({"metadata": {"name": name}}));
            cms.create(&PostParams::default(), &cm)
                .await
                .expect("created");
        }
    };
    create("a").await;
    create("b").await;
    let first = cms
        .list(&ListParams::default().limit(1))
        .await
        .expect("page");
    let token = first.metadata.continue_.expect("more follow");
    for name in ["c", "d", "e", "f"] {
        create(name).await;
    }
    let status = api_error(
        cms.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
    );
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    // The Status carries a token continuing at the latest state (`rv: -1`).
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{}/configmaps?limit=1&continue={token}",
        c.namespace()
    ))
    .body(kube::client::Body::from(Vec::new()))
    .expect("request");
    let resp = c.client().send(req).await.expect("answered");
    let bytes = resp.into_body().collect_bytes().await.expect("body");
    let status: Value = serde_json::from_slice(&bytes).expect("JSON");
    let fresh = status["metadata"]["continue"]
        .as_str()
        .expect("a fresh token")
        .to_string();
    let rest = cms
        .list(&ListParams::default().continue_token(&fresh))
        .await
        .expect("inconsistent continuation");
    let names: Vec<String> = rest
        .items
        .iter()
        .filter_map(|cm| cm.metadata.name.clone())
        .collect();
    assert_eq!(names, ["b", "c", "d", "e", "f"]);
}
