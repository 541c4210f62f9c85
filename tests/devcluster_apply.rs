//! Server-side apply and managedFields, on the embedded server and on a real one
//! (`AGENTRT_TEST_KUBECONFIG`): merges by list and map type, field ownership per manager,
//! conflicts and force, removal of fields an applier stops applying, the Update entries every
//! other write keeps (managers from `?fieldManager=`, the User-Agent and kubectl's commands),
//! and no-op writes. Expected values are what kube-apiserver 1.34 answered.

mod support;

use serde_json::{json, Value};
use support::cluster::TestCluster;

const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

/// A cluster with the gadgets CRD established (`tests/fixtures/devcluster/apply/`: a folder of
/// its own, so the CRDs of `tests/fixtures/devcluster/` stay those other tests count).
async fn cluster() -> TestCluster {
    let c = TestCluster::start().await;
    let crd = support::fixtures::devcluster("apply/gadgets-crd.yaml");
    c.kubectl_ok(&["apply", "-f", &crd.to_string_lossy()]);
    c.kubectl_ok(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout=30s",
        "crd/gadgets.example.dev",
    ]);
    c
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
async fn updates_record_their_manager_per_subresource_with_new_maps_marked() {
    let c = cluster().await;
    let body = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g4", "labels": {"x": "1"}},
        "spec": {"color": "red", "ports": [{"name": "a", "protocol": "TCP", "port": 1}],
                 "tags": ["t1"], "selector": {"app": "x"}, "extra": {"q": {"w": 1}}},
        "status": {"phase": "ignored"}});
    let (code, created) = call(
        &c,
        "POST",
        &format!("{}?fieldManager=creator", gadgets(&c)),
        "application/json",
        "test/1",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        entries(&created),
        vec![(
            "creator".to_string(),
            "Update".to_string(),
            String::new(),
            json!({
                "f:metadata": {"f:labels": {".": {}, "f:x": {}}},
                "f:spec": {".": {}, "f:color": {},
                    "f:extra": {".": {}, "f:q": {".": {}, "f:w": {}}},
                    "f:ports": {".": {}, "k:{\"name\":\"a\",\"protocol\":\"TCP\"}":
                        {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}},
                    "f:selector": {},
                    "f:tags": {".": {}, "v:\"t1\"": {}}}
            })
        )]
    );
    let path = format!("{}/g4", gadgets(&c));
    // Without ?fieldManager the manager is the User-Agent's program name.
    let (_, patched) = call(
        &c,
        "PATCH",
        &path,
        MERGE,
        "myprog/1.0 (linux)",
        r#"{"spec":{"size":3}}"#,
    )
    .await;
    assert_eq!(
        entry_of(&patched, "myprog").map(|e| (e["operation"].clone(), e["fieldsV1"].clone())),
        Some((json!("Update"), json!({"f:spec": {"f:size": {}}})))
    );
    // A status write: its own entry, subresource status.
    let (code, status) = call(
        &c,
        "PATCH",
        &format!("{path}/status?fieldManager=st"),
        MERGE,
        "test/1",
        r#"{"status":{"phase":"Ok"}}"#,
    )
    .await;
    assert_eq!(code, 200, "{status}");
    let st = entry_of(&status, "st").expect("status entry");
    assert_eq!(st["subresource"], "status");
    assert_eq!(
        st["fieldsV1"],
        json!({"f:status": {".": {}, "f:phase": {}}})
    );
    // Changing a field another Update manager set takes it from them.
    let (_, taken) = call(
        &c,
        "PATCH",
        &format!("{path}?fieldManager=other"),
        MERGE,
        "test/1",
        r#"{"spec":{"size":4}}"#,
    )
    .await;
    assert!(entry_of(&taken, "myprog").is_none(), "{taken}");
    assert_eq!(
        entry_of(&taken, "other").map(|e| e["fieldsV1"].clone()),
        Some(json!({"f:spec": {"f:size": {}}}))
    );
}

#[tokio::test]
async fn no_op_writes_keep_the_resource_version_and_the_time() {
    let c = cluster().await;
    let (_, first) = apply(
        &c,
        "g5",
        "fieldManager=a",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (code, again) = apply(
        &c,
        "g5",
        "fieldManager=a",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        again["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert_eq!(
        again["metadata"]["managedFields"],
        first["metadata"]["managedFields"]
    );
    let path = format!("{}/g5?fieldManager=p", gadgets(&c));
    let (_, same) = call(
        &c,
        "PATCH",
        &path,
        MERGE,
        "test/1",
        r#"{"spec":{"color":"red"}}"#,
    )
    .await;
    assert_eq!(
        same["metadata"]["resourceVersion"],
        first["metadata"]["resourceVersion"]
    );
    assert!(entry_of(&same, "p").is_none());
}

#[tokio::test]
async fn the_write_that_set_spec_decision_is_dated_by_its_entry() {
    // What the controller reads (engine::approvals::decision_time): the entry owning
    // spec.decision and its time.
    let c = cluster().await;
    apply(
        &c,
        "g6",
        "fieldManager=creator",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    let before = jiff::Timestamp::now();
    let path = format!("{}/g6?fieldManager=kubectl-patch", gadgets(&c));
    let (code, decided) = call(
        &c,
        "PATCH",
        &path,
        MERGE,
        "kubectl/v1.32",
        r#"{"spec":{"decision":"Approved"}}"#,
    )
    .await;
    assert_eq!(code, 200, "{decided}");
    let entry = decided["metadata"]["managedFields"]
        .as_array()
        .and_then(|l| {
            l.iter()
                .find(|e| e.pointer("/fieldsV1/f:spec/f:decision").is_some())
        })
        .cloned()
        .expect("an entry owns spec.decision");
    assert_eq!(entry["manager"], "kubectl-patch");
    let time: jiff::Timestamp = entry["time"]
        .as_str()
        .expect("time")
        .parse()
        .expect("RFC 3339");
    assert!(
        time.as_second() >= before.as_second() - 1,
        "{time} {before}"
    );
}

#[tokio::test]
async fn kubectl_commands_name_their_managers_and_managed_fields_show_on_request() {
    let c = cluster().await;
    let manifest =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k1\nspec:\n  color: red\n";
    c.kubectl_stdin(&["create", "-f", "-"], manifest);
    c.kubectl_ok(&[
        "patch",
        "gadget",
        "k1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"size":2}}"#,
    ]);
    c.kubectl_ok(&["label", "gadget", "k1", "tier=front"]);
    let ssa =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k1\nspec:\n  tags: [a]\n";
    let out = c.kubectl_stdin(&["apply", "--server-side", "-f", "-"], ssa);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "gadget",
        "k1",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    let mut managers: Vec<(String, String)> = entries(&shown)
        .into_iter()
        .map(|(m, op, _, _)| (m, op))
        .collect();
    managers.sort();
    assert_eq!(
        managers,
        vec![
            ("kubectl".to_string(), "Apply".to_string()),
            ("kubectl-create".to_string(), "Update".to_string()),
            ("kubectl-label".to_string(), "Update".to_string()),
            ("kubectl-patch".to_string(), "Update".to_string()),
        ]
    );
    let hidden = c.kubectl_ok(&["get", "gadget", "k1", "-o", "yaml"]);
    assert!(!hidden.contains("managedFields"), "{hidden}");
}

#[tokio::test]
async fn built_in_objects_keep_managed_fields_and_take_apply() {
    let c = cluster().await;
    let path = format!("/api/v1/namespaces/{}/configmaps", c.namespace());
    let (code, applied) = call(
        &c,
        "PATCH",
        &format!("{path}/c1?fieldManager=a"),
        APPLY,
        "test/1",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c1"},"data":{"a":"b"}}"#,
    )
    .await;
    assert_eq!(code, 201, "{applied}");
    assert_eq!(
        entries(&applied),
        vec![(
            "a".to_string(),
            "Apply".to_string(),
            String::new(),
            json!({"f:data": {"f:a": {}}})
        )]
    );
    let (code, created) = call(
        &c,
        "POST",
        &path,
        "application/json",
        "maker/2",
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c2"},"data":{"a":"b"}}"#,
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(
        entries(&created),
        vec![(
            "maker".to_string(),
            "Update".to_string(),
            String::new(),
            json!({"f:data": {".": {}, "f:a": {}}})
        )]
    );
}

#[tokio::test]
async fn a_single_empty_entry_clears_managed_fields_and_a_client_list_is_kept() {
    let c = cluster().await;
    let (_, created) = apply(
        &c,
        "g7",
        "fieldManager=a",
        json!({"spec": {"color": "red"}}),
    )
    .await;
    let rv = created["metadata"]["resourceVersion"].clone();
    let path = format!("{}/g7?fieldManager=m2", gadgets(&c));
    let body = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g7", "resourceVersion": rv, "managedFields": [{}]},
        "spec": {"color": "red", "size": 2}});
    let (code, reset) = call(
        &c,
        "PUT",
        &path,
        "application/json",
        "test/1",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{reset}");
    assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");
    // A list the client sends replaces the stored one; the writer's entry is added to it.
    let body = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g7", "resourceVersion": reset["metadata"]["resourceVersion"],
            "managedFields": [{"manager": "zz", "operation": "Update",
                "apiVersion": "example.dev/v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:color": {}}}}]},
        "spec": {"color": "red", "size": 3}});
    let (code, kept) = call(
        &c,
        "PUT",
        &path,
        "application/json",
        "test/1",
        &body.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{kept}");
    let mut got: Vec<(String, Value)> = entries(&kept)
        .into_iter()
        .map(|(m, _, _, f)| (m, f))
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("m2".to_string(), json!({"f:spec": {"f:size": {}}})),
            ("zz".to_string(), json!({"f:spec": {"f:color": {}}})),
        ]
    );
}

#[tokio::test]
async fn kubectl_server_side_apply_takes_over_from_client_side_apply() {
    let c = cluster().await;
    let first = "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k2\nspec:\n  color: red\n  size: 1\n";
    let out = c.kubectl_stdin(&["apply", "-f", "-"], first);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // kubectl-client-side-apply owns spec.color; the last-applied configuration still matches
    // the object, so the conflict is allowed for kubectl and the annotation follows.
    let second =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k2\nspec:\n  color: blue\n";
    let out = c.kubectl_stdin(&["apply", "--server-side", "-f", "-"], second);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "gadget",
        "k2",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert_eq!(shown["spec"], json!({"color": "blue"}));
    let last = shown["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("annotation");
    let last: Value = serde_json::from_str(last).expect("JSON");
    assert_eq!(last["spec"], json!({"color": "blue"}));
    let mut managers: Vec<(String, String)> = entries(&shown)
        .into_iter()
        .map(|(m, op, _, _)| (m, op))
        .collect();
    managers.sort();
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

#[tokio::test]
async fn past_ten_update_managers_the_oldest_merge_into_ancient_changes() {
    let c = cluster().await;
    let path = format!("/api/v1/namespaces/{}/configmaps", c.namespace());
    let body =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"many"},"data":{"k00":"x"}}"#;
    let (code, _) = call(
        &c,
        "POST",
        &format!("{path}?fieldManager=m00"),
        "application/json",
        "test/1",
        body,
    )
    .await;
    assert_eq!(code, 201);
    let mut last = Value::Null;
    for i in 1..12 {
        let patch = format!(r#"{{"data":{{"k{i:02}":"x"}}}}"#);
        let url = format!("{path}/many?fieldManager=m{i:02}");
        let (code, out) = call(&c, "PATCH", &url, MERGE, "test/1", &patch).await;
        assert_eq!(code, 200, "{out}");
        last = out;
    }
    let got: Vec<(String, Value)> = entries(&last)
        .into_iter()
        .map(|(m, _, _, f)| (m, f))
        .collect();
    assert_eq!(got.len(), 10, "{got:?}");
    assert_eq!(
        got[0],
        (
            "ancient-changes".to_string(),
            json!({"f:data": {".": {}, "f:k00": {}, "f:k01": {}, "f:k02": {}}})
        )
    );
    assert_eq!(got[1].0, "m03");
    assert_eq!(got[9].0, "m11");
}

#[tokio::test]
async fn built_in_defaults_are_the_writers_and_server_set_fields_nobodys() {
    let c = cluster().await;
    // The test's namespace was created by the harness; a namespace kubectl creates.
    let name = format!("{}-ns", c.namespace());
    c.kubectl_ok(&["create", "namespace", &name]);
    let ns: Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "namespace",
        &name,
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    c.kubectl_ok(&["delete", "namespace", &name, "--wait=false"]);
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        json!(name)
    );
    assert_eq!(
        entries(&ns),
        vec![(
            "kubectl-create".to_string(),
            "Update".to_string(),
            String::new(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:kubernetes.io/metadata.name": {}}}})
        )]
    );
    c.kubectl_ok(&["create", "secret", "generic", "s1", "--from-literal=a=b"]);
    let secret: Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "secret",
        "s1",
        "-o",
        "json",
        "--show-managed-fields",
    ]))
    .expect("json");
    assert_eq!(
        entries(&secret),
        vec![(
            "kubectl-create".to_string(),
            "Update".to_string(),
            String::new(),
            json!({"f:data": {".": {}, "f:a": {}}, "f:type": {}})
        )]
    );
}
