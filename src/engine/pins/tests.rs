//! The pin rules, one test per rule (docs/design.md section 6; docs/behaviours.md 60, 61, 64),
//! and the property that a changed definition never compares equal to its pin.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::api::{McpServer, ToolSetOverride};

const SERVER: &str = "http://127.0.0.1:8089/mcp";

fn listed(entries: Value) -> Vec<ToolDefinition> {
    definitions(SERVER, entries.as_array().unwrap()).unwrap()
}

fn shop() -> Vec<ToolDefinition> {
    listed(json!([
        {"name": "lookup_order", "description": "Read an order.",
         "inputSchema": {"type": "object", "properties": {"order": {"type": "integer"}}},
         "annotations": {"readOnlyHint": true}},
        {"name": "issue_refund", "title": "Refund", "description": "Refund an order.",
         "inputSchema": {"type": "object", "required": ["order", "amount"]},
         "outputSchema": {"type": "object"}},
        {"name": "delete.everything", "inputSchema": {"type": "object"}}
    ]))
}

fn set(include: &[&str], overrides: Vec<ToolSetOverride>) -> ToolSet {
    ToolSet {
        name: "shop".into(),
        mcp: McpServer {
            url: SERVER.into(),
            headers: vec![],
            oauth: None,
        },
        include: include.iter().map(|s| s.to_string()).collect(),
        side_effect: SideEffect::RemoteMutation,
        overrides,
    }
}

fn mcp_tool(name: &str, server_tool: Option<&str>) -> ToolSpec {
    ToolSpec {
        job: None,
        name: name.into(),
        description: String::new(),
        input_schema: Value::Null,
        side_effect: SideEffect::ReadOnly,
        timeout_seconds: 30,
        terminal: false,
        http: None,
        mcp: Some(Box::new(McpTool {
            url: SERVER.into(),
            tool: server_tool.map(str::to_string),
            headers: vec![],
            on_cancel: None,
            oauth: None,
        })),
    }
}

#[test]
fn a_pin_hashes_the_definition_whatever_its_member_order_or_number_spelling() {
    let a = listed(
        json!([{"name": "t", "inputSchema": {"type": "object", "maximum": 1.0, "minimum": 0}}]),
    );
    let b = listed(
        json!([{"inputSchema": {"minimum": 0, "type": "object", "maximum": 1}, "name": "t"}]),
    );
    let pa = pin("t", SERVER, a[0].clone()).unwrap();
    assert_eq!(pa.sha256, definition_sha256(&b[0]).unwrap());
    assert!(pa.sha256.starts_with("sha256:") && pa.sha256.len() == 71);
    assert_eq!(check(&pa, &b).unwrap(), PinCheck::Unchanged);
}

#[test]
fn a_definition_that_changed_does_not_match_its_pin_and_one_gone_is_gone() {
    let pinned = pin("lookup_order", SERVER, shop()[0].clone()).unwrap();
    let mut now = shop();
    now[0].description = Some("Read an order, and cancel it.".into());
    match check(&pinned, &now).unwrap() {
        PinCheck::Changed { pinned: p, current } => {
            assert_eq!(p, pinned.sha256);
            assert_ne!(current, pinned.sha256);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(check(&pinned, &shop()[1..]).unwrap(), PinCheck::Gone);
}

#[test]
fn only_name_title_description_schemas_annotations_and_execution_are_pinned() {
    let with = shop()[1].clone();
    let without = listed(json!([{"name": "issue_refund", "title": "Refund",
        "description": "Refund an order.", "inputSchema": {"type": "object", "required": ["order", "amount"]},
        "outputSchema": {"type": "object"}, "icons": [{"src": "https://x/icon.png"}], "_meta": {"x": 1}}]));
    assert_eq!(
        definition_sha256(&with).unwrap(),
        definition_sha256(&without[0]).unwrap()
    );
    // outputSchema and execution are pinned (2025-06-18 and 2025-11-25 define a tool by them).
    let output = listed(json!([{"name": "issue_refund", "title": "Refund",
        "description": "Refund an order.", "inputSchema": {"type": "object", "required": ["order", "amount"]},
        "outputSchema": {"type": "object"}, "execution": {"taskSupport": "optional"}}]));
    assert_eq!(output[0].output_schema, Some(json!({"type": "object"})));
    assert_eq!(
        output[0].execution,
        Some(json!({"taskSupport": "optional"}))
    );
    assert_ne!(
        definition_sha256(&with).unwrap(),
        definition_sha256(&output[0]).unwrap()
    );
    let extra_hint = listed(json!([{"name": "t", "inputSchema": {"type": "object"},
        "annotations": {"vendorHint": "x"}}]));
    let plain =
        listed(json!([{"name": "t", "inputSchema": {"type": "object"}, "annotations": {}}]));
    assert_ne!(
        definition_sha256(&extra_hint[0]).unwrap(),
        definition_sha256(&plain[0]).unwrap(),
        "an unknown annotation is part of the pin"
    );
}

#[test]
fn a_listing_entry_that_is_no_definition_is_refused_naming_it() {
    for (entry, words) in [
        (json!("lookup"), "not a JSON object"),
        (json!({"inputSchema": {}}), "name is not a string"),
        (json!({"name": "t"}), "t: inputSchema is not a JSON object"),
        (
            json!({"name": "t", "inputSchema": {}, "title": 3}),
            "t: title is not a string",
        ),
        (
            json!({"name": "t", "inputSchema": {}, "annotations": {"readOnlyHint": "yes"}}),
            "t: annotations",
        ),
    ] {
        let err =
            definitions(SERVER, &[json!({"name": "ok", "inputSchema": {}}), entry]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("{SERVER}: tools/list entry 1")) && text.contains(words),
            "{text}"
        );
    }
}

#[test]
fn an_mcp_tool_pins_the_server_tool_it_names_or_its_own_name() {
    let own = pin_tool(
        0,
        &mcp_tool("lookup_order", None),
        &McpTool {
            url: SERVER.into(),
            tool: None,
            headers: vec![],
            on_cancel: None,
            oauth: None,
        },
        &shop(),
    )
    .unwrap();
    assert_eq!(
        (
            own.tool.as_str(),
            own.server_tool.as_str(),
            own.server.as_str()
        ),
        ("lookup_order", "lookup_order", SERVER)
    );
    let spec = mcp_tool("read", Some("lookup_order"));
    let named = pin_tool(1, &spec, spec.mcp.as_deref().unwrap(), &shop()).unwrap();
    assert_eq!(
        (named.tool.as_str(), named.server_tool.as_str()),
        ("read", "lookup_order")
    );
    assert_eq!(named.sha256, own.sha256);
    let spec = mcp_tool("refund_all", None);
    let err = pin_tool(2, &spec, spec.mcp.as_deref().unwrap(), &shop()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("spec.tools[2] (refund_all): the server {SERVER} lists no tool \"refund_all\"; set mcp.tool to one of its tools")
    );
}

#[test]
fn a_toolset_brings_in_the_included_tools_as_set_double_underscore_tool() {
    let override_ = ToolSetOverride {
        tool: "lookup_order".into(),
        side_effect: Some(SideEffect::ReadOnly),
        timeout_seconds: Some(5),
        terminal: None,
    };
    let tools = expand_tool_set(
        0,
        &set(&["lookup_*", "issue_?efund"], vec![override_]),
        &shop(),
    )
    .unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
    assert_eq!(names, ["shop__lookup_order", "shop__issue_refund"]);
    let (lookup, refund) = (&tools[0].spec, &tools[1].spec);
    assert_eq!(
        (lookup.side_effect, lookup.timeout_seconds),
        (SideEffect::ReadOnly, 5)
    );
    assert_eq!(
        (refund.side_effect, refund.timeout_seconds, refund.terminal),
        (SideEffect::RemoteMutation, 30, false)
    );
    assert_eq!(lookup.description, "Read an order.");
    assert_eq!(lookup.input_schema, shop()[0].input_schema);
    assert_eq!(
        refund.mcp.as_deref().unwrap().tool.as_deref(),
        Some("issue_refund")
    );
    assert_eq!(tools[1].pin.tool, "shop__issue_refund");
    assert_eq!(tools[1].pin.server_tool, "issue_refund");
}

#[test]
fn a_toolset_name_that_is_no_function_name_is_an_error_naming_it() {
    let err = expand_tool_set(1, &set(&[], vec![]), &shop()).unwrap_err();
    assert!(
        matches!(&err, PinError::InvalidName { name, .. } if name == "shop__delete.everything"),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("spec.toolSets[1] (shop): the tool \"shop__delete.everything\""),
        "{err}"
    );
    let long = "x".repeat(59);
    let listing = listed(json!([{"name": long, "inputSchema": {}}]));
    let err = expand_tool_set(0, &set(&["*"], vec![]), &listing).unwrap_err();
    assert!(
        matches!(err, PinError::InvalidName { .. }),
        "shop__ + 59 = 65 characters: {err}"
    );
    assert!(is_function_name(&format!("shop__{}", "x".repeat(58))));
}

#[test]
fn an_override_of_a_tool_the_set_does_not_bring_in_is_an_error() {
    let o = ToolSetOverride {
        tool: "issue_refund".into(),
        ..ToolSetOverride::default()
    };
    let err = expand_tool_set(0, &set(&["lookup_*"], vec![o]), &shop()).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "spec.toolSets[0] (shop).overrides[0]: the override names \"issue_refund\""
        ),
        "{err}"
    );
    let err = expand_tool_set(0, &set(&["lookup_*", ""], vec![]), &shop()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.toolSets[0] (shop).include[1]: an empty glob"),
        "{err}"
    );
}

#[test]
fn expanded_names_are_unique_across_the_run() {
    let mut spec: AgentRunSpec = serde_json::from_value(json!({
        "goal": "g", "agent": {"scripted": {"decisions": []}},
        "tools": [{"name": "shop__lookup_order", "sideEffect": "ReadOnly", "inputSchema": {"type": "object"}, "http": {"url": "http://x"}}]
    }))
    .unwrap();
    spec.tool_sets = vec![set(&["lookup_*"], vec![])];
    let err = expand_tool_sets(&spec, &[shop()]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.toolSets[0] (shop): the tool name \"shop__lookup_order\" is already taken by spec.tools[0]; rename one of them"
    );
    spec.tools[0].name = "other".into();
    let tools = expand_tool_sets(&spec, &[shop()]).unwrap();
    assert_eq!(tools.len(), 1);
}

fn hints(a: Value) -> ToolAnnotations {
    serde_json::from_value(a).unwrap()
}

fn disagree(a: Value, class: SideEffect) -> Vec<&'static str> {
    hint_disagreements(Some(&hints(a)), class)
        .iter()
        .map(|d| d.hint)
        .collect()
}

#[test]
fn annotations_that_claim_more_danger_than_the_manifest_disagree_as_the_table_says() {
    use SideEffect::*;
    assert!(hint_disagreements(None, ReadOnly).is_empty());
    assert!(
        disagree(json!({}), ReadOnly).is_empty(),
        "absent hints claim nothing"
    );
    assert_eq!(
        disagree(json!({"readOnlyHint": false}), ReadOnly),
        ["readOnlyHint"]
    );
    assert!(disagree(json!({"readOnlyHint": false}), LocalMutation).is_empty());
    assert_eq!(
        disagree(
            json!({"readOnlyHint": false, "destructiveHint": true}),
            ReadOnly
        ),
        ["readOnlyHint", "destructiveHint"]
    );
    for class in [ReadOnly, LocalMutation, RemoteMutation] {
        assert_eq!(
            disagree(json!({"destructiveHint": true}), class),
            ["destructiveHint"],
            "{class:?}"
        );
    }
    assert!(disagree(json!({"destructiveHint": true}), Destructive).is_empty());
    assert!(disagree(
        json!({"readOnlyHint": true, "destructiveHint": true}),
        ReadOnly
    )
    .is_empty());
    assert_eq!(
        disagree(
            json!({"readOnlyHint": false, "openWorldHint": true}),
            LocalMutation
        ),
        ["openWorldHint"]
    );
    assert!(disagree(
        json!({"readOnlyHint": false, "openWorldHint": true}),
        RemoteMutation
    )
    .is_empty());
    assert!(
        disagree(json!({"openWorldHint": true}), ReadOnly).is_empty(),
        "a read-only web search is open-world"
    );
    for a in [
        json!({"readOnlyHint": true}),
        json!({"destructiveHint": false}),
        json!({"idempotentHint": true}),
        json!({"idempotentHint": false}),
    ] {
        for class in SideEffect::ALL {
            assert!(disagree(a.clone(), class).is_empty(), "{a} {class:?}");
        }
    }
    let d = &hint_disagreements(Some(&hints(json!({"destructiveHint": true}))), ReadOnly)[0];
    assert_eq!(d.manifest, ReadOnly);
    assert!(d.claim.contains("destructiveHint: true"));
}

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z ]{0,8}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn a_definition() -> impl Strategy<Value = ToolDefinition> {
    (
        "[a-z_]{1,12}",
        prop::option::of("[A-Za-z ]{0,12}"),
        prop::option::of("[A-Za-z .]{0,24}"),
        prop::collection::btree_map("[a-z]{1,4}", json_value(), 0..4),
        prop::option::of((prop::option::of(any::<bool>()), prop::option::of(any::<bool>()))),
        prop::option::of("[a-z]{1,4}"),
        prop::option::of(prop_oneof![Just("forbidden"), Just("optional"), Just("required")]),
    )
        .prop_map(|(name, title, description, props, hints, output, tasks)| ToolDefinition {
            name,
            title,
            description,
            input_schema: json!({"type": "object", "properties": Value::Object(props.into_iter().collect())}),
            annotations: hints.map(|(read_only_hint, destructive_hint)| ToolAnnotations {
                read_only_hint,
                destructive_hint,
                ..ToolAnnotations::default()
            }),
            output_schema: output.map(|p| json!({"type": "object", "required": [p]})),
            execution: tasks.map(|t| json!({"taskSupport": t})),
        })
}

#[derive(Debug, Clone)]
enum Change {
    Title(Option<String>),
    Description(Option<String>),
    Property(String, Value),
    ReadOnly(Option<bool>),
    Destructive(Option<bool>),
    Idempotent(bool),
    OutputSchema(Option<String>),
    TaskSupport(Option<&'static str>),
}

fn a_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        prop::option::of("[A-Za-z ]{0,12}").prop_map(Change::Title),
        prop::option::of("[A-Za-z .]{0,24}").prop_map(Change::Description),
        ("[a-z]{1,4}", json_value()).prop_map(|(k, v)| Change::Property(k, v)),
        prop::option::of(any::<bool>()).prop_map(Change::ReadOnly),
        prop::option::of(any::<bool>()).prop_map(Change::Destructive),
        any::<bool>().prop_map(Change::Idempotent),
        prop::option::of("[a-z]{1,4}").prop_map(Change::OutputSchema),
        prop::option::of(prop_oneof![
            Just("forbidden"),
            Just("optional"),
            Just("required")
        ])
        .prop_map(Change::TaskSupport),
    ]
}

fn apply(mut d: ToolDefinition, change: Change) -> ToolDefinition {
    let hints = || ToolAnnotations::default();
    match change {
        Change::Title(t) => d.title = t,
        Change::Description(t) => d.description = t,
        Change::Property(k, v) => {
            d.input_schema["properties"][k] = v;
        }
        Change::ReadOnly(h) => d.annotations.get_or_insert_with(hints).read_only_hint = h,
        Change::Destructive(h) => d.annotations.get_or_insert_with(hints).destructive_hint = h,
        Change::Idempotent(h) => d.annotations.get_or_insert_with(hints).idempotent_hint = Some(h),
        Change::OutputSchema(p) => {
            d.output_schema = p.map(|p| json!({"type": "object", "required": [p]}));
        }
        Change::TaskSupport(t) => d.execution = t.map(|t| json!({"taskSupport": t})),
    }
    d
}

proptest! {
    /// docs/behaviours.md 61: whatever changed, a changed definition never passes for its pin
    /// (and the same definition, re-listed, always does).
    #[test]
    fn a_changed_definition_never_compares_equal_to_its_pin(d in a_definition(), change in a_change()) {
        let mut pinned = pin("t", SERVER, d.clone()).unwrap();
        pinned.protocol_version = Some("2025-11-25".into());
        let relisted: Vec<ToolDefinition> = definitions(SERVER, &[serde_json::to_value(&d).unwrap()]).unwrap();
        prop_assert_eq!(check(&pinned, &relisted).unwrap(), PinCheck::Unchanged);
        let changed = apply(d.clone(), change);
        let now = check(&pinned, std::slice::from_ref(&changed)).unwrap();
        if changed == d {
            prop_assert_eq!(now, PinCheck::Unchanged);
        } else {
            let is_changed = matches!(now, PinCheck::Changed { .. });
            prop_assert!(is_changed, "{:?}", now);
        }
    }
}

/// A pin made before outputSchema and execution were pinned (no `protocolVersion`) still
/// matches the server's listing of the same tool that now carries them, and still refuses a
/// change of what it did pin (docs/design.md section 6, "MCP revisions").
#[test]
fn a_pin_from_before_output_schemas_ignores_them_and_still_sees_other_changes() {
    let old = ToolDefinition {
        name: "t".into(),
        input_schema: json!({"type": "object"}),
        ..ToolDefinition::default()
    };
    let pinned = pin("t", SERVER, old.clone()).unwrap();
    assert_eq!(pinned.protocol_version, None);
    let now = ToolDefinition {
        output_schema: Some(json!({"type": "object"})),
        execution: Some(json!({"taskSupport": "optional"})),
        ..old.clone()
    };
    assert_eq!(
        check(&pinned, std::slice::from_ref(&now)).unwrap(),
        PinCheck::Unchanged
    );
    let described = ToolDefinition {
        description: Some("new".into()),
        ..now.clone()
    };
    assert!(matches!(
        check(&pinned, &[described]).unwrap(),
        PinCheck::Changed { .. }
    ));
    // A pin of this version (it records the revision) sees an outputSchema change.
    let mut current = pin("t", SERVER, now.clone()).unwrap();
    current.protocol_version = Some("2026-07-28".into());
    let other = ToolDefinition {
        output_schema: Some(json!({"type": "string"})),
        ..now
    };
    assert!(matches!(
        check(&current, &[other]).unwrap(),
        PinCheck::Changed { .. }
    ));
}
