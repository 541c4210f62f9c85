//! Schema admission of the embedded API server: CEL rule features (messageExpression, fieldPath,
//! reason, escaping, map-list correlation, optionalOldSelf, runtime errors), the remaining OpenAPI
//! keywords, compile-time refusals, and a property test that admission never panics; and
//! (`crd_checks`) scenarios of CRDs whose rules kube-apiserver refuses at create/update, run on the
//! cluster under test.

#[path = "devcluster_schema_rules/crd_checks.rs"]
mod crd_checks;
mod support;

use agentrt::devcluster::schema::{AdmissionError, CompiledSchema, FieldValidation};
use proptest::prelude::*;
use serde_json::{json, Value};

fn schema(spec: Value) -> CompiledSchema {
    let root = json!({"type": "object", "properties": {"spec": spec}});
    CompiledSchema::compile(&root).expect("schema compiles")
}

fn object(spec: Value) -> Value {
    json!({"apiVersion": "t.dev/v1", "kind": "T", "metadata": {"name": "w1"}, "spec": spec})
}

fn admit(s: &CompiledSchema, spec: Value, old: Option<Value>) -> Result<Vec<String>, Vec<String>> {
    let mut obj = object(spec);
    let old = old.map(object);
    s.admit(&mut obj, old.as_ref(), FieldValidation::Strict)
        .map_err(|e| match e {
            AdmissionError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        })
}

fn spec_with_rule(rule: Value, properties: Value) -> Value {
    json!({"type": "object", "properties": properties, "x-kubernetes-validations": [rule]})
}

#[test]
fn message_expression_becomes_the_detail() {
    // (`'has ' + string(self.size())` would be refused for cost: the size of `string(int)` is
    // unknown to kube-apiserver's estimate.)
    let s = schema(json!({"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "string"},
        "x-kubernetes-validations": [{"rule": "self.size() <= 3", "message": "too many",
            "messageExpression": "string(self.size()) == '4' ? 'has 4 items, at most 3' : 'too many'"}]}}}));
    assert_eq!(
        admit(&s, json!({"items": ["a", "b", "c", "d"]}), None),
        Err(vec![
            "spec.items: Invalid value: \"array\": has 4 items, at most 3".to_string()
        ])
    );
}

/// The value bound to `self` is built from what a node's rules read (session 19): a field only
/// the messageExpression reads, one only a sibling rule reads, and `oldSelf` of a transition
/// rule beside them are all there when evaluated.
#[test]
fn every_field_a_node_s_rules_and_messages_read_is_bound() {
    let s = schema(json!({"type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "integer"},
            "big": {"type": "array", "items": {"type": "string"}}},
        "x-kubernetes-validations": [
            {"rule": "self.a < 3", "messageExpression": "'a too big beside ' + self.b"},
            {"rule": "!has(self.c) || self.c == 1", "message": "c must be 1"},
            {"rule": "!has(oldSelf.b) || self.b == oldSelf.b", "message": "b is immutable"}]}));
    let spec = json!({"a": 5, "b": "bee", "c": 2, "big": ["x", "y"]});
    assert_eq!(
        admit(&s, spec.clone(), None),
        Err(vec![
            "spec: Invalid value: \"object\": a too big beside bee".to_string(),
            "spec: Invalid value: \"object\": c must be 1".to_string(),
        ])
    );
    let old = json!({"a": 1, "b": "old", "c": 1});
    assert_eq!(
        admit(
            &s,
            json!({"a": 1, "b": "new", "c": 1, "big": ["x"]}),
            Some(old.clone())
        ),
        Err(vec![
            "spec: Invalid value: \"object\": b is immutable".to_string()
        ])
    );
    assert_eq!(
        admit(
            &s,
            json!({"a": 1, "b": "old", "c": 1, "big": ["x"]}),
            Some(old)
        ),
        Ok(vec![])
    );
}

#[test]
fn failing_message_expression_falls_back_to_the_message() {
    let s = schema(
        json!({"type": "object", "properties": {"n": {"type": "integer",
        "x-kubernetes-validations": [{"rule": "self < 3", "message": "n is too big",
            "messageExpression": "string(self / 0)"}]}}}),
    );
    assert_eq!(
        admit(&s, json!({"n": 5}), None),
        Err(vec![
            "spec.n: Invalid value: \"integer\": n is too big".to_string()
        ])
    );
}

#[test]
fn rule_without_message_reports_the_rule() {
    let s = schema(
        json!({"type": "object", "properties": {"n": {"type": "integer",
        "x-kubernetes-validations": [{"rule": " self < 3 "}]}}}),
    );
    assert_eq!(
        admit(&s, json!({"n": 5}), None),
        Err(vec![
            "spec.n: Invalid value: \"integer\": failed rule: self < 3".to_string()
        ])
    );
}

#[test]
fn field_path_and_reason_shape_the_error() {
    let props = json!({"x": {"type": "string"}, "y": {"type": "string"}, "z": {"type": "string"}});
    let s = schema(
        json!({"type": "object", "properties": props, "x-kubernetes-validations": [
            {"rule": "has(self.x) || !has(self.y)", "fieldPath": ".x", "reason": "FieldValueRequired", "message": "x is required with y"},
            {"rule": "!has(self.z)", "fieldPath": ".z", "reason": "FieldValueForbidden", "message": "z is not allowed"},
            {"rule": "!has(self.z)", "reason": "FieldValueDuplicate", "message": "not shown"},
        ]}),
    );
    assert_eq!(
        admit(&s, json!({"y": "1", "z": "2"}), None),
        Err(vec![
            "spec.x: Required value: x is required with y".to_string(),
            "spec.z: Forbidden: z is not allowed".to_string(),
            "spec: Duplicate value: \"object\"".to_string(),
        ])
    );
}

#[test]
fn rule_at_the_root_reports_a_nil_path_and_sees_the_name() {
    let root = json!({"type": "object", "properties": {"spec": {"type": "object"}},
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('x') && self.kind == 'T'"}]});
    let s = CompiledSchema::compile(&root).expect("compiles");
    assert_eq!(
        admit(&s, json!({}), None),
        Err(vec![
            "<nil>: Invalid value: \"object\": failed rule: self.metadata.name.startsWith('x') && self.kind == 'T'"
                .to_string()
        ])
    );
}

#[test]
fn rule_reading_an_absent_field_is_a_runtime_error() {
    let s = schema(spec_with_rule(
        json!({"rule": "self.x == 'a'"}),
        json!({"x": {"type": "string"}}),
    ));
    assert_eq!(
        admit(&s, json!({}), None),
        Err(vec![
            "spec: Invalid value: \"object\": no such key: x evaluating rule: self.x == 'a'"
                .to_string()
        ])
    );
}

#[test]
fn kubernetes_cel_functions_used_by_our_crds_evaluate() {
    let rules = [
        "self.name.startsWith('re') && self.name.endsWith('und') && self.name.contains('fu')",
        "self.name.matches('^[a-z]+$') && size(self.name) == 6 && self.name.size() == 6",
        "self.tags.all(t, t.size() > 0) && self.tags.exists(t, t == 'b') && self.tags.exists_one(t, t == 'a')",
        "self.tags.filter(t, t != 'a') == ['b'] && self.tags.map(t, t + '!') == ['a!', 'b!']",
        "int(self.ratio) == 2 && double(self.count) == 3.0 && self.ratio == 2.5",
        "(self.count > 2 ? 'big' : 'small') == 'big' && !(self.count < 0) || false",
        "self.name.lowerAscii() == 'refund' && self.tags.join(',') == 'a,b'",
    ];
    // Bounded, as kube-apiserver's cost estimate needs for rules iterating and joining them.
    let props = json!({"name": {"type": "string", "maxLength": 64},
        "tags": {"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 16}},
        "ratio": {"type": "number"}, "count": {"type": "integer"}});
    let spec = json!({"name": "refund", "tags": ["a", "b"], "ratio": 2.5, "count": 3});
    for rule in rules {
        let s = schema(spec_with_rule(json!({"rule": rule}), props.clone()));
        assert_eq!(admit(&s, spec.clone(), None), Ok(vec![]), "{rule}");
    }
    let s = schema(spec_with_rule(json!({"rule": rules[0]}), props));
    assert!(admit(
        &s,
        json!({"name": "other", "tags": [], "ratio": 1, "count": 0}),
        None
    )
    .is_err());
}

#[test]
fn number_field_stored_as_an_integer_is_a_double_in_rules() {
    let s = schema(spec_with_rule(
        json!({"rule": "self.amount * 2.0 == 500.0"}),
        json!({"amount": {"type": "number"}}),
    ));
    assert_eq!(admit(&s, json!({"amount": 250.0}), None), Ok(vec![]));
    assert_eq!(admit(&s, json!({"amount": 250}), None), Ok(vec![]));
}

#[test]
fn property_names_are_escaped_in_rules() {
    let s = schema(spec_with_rule(
        json!({"rule": "self.x__dash__y == 'v' && self.__namespace__ == 'n'"}),
        json!({"x-y": {"type": "string"}, "namespace": {"type": "string"}}),
    ));
    assert_eq!(
        admit(&s, json!({"x-y": "v", "namespace": "n"}), None),
        Ok(vec![])
    );
}

#[test]
fn int_or_string_accepts_both_and_refuses_others() {
    let s = schema(
        json!({"type": "object", "properties": {"port": {"x-kubernetes-int-or-string": true,
        "x-kubernetes-validations": [{"rule": "type(self) == string || self > 0"}]}}}),
    );
    assert_eq!(admit(&s, json!({"port": 80}), None), Ok(vec![]));
    assert_eq!(admit(&s, json!({"port": "http"}), None), Ok(vec![]));
    assert_eq!(
        admit(&s, json!({"port": true}), None),
        Err(vec![
            "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"".to_string(),
            "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".to_string(),
        ])
    );
    assert_eq!(
        admit(&s, json!({"port": -1}), None),
        Err(vec![
            "spec.port: Invalid value: \"\": failed rule: type(self) == string || self > 0"
                .to_string()
        ])
    );
}

#[test]
fn map_list_items_are_compared_with_the_old_item_of_the_same_key() {
    let s = schema(
        json!({"type": "object", "properties": {"entries": {"type": "array", "maxItems": 10,
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "string", "maxLength": 64}},
            "x-kubernetes-validations": [{"rule": "self.value == oldSelf.value", "message": "value is immutable"}]}}}}),
    );
    let old = json!({"entries": [{"name": "a", "value": "1"}, {"name": "b", "value": "2"}]});
    // Reordered, one new item: accepted.
    let new = json!({"entries": [{"name": "b", "value": "2"}, {"name": "c", "value": "3"}, {"name": "a", "value": "1"}]});
    assert_eq!(admit(&s, new, Some(old.clone())), Ok(vec![]));
    let new = json!({"entries": [{"name": "b", "value": "changed"}, {"name": "a", "value": "1"}]});
    assert_eq!(
        admit(&s, new, Some(old)),
        Err(vec![
            "spec.entries[0]: Invalid value: \"object\": value is immutable".to_string()
        ])
    );
}

#[test]
fn rule_reading_old_self_only_inside_has_is_a_transition_rule() {
    let s = schema(spec_with_rule(
        json!({"rule": "!has(oldSelf.x) || has(self.x)", "message": "x may not be removed"}),
        json!({"x": {"type": "string"}}),
    ));
    assert_eq!(admit(&s, json!({}), None), Ok(vec![]), "skipped on create");
    assert_eq!(
        admit(&s, json!({}), Some(json!({"x": "a"}))),
        Err(vec![
            "spec: Invalid value: \"object\": x may not be removed".to_string()
        ])
    );
}

#[test]
fn transition_rule_erroring_at_runtime_names_the_rule_by_its_message() {
    let s = schema(spec_with_rule(
        json!({"rule": "!has(oldSelf.d) || self.d == oldSelf.d", "message": "d is write-once"}),
        json!({"d": {"type": "string"}}),
    ));
    assert_eq!(
        admit(&s, json!({}), Some(json!({"d": "a"}))),
        Err(vec![
            "spec: Invalid value: \"object\": no such key: d evaluating rule: d is write-once"
                .to_string()
        ])
    );
}

#[test]
fn optional_old_self_runs_the_rule_on_create() {
    let s = schema(
        json!({"type": "object", "properties": {"phase": {"type": "string",
        "x-kubernetes-validations": [{"rule": "oldSelf.hasValue() || self == 'New'", "optionalOldSelf": true,
            "message": "must start New"}]}}}),
    );
    assert_eq!(
        admit(&s, json!({"phase": "Done"}), None),
        Err(vec![
            "spec.phase: Invalid value: \"string\": must start New".to_string()
        ])
    );
    assert_eq!(admit(&s, json!({"phase": "New"}), None), Ok(vec![]));
    assert_eq!(
        admit(&s, json!({"phase": "Done"}), Some(json!({"phase": "New"}))),
        Ok(vec![])
    );
}

#[test]
fn rules_see_a_preserved_object_whole_but_not_its_fields() {
    // kube-apiserver types a `type: object` with x-kubernetes-preserve-unknown-fields as an
    // object with no fields: it can be compared whole, its unknown fields cannot be named.
    let s = schema(
        json!({"type": "object", "properties": {"args": {"type": "object",
        "x-kubernetes-preserve-unknown-fields": true}},
        "x-kubernetes-validations": [{"rule": "self.args == oldSelf.args", "message": "args are immutable"}]}),
    );
    let args = json!({"args": {"amount": 50, "note": {"x": [1]}}});
    assert_eq!(admit(&s, args.clone(), Some(args.clone())), Ok(vec![]));
    assert_eq!(
        admit(&s, json!({"args": {"amount": 51}}), Some(args)),
        Err(vec![
            "spec: Invalid value: \"object\": args are immutable".to_string()
        ])
    );
    let err = CompiledSchema::compile(
        &json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"args": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-validations": [{"rule": "self.amount <= 100"}]}}}}}),
    )
    .expect_err("unknown field refused");
    assert!(
        err.contains("compilation failed: ERROR: <input>:1:5: undefined field 'amount'"),
        "{err}"
    );
}

#[test]
fn unchanged_value_failing_a_rule_only_warns_on_update() {
    let s = schema(
        json!({"type": "object", "properties": {"n": {"type": "integer",
        "x-kubernetes-validations": [{"rule": "self < 3", "message": "n is too big"}]},
        "other": {"type": "string"}}}),
    );
    let old = json!({"n": 5, "other": "a"});
    assert_eq!(
        admit(&s, json!({"n": 5, "other": "b"}), Some(old.clone())),
        Ok(vec![
            "spec.n: Invalid value: \"integer\": n is too big".to_string()
        ])
    );
    assert_eq!(
        admit(&s, json!({"n": 6, "other": "a"}), Some(old)),
        Err(vec![
            "spec.n: Invalid value: \"integer\": n is too big".to_string()
        ])
    );
}

#[test]
fn nullable_field_accepts_null_and_its_rules_skip_it() {
    let s = schema(
        json!({"type": "object", "properties": {"note": {"type": "string", "nullable": true,
        "x-kubernetes-validations": [{"rule": "self.size() > 2"}]}}}),
    );
    let mut obj = object(json!({"note": null}));
    s.admit(&mut obj, None, FieldValidation::Strict)
        .expect("admitted");
    assert_eq!(obj["spec"]["note"], Value::Null);
}

#[test]
fn embedded_resource_keeps_its_meta_and_requires_kind() {
    let s = schema(
        json!({"type": "object", "properties": {"template": {"type": "object",
        "x-kubernetes-embedded-resource": true, "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}}}}),
    );
    let mut obj = object(
        json!({"template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": "1"}}}),
    );
    s.admit(&mut obj, None, FieldValidation::Strict)
        .expect("admitted");
    assert_eq!(obj["spec"]["template"]["metadata"], json!({"name": "p"}));
    assert_eq!(
        admit(&s, json!({"template": {"apiVersion": "v1"}}), None),
        Err(vec!["spec.template.kind: Required value".to_string()])
    );
}

#[test]
fn malformed_date_time_is_a_type_error() {
    let s = schema(
        json!({"type": "object", "properties": {"at": {"type": "string", "format": "date-time"}}}),
    );
    assert_eq!(
        admit(&s, json!({"at": "2024-05-01T10:00:00Z"}), None),
        Ok(vec![])
    );
    assert_eq!(
        admit(&s, json!({"at": "yesterday"}), None),
        Err(vec!["spec.at: Invalid value: \"yesterday\": spec.at in body must be of type date-time: \"yesterday\"".to_string()])
    );
}

#[test]
fn map_values_are_validated_with_a_dotted_path() {
    let s = schema(
        json!({"type": "object", "properties": {"labels": {"type": "object",
        "maxProperties": 2, "additionalProperties": {"type": "string"}}}}),
    );
    assert_eq!(
        admit(&s, json!({"labels": {"a": 1}}), None),
        Err(vec!["spec.labels.a: Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\"".to_string()])
    );
    assert_eq!(
        admit(&s, json!({"labels": {"a": "1", "b": "2", "c": "3"}}), None),
        Err(vec![
            "spec.labels: Too many: 3: must have at most 2 items".to_string()
        ])
    );
}

#[test]
fn value_matching_no_any_of_branch_is_invalid() {
    let s = schema(
        json!({"type": "object", "properties": {"n": {"type": "integer",
        "anyOf": [{"minimum": 10}, {"maximum": 0}]}}}),
    );
    assert_eq!(admit(&s, json!({"n": 12}), None), Ok(vec![]));
    assert_eq!(
        admit(&s, json!({"n": 5}), None),
        Err(vec![
            "<nil>: Invalid value: \"\": \"spec.n\" must validate at least one schema (anyOf)"
                .to_string(),
            "spec.n: Invalid value: 5: spec.n in body should be greater than or equal to 10"
                .to_string(),
        ])
    );
}

#[test]
fn schema_that_a_crd_could_not_declare_is_refused() {
    let bad_rule = json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.x ==", "message": "m"}]});
    let err = CompiledSchema::compile(&bad_rule).expect_err("syntax error refused");
    assert!(err.starts_with("openAPIV3Schema.x-kubernetes-validations[0].rule: Invalid value: {\"Rule\":\"self.x ==\",\"Message\":\"m\",\"MessageExpression\":\"\",\"Reason\":null,\"FieldPath\":\"\",\"OptionalOldSelf\":null}: compilation failed: ERROR: <input>:1:"), "{err}");

    let multi_line =
        json!({"type": "object", "x-kubernetes-validations": [{"rule": "true &&\n true"}]});
    assert_eq!(
        CompiledSchema::compile(&multi_line).expect_err("multi-line rule needs a message"),
        "openAPIV3Schema.x-kubernetes-validations[0].message: Required value: message must be specified if rule contains line breaks"
    );

    let uncorrelatable = json!({"type": "object", "properties": {"l": {"type": "array",
        "items": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf"}]}}}});
    let err = CompiledSchema::compile(&uncorrelatable).expect_err("oldSelf under a list refused");
    assert!(
        err.contains("oldSelf cannot be used on the uncorrelatable portion of the schema"),
        "{err}"
    );

    let bad_path = json!({"type": "object", "properties": {"a": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "true", "fieldPath": ".b"}]});
    let err = CompiledSchema::compile(&bad_path).expect_err("unknown fieldPath refused");
    assert!(err.contains("does not refer to a valid field"), "{err}");

    assert!(CompiledSchema::compile(&json!({"type": "string"})).is_err());
    assert!(CompiledSchema::compile(
        &json!({"type": "object", "properties": {"a": {"type": "text"}}})
    )
    .is_err());
    assert!(CompiledSchema::compile(
        &json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}})
    )
    .is_err());
}

#[test]
fn compiled_schema_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CompiledSchema>();
}

fn widget_schema() -> CompiledSchema {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/schema/widgets-crd.yaml"
    );
    let text = std::fs::read_to_string(path).expect("fixture readable");
    let crd: Value = serde_yaml::from_str(&text).expect("fixture is YAML");
    CompiledSchema::compile(&crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        .expect("compiles")
}

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z]{0,6}".prop_map(Value::String),
        Just(json!("Fast")),
        Just(json!(1)),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    "[a-z]{1,6}",
                    Just("goal".to_string()),
                    Just("a".to_string()),
                    Just("tools".to_string()),
                    Just("name".to_string()),
                    Just("cancel".to_string()),
                    Just("decision".to_string()),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn admit_never_panics_on_arbitrary_json(spec in arbitrary_json(), old_spec in arbitrary_json(), status in arbitrary_json()) {
        let s = widget_schema();
        for mode in [FieldValidation::Strict, FieldValidation::Warn, FieldValidation::Ignore] {
            let mut obj = object(spec.clone());
            obj["status"] = status.clone();
            let old = object(old_spec.clone());
            let _ = s.admit(&mut obj.clone(), None, mode);
            let _ = s.admit(&mut obj, Some(&old), mode);
        }
        let mut bare = spec.clone();
        let _ = s.admit(&mut bare, Some(&old_spec), FieldValidation::Warn);
    }
}

#[test]
fn rules_over_the_schema_budget_together_are_forbidden_at_the_root() {
    use agentrt::devcluster::schema::{FieldErrorKind, SchemaError};
    // 14 rules of 7,864,375 each (25 strings lowercased): each within its budget, together 1.1x
    // the schema's (kube-apiserver v1.34 gives the same factor).
    let item = json!({"type": "array", "maxItems": 25, "items": {"type": "string",
        "x-kubernetes-validations": [{"rule": "self.lowerAscii() == 'a'"}]}});
    let props: serde_json::Map<String, Value> = "abcdefghijklmn"
        .chars()
        .map(|c| (c.to_string(), item.clone()))
        .collect();
    let root =
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": props}}});
    let Err(SchemaError::Rules(errors)) = CompiledSchema::check(&root) else {
        panic!("refused for cost");
    };
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(errors.iter().all(|e| e.kind == FieldErrorKind::Forbidden));
    assert_eq!(
        errors[0].to_string(),
        "openAPIV3Schema.properties[spec].properties[a].items.x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema"
    );
    assert_eq!(
        errors[4].to_string(),
        "openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of 1.101012x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    );
}

#[test]
fn refused_rules_are_printed_as_kube_apiserver_prints_its_validation_rule() {
    let root = json!({"type": "object", "properties": {"b": {"type": "string"}},
        "x-kubernetes-validations": [
        {"rule": "self.a < 1 && \"q\" == 'q'", "message": "m<&>", "reason": "FieldValueForbidden",
         "fieldPath": ".b", "optionalOldSelf": false}]});
    let err = CompiledSchema::compile(&root).expect_err("undefined field");
    assert_eq!(
        err,
        "openAPIV3Schema.x-kubernetes-validations[0].rule: Invalid value: {\"Rule\":\"self.a \\u003c 1 \\u0026\\u0026 \\\"q\\\" == 'q'\",\"Message\":\"m\\u003c\\u0026\\u003e\",\"MessageExpression\":\"\",\"Reason\":\"FieldValueForbidden\",\"FieldPath\":\".b\",\"OptionalOldSelf\":false}: compilation failed: ERROR: <input>:1:5: undefined field 'a'\n | self.a < 1 && \"q\" == 'q'\n | ....^\n\
openAPIV3Schema.x-kubernetes-validations[0].optionalOldSelf: Invalid value: false: may not be set if oldSelf is not used in rule"
    );
}
