//! docs/behaviours.md 4-10: each step's limits, decisions and validation.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{ObservationKind, RunPhase, StepStatus, TerminalReason};
use crate::engine::Input;

fn reads(n: usize) -> Vec<Value> {
    (0..n).map(|_| call("read", json!({"n": 1}))).collect()
}

#[test]
fn the_step_limit_ends_the_run_limit_steps_and_no_step_starts() {
    let mut h = Harness::scripted(reads(3));
    h.spec_mut().limits.max_steps = 2;
    h.reconcile("a");
    h.result("a", json!({"v": 1}));
    let effects = h.result("a", json!({"v": 2}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::LimitSteps));
    assert_eq!(status.steps.len(), 2);
    assert_words!(
        h.journal_tail(3),
        ["step.tool_finished@1", "limit.exceeded", "run.finished"]
    );
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxSteps", "value": 2, "max": 2})
    );
    assert_eq!(status.finished_at, Some(h.now));
    assert_eq!(h.tool_calls.len(), 2);
}

#[test]
fn repeated_failures_end_the_run_repeated_tool_failures() {
    // Destructive tools are denied by default: three denials in a row, one write.
    let mut h = Harness::scripted(vec![
        call("destroy", json!({})),
        call("destroy", json!({})),
        call("destroy", json!({})),
        call("read", json!({})),
    ]);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    assert_eq!(h.writes.len(), 1);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::RepeatedToolFailures));
    assert_eq!(status.steps.len(), 3);
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxConsecutiveToolFailures", "value": 3, "max": 3})
    );
    assert!(h.tool_calls.is_empty());
}

#[test]
fn the_active_time_limit_ends_the_run_limit_active_time() {
    let mut h = Harness::scripted(reads(2));
    h.spec_mut().limits.max_active_seconds = Some(1);
    h.reconcile("a");
    h.advance(2);
    h.result("a", json!({}));
    let status = h.status();
    assert_eq!(status.active_seconds, 2.0);
    assert_eq!(status.reason, Some(TerminalReason::LimitActiveTime));
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxActiveSeconds", "value": 2.0, "max": 1})
    );
}

#[test]
fn the_elapsed_time_limit_ends_the_run_limit_elapsed_time() {
    let mut h = Harness::scripted(reads(2));
    h.spec_mut().limits.max_elapsed_seconds = Some(10);
    h.reconcile("a");
    h.advance(11);
    h.result("a", json!({}));
    assert_eq!(h.status().reason, Some(TerminalReason::LimitElapsedTime));
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxElapsedSeconds", "value": 11.0, "max": 10})
    );
}

#[test]
fn limits_are_checked_in_order_steps_first() {
    let mut h = Harness::scripted(reads(3));
    h.spec_mut().limits.max_steps = 1;
    h.spec_mut().limits.max_active_seconds = Some(1);
    h.spec_mut().limits.max_elapsed_seconds = Some(1);
    h.reconcile("a");
    h.advance(5);
    h.result("a", json!({}));
    assert_eq!(h.status().reason, Some(TerminalReason::LimitSteps));
    let limits: Vec<String> = h
        .events()
        .iter()
        .filter_map(|e| e.data.as_ref()?.get("limit")?.as_str().map(String::from))
        .collect();
    assert_eq!(
        limits,
        vec!["maxSteps".to_string()],
        "only the first limit fires"
    );
}

#[test]
fn consecutive_failures_count_errors_denials_invalid_decisions_and_interruptions() {
    let mut h = Harness::scripted(vec![
        call("destroy", json!({})),
        json!({"kind": "nope"}),
        call("read", json!({"n": 1})),
        call("read", json!({"n": 2})),
        call("read", json!({"n": 3})),
    ]);
    h.spec_mut().limits.max_consecutive_tool_failures = 4;
    h.reconcile("a");
    h.error("a", json!({"error": "boom"}));
    // Step 3 is interrupted by a takeover: the fourth failure in a row.
    h.expire_lease();
    h.reconcile("b");
    let status = h.status();
    let observed: Vec<Option<ObservationKind>> = status
        .steps
        .iter()
        .map(|s| s.observation.as_ref().map(|o| o.kind))
        .collect();
    assert_eq!(
        observed,
        vec![
            Some(ObservationKind::PolicyDenied),
            Some(ObservationKind::InvalidDecision),
            Some(ObservationKind::ToolError),
            Some(ObservationKind::Interrupted),
        ]
    );
    assert_eq!(status.reason, Some(TerminalReason::RepeatedToolFailures));
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxConsecutiveToolFailures", "value": 4, "max": 4})
    );
}

#[test]
fn a_tool_result_resets_the_failure_count() {
    let mut h = Harness::scripted(vec![
        call("destroy", json!({})),
        call("destroy", json!({})),
        call("read", json!({})),
        call("destroy", json!({})),
        call("destroy", json!({})),
        complete(json!("done")),
    ]);
    h.reconcile("a");
    h.result("a", json!({"ok": true}));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.steps.len(), 6);
}

#[test]
fn three_identical_calls_with_the_same_answer_are_a_loop() {
    let mut h = Harness::scripted(reads(4));
    h.reconcile("a");
    h.result("a", json!({"same": true}));
    h.result("a", json!({"same": true}));
    let effects = h.result("a", json!({"same": true}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LoopDetected));
    assert_eq!(status.steps.len(), 3);
    let detected = h.last_event("loop.detected");
    assert_eq!(detected["tool"], json!("read"));
    assert_eq!(detected["count"], json!(3));
    assert_eq!(
        detected["contentHash"],
        json!(status.steps[2].observation.as_ref().unwrap().content_hash)
    );
    assert_words!(
        h.journal_tail(3),
        ["step.tool_finished@2", "loop.detected", "run.finished"]
    );
}

#[test]
fn a_changed_observation_breaks_the_loop() {
    let mut decisions = reads(3);
    decisions.push(complete(json!(1)));
    let mut h = Harness::scripted(decisions);
    h.reconcile("a");
    h.result("a", json!({"v": 1}));
    h.result("a", json!({"v": 1}));
    h.result("a", json!({"v": 2}));
    assert_eq!(h.status().reason, Some(TerminalReason::GoalCompleted));
}

#[test]
fn an_invalid_decision_breaks_the_loop() {
    let mut h = Harness::scripted(vec![
        call("read", json!({"n": 1})),
        call("read", json!({"n": 1})),
        json!({"kind": "nope"}),
        call("read", json!({"n": 1})),
        complete(json!(1)),
    ]);
    h.reconcile("a");
    h.result("a", json!({"v": 1}));
    h.result("a", json!({"v": 1}));
    h.result("a", json!({"v": 1}));
    assert_eq!(h.status().reason, Some(TerminalReason::GoalCompleted));
}

#[test]
fn the_decision_is_recorded_verbatim_before_it_is_validated() {
    let raw = json!({"kind": "tool_call", "tool": "send", "args": {"m": "x"}, "why": ["a", 1]});
    let mut h = Harness::scripted(vec![raw.clone(), complete(json!(null))]);
    h.reconcile("a");
    let step = &h.steps()[0];
    assert_eq!(
        serde_json::to_value(step.decision.as_ref().unwrap()).unwrap(),
        raw
    );
    assert_eq!(
        step.status,
        StepStatus::Failed,
        "the args fail send's schema"
    );
    let journal = h.journal();
    let decided = journal.iter().position(|w| w == "step.decided@0").unwrap();
    let failed = journal.iter().position(|w| w == "step.failed@0").unwrap();
    assert!(decided < failed);
    assert_eq!(
        h.events()[3].data,
        Some(json!({"kind": "tool_call", "tool": "send"}))
    );
}

#[test]
fn args_that_are_not_usable_json_are_kept_in_invalid_args() {
    let mut h = Harness::scripted(vec![]);
    h.spec_mut().agent.scripted = None;
    h.spec_mut().agent.webhook = Some(crate::api::WebhookAgent {
        url: "http://127.0.0.1:1/agent".into(),
        ..Default::default()
    });
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "CallAgent(0)"]);
    let answer = json!({"kind": "tool_call", "tool": "read", "args": {"n": u64::MAX}});
    h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(answer),
        },
    );
    let step = &h.steps()[0];
    let decision = step.decision.as_ref().unwrap();
    assert_eq!(decision.args, None);
    assert_eq!(
        decision.invalid_args.as_deref(),
        Some("{\"n\":18446744073709551615}")
    );
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.as_ref().unwrap().kind,
        ObservationKind::InvalidDecision
    );
    assert!(h.run.status.to_string().contains("invalidArgs"));
}

fn invalid_then_complete(decision: Value) -> Harness {
    let mut h = Harness::scripted(vec![decision, complete(json!("ok"))]);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed, "the run continues");
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.as_ref().unwrap().kind,
        ObservationKind::InvalidDecision
    );
    assert_words!(
        h.journal()[2..7].to_vec(),
        [
            "step.started@0",
            "step.decided@0",
            "step.failed@0",
            "step.started@1",
            "step.decided@1"
        ]
    );
    h
}

#[test]
fn an_unknown_decision_kind_fails_the_step_invalid_decision_and_the_run_goes_on() {
    let h = invalid_then_complete(json!({"kind": "dance"}));
    let content = h.steps()[0].observation.clone().unwrap().content.unwrap();
    assert_eq!(
        content,
        json!({"error": "unknown decision kind \"dance\" (expected tool_call, complete or fail)"})
    );
}

#[test]
fn a_missing_decision_kind_fails_the_step_invalid_decision() {
    invalid_then_complete(json!({"tool": "read"}));
}

#[test]
fn an_unknown_tool_fails_the_step_invalid_decision() {
    let h = invalid_then_complete(call("teleport", json!({})));
    let summary = h.steps()[0].observation.clone().unwrap().summary;
    assert!(summary.contains("teleport"), "{summary}");
}

#[test]
fn args_that_fail_the_schema_fail_the_step_invalid_decision() {
    let h = invalid_then_complete(call("send", json!({"n": "seven"})));
    let content = h.steps()[0].observation.clone().unwrap().content.unwrap();
    assert!(content["details"].as_array().is_some_and(|d| !d.is_empty()));
    assert!(h.tool_calls.is_empty());
}

#[test]
fn complete_ends_step_and_run_together_with_its_result() {
    let mut h = Harness::scripted(vec![complete(json!({"refunded": 250}))]);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    assert_eq!(h.writes.len(), 1);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.reason, Some(TerminalReason::GoalCompleted));
    assert_eq!(status.result, Some(json!({"refunded": 250})));
    assert_eq!(status.steps[0].status, StepStatus::Done);
    assert_eq!(status.finished_at, Some(h.now));
    assert_words!(
        h.journal(),
        [
            "run.created",
            "run.started",
            "step.started@0",
            "step.decided@0",
            "run.finished"
        ]
    );
    assert_eq!(
        h.last_event("run.finished"),
        json!({"phase": "Completed", "reason": "goal_completed"})
    );
    let ready = &status.conditions[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert_eq!(
        ready.reason, "GoalCompleted",
        "a condition's reason is CamelCase"
    );
}

#[test]
fn fail_ends_step_and_run_goal_failed_with_its_message() {
    let mut h = Harness::scripted(vec![json!({"kind": "fail", "message": "order not found"})]);
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::GoalFailed));
    assert_eq!(status.reason_detail.as_deref(), Some("order not found"));
    assert_eq!(status.steps[0].status, StepStatus::Failed);
}

#[test]
fn an_agent_error_ends_the_run_agent_error() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    let effects = h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Err("HTTP 503 after 3 attempts".into()),
        },
    );
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::AgentError));
    assert!(status.reason_detail.unwrap().contains("HTTP 503"));
    assert_eq!(status.steps[0].status, StepStatus::Failed);
}

#[test]
fn a_script_past_its_end_fails_agent_error() {
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.reconcile("a");
    h.result("a", json!({}));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::AgentError));
    assert_eq!(
        status.reason_detail.as_deref(),
        Some("scripted agent has no decision 1")
    );
}

#[test]
fn a_webhook_agent_is_asked_after_the_step_starts_and_its_answer_runs_the_loop() {
    let mut h = Harness::new(WEBHOOK);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "CallAgent(0)"]);
    assert_eq!(h.steps()[0].status, StepStatus::Deciding);
    let (_, request) = h.pending_agent.clone().unwrap();
    assert_eq!(request["goal"], json!("Send a message once."));
    assert_eq!(request["tools"][0]["name"], json!("send"));
    let effects = h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(call("send", json!({"n": 1}))),
        },
    );
    assert_effects!(effects, ["WriteStatus", "CallTool(send#1)"]);
    // The same answer again (a lost write answer) changes nothing and calls nothing.
    let before = h.run.status.clone();
    let effects = h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(call("send", json!({"n": 1}))),
        },
    );
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert_eq!(h.run.status, before);
}
