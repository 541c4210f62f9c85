//! Structural schema admission of the embedded API server, through its public interface only:
//! each test is one kube-apiserver 1.32 behaviour, asserted with its exact message and path.

use agentrt::devcluster::schema::{
    invalid_status, AdmissionError, CompiledSchema, FieldError, FieldErrorKind, FieldValidation,
};
use serde_json::{json, Value};

fn widget_schema() -> CompiledSchema {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/schema/widgets-crd.yaml"
    );
    let text = std::fs::read_to_string(path).expect("fixture readable");
    let crd: Value = serde_yaml::from_str(&text).expect("fixture is YAML");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    CompiledSchema::compile(schema).expect("fixture schema compiles")
}

fn widget(spec: Value) -> Value {
    json!({
        "apiVersion": "test.agentrt.dev/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "default", "labels": {"app": "x"}},
        "spec": spec,
    })
}

/// Admits a create with strict field validation, returning the stored object.
fn create(object: Value) -> Result<Value, AdmissionError> {
    let mut object = object;
    widget_schema().admit(&mut object, None, FieldValidation::Strict)?;
    Ok(object)
}

/// Admits an update of `old` (as created) to `new`.
fn update(old: &Value, new: Value) -> Result<(Value, Vec<String>), AdmissionError> {
    let mut new = new;
    let warnings = widget_schema().admit(&mut new, Some(old), FieldValidation::Strict)?;
    Ok((new, warnings))
}

fn invalid(result: Result<Value, AdmissionError>) -> Vec<String> {
    match result {
        Err(AdmissionError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect(),
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

fn invalid_update(result: Result<(Value, Vec<String>), AdmissionError>) -> Vec<String> {
    invalid(result.map(|(v, _)| v))
}

const RULES_NOT_CHECKED: &str = "<nil>: Invalid value: null: some validation rules were not \
                                 checked because the object was invalid; correct the existing \
                                 errors to complete validation";

#[test]
fn unknown_field_is_refused_under_strict_field_validation() {
    let err = create(widget(
        json!({"goal": "g", "a": "x", "foo": 1, "tools": [{"name": "t", "bogus": true}]}),
    ))
    .expect_err("unknown fields refused");
    assert_eq!(
        err,
        AdmissionError::StrictDecoding(vec![
            "unknown field \"spec.foo\"".to_string(),
            "unknown field \"spec.tools[0].bogus\"".to_string(),
        ])
    );
    assert_eq!(
        err.to_string(),
        "strict decoding error: unknown field \"spec.foo\", unknown field \"spec.tools[0].bogus\""
    );
}

#[test]
fn unknown_field_is_pruned_with_a_warning_under_warn() {
    let mut object = widget(json!({"goal": "g", "a": "x", "foo": 1}));
    object["extra"] = json!("top-level");
    let warnings = widget_schema()
        .admit(&mut object, None, FieldValidation::Warn)
        .expect("admitted");
    assert_eq!(
        warnings,
        vec!["unknown field \"extra\"", "unknown field \"spec.foo\""]
    );
    assert!(object["spec"].get("foo").is_none());
    assert!(object.get("extra").is_none());
}

#[test]
fn unknown_field_is_pruned_silently_under_ignore() {
    let mut object = widget(json!({"goal": "g", "a": "x", "foo": 1}));
    let warnings = widget_schema()
        .admit(&mut object, None, FieldValidation::Ignore)
        .expect("admitted");
    assert!(warnings.is_empty());
    assert!(object["spec"].get("foo").is_none());
}

#[test]
fn top_level_type_and_object_meta_are_kept_as_they_are() {
    let mut object = widget(json!({"goal": "g", "a": "x"}));
    object["metadata"]["annotations"] = json!({"k": "v"});
    object["metadata"]["somethingNew"] = json!(true);
    let stored = create(object.clone()).expect("admitted");
    assert_eq!(stored["apiVersion"], object["apiVersion"]);
    assert_eq!(stored["kind"], object["kind"]);
    assert_eq!(stored["metadata"], object["metadata"]);
}

#[test]
fn preserve_unknown_fields_keeps_arbitrary_json() {
    let raw = json!({"deep": {"list": [1, "two", {"three": null}], "flag": true}, "n": 1.5});
    let stored = create(widget(json!({
        "goal": "g", "a": "x", "raw": raw,
        "tools": [{"name": "t", "args": {"order": 1042, "nested": {"any": ["thing"]}}}],
    })))
    .expect("admitted");
    assert_eq!(stored["spec"]["raw"], raw);
    assert_eq!(
        stored["spec"]["tools"][0]["args"],
        json!({"order": 1042, "nested": {"any": ["thing"]}})
    );
}

#[test]
fn defaults_are_applied_nested_and_in_list_items() {
    let stored = create(widget(json!({"goal": "g", "a": "x", "tools": [{"name": "t"}, {"name": "u", "timeoutSeconds": 5}]})))
        .expect("admitted");
    let spec = &stored["spec"];
    assert_eq!(spec["mode"], json!("Fast"));
    assert_eq!(spec["replicas"], json!(1));
    assert_eq!(spec["cancel"], json!(false));
    assert_eq!(spec["logging"], json!({"level": "info"}));
    assert_eq!(spec["tools"][0]["timeoutSeconds"], json!(30));
    assert_eq!(spec["tools"][1]["timeoutSeconds"], json!(5));
}

#[test]
fn null_of_a_non_nullable_field_takes_its_default_or_is_dropped() {
    let stored = create(widget(
        json!({"goal": "g", "a": "x", "mode": null, "ratio": null}),
    ))
    .expect("admitted");
    assert_eq!(stored["spec"]["mode"], json!("Fast"));
    assert!(stored["spec"].get("ratio").is_none());
}

#[test]
fn missing_required_field_is_refused_and_rules_are_not_run() {
    let errors = invalid(create(widget(json!({"a": "x"}))));
    assert_eq!(errors, vec!["spec.goal: Required value", RULES_NOT_CHECKED]);
}

#[test]
fn value_outside_an_enum_is_unsupported() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "mode": "Medium"}),
    )));
    assert_eq!(
        errors,
        vec![
            "spec.mode: Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\"",
            RULES_NOT_CHECKED,
        ]
    );
}

#[test]
fn value_below_the_minimum_is_invalid() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "replicas": 0}),
    )));
    assert_eq!(
        errors,
        vec!["spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"]
    );
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "replicas": 11}),
    )));
    assert_eq!(
        errors,
        vec!["spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10"]
    );
}

#[test]
fn string_not_matching_the_pattern_is_invalid() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "code": "ABC"}),
    )));
    assert_eq!(
        errors,
        vec!["spec.code: Invalid value: \"ABC\": spec.code in body should match '^[a-z]+$'"]
    );
}

#[test]
fn string_longer_than_max_length_is_too_long() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "code": "abcdefghij"}),
    )));
    assert_eq!(
        errors,
        vec![
            "spec.code: Too long: may not be more than 8 bytes",
            RULES_NOT_CHECKED
        ]
    );
}

#[test]
fn empty_string_below_min_length_is_invalid() {
    let errors = invalid(create(widget(json!({"goal": "", "a": "x"}))));
    assert_eq!(
        errors,
        vec!["spec.goal: Invalid value: \"\": spec.goal in body should be at least 1 chars long"]
    );
}

#[test]
fn list_longer_than_max_items_is_too_many() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "tags": ["a", "b", "c", "d"]}),
    )));
    assert_eq!(
        errors,
        vec![
            "spec.tags: Too many: 4: must have at most 3 items",
            RULES_NOT_CHECKED
        ]
    );
}

#[test]
fn duplicate_key_in_a_map_list_is_a_duplicate_value() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "tools": [{"name": "a"}, {"name": "a"}]}),
    )));
    assert_eq!(
        errors,
        vec!["spec.tools[1]: Duplicate value: {\"name\":\"a\"}"]
    );
}

#[test]
fn duplicate_item_in_a_set_list_is_a_duplicate_value() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "tags": ["x", "y", "x"]}),
    )));
    assert_eq!(errors, vec!["spec.tags[2]: Duplicate value: \"x\""]);
}

#[test]
fn fraction_for_an_integer_field_is_a_type_error() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "replicas": 1.5}),
    )));
    assert_eq!(
        errors,
        vec![
            "spec.replicas: Invalid value: \"number\": spec.replicas in body must be of type integer: \"number\"",
            RULES_NOT_CHECKED,
        ]
    );
}

#[test]
fn string_for_a_boolean_field_is_a_type_error() {
    let errors = invalid(create(widget(
        json!({"goal": "g", "a": "x", "cancel": "yes"}),
    )));
    assert_eq!(
        errors[0],
        "spec.cancel: Invalid value: \"string\": spec.cancel in body must be of type boolean: \"string\""
    );
}

#[test]
fn integer_for_a_number_field_is_accepted() {
    let stored = create(widget(json!({"goal": "g", "a": "x", "ratio": 2}))).expect("admitted");
    assert_eq!(stored["spec"]["ratio"], json!(2));
}

#[test]
fn numbers_are_normalized_as_kube_apiserver_stores_them() {
    let text = r#"{"apiVersion":"test.agentrt.dev/v1","kind":"Widget","metadata":{"name":"w1"},
        "spec":{"goal":"g","a":"x","ratio":250.0,"replicas":1e0,
        "raw":{"thousand":1e3,"big":12345678901234567890,"half":0.5}}}"#;
    let stored = create(serde_json::from_str(text).expect("json")).expect("admitted");
    let spec = &stored["spec"];
    assert_eq!(spec["ratio"].to_string(), "250");
    assert_eq!(spec["replicas"].to_string(), "1");
    assert_eq!(spec["raw"]["thousand"].to_string(), "1000");
    assert!(spec["raw"]["big"].is_f64(), "beyond int64 is a float64");
    assert_eq!(
        spec["raw"]["big"].as_f64(),
        Some(12_345_678_901_234_567_890.0)
    );
    assert_eq!(spec["raw"]["half"].to_string(), "0.5");
}

#[test]
fn failing_rule_reports_its_message_at_its_node() {
    let errors = invalid(create(widget(json!({"goal": "g", "a": "x", "b": "y"}))));
    assert_eq!(
        errors,
        vec!["spec: Invalid value: \"object\": exactly one of a or b must be set"]
    );
    let errors = invalid(create(widget(json!({"goal": "g"}))));
    assert_eq!(
        errors,
        vec!["spec: Invalid value: \"object\": exactly one of a or b must be set"]
    );
}

#[test]
fn immutable_field_may_not_change_on_update() {
    let old = create(widget(json!({"goal": "g", "a": "x"}))).expect("created");
    let errors = invalid_update(update(&old, widget(json!({"goal": "other", "a": "x"}))));
    assert_eq!(
        errors,
        vec!["spec.goal: Invalid value: \"string\": goal is immutable"]
    );
    update(&old, widget(json!({"goal": "g", "a": "x", "replicas": 3})))
        .expect("other fields may change");
}

#[test]
fn transition_rule_is_skipped_on_create() {
    // `self == oldSelf` and `self || !oldSelf` have no old value to compare with on create.
    let stored = create(widget(json!({"goal": "g", "a": "x", "cancel": true}))).expect("admitted");
    assert_eq!(stored["spec"]["cancel"], json!(true));
}

#[test]
fn write_once_field_may_be_set_but_not_changed() {
    let old = create(widget(json!({"goal": "g", "a": "x"}))).expect("created");
    let decided =
        widget(json!({"goal": "g", "a": "x", "decision": {"verdict": "Approved", "hash": "h1"}}));
    let (stored, _) = update(&old, decided).expect("the first decision is accepted");
    let errors = invalid_update(update(
        &stored,
        widget(json!({"goal": "g", "a": "x", "decision": {"verdict": "Rejected", "hash": "h1"}})),
    ));
    assert_eq!(
        errors,
        vec!["spec: Invalid value: \"object\": decision is write-once"]
    );
    update(&stored, stored.clone()).expect("an unchanged decision is accepted");
}

#[test]
fn flag_may_only_go_from_false_to_true() {
    let off = create(widget(json!({"goal": "g", "a": "x"}))).expect("created");
    let (on, _) = update(&off, widget(json!({"goal": "g", "a": "x", "cancel": true})))
        .expect("false to true");
    let errors = invalid_update(update(
        &on,
        widget(json!({"goal": "g", "a": "x", "cancel": false})),
    ));
    assert_eq!(
        errors,
        vec!["spec.cancel: Invalid value: \"boolean\": cancel may only go from false to true"]
    );
}

#[test]
fn status_write_checks_transition_rules_on_both_halves() {
    let mut old = create(widget(json!({"goal": "g", "a": "x"}))).expect("created");
    old["status"] = json!({"phase": "Done", "finished": true});
    let mut new = old.clone();
    new["status"]["finished"] = json!(false);
    new["spec"]["goal"] = json!("changed");
    let errors = invalid_update(update(&old, new));
    assert_eq!(
        errors,
        vec![
            "spec.goal: Invalid value: \"string\": goal is immutable",
            "status.finished: Invalid value: \"boolean\": a finished widget stays finished",
        ]
    );
}

#[test]
fn rule_on_list_items_reports_the_item_path() {
    let mut object = widget(json!({"goal": "g", "a": "x"}));
    object["status"] = json!({"steps": [{"index": 0}, {"index": -1}]});
    let errors = invalid(create(object));
    assert_eq!(
        errors,
        vec!["status.steps[1]: Invalid value: \"object\": index must not be negative"]
    );
}

#[test]
fn unchanged_invalid_value_is_ratcheted_on_update() {
    // Stored before the schema said replicas <= 10: an update that leaves it alone is accepted.
    let mut old = create(widget(json!({"goal": "g", "a": "x"}))).expect("created");
    old["spec"]["replicas"] = json!(50);
    let mut new = old.clone();
    new["spec"]["labels"] = json!({"team": "a"});
    update(&old, new.clone()).expect("unchanged replicas are not validated again");
    new["spec"]["replicas"] = json!(60);
    let errors = invalid_update(update(&old, new));
    assert_eq!(
        errors,
        vec!["spec.replicas: Invalid value: 60: spec.replicas in body should be less than or equal to 10"]
    );
}

#[test]
fn invalid_status_formats_one_error() {
    let errors = vec![FieldError {
        kind: FieldErrorKind::Required,
        field: "spec.goal".to_string(),
        bad_value: None,
        detail: String::new(),
    }];
    assert_eq!(
        invalid_status("AgentRun", "agentrt.dev", "x", &errors),
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "AgentRun.agentrt.dev \"x\" is invalid: spec.goal: Required value",
            "reason": "Invalid",
            "details": {
                "name": "x",
                "group": "agentrt.dev",
                "kind": "AgentRun",
                "causes": [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.goal"}],
            },
            "code": 422,
        })
    );
}

#[test]
fn invalid_status_formats_several_errors_as_a_list() {
    let Err(AdmissionError::Invalid(errors)) = create(widget(json!({"a": "x", "mode": "Medium"})))
    else {
        panic!("expected 422");
    };
    let status = invalid_status("Widget", "test.agentrt.dev", "w1", &errors);
    assert_eq!(
        status["message"],
        json!(format!(
            "Widget.test.agentrt.dev \"w1\" is invalid: [spec.mode: Unsupported value: \"Medium\": \
             supported values: \"Fast\", \"Slow\", spec.goal: Required value, {RULES_NOT_CHECKED}]"
        ))
    );
    assert_eq!(
        status["details"]["causes"],
        json!([
            {"reason": "FieldValueNotSupported", "message": "Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\"", "field": "spec.mode"},
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.goal"},
            {"reason": "FieldValueInvalid", "message": "Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation", "field": "<nil>"},
        ])
    );
}
