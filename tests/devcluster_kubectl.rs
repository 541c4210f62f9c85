//! kubectl 1.32 against the API server (the embedded `agentrt dev`, or a real cluster when
//! `AGENTRT_TEST_KUBECONFIG` is set): apply, get with printer columns, patch, delete, watch,
//! api-resources and selectors, `get --chunk-size`, `explain` (OpenAPI v3 schemas) and
//! `auth can-i`, as a person would use them.

mod support;

use std::time::Duration;

use support::cli::table_row;
use support::cluster::TestCluster;
use support::fixtures;

fn widgets_yaml() -> String {
    fixtures::devcluster("widgets.yaml")
        .to_string_lossy()
        .to_string()
}

async fn cluster_with_widgets() -> TestCluster {
    let c = TestCluster::start_with_test_crds().await;
    c.kubectl_ok(&["apply", "-f", &widgets_yaml()]);
    c
}

fn yaml(text: &str) -> serde_yaml::Value {
    serde_yaml::from_str(text).expect("kubectl printed YAML")
}

#[tokio::test]
async fn get_shows_the_printer_columns_and_wide_adds_the_priority_one_column() {
    let c = cluster_with_widgets().await;
    let out = c.kubectl_ok(&["get", "widgets"]);
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["NAME", "COLOR", "SIZE", "PHASE", "AGE"]);
    let red: Vec<&str> = lines
        .iter()
        .find(|l| l.starts_with("red-one"))
        .expect("red-one listed")
        .split_whitespace()
        .collect();
    assert_eq!(&red[..3], ["red-one", "red", "3"]);
    assert!(!out.contains("alice"), "OWNER is priority 1:\n{out}");

    let wide = c.kubectl_ok(&["get", "widgets", "-o", "wide"]);
    let header = table_row(&wide, 0);
    assert_eq!(header, ["NAME", "COLOR", "SIZE", "PHASE", "OWNER", "AGE"]);
    assert!(wide.contains("alice") && wide.contains("bob"), "{wide}");

    let short = c.kubectl_ok(&["get", "wd", "green-one", "--no-headers"]);
    assert!(short.starts_with("green-one"), "{short}");
}

#[tokio::test]
async fn get_o_yaml_shows_the_stored_object_with_system_metadata() {
    let c = cluster_with_widgets().await;
    let doc = yaml(&c.kubectl_ok(&["get", "widget", "red-one", "-o", "yaml"]));
    assert_eq!(doc["apiVersion"].as_str(), Some("example.dev/v1"));
    assert_eq!(doc["kind"].as_str(), Some("Widget"));
    assert_eq!(doc["metadata"]["generation"].as_i64(), Some(1));
    assert_eq!(doc["metadata"]["namespace"].as_str(), Some(c.namespace()));
    assert!(doc["metadata"]["uid"]
        .as_str()
        .is_some_and(|u| u.len() == 36));
    assert!(doc["metadata"]["creationTimestamp"].as_str().is_some());
    let rv: u64 = doc["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("resourceVersion is an integer string");
    assert!(rv > 0);
    assert_eq!(doc["spec"]["owner"]["name"].as_str(), Some("alice"));

    // The other served version shows the same object with its own apiVersion.
    let beta = yaml(&c.kubectl_ok(&[
        "get",
        "widgets.v1beta1.example.dev",
        "red-one",
        "-o",
        "yaml",
    ]));
    assert_eq!(beta["apiVersion"].as_str(), Some("example.dev/v1beta1"));
    assert_eq!(beta["metadata"]["uid"], doc["metadata"]["uid"]);
}

#[tokio::test]
async fn patch_by_merge_json_and_status_subresource() {
    let c = cluster_with_widgets().await;
    c.merge_patch_ok("widget", "red-one", r#"{"spec":{"size":4}}"#);
    c.kubectl_ok(&[
        "patch",
        "widget",
        "red-one",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/color","value":"blue"}]"#,
    ]);
    c.merge_patch_status_ok("widget", "red-one", r#"{"status":{"phase":"Ready"}}"#);
    // The main endpoint ignores status.
    c.merge_patch_ok("widget", "red-one", r#"{"status":{"phase":"Hacked"}}"#);
    let doc = yaml(&c.kubectl_ok(&["get", "widget", "red-one", "-o", "yaml"]));
    assert_eq!(doc["spec"]["size"].as_i64(), Some(4));
    assert_eq!(doc["spec"]["color"].as_str(), Some("blue"));
    assert_eq!(doc["status"]["phase"].as_str(), Some("Ready"));
    assert_eq!(
        doc["metadata"]["generation"].as_i64(),
        Some(3),
        "two spec changes"
    );

    let out = c.kubectl_ok(&["get", "widget", "red-one", "--no-headers"]);
    assert!(out.contains("Ready"), "{out}");

    // Strategic merge patch is refused for custom resources, as kube-apiserver does.
    let refused = c.kubectl(&["patch", "widget", "red-one", "-p", r#"{"spec":{"size":5}}"#]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("application/strategic-merge-patch+json is not supported"),
        "{err}"
    );
}

#[tokio::test]
async fn delete_removes_a_widget_and_get_then_reports_not_found() {
    let c = cluster_with_widgets().await;
    let out = c.kubectl_ok(&["delete", "widget", "green-one"]);
    assert!(
        out.contains("widget.example.dev \"green-one\" deleted"),
        "{out}"
    );
    let gone = c.kubectl(&["get", "widget", "green-one"]);
    assert!(!gone.status.success());
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(
        err.contains("Error from server (NotFound): widgets.example.dev \"green-one\" not found"),
        "{err}"
    );
    let names = c.kubectl_ok(&["get", "widgets", "-o", "name"]);
    assert_eq!(names.lines().count(), 2, "{names}");
}

#[tokio::test]
async fn get_watch_sees_every_change() {
    let c = cluster_with_widgets().await;
    let watch = c.kubectl_spawn(&["get", "widgets", "-w", "--output-watch-events"]);
    watch
        .wait_for("the three widgets", Duration::from_secs(20), |l| {
            l.iter().filter(|l| l.starts_with("ADDED")).count() == 3
        })
        .await;
    c.merge_patch_ok("widget", "red-one", r#"{"spec":{"size":7}}"#);
    watch
        .wait_for("the patch", Duration::from_secs(20), |l| {
            l.iter()
                .any(|l| l.starts_with("MODIFIED") && l.contains("red-one") && l.contains(" 7 "))
        })
        .await;
    c.kubectl_ok(&["delete", "widget", "blue-one"]);
    watch
        .wait_for("the delete", Duration::from_secs(20), |l| {
            l.iter()
                .any(|l| l.starts_with("DELETED") && l.contains("blue-one"))
        })
        .await;
    // Re-create only blue-one: re-applying red-one's original size would shrink it, which the
    // CRD's transition rule refuses.
    c.kubectl_ok(&["apply", "-f", &widgets_yaml(), "-l", "color=blue"]);
    watch
        .wait_for("the re-creation", Duration::from_secs(20), |l| {
            l.iter()
                .filter(|l| l.starts_with("ADDED") && l.contains("blue-one"))
                .count()
                == 2
        })
        .await;
}

#[tokio::test]
async fn api_resources_lists_the_crd_with_short_name_and_category() {
    let c = TestCluster::start_with_test_crds().await;
    let out = c.kubectl_ok(&["api-resources", "--api-group=example.dev", "-o", "wide"]);
    let widgets: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("widgets"))
        .expect("widgets listed")
        .split_whitespace()
        .collect();
    assert_eq!(
        &widgets[..5],
        ["widgets", "wd", "example.dev/v1", "true", "Widget"]
    );
    assert!(widgets.iter().any(|w| w.contains("examples")), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("gizmos") && l.contains("false")),
        "{out}"
    );

    c.kubectl_ok(&["apply", "-f", &widgets_yaml()]);
    let by_category = c.kubectl_ok(&["get", "examples", "-o", "name"]);
    assert_eq!(by_category.lines().count(), 3, "{by_category}");
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let c = cluster_with_widgets().await;
    let names = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["get", "widgets", "-o", "name"];
        all.extend_from_slice(args);
        let mut v: Vec<String> = c.kubectl_ok(&all).lines().map(str::to_string).collect();
        v.sort();
        v
    };
    assert_eq!(names(&["-l", "tier=front"]), ["widget.example.dev/red-one"]);
    assert_eq!(
        names(&["-l", "color in (green,blue)"]),
        [
            "widget.example.dev/blue-one",
            "widget.example.dev/green-one"
        ]
    );
    assert_eq!(names(&["-l", "!tier"]), ["widget.example.dev/blue-one"]);
    assert_eq!(
        names(&["-l", "tier,tier!=back"]),
        ["widget.example.dev/red-one"]
    );
    assert_eq!(
        names(&["--field-selector", "metadata.name=green-one"]),
        ["widget.example.dev/green-one"]
    );
    assert_eq!(
        names(&["--field-selector", "metadata.name!=green-one"]).len(),
        2
    );
}

#[tokio::test]
async fn kubectl_create_generators_make_builtin_objects() {
    let c = TestCluster::start().await;
    c.kubectl_ok(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=fast",
    ]);
    c.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "api-key",
        "--from-literal=token=s3cret",
    ]);
    c.kubectl_ok(&["create", "serviceaccount", "bot"]);
    let cm = yaml(&c.kubectl_ok(&["get", "configmap", "settings", "-o", "yaml"]));
    assert_eq!(cm["data"]["mode"].as_str(), Some("fast"));
    let secret = yaml(&c.kubectl_ok(&["get", "secret", "api-key", "-o", "yaml"]));
    assert_eq!(secret["data"]["token"].as_str(), Some("czNjcmV0"));
    assert_eq!(secret["type"].as_str(), Some("Opaque"));
    let table = c.kubectl_ok(&["get", "configmaps,secrets,serviceaccounts"]);
    assert!(table.contains("configmap/settings"), "{table}");
    assert!(table.contains("secret/api-key"), "{table}");
    assert!(table.contains("serviceaccount/bot"), "{table}");
}

#[tokio::test]
async fn creating_in_a_missing_namespace_is_not_found() {
    let c = TestCluster::start().await;
    let out = c.kubectl(&["create", "configmap", "x", "-n", "no-such-namespace-here"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("namespaces \"no-such-namespace-here\" not found"),
        "{err}"
    );
}

#[tokio::test]
async fn unknown_fields_of_builtins_follow_field_validation() {
    let c = TestCluster::start().await;
    let manifest =
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: odd\ndata:\n  a: b\nspec:\n  x: 1\n";
    let strict = c.kubectl_stdin(&["apply", "-f", "-"], manifest);
    assert!(!strict.status.success());
    let err = String::from_utf8_lossy(&strict.stderr);
    assert!(
        err.contains("ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"spec\""),
        "{err}"
    );
    let warn = c.kubectl_stdin(&["apply", "--validate=warn", "-f", "-"], manifest);
    assert!(
        warn.status.success(),
        "{}",
        String::from_utf8_lossy(&warn.stderr)
    );
    let err = String::from_utf8_lossy(&warn.stderr);
    assert!(err.contains("Warning: unknown field \"spec\""), "{err}");
    let stored = yaml(&c.kubectl_ok(&["get", "configmap", "odd", "-o", "yaml"]));
    assert!(stored.get("spec").is_none());
    assert_eq!(stored["data"]["a"].as_str(), Some("b"));
}

#[tokio::test]
async fn server_side_apply_and_client_side_apply_both_work() {
    let c = TestCluster::start_with_test_crds().await;
    let out = c.kubectl_ok(&["apply", "--server-side", "-f", &widgets_yaml()]);
    assert!(out.contains("serverside-applied"), "{out}");
    let shown = c.kubectl_ok(&["get", "widgets", "-o", "yaml", "--show-managed-fields"]);
    assert!(shown.contains("manager: kubectl\n"), "{shown}");
    assert!(shown.contains("operation: Apply"), "{shown}");
    let hidden = c.kubectl_ok(&["get", "widgets", "-o", "yaml"]);
    assert!(!hidden.contains("managedFields"), "{hidden}");
}

#[tokio::test]
async fn get_with_chunk_size_pages_through_the_list_with_continue() {
    let c = cluster_with_widgets().await;
    let widget = |name: &str| {
        format!(
            "apiVersion: example.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n  \
             color: blue\n  size: 1\n"
        )
    };
    for name in ["page-a", "page-b"] {
        let out = c.kubectl_stdin(&["apply", "-f", "-"], &widget(name));
        assert!(out.status.success(), "{out:?}");
    }
    // Five widgets: three requests of two, the last without `continue`.
    let out = c.kubectl(&["get", "widgets", "--chunk-size=2", "-v=6"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        ["blue-one", "green-one", "page-a", "page-b", "red-one"],
        "{stdout}"
    );
    let log = String::from_utf8_lossy(&out.stderr);
    let gets: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("GET") && l.contains("/widgets?"))
        .collect();
    assert_eq!(gets.len(), 3, "{log}");
    assert!(gets[1].contains("continue=") && gets[2].contains("continue="));
}

#[tokio::test]
async fn list_pages_carry_remaining_item_count_and_a_consistent_snapshot() {
    let c = cluster_with_widgets().await;
    let client = c.client();
    let path = format!("/apis/example.dev/v1/namespaces/{}/widgets", c.namespace());
    let get = |query: String| {
        let client = client.clone();
        let uri = format!("{path}?{query}");
        async move {
            let req = http::Request::get(uri).body(Vec::new()).expect("request");
            client
                .request::<serde_json::Value>(req)
                .await
                .expect("list answered")
        }
    };
    let first = get("limit=2".into()).await;
    assert_eq!(first["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(first["metadata"]["remainingItemCount"], 1);
    let token = first["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    // A widget created after the first page is not in the rest of this list.
    let out = c.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.dev/v1\nkind: Widget\nmetadata:\n  name: zz-late\nspec:\n  \
         color: blue\n  size: 1\n",
    );
    assert!(out.status.success(), "{out:?}");
    let rest = get(format!("limit=2&continue={token}")).await;
    let names: Vec<&str> = rest["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["red-one"]);
    assert_eq!(
        rest["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    // Lists of custom resources always carry `continue`, empty on the last page.
    assert_eq!(rest["metadata"]["continue"], "", "{rest}");
    assert!(
        rest["metadata"].get("remainingItemCount").is_none(),
        "{rest}"
    );

    let bad = http::Request::get(format!("{path}?limit=2&continue=garbage"))
        .body(Vec::new())
        .expect("request");
    match client.request::<serde_json::Value>(bad).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (400, "BadRequest"));
            assert!(
                status.message.starts_with("invalid continue token"),
                "{status:?}"
            );
        }
        other => panic!("a garbage token is a bad request: {other:?}"),
    }
}

/// The project's CRDs (`crds/`), applied as a user would, and established.
fn apply_project_crds(c: &TestCluster) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    c.apply_crds(&dir);
    c.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout=30s",
        "crd/agentruns.agentrt.dev",
        "crd/approvals.agentrt.dev",
    ]);
}

#[tokio::test]
async fn explain_reads_the_crd_schema_from_openapi_v3() {
    let c = TestCluster::start().await;
    apply_project_crds(&c);
    let out = c.kubectl_ok(&["explain", "agentrun.spec.tools"]);
    assert!(out.contains("KIND:       AgentRun"), "{out}");
    assert!(out.contains("FIELD: tools <[]Object>"), "{out}");
    assert!(out.contains("inputSchema\t<Object>\n"), "{out}");
    assert!(out.contains("mcp\t<Object>"), "{out}");
    assert!(out.contains("name\t<string> -required-"), "{out}");
    let recursive = c.kubectl_ok(&["explain", "agentruns.spec", "--recursive"]);
    assert!(recursive.contains("FIELD: spec <Object>"), "{recursive}");
    assert!(
        recursive.contains("  agent\t<Object> -required-")
            && recursive.contains("      baseURL\t<string> -required-"),
        "{recursive}"
    );
    let meta = c.kubectl_ok(&["explain", "approval.metadata.name"]);
    assert!(meta.contains("FIELD: name <string>"), "{meta}");
}

#[tokio::test]
async fn auth_can_i_answers_yes_for_the_clusters_admin() {
    let c = TestCluster::start().await;
    apply_project_crds(&c);
    assert_eq!(
        c.kubectl_ok(&["auth", "can-i", "create", "agentruns"])
            .trim(),
        "yes"
    );
    assert_eq!(
        c.kubectl_ok(&["auth", "can-i", "delete", "approvals.agentrt.dev", "-A"])
            .trim(),
        "yes"
    );
    assert_eq!(
        c.kubectl_ok(&["auth", "can-i", "get", "/healthz"]).trim(),
        "yes"
    );
    let resources = c.kubectl_ok(&["api-resources", "--api-group=authorization.k8s.io"]);
    assert!(
        resources.contains("selfsubjectaccessreviews"),
        "{resources}"
    );
}
