//! docs/behaviours.md 1-3: creating a run.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{AgentRunSpec, LeaseRecord, RunPhase, StepStatus, TerminalReason};
use crate::engine::Input;

#[test]
fn a_new_run_starts_with_created_and_started_in_one_write() {
    let mut h = Harness::new(REFUND);
    let effects = h.reconcile("a");

    assert_effects!(effects, ["WriteStatus", "CallTool(lookup_order#1)"]);
    assert_eq!(
        h.writes.len(),
        1,
        "created, started and the first step share one write"
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Running);
    assert_eq!(
        status.lease,
        Some(LeaseRecord {
            holder: "a".into(),
            epoch: 1
        })
    );
    assert_eq!(status.started_at, Some(h.now));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.step_count, 1);
    assert_eq!(status.current_tool.as_deref(), Some("lookup_order"));
    assert_words!(
        h.journal(),
        [
            "run.created",
            "run.started",
            "step.started@0",
            "step.decided@0",
            "step.policy@0",
            "step.tool_started@0"
        ]
    );
    let created = &h.events()[0].data;
    let created = created.as_ref().expect("run.created has data");
    assert_eq!(
        created["goal"],
        json!("Refund order 1042 if it arrived damaged.")
    );
    assert_eq!(
        created["limits"],
        json!({"maxSteps": 50, "maxConsecutiveToolFailures": 3, "loopThreshold": 3})
    );
    let hashes = created["toolSpecHashes"].as_object().expect("an object");
    assert_eq!(hashes.len(), 2);
    assert!(hashes["issue_refund"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(
        h.last_event("run.started"),
        json!({"holder": "a", "epoch": 1})
    );
    let conditions: Vec<(String, String)> = status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    assert_eq!(
        conditions,
        vec![
            ("Ready".into(), "False".into()),
            ("WaitingForApproval".into(), "False".into())
        ]
    );
}

fn with_schema(schema: Value) -> Harness {
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.spec_mut().tools[2].input_schema = schema;
    h
}

fn assert_fails_before_any_step(h: &mut Harness, field: &str) {
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::InvalidSpec));
    let detail = status.reason_detail.unwrap_or_default();
    assert!(detail.contains(field), "{detail:?} names {field}");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.message, detail);
    assert!(status.steps.is_empty());
    assert!(h.tool_calls.is_empty());
    assert_words!(h.journal(), ["run.finished"]);
}

#[test]
fn an_input_schema_with_an_external_ref_fails_the_run_invalid_spec_before_any_step() {
    let mut h = with_schema(json!({"$ref": "https://example.com/schema.json"}));
    assert_fails_before_any_step(&mut h, "spec.tools[2].inputSchema");
}

#[test]
fn an_input_schema_that_does_not_compile_fails_the_run_invalid_spec_before_any_step() {
    let mut h = with_schema(json!({"type": "no-such-type"}));
    assert_fails_before_any_step(&mut h, "spec.tools[2].inputSchema");
}

#[test]
fn an_input_schema_nested_past_256_levels_fails_the_run_invalid_spec_before_any_step() {
    let mut schema = json!({"type": "object"});
    for _ in 0..300 {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    let mut h = with_schema(schema);
    assert_fails_before_any_step(&mut h, "spec.tools[2].inputSchema");
}

#[test]
fn a_spec_with_several_problems_fails_invalid_spec_naming_every_field_before_any_step() {
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.spec_mut().tools[0].name = "get weather!".into();
    h.spec_mut().tools[1].http = None;
    h.spec_mut().tools[1].mcp = None;
    h.spec_mut().policy.rules = vec![crate::api::PolicyRule {
        name: "broken".into(),
        tools: vec![],
        when: Some("args.amount <=> 100 &&".into()),
        outcome: crate::api::PolicyOutcome::Allow,
        reason: None,
        kind: None,
        capability: None,
        presentation: None,
    }];
    assert_fails_before_any_step(
        &mut h,
        "spec.tools[0].name: \"get weather!\" is not a valid",
    );
    let detail = h.status().reason_detail.unwrap_or_default();
    assert!(
        detail.contains("; spec.tools[1]: has no executor"),
        "{detail}"
    );
    assert!(detail.contains("; spec.policy.rules[0].when: "), "{detail}");
}

#[test]
fn a_spec_the_api_server_should_have_refused_fails_the_run_naming_the_field() {
    let mut h = Harness::scripted(vec![]);
    h.spec_mut().tools[1].name = "read".into();
    assert_fails_before_any_step(&mut h, "spec.tools[1].name");
    let mut h = Harness::scripted(vec![]);
    h.spec_mut().limits.max_steps = 0;
    assert_fails_before_any_step(&mut h, "spec.limits.maxSteps");
}

#[test]
fn a_run_named_longer_than_63_characters_fails_invalid_spec_before_any_step() {
    // Created before the CRD's rule (or past it): it would wait for ever at its first
    // Approval, whose label agentrt.dev/run cannot hold the name (docs/behaviours.md 80).
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.run.name = "r".repeat(64);
    assert_fails_before_any_step(&mut h, "metadata.name: must be no more than 63 characters");
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.run.name = "r".repeat(63);
    h.reconcile("a");
    assert_ne!(h.status().reason, Some(TerminalReason::InvalidSpec));
}

#[test]
fn defaults_are_fifty_steps_three_failures_loop_three_lease_thirty_and_optional_limits_off() {
    let spec: AgentRunSpec =
        serde_yaml::from_str("goal: g\nagent: {scripted: {decisions: []}}\ntools: []\n")
            .expect("a minimal spec decodes");
    assert_eq!(spec.limits.max_steps, 50);
    assert_eq!(spec.limits.max_consecutive_tool_failures, 3);
    assert_eq!(spec.limits.loop_threshold, 3);
    assert_eq!(spec.lease_duration_seconds, 30);
    let limits = serde_json::to_value(&spec.limits).expect("limits serialize");
    assert_eq!(
        limits,
        json!({"maxSteps": 50, "maxConsecutiveToolFailures": 3, "loopThreshold": 3}),
        "every optional limit is off"
    );
    assert!(!spec.cancel);
}

#[test]
fn observing_a_new_run_asks_for_the_lease_and_writes_nothing() {
    let h = Harness::new(REFUND);
    let effects = h.decide(
        "a",
        Observe {
            lease: h.lease_view(),
        },
    );
    assert_effects!(effects, ["AcquireLease"]);
}

#[test]
fn a_start_applied_again_does_not_start_anything_twice() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    let before = h.run.status.clone();
    // The write landed but its answer was lost: the same input again on the new record.
    let effects = h.step("a", Input::LeaseAcquired { takeover: None });
    assert_eq!(h.run.status, before, "nothing is written twice");
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert!(
        !kinds(&effects).iter().any(|k| k.starts_with("CallTool")),
        "the started step is not started again: {effects:?}"
    );
    assert_eq!(h.tool_calls.len(), 1);
    assert_eq!(h.steps()[0].status, StepStatus::Executing);
}
