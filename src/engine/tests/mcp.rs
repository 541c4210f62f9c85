//! docs/behaviours.md 60-61, 63, 65: MCP tools are pinned before `run.started`, called with
//! their pin, and a server that cannot be listed fails the run `tool_unavailable`.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{RunPhase, TerminalReason};

pub const MCP: &str = include_str!("../../../tests/fixtures/engine/mcp.yaml");

/// What the fixture's server lists: `search` (read-only hints) and `create_issue`.
pub fn listing() -> Vec<Value> {
    vec![
        json!({
            "name": "search",
            "description": "Search the issues.",
            "inputSchema": {"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}},
            "annotations": {"readOnlyHint": true}
        }),
        json!({
            "name": "create_issue",
            "description": "Open an issue.",
            "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}}},
            "annotations": {"readOnlyHint": false, "destructiveHint": false}
        }),
        json!({"name": "delete_repo", "inputSchema": {"type": "object"}}),
    ]
}

pub fn mcp_run(decisions: Vec<Value>) -> Harness {
    let mut h = Harness::new(MCP);
    h.spec_mut()
        .agent
        .scripted
        .as_mut()
        .expect("scripted")
        .decisions = decisions;
    h
}

#[test]
fn mcp_tools_are_pinned_in_the_write_that_starts_the_run() {
    let mut h = mcp_run(vec![call("search", json!({"q": "crash"}))]);
    let effects = h.reconcile("a");
    assert_effects!(
        effects,
        ["ListTools(1)"],
        "listing comes first and writes nothing"
    );
    assert!(h.writes.is_empty());

    let effects = h.list_tools("a", |_| Ok(listing()));
    assert_effects!(effects, ["WriteStatus", "CallTool(search#1)"]);
    assert_eq!(
        h.writes.len(),
        1,
        "pins, run.started and the first call share one write"
    );
    assert_words!(
        h.journal(),
        [
            "run.created",
            "tool.pinned",
            "tool.pinned",
            "run.started",
            "step.started@0",
            "step.decided@0",
            "step.policy@0",
            "step.tool_started@0"
        ]
    );
    let status = h.status();
    let names: Vec<&str> = status.tool_pins.iter().map(|p| p.tool.as_str()).collect();
    assert_eq!(names, ["search", "gh__create_issue"]);
    // Each pin records the revision its server's listing was made in (docs/design.md
    // section 6, "MCP revisions").
    assert!(status
        .tool_pins
        .iter()
        .all(|p| p.protocol_version.as_deref() == Some("2026-07-28")));
    assert!(status
        .tool_pins
        .iter()
        .all(|p| p.server_info == Some(json!({"name": "shop", "version": "1.0"}))));
    let pinned = h.events()[1].data.clone().expect("tool.pinned has data");
    assert_eq!(pinned["tool"], json!("search"));
    assert_eq!(pinned["sha256"], json!(status.tool_pins[0].sha256));

    let call = h.tool_calls[0].clone();
    assert_eq!(call.pin.as_deref(), Some(&status.tool_pins[0]));
    assert_eq!(
        call.tool.input_schema["required"],
        json!(["q"]),
        "the schema is the pin's"
    );
    assert_eq!(call.tool.description, "Search the issues.");
}

#[test]
fn args_are_checked_against_the_pinned_schema() {
    let mut h = mcp_run(vec![call("search", json!({"q": 7}))]);
    h.reconcile("a");
    let effects = h.list_tools("a", |_| Ok(listing()));
    assert!(
        !super::harness::kinds(&effects)
            .iter()
            .any(|k| k.starts_with("CallTool")),
        "{effects:?}"
    );
    assert!(
        h.journal().iter().any(|w| w == "step.failed@0"),
        "{:?}",
        h.journal()
    );
}

#[test]
fn a_toolset_tool_is_called_like_any_other_and_its_approval_covers_the_pin() {
    let mut h = mcp_run(vec![call("gh__create_issue", json!({"title": "t"}))]);
    h.reconcile("a");
    let effects = h.list_tools("a", |_| Ok(listing()));
    let kinds = super::harness::kinds(&effects);
    assert!(
        kinds.iter().any(|k| k.starts_with("CreateApproval")),
        "a RemoteMutation waits for a person by default: {kinds:?}"
    );
    let pin = h.status().tool_pins[1].clone();
    let approval = h.approvals.values().next().expect("an Approval").clone();
    let tool = &approval["spec"]["request"]["tool"];
    assert_eq!(tool["name"], json!("gh__create_issue"));
    assert_eq!(tool["pinSha256"], json!(pin.sha256), "{approval}");
}

#[test]
fn a_server_down_at_start_fails_the_run_tool_unavailable_naming_it() {
    let mut h = mcp_run(vec![call("search", json!({"q": "x"}))]);
    h.reconcile("a");
    h.list_tools("a", |_| Err("connection refused".into()));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::ToolUnavailable));
    let detail = status.reason_detail.unwrap_or_default();
    assert!(detail.contains("http://mcp.tools.svc:8080/mcp"), "{detail}");
    assert!(h.tool_calls.is_empty());
}

#[test]
fn a_spec_tool_the_server_does_not_list_is_tool_unavailable() {
    let mut h = mcp_run(vec![]);
    h.reconcile("a");
    h.list_tools("a", |_| Ok(listing()[1..].to_vec()));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ToolUnavailable));
    assert!(status.tool_pins.is_empty());
}

#[test]
fn a_toolset_name_taken_twice_is_invalid_spec() {
    let mut h = mcp_run(vec![]);
    h.spec_mut().tools[0].name = "gh__create_issue".into();
    h.spec_mut().tools[0].mcp.as_mut().expect("mcp").tool = Some("search".into());
    h.reconcile("a");
    h.list_tools("a", |_| Ok(listing()));
    assert_eq!(h.status().reason, Some(TerminalReason::InvalidSpec));
}

#[test]
fn annotations_claiming_more_danger_raise_tool_hints_disagree_and_the_class_stays() {
    let mut h = mcp_run(vec![call("search", json!({"q": "x"}))]);
    h.reconcile("a");
    let mut listed = listing();
    listed[0]["annotations"] = json!({"readOnlyHint": false});
    let effects = h.list_tools("a", |_| Ok(listed.clone()));
    assert_effects!(
        effects,
        ["WriteStatus", "CallTool(search#1)"],
        "still allowed as ReadOnly"
    );
    let status = h.status();
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ToolHintsDisagree")
        .expect("the condition");
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains("search"),
        "{}",
        condition.message
    );
    let pinned = h.events()[1].data.clone().expect("data");
    assert_eq!(pinned["hintsDisagree"][0]["hint"], json!("readOnlyHint"));
    let warnings = crate::engine::kube_events(&Value::Null, &h.run.status);
    assert!(
        warnings.iter().any(|e| e.reason == "ToolHintsDisagree"),
        "{warnings:?}"
    );
}

#[test]
fn agreeing_annotations_raise_no_condition() {
    let mut h = mcp_run(vec![call("search", json!({"q": "x"}))]);
    h.reconcile("a");
    h.list_tools("a", |_| Ok(listing()));
    assert!(h
        .status()
        .conditions
        .iter()
        .all(|c| c.type_ != "ToolHintsDisagree"));
}

#[test]
fn an_approval_of_an_mcp_call_presents_the_server_tool_pin_and_annotations() {
    let mut h = mcp_run(vec![call("gh__create_issue", json!({"title": "t"}))]);
    h.reconcile("a");
    h.list_tools("a", |_| Ok(listing()));
    let approval = h.approvals.values().next().expect("an Approval").clone();
    let shown = &approval["spec"]["presentation"]["mcp"];
    assert_eq!(shown["server"], json!("http://mcp.tools.svc:8080/mcp"));
    assert_eq!(shown["tool"], json!("create_issue"));
    assert_eq!(shown["pinSha256"], json!(h.status().tool_pins[1].sha256));
    assert_eq!(shown["annotations"]["readOnlyHint"], json!(false));
}

#[test]
fn a_toolset_matching_nothing_starts_the_run_without_listing_again() {
    let mut h = mcp_run(vec![complete(json!({"done": true}))]);
    h.spec_mut().tools.clear();
    h.spec_mut().tool_sets[0].include = vec!["nothing_*".into()];
    h.reconcile("a");
    let effects = h.list_tools("a", |_| Ok(listing()));
    assert!(h.pending_listing.is_none(), "{effects:?}");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert!(status.tool_pins.is_empty());
}
