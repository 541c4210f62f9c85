//! docs/behaviours.md 11-14: the policy and starting a tool.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{
    ObservationKind, PolicyDecisionKind, PolicyOutcome, PolicyRule, RunPhase, StepStatus,
    TerminalReason,
};
use crate::engine::{Input, ToolOutcome};

fn rule(name: &str, tools: &[&str], when: Option<&str>, outcome: PolicyOutcome) -> PolicyRule {
    PolicyRule {
        name: name.into(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        when: when.map(String::from),
        outcome,
        reason: Some(format!("rule {name}")),
        kind: None,
        capability: None,
        presentation: None,
    }
}

#[test]
fn the_policy_sees_the_same_canonical_args_in_the_loop_and_on_re_evaluation() {
    // 7.0 and 7 are one number; keys in any order are one object.
    let mut h = Harness::scripted(vec![call("send", json!({"n": 7.0})), complete(json!(1))]);
    h.spec_mut().policy.rules = vec![rule(
        "sevens",
        &["send"],
        Some("args.n == 7"),
        PolicyOutcome::RequireApproval,
    )];
    h.reconcile("a");
    let approval = h.approval("tools-0-1").clone();
    assert_eq!(approval["spec"]["request"]["args"], json!({"n": 7}));
    assert_eq!(h.last_event("step.policy")["rule"], json!("sevens"));
    h.approve("tools-0-1");
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(tools-0-1:Executed)",
            "CallTool(send#1)"
        ]
    );
    assert_eq!(h.last_event("step.policy")["rule"], json!("sevens"));
    let started = h.last_event("step.tool_started");
    assert_eq!(started["args"], json!({"n": 7}));
    assert_eq!(h.tool_calls[0].args, json!({"n": 7}));
}

#[test]
fn a_when_that_fails_on_the_args_pauses_on_a_policy_error_approval_and_nothing_executes() {
    let mut h = Harness::scripted(vec![call("send", json!({"n": 1})), complete(json!("ok"))]);
    h.spec_mut().policy.rules = vec![rule(
        "broken",
        &[],
        Some("args.nope > 1"),
        PolicyOutcome::Allow,
    )];
    let effects = h.reconcile("a");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(tools-0-1)",
            "WriteApprovalStatus(tools-0-1:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    let status = h.status();
    assert_eq!(
        status.phase,
        RunPhase::WaitingForApproval,
        "the run is kept"
    );
    assert_eq!(status.reason, None);
    assert_eq!(status.steps[0].status, StepStatus::AwaitingApproval);
    assert!(h.tool_calls.is_empty(), "nothing ran");
    let approval = h.approval("tools-0-1").clone();
    assert_eq!(approval["spec"]["kind"], "policy_error");
    let shown = &approval["spec"]["presentation"];
    assert_eq!(
        shown["rule"],
        json!({"index": 0, "name": "broken", "when": "args.nope > 1"})
    );
    assert_eq!(shown["args"], json!({"n": 1}));
    assert_eq!(shown["tool"], "send");
    assert!(
        shown["error"]
            .as_str()
            .is_some_and(|e| e.contains("No such key: nope") && e.contains("has(")),
        "{shown}"
    );
    let policy = h.last_event("step.policy");
    assert_eq!(policy["decision"], "require_approval");
    assert_eq!(policy["rule"], "broken");
    // A person approves: the same error gives the same hash, so the call runs, once.
    h.approve("tools-0-1");
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(tools-0-1:Executed)",
            "CallTool(send#1)"
        ]
    );
    assert_eq!(h.tool_calls.len(), 1);
    assert_eq!(h.tool_calls[0].args, json!({"n": 1}));
}

#[test]
fn a_when_that_cannot_compile_on_a_live_run_fails_it_internal_error_and_nothing_executes() {
    // Edited into the policy after the run started, past admission (docs/behaviours.md 1).
    let mut h = Harness::scripted(vec![call("read", json!({})), call("send", json!({"n": 1}))]);
    h.reconcile("a");
    h.spec_mut().policy.rules = vec![rule(
        "broken",
        &[],
        Some("args.n <=> 1 &&"),
        PolicyOutcome::Allow,
    )];
    h.result("a", json!({}));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::InternalError));
    assert!(status
        .reason_detail
        .unwrap()
        .contains("spec.policy.rules[0] (broken).when"));
    assert_eq!(status.steps[1].status, StepStatus::Failed);
    assert_eq!(h.tool_calls.len(), 1, "only the read ran");
    assert!(h.approvals.is_empty());
}

#[test]
fn a_capability_that_is_not_storable_json_fails_the_run_internal_error_and_no_approval_exists() {
    // A policy edited on a live run (docs/design.md section 2: policy may change); at start
    // the same spec fails `invalid_spec` (docs/behaviours.md 1).
    let mut h = Harness::scripted(vec![call("read", json!({})), call("send", json!({"n": 1}))]);
    h.reconcile("a");
    let mut approve = rule("approve", &["send"], None, PolicyOutcome::RequireApproval);
    approve.capability = Some(json!({"max": u64::MAX}));
    h.spec_mut().policy.rules = vec![approve];
    h.result("a", json!({}));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::InternalError));
    assert!(status.reason_detail.unwrap().contains("capability"));
    assert!(h.approvals.is_empty());
    assert_eq!(h.tool_calls.len(), 1, "only the read ran, send never did");
}

#[test]
fn deny_writes_step_policy_and_fails_the_step_policy_denied_together_and_the_loop_goes_on() {
    let mut h = Harness::scripted(vec![
        call("destroy", json!({"n": 1})),
        complete(json!("ok")),
    ]);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    assert_eq!(h.writes.len(), 1);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.policy.as_ref().unwrap().decision,
        PolicyDecisionKind::Deny
    );
    let observation = step.observation.as_ref().unwrap();
    assert_eq!(observation.kind, ObservationKind::PolicyDenied);
    assert_eq!(
        observation.content,
        Some(json!({"tool": "destroy", "reason": "Destructive tools are denied by default"}))
    );
    assert_words!(
        h.journal()[2..7].to_vec(),
        [
            "step.started@0",
            "step.decided@0",
            "step.policy@0",
            "step.failed@0",
            "step.started@1"
        ]
    );
    assert!(h.tool_calls.is_empty());
}

#[test]
fn abort_ends_the_run_policy_abort() {
    let mut h = Harness::scripted(vec![call("read", json!({"n": 1}))]);
    h.spec_mut().policy.rules = vec![rule("stop", &["re*"], None, PolicyOutcome::Abort)];
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::PolicyAbort));
    assert_eq!(status.reason_detail.as_deref(), Some("rule stop"));
    assert_eq!(status.steps[0].status, StepStatus::Failed);
    assert_words!(
        h.journal_tail(3),
        ["step.policy@0", "step.failed@0", "run.finished"]
    );
    assert!(h.tool_calls.is_empty());
}

#[test]
fn allow_writes_executing_step_policy_and_tool_started_together_before_the_call() {
    let mut h = Harness::scripted(vec![call("write_local", json!({"n": 3}))]);
    let effects = h.reconcile("a");
    let Effect::WriteStatus { status } = &effects[0] else {
        panic!("the write comes first: {effects:?}");
    };
    let Effect::CallTool(call) = &effects[1] else {
        panic!("then the call: {effects:?}");
    };
    assert_eq!(effects.len(), 2);
    assert_eq!(status["steps"][0]["status"], json!("executing"));
    assert_eq!(status["steps"][0]["attempts"], json!(1));
    assert_eq!(
        status["steps"][0]["policy"],
        json!({"decision": "allow", "reason": "LocalMutation tools are allowed by default"})
    );
    assert_words!(h.journal_tail(2), ["step.policy@0", "step.tool_started@0"]);
    assert_eq!(
        h.last_event("step.tool_started"),
        json!({"tool": "write_local", "args": {"n": 3}, "attempt": 1})
    );
    assert_eq!(call.step, StepIndex(0));
    assert_eq!(call.attempt, 1);
    assert_eq!(call.idempotency_key, "uid-1/0");
    assert_eq!(call.args, json!({"n": 3}));
}

#[test]
fn a_replica_that_is_not_the_recorded_holder_writes_nothing_and_stops() {
    let mut h = Harness::scripted(vec![call("write_local", json!({}))]);
    h.reconcile("a");
    let before = h.run.status.clone();
    let effects = h.step(
        "z",
        Input::ToolFinished {
            step: StepIndex(0),
            attempt: 1,
            outcome: ToolOutcome::Result {
                status: 200,
                content: Value::Null,
                duration_ms: 1,
            },
        },
    );
    assert_effects!(effects, ["Stop"]);
    assert_eq!(h.run.status, before);
}
