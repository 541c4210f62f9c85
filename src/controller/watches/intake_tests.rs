//! Issue 34: the run watch decodes each object on its own. Whatever a run's author writes
//! (a spec nested past serde_json's 128 levels, huge strings, wrong types) fails neither the
//! list nor a watch event of the other runs: each such run is kept with its identity and set
//! aside with a short cause that never carries its text.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::WatchedRun;
use crate::controller::cluster::{DecodeError, StoredRun, CAUSE_CHARS};

/// A run as the API server sends it before any controller wrote its status.
fn run(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "resourceVersion": "7", "generation": 1,
                     "managedFields": [{"manager": "kubectl", "operation": "Update",
                                        "fieldsV1": {"f:spec": spec_fields(&spec)}}]},
        "spec": spec,
    })
}

/// `fieldsV1` mirroring `spec`'s shape, as kube-apiserver's managedFields do (so they nest as
/// deep as the spec).
fn spec_fields(spec: &Value) -> Value {
    match spec {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| (format!("f:{key}"), spec_fields(value)))
                .collect(),
        ),
        _ => json!({}),
    }
}

fn valid_spec() -> Value {
    json!({"goal": "g", "agent": {"scripted": {"decisions": [
        {"kind": "complete", "result": {"ok": true}}]}}})
}

/// `{"a": {"a": ... leaf ...}}`, `depth` objects deep (built without recursion).
fn nested(depth: usize, leaf: Value) -> Value {
    let mut value = leaf;
    for _ in 0..depth {
        value = json!({ "a": value });
    }
    value
}

/// The text of `value` built without serde_json's recursive serializer for the deep part.
fn text_of(value: &Value) -> String {
    serde_json::to_string(value).expect("serializes")
}

/// One way a run's author can make a spec the controller cannot use.
#[derive(Debug, Clone)]
enum Bad {
    /// Scripted args nested this deep (past serde_json's 128).
    Deep(usize),
    /// A huge string where an object belongs (serde's message quotes the value).
    HugeWrongType(usize),
    /// Any JSON where the goal belongs (a string).
    WrongGoal(Value),
    /// Many fields of anything where the agent belongs.
    Wide(Vec<(String, Value)>),
}

impl Bad {
    fn spec(&self) -> Value {
        match self {
            Bad::Deep(depth) => json!({"goal": "g", "agent": {"scripted": {"decisions": [
                {"kind": "tool_call", "tool": "t", "args": nested(*depth, json!(1))}]}}}),
            Bad::HugeWrongType(len) => json!({"goal": "g", "agent": "x".repeat(*len)}),
            Bad::WrongGoal(goal) => json!({"goal": goal, "agent": {"scripted": {"decisions": []}}}),
            Bad::Wide(fields) => json!({"goal": "g", "agent": {"scripted": Value::Object(
                fields.iter().cloned().collect())}}),
        }
    }
}

fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,8}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn bad() -> impl Strategy<Value = Bad> {
    prop_oneof![
        (129usize..600).prop_map(Bad::Deep),
        (1_000usize..200_000).prop_map(Bad::HugeWrongType),
        any_json()
            .prop_filter("not a string", |v| !v.is_string())
            .prop_map(Bad::WrongGoal),
        prop::collection::vec(("[a-z]{1,12}", any_json()), 1..40).prop_map(|fields| {
            // `decisions` must be a list: a wide object with one that is not.
            let mut fields = fields;
            fields.push(("decisions".into(), json!("not a list")));
            Bad::Wide(fields)
        }),
    ]
}

/// Checks one bad run as the watch kept it and as a read of it decodes.
fn assert_set_aside(name: &str, watched: &WatchedRun, item: &str) {
    assert_eq!(watched.metadata.name.as_deref(), Some(name));
    assert_eq!(
        watched.metadata.uid.as_deref(),
        Some(&*format!("uid-{name}"))
    );
    // Either the watch already knows (the spec does not even parse), or the run is not kept
    // whole and its reconcile reads it: both end in the read's verdict.
    if let Some(cause) = &watched.undecodable {
        assert!(cause.chars().count() <= CAUSE_CHARS + 16, "{cause}");
        assert!(watched.fresh.is_none());
    } else if let Some(fresh) = &watched.fresh {
        assert!(fresh.stored().is_err(), "{name}: a bad spec decoded");
    }
    match StoredRun::from_text(item) {
        Err(DecodeError::Spec { held, cause, .. }) => {
            assert_eq!(held.name, name);
            assert_eq!(held.resource_version, "7");
            assert!(cause.chars().count() <= CAUSE_CHARS + 1, "{cause}");
            assert!(!cause.contains("xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"));
            let line = DecodeError::Spec {
                held,
                cause,
                status: Value::Null,
            }
            .to_string();
            assert!(
                line.len() < 600,
                "a decode failure's line is short: {}",
                line.len()
            );
        }
        other => panic!("{name}: expected a spec that does not decode, got {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_list_with_undecodable_runs_delivers_the_valid_one_and_sets_each_bad_one_aside(
        bads in prop::collection::vec(bad(), 1..5),
        valid_at in 0usize..5,
    ) {
        let mut items: Vec<Value> = bads
            .iter()
            .enumerate()
            .map(|(i, bad)| run(&format!("bad-{i}"), bad.spec()))
            .collect();
        items.insert(valid_at.min(items.len()), run("valid", valid_spec()));
        let item_texts: Vec<String> = items.iter().map(text_of).collect();
        let list = format!(
            r#"{{"apiVersion":"agentrt.dev/v1alpha1","kind":"AgentRunList","metadata":{{"resourceVersion":"9"}},"items":[{}]}}"#,
            item_texts.join(",")
        );
        let decoded: kube::core::ObjectList<WatchedRun> =
            serde_json::from_str(&list).expect("the list decodes whatever its items hold");
        prop_assert_eq!(decoded.items.len(), items.len());
        for (watched, text) in decoded.items.iter().zip(&item_texts) {
            let name = watched.metadata.name.clone().unwrap_or_default();
            if name == "valid" {
                prop_assert!(watched.undecodable.is_none());
                let fresh = watched.fresh.as_ref().expect("a new valid run is kept whole");
                let stored = fresh.stored().expect("and decodes");
                prop_assert_eq!(stored.snapshot.name, "valid");
            } else {
                assert_set_aside(&name, watched, text);
            }
        }
        // The same objects one by one, as watch events.
        for text in &item_texts {
            let line = format!(r#"{{"type":"ADDED","object":{text}}}"#);
            let event: kube::core::WatchEvent<WatchedRun> =
                serde_json::from_str(&line).expect("a watch event decodes whatever it holds");
            prop_assert!(matches!(event, kube::core::WatchEvent::Added(_)));
        }
    }
}

#[test]
fn a_run_nested_150_deep_does_not_fail_the_list_and_its_cause_is_short() {
    let deep = text_of(&run("deep", Bad::Deep(150).spec()));
    let valid = text_of(&run("valid", valid_spec()));
    let list = format!(r#"{{"metadata":{{}},"items":[{deep},{valid}]}}"#);
    // Before issue 34 this failed: "recursion limit exceeded".
    let decoded: kube::core::ObjectList<WatchedRun> =
        serde_json::from_str(&list).expect("the list decodes");
    let deep_run = &decoded.items[0];
    let cause = deep_run.undecodable.as_deref().expect("set aside");
    assert!(
        cause.starts_with("spec: recursion limit exceeded"),
        "{cause}"
    );
    assert!(decoded.items[1].fresh.is_some());
    let err = StoredRun::from_text(&deep).expect_err("the spec does not decode");
    let line = err.to_string();
    assert!(
        line.starts_with("AgentRun ns/deep: spec does not decode: recursion limit exceeded"),
        "{line}"
    );
    assert!(line.len() < 200, "{line}");
    // A run some controller wrote, with a deep status: the list still decodes.
    let mut written = run("written", valid_spec());
    written["metadata"]["managedFields"] = json!([
        {"manager": "agentrt", "operation": "Update", "subresource": "status"}]);
    written["status"] = json!({"phase": "Running", "observedGeneration": 1,
                               "extra": nested(200, json!(1))});
    let list = format!(r#"{{"metadata":{{}},"items":[{}]}}"#, text_of(&written));
    let decoded: kube::core::ObjectList<WatchedRun> =
        serde_json::from_str(&list).expect("the list decodes");
    assert!(decoded.items[0]
        .undecodable
        .as_deref()
        .is_some_and(|cause| cause.starts_with("status: recursion limit exceeded")));
}
