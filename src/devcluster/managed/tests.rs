//! Unit tests of the field manager: what Updates record, what Apply merges, removes and
//! refuses, against outcomes observed on kube-apiserver 1.34.

use serde_json::{json, Value};

use super::*;

fn shape() -> Shape {
    from_crd_schema(Some(&json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "color": {"type": "string"}, "size": {"type": "integer"},
            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                     "items": {"type": "string"}}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}})))
}

fn writer(manager: &str, now: &str) -> Writer {
    Writer {
        manager: manager.into(),
        subresource: String::new(),
        api_version: "example.dev/v1".into(),
        now: now.into(),
    }
}

fn managed(object: &Value) -> Vec<(String, &'static str, Value, String)> {
    decode(object)
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            (
                e.manager.clone(),
                e.operation.name(),
                e.fields.to_fields_v1(),
                e.time.unwrap_or_default(),
            )
        })
        .collect()
}

fn obj(spec: Value) -> Value {
    json!({"apiVersion": "example.dev/v1", "kind": "Gadget",
           "metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": spec})
}

fn with_entries(mut o: Value, entries: &[Entry]) -> Value {
    o["metadata"]["managedFields"] = encode(entries);
    o
}

#[test]
fn a_create_records_new_maps_with_a_dot_and_no_system_metadata() {
    let mut new = obj(json!({"color": "red"}));
    new["metadata"]["labels"] = json!({"a": "1"});
    let entries = record_update(
        Vec::new(),
        &json!({}),
        &new,
        &shape(),
        &writer("curl", "t1"),
    );
    let out = with_entries(new, &entries);
    assert_eq!(
        managed(&out),
        vec![(
            "curl".to_string(),
            "Update",
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}},
                   "f:spec": {".": {}, "f:color": {}}}),
            "t1".to_string()
        )]
    );
}

#[test]
fn an_update_takes_changed_fields_from_others_and_a_no_op_keeps_the_time() {
    let s = shape();
    let a = obj(json!({"color": "red", "size": 1}));
    let entries = record_update(Vec::new(), &json!({}), &a, &s, &writer("one", "t1"));
    let b = obj(json!({"color": "blue", "size": 1}));
    let entries = record_update(entries, &a, &b, &s, &writer("two", "t2"));
    let out = with_entries(b.clone(), &entries);
    let m = managed(&out);
    assert_eq!(m[0].0, "one");
    assert_eq!(m[0].2, json!({"f:spec": {".": {}, "f:size": {}}}));
    assert_eq!(
        (m[1].0.as_str(), &m[1].2),
        ("two", &json!({"f:spec": {"f:color": {}}}))
    );
    let again = record_update(entries.clone(), &b, &b, &s, &writer("two", "t3"));
    assert_eq!(again, entries, "nothing changed, nothing recorded");
}

#[test]
fn apply_conflicts_name_the_owner_and_force_takes_the_field() {
    let s = shape();
    let (live, _) = apply(
        None,
        &obj(json!({"color": "red"})),
        &s,
        &writer("a", "t1"),
        false,
    )
    .expect("create");
    let err = apply(
        Some(&live),
        &obj(json!({"color": "blue"})),
        &s,
        &writer("b", "t2"),
        false,
    );
    match err {
        Err(ApplyError::Conflict(status)) => {
            assert_eq!(
                status["message"],
                "Apply failed with 1 conflict: conflict with \"a\": .spec.color"
            );
            assert_eq!(
                status["details"]["causes"][0]["reason"],
                "FieldManagerConflict"
            );
            assert_eq!(status["code"], 409);
        }
        other => panic!("{other:?}"),
    }
    // The same value is shared, not a conflict.
    let (shared, _) = apply(
        Some(&live),
        &obj(json!({"color": "red"})),
        &s,
        &writer("b", "t2"),
        false,
    )
    .expect("shared");
    assert_eq!(managed(&shared).len(), 2);
    let (forced, changed) = apply(
        Some(&live),
        &obj(json!({"color": "blue"})),
        &s,
        &writer("b", "t2"),
        true,
    )
    .expect("forced");
    assert!(changed);
    assert_eq!(forced["spec"]["color"], "blue");
    let m = managed(&forced);
    assert_eq!(m.len(), 1, "a lost its only field: {m:?}");
    assert_eq!(m[0].0, "b");
}

#[test]
fn fields_an_applier_stops_applying_go_unless_someone_else_owns_them() {
    let s = shape();
    let (live, _) = apply(
        None,
        &obj(json!({"color": "red", "size": 2, "tags": ["x", "y"]})),
        &s,
        &writer("a", "t1"),
        false,
    )
    .expect("create");
    let (live, _) = apply(
        Some(&live),
        &obj(json!({"tags": ["y"]})),
        &s,
        &writer("b", "t2"),
        false,
    )
    .expect("b shares y");
    let (out, _) = apply(
        Some(&live),
        &obj(json!({"color": "red"})),
        &s,
        &writer("a", "t3"),
        false,
    )
    .expect("a drops size and tags");
    assert_eq!(out["spec"], json!({"color": "red", "tags": ["y"]}));
}

#[test]
fn a_second_identical_apply_changes_nothing() {
    let s = shape();
    let cfg = obj(json!({"color": "red"}));
    let (live, _) = apply(None, &cfg, &s, &writer("a", "t1"), false).expect("create");
    let (again, changed) = apply(Some(&live), &cfg, &s, &writer("a", "t2"), false).expect("noop");
    assert!(!changed);
    assert_eq!(again, live, "time kept");
}

#[test]
fn past_ten_update_entries_the_oldest_merge_into_ancient_changes() {
    let s = shape();
    let mut entries = Vec::new();
    let mut old = obj(json!({}));
    for i in 0..12 {
        let mut new = old.clone();
        new["metadata"]["labels"][format!("l{i}")] = json!("x");
        let w = writer(&format!("m{i:02}"), &format!("2026-01-01T00:00:{i:02}Z"));
        entries = record_update(entries, &old, &new, &s, &w);
        old = new;
    }
    let managers: Vec<&str> = entries.iter().map(|e| e.manager.as_str()).collect();
    assert_eq!(entries.len(), 10, "{managers:?}");
    let ancient = entries
        .iter()
        .find(|e| e.manager == "ancient-changes")
        .expect("bucket");
    // m00 was the first of its version; m01 and m02 went into the bucket with it.
    assert_eq!(ancient.time.as_deref(), Some("2026-01-01T00:00:02Z"));
    assert!(!managers.contains(&"m00") && !managers.contains(&"m02"));
    assert!(managers.contains(&"m03"));
    assert_eq!(ancient.fields.iter().count(), 4, "labels map and l0..l2");
}
