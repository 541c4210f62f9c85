//! Server-side apply and managedFields, on the embedded server and on a real one
//! (`AGENTRT_TEST_KUBECONFIG`): merges by list and map type, field ownership per manager,
//! conflicts and force, removal of fields an applier stops applying, kubectl's move from
//! client-side apply; and (in `updates`) the Update entries every other write keeps (managers
//! from `?fieldManager=`, the User-Agent and kubectl's commands), no-op writes, the cap on
//! entries, built-ins. Expected values are what kube-apiserver 1.34 answered.

mod support;

/// The Update entries of the other write verbs, kubectl's managers, built-ins.
#[path = "devcluster_apply/updates.rs"]
mod updates;

use serde_json::{json, Value};
use support::cluster::TestCluster;

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

/// A cluster with the gadgets CRD established (`tests/fixtures/devcluster/apply/`: a folder of
/// its own, so the CRDs of `tests/fixtures/devcluster/` stay those other tests count).
async fn cluster() -> TestCluster {
    let c = TestCluster::start().await;
    let crd = support::fixtures::devcluster("apply/gadgets-crd.yaml");
    c.apply_crds(&crd);
    c.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout=30s",
        "crd/gadgets.example.dev",
    ]);
    c
}

/// `kubectl get KIND NAME -o json --show-managed-fields`, parsed; panics when kubectl fails.
fn shown_with_managed_fields(c: &TestCluster, kind: &str, name: &str) -> Value {
    serde_json::from_str(&c.kubectl_ok(&["get", kind, name, "-o", "json", "--show-managed-fields"]))
        .expect("json")
}

/// The (manager, operation) of each managedFields entry of `object`, sorted.
fn managers_and_operations(object: &Value) -> Vec<(String, String)> {
    let mut managers: Vec<(String, String)> = entries(object)
        .into_iter()
        .map(|(m, op, _, _)| (m, op))
        .collect();
    managers.sort();
    managers
}

/// `kubectl apply ARGS -f -` of `manifest` (`args`: `--server-side`, say); panics with
/// kubectl's standard error when it fails.
fn kubectl_apply_ok(c: &TestCluster, args: &[&str], manifest: &str) {
    let mut all = vec!["apply"];
    all.extend_from_slice(args);
    all.extend(["-f", "-"]);
    let out = c.kubectl_stdin(&all, manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `body` (JSON) sent with `method` to `path` as `application/json` by user agent `test/1`
/// ([`call`]).
async fn send_json(c: &TestCluster, method: &str, path: &str, body: &str) -> (u16, Value) {
    call(c, method, path, "application/json", "test/1", body).await
}

/// One request; returns the status code and the JSON body.
async fn call(
    c: &TestCluster,
    method: &str,
    path: &str,
    content_type: &str,
    user_agent: &str,
    body: &str,
) -> (u16, Value) {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("user-agent", user_agent)
        .body(kube::client::Body::from(body.as_bytes().to_vec()))
        .expect("request");
    let response = c.client().send(request).await.expect("response");
    let code = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect_bytes()
        .await
        .expect("response body");
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn gadgets(c: &TestCluster) -> String {
    format!("/apis/example.dev/v1/namespaces/{}/gadgets", c.namespace())
}

/// Applies `spec` (and `metadata` extras) to gadget `name` as `manager` (`query` appended).
async fn apply(c: &TestCluster, name: &str, query: &str, body: Value) -> (u16, Value) {
    let mut doc = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
                         "metadata": {"name": name}});
    if let (Some(d), Some(b)) = (doc.as_object_mut(), body.as_object()) {
        for (k, v) in b {
            if k == "metadata" {
                if let (Some(m), Some(extra)) = (d["metadata"].as_object_mut(), v.as_object()) {
                    m.extend(extra.clone());
                }
            } else {
                d.insert(k.clone(), v.clone());
            }
        }
    }
    let path = format!("{}/{name}?{query}", gadgets(c));
    call(c, "PATCH", &path, APPLY, "test/1", &doc.to_string()).await
}

/// The managedFields entries as (manager, operation, subresource, fieldsV1).
fn entries(object: &Value) -> Vec<(String, String, String, Value)> {
    object["metadata"]["managedFields"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (
                s("manager"),
                s("operation"),
                s("subresource"),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

fn entry_of<'a>(object: &'a Value, manager: &str) -> Option<&'a Value> {
    object["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .find(|e| e["manager"] == manager)
}

#[tokio::test]
async fn apply_creates_merges_by_list_type_and_records_what_each_manager_applied() {
    let c = cluster().await;
    let (code, created) = apply(
        &c,
        "g1",
        "fieldManager=one",
        json!({"metadata": {"labels": {"a": "1"}, "finalizers": ["example.dev/x"]},
               "spec": {"color": "red", "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
                        "tags": ["a", "b"], "args": ["x", "z"], "labels": {"k": "v"},
                        "selector": {"app": "web"}, "extra": {"foo": {"bar": 1}, "list": [1, 2]}}}),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        entries(&created),
        vec![(
            "one".to_string(),
            "Apply".to_string(),
            String::new(),
            json!({
                "f:metadata": {"f:finalizers": {"v:\"example.dev/x\"": {}}, "f:labels": {"f:a": {}}},
                "f:spec": {
                    "f:args": {}, "f:color": {},
                    "f:extra": {"f:foo": {".": {}, "f:bar": {}}, "f:list": {}},
                    "f:labels": {"f:k": {}},
                    "f:ports": {"k:{\"name\":\"http\",\"protocol\":\"TCP\"}":
                        {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}},
                    "f:selector": {},
                    "f:tags": {"v:\"a\"": {}, "v:\"b\"": {}}
                }
            })
        )]
    );
    let entry = entry_of(&created, "one").expect("entry");
    assert_eq!(entry["apiVersion"], "example.dev/v1");
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert!(entry["time"].as_str().is_some_and(|t| t.ends_with('Z')));

    // A second manager: map-list items merge by key, set items by value, atomic lists and
    // atomic maps are replaced, granular maps merge.
    let (code, merged) = apply(
        &c,
        "g1",
        "fieldManager=two",
        json!({"spec": {"ports": [{"name": "http", "protocol": "UDP", "port": 53}],
                        "tags": ["b", "c"], "labels": {"k2": "v2"}}}),
    )
    .await;
    assert_eq!(code, 200, "{merged}");
    let spec = &merged["spec"];
    assert_eq!(
        spec["ports"],
        json!([{"name": "http", "protocol": "TCP", "port": 80},
               {"name": "http", "protocol": "UDP", "port": 53}])
    );
    assert_eq!(spec["tags"], json!(["a", "b", "c"]));
    assert_eq!(spec["labels"], json!({"k": "v", "k2": "v2"}));
    assert_eq!(
        entry_of(&merged, "two").map(|e| e["fieldsV1"].clone()),
        Some(json!({"f:spec": {
            "f:labels": {"f:k2": {}},
            "f:ports": {"k:{\"name\":\"http\",\"protocol\":\"UDP\"}":
                {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}},
            "f:tags": {"v:\"b\"": {}, "v:\"c\"": {}}
        }}))
    );
    // "b" is owned by both.
    let one = entry_of(&merged, "one").expect("one");
    assert!(one["fieldsV1"]["f:spec"]["f:tags"].get("v:\"b\"").is_some());
}

#[tokio::test]
async fn conflicts_name_the_owner_and_force_takes_the_field() {
    let c = cluster().await;
    let (code, _) = apply(
        &c,
        "g2",
        "fieldManager=a",
        json!({"spec": {"color": "red", "size": 1}}),
    )
    .await;
    assert_eq!(code, 201);
    let (code, status) = apply(
        &c,
        "g2",
        "fieldManager=b",
        json!({"spec": {"color": "blue", "size": 2}}),
    )
    .await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["status"], "Failure");
    assert_eq!(
        status["message"],
        "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.color\n- .spec.size"
    );
    assert_eq!(
        status["details"]["causes"],
        json!([
            {"reason": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.color"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.size"}
        ])
    );
    // An Update manager is named with its apiVersion.
    let path = format!("{}/g2", gadgets(&c));
    let (code, _) = call(
        &c,
        "PATCH",
        &path,
        MERGE,
        "myprog/1.0 (x)",
        r#"{"spec":{"size":5}}"#,
    )
    .await;
    assert_eq!(code, 200);
    let (code, status) = apply(&c, "g2", "fieldManager=b", json!({"spec": {"size": 3}})).await;
    assert_eq!(code, 409);
    assert_eq!(
        status["message"],
        "Apply failed with 1 conflict: conflict with \"myprog\" using example.dev/v1: .spec.size"
    );
    // Same value: shared, no conflict. Force: the field changes hands.
    let (code, shared) = apply(
        &c,
        "g2",
        "fieldManager=b",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    assert_eq!(code, 200, "{shared}");
    assert!(entry_of(&shared, "a").is_some() && entry_of(&shared, "b").is_some());
    let (code, forced) = apply(
        &c,
        "g2",
        "fieldManager=b&force=true",
        json!({"spec": {"color": "red", "size": 3}}),
    )
    .await;
    assert_eq!(code, 200, "{forced}");
    assert_eq!(forced["spec"]["size"], 3);
    assert!(
        entry_of(&forced, "myprog").is_none(),
        "myprog owned only size"
    );
    assert_eq!(
        entry_of(&forced, "b").map(|e| e["fieldsV1"].clone()),
        Some(json!({"f:spec": {"f:color": {}, "f:size": {}}}))
    );
    assert_eq!(
        entry_of(&forced, "a").map(|e| e["fieldsV1"].clone()),
        Some(json!({"f:spec": {"f:color": {}}}))
    );
}

#[tokio::test]
async fn fields_an_applier_stops_applying_are_removed_unless_another_manager_owns_them() {
    let c = cluster().await;
    apply(
        &c,
        "g3",
        "fieldManager=a",
        json!({"metadata": {"labels": {"x": "1"}},
               "spec": {"color": "red", "size": 1,
                        "ports": [{"name": "a", "protocol": "TCP", "port": 1},
                                  {"name": "b", "protocol": "TCP", "port": 2}],
                        "tags": ["t1", "t2"], "labels": {"l1": "a"}}}),
    )
    .await;
    let (code, _) = apply(
        &c,
        "g3",
        "fieldManager=b",
        json!({"spec": {"ports": [{"name": "b", "protocol": "TCP", "port": 2}],
                        "tags": ["t2"]}}),
    )
    .await;
    assert_eq!(code, 200);
    let (code, out) = apply(
        &c,
        "g3",
        "fieldManager=a",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    assert_eq!(code, 200, "{out}");
    assert_eq!(
        out["spec"],
        json!({"color": "red", "ports": [{"name": "b", "protocol": "TCP", "port": 2}],
               "tags": ["t2"]})
    );
    assert!(out["metadata"].get("labels").is_none(), "{out}");
    assert_eq!(
        entry_of(&out, "a").map(|e| e["fieldsV1"].clone()),
        Some(json!({"f:spec": {"f:color": {}}}))
    );
}

#[tokio::test]
async fn apply_needs_a_field_manager_a_named_object_and_force_only_for_apply() {
    let c = cluster().await;
    let path = format!("{}/e1", gadgets(&c));
    let doc = r#"{"apiVersion":"example.dev/v1","kind":"Gadget","metadata":{"name":"e1"}}"#;
    let (code, status) = call(&c, "PATCH", &path, APPLY, "test/1", doc).await;
    assert_eq!(code, 422);
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    // A field the schema does not declare: 500 whatever fieldValidation says.
    let (code, status) = apply(
        &c,
        "e1",
        "fieldManager=a&fieldValidation=Ignore",
        json!({"spec": {"bogus": 1}}),
    )
    .await;
    assert_eq!(code, 500, "{status}");
    assert_eq!(
        status["message"],
        "failed to create typed patch object (/e1; example.dev/v1, Kind=Gadget): .spec.bogus: \
         field not declared in schema"
    );
    let long = format!("fieldManager={}", "x".repeat(129));
    let (code, status) = apply(&c, "e1", &long, json!({})).await;
    assert_eq!(code, 422);
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes"
    );
    let (code, status) = apply(
        &c,
        "e1",
        "fieldManager=a",
        json!({"metadata": {"name": "e2"}}),
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(
        status["message"],
        "the name of the object (e2) does not match the name on the URL (e1)"
    );
    let with_fields = r#"{"apiVersion":"example.dev/v1","kind":"Gadget","metadata":{"name":"e1","managedFields":[{"manager":"x","operation":"Apply"}]}}"#;
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=a"),
        APPLY,
        "test/1",
        with_fields,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(status["message"], "metadata.managedFields must be nil");
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=a"),
        APPLY,
        "test/1",
        r#"{"kind":"Gadget","metadata":{"name":"e1"}}"#,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(status["message"], "invalid object type: /, Kind=Gadget");
    // YAML bodies are configurations too.
    let yaml =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: e1\nspec:\n  color: red\n";
    let (code, created) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=a"),
        APPLY,
        "test/1",
        yaml,
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["spec"]["color"], "red");
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}?force=true"),
        MERGE,
        "test/1",
        "{}",
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        status["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch"
    );
}

#[tokio::test]
async fn kubectl_server_side_apply_takes_over_from_client_side_apply() {
    let c = cluster().await;
    let first = "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k2\nspec:\n  color: red\n  size: 1\n";
    kubectl_apply_ok(&c, &[], first);
    // kubectl-client-side-apply owns spec.color; the last-applied configuration still matches
    // the object, so the conflict is allowed for kubectl and the annotation follows.
    let second =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k2\nspec:\n  color: blue\n";
    kubectl_apply_ok(&c, &["--server-side"], second);
    let shown = shown_with_managed_fields(&c, "gadget", "k2");
    assert_eq!(shown["spec"], json!({"color": "blue"}));
    let last = shown["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("annotation");
    let last: Value = serde_json::from_str(last).expect("JSON");
    assert_eq!(last["spec"], json!({"color": "blue"}));
    let managers = managers_and_operations(&shown);
    assert_eq!(
        managers,
        vec![
            ("kubectl".to_string(), "Apply".to_string()),
            ("kubectl-last-applied".to_string(), "Apply".to_string()),
        ]
    );
    // Another manager gets no such pass.
    let path = format!("{}/k2?fieldManager=other", gadgets(&c));
    let doc = r#"{"apiVersion":"example.dev/v1","kind":"Gadget","metadata":{"name":"k2"},"spec":{"color":"green"}}"#;
    let (code, _) = call(&c, "PATCH", &path, APPLY, "test/1", doc).await;
    assert_eq!(code, 409);
}
