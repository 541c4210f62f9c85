//! managedFields of the write verbs other than apply: Update entries per manager and
//! subresource, managers from `?fieldManager=`, the User-Agent and kubectl's commands, no-op
//! writes, what the controller reads to date a decision, resets, the cap on Update entries, and
//! built-in kinds.

use serde_json::{json, Value};

use super::{
    apply, call, cluster, entries, entry_of, gadgets, kubectl_apply_ok, managers_and_operations,
    send_json, shown_with_managed_fields, APPLY, MERGE,
};

#[tokio::test]
async fn updates_record_their_manager_per_subresource_with_new_maps_marked() {
    let c = cluster().await;
    let body = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g4", "labels": {"x": "1"}},
        "spec": {"color": "red", "ports": [{"name": "a", "protocol": "TCP", "port": 1}],
                 "tags": ["t1"], "selector": {"app": "x"}, "extra": {"q": {"w": 1}}},
        "status": {"phase": "ignored"}});
    let (code, created) = send_json(
        &c,
        "POST",
        &format!("{}?fieldManager=creator", gadgets(&c)),
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
    c.merge_patch_ok("gadget", "k1", r#"{"spec":{"size":2}}"#);
    c.kubectl_ok(&["label", "gadget", "k1", "tier=front"]);
    let ssa =
        "apiVersion: example.dev/v1\nkind: Gadget\nmetadata:\n  name: k1\nspec:\n  tags: [a]\n";
    kubectl_apply_ok(&c, &["--server-side"], ssa);
    let shown = shown_with_managed_fields(&c, "gadget", "k1");
    let managers = managers_and_operations(&shown);
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
    let (code, reset) = send_json(&c, "PUT", &path, &body.to_string()).await;
    assert_eq!(code, 200, "{reset}");
    assert!(reset["metadata"].get("managedFields").is_none(), "{reset}");
    // A list the client sends replaces the stored one; the writer's entry is added to it.
    let body = json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
        "metadata": {"name": "g7", "resourceVersion": reset["metadata"]["resourceVersion"],
            "managedFields": [{"manager": "zz", "operation": "Update",
                "apiVersion": "example.dev/v1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:color": {}}}}]},
        "spec": {"color": "red", "size": 3}});
    let (code, kept) = send_json(&c, "PUT", &path, &body.to_string()).await;
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
async fn past_ten_update_managers_the_oldest_merge_into_ancient_changes() {
    let c = cluster().await;
    let path = format!("/api/v1/namespaces/{}/configmaps", c.namespace());
    let body =
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"many"},"data":{"k00":"x"}}"#;
    let (code, _) = send_json(&c, "POST", &format!("{path}?fieldManager=m00"), body).await;
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
    let ns: Value = shown_with_managed_fields(&c, "namespace", &name);
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
    let secret: Value = shown_with_managed_fields(&c, "secret", "s1");
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
