//! docs/behaviours.md 15-18 and the per-step content budget of 50: tool outcomes.

use serde_json::json;

use super::harness::*;
use crate::api::{ObservationKind, RunPhase, StepStatus, TerminalReason, Truncation};
use crate::engine::canonical::content_hash;
use crate::engine::{Input, ToolOutcome};

#[test]
fn a_2xx_json_answer_is_a_tool_result_and_the_step_is_done() {
    let mut h = Harness::scripted(vec![call("read", json!({"n": 1})), complete(json!("ok"))]);
    h.reconcile("a");
    let effects = h.result("a", json!({"order": 1042}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let step = &h.steps()[0];
    assert_eq!(step.status, StepStatus::Done);
    assert_eq!(step.finished_at, Some(h.now));
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::ToolResult);
    assert_eq!(observation.content, Some(json!({"order": 1042})));
    assert_eq!(observation.summary, "{\"order\":1042}");
    assert_eq!(
        observation.content_hash,
        content_hash(&json!({"order": 1042})).unwrap()
    );
    assert_eq!(observation.truncated, None);
    assert_eq!(
        h.events()[6].data,
        Some(json!({
            "tool": "read",
            "attempt": 1,
            "status": 200,
            "durationMs": 5,
            "summary": "{\"order\":1042}",
            "contentHash": observation.content_hash,
        }))
    );
    assert_eq!(
        h.writes.len(),
        2,
        "the outcome and the next step share one write"
    );
}

#[test]
fn a_non_2xx_answer_is_a_tool_error_keeping_the_body() {
    let mut h = Harness::scripted(vec![call("read", json!({})), complete(json!("ok"))]);
    h.reconcile("a");
    h.error("a", json!({"error": "no such order"}));
    let status = h.status();
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Failed);
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::ToolError);
    assert_eq!(observation.content, Some(json!({"error": "no such order"})));
    assert_eq!(observation.summary, "read failed: http_status (HTTP 500)");
    assert_words!(
        h.journal()[6..9].to_vec(),
        ["step.tool_finished@0", "step.failed@0", "step.started@1"]
    );
    assert_eq!(
        h.events()[6].data.clone().unwrap()["error"],
        json!({"failure": "http_status", "status": 500})
    );
    assert_eq!(status.phase, RunPhase::Completed, "the loop went on");
}

#[test]
fn content_that_is_not_json_is_a_tool_error_invalid_content_keeping_the_bytes() {
    let mut h = Harness::scripted(vec![call("read", json!({})), complete(json!("ok"))]);
    h.reconcile("a");
    h.finish_tool(
        "a",
        ToolOutcome::Error {
            failure: crate::api::ToolFailure::InvalidContent,
            status: Some(200),
            content: json!("<html>oops</html>"),
            duration_ms: 3,
        },
    );
    let observation = h.steps()[0].observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::ToolError);
    assert_eq!(observation.content, Some(json!("<html>oops</html>")));
    assert_eq!(
        h.events()[6].data.clone().unwrap()["error"]["failure"],
        json!("invalid_content")
    );
}

#[test]
fn an_unknown_outcome_of_a_read_only_tool_is_an_interruption_and_the_loop_goes_on() {
    let mut h = Harness::scripted(vec![call("read", json!({})), complete(json!("ok"))]);
    h.reconcile("a");
    h.unknown("a");
    let status = h.status();
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Interrupted);
    assert_eq!(
        step.observation.clone().unwrap().content,
        Some(json!({"previousStatus": "executing", "detail": "timed out after 10s"}))
    );
    assert_words!(
        h.journal()[6..10].to_vec(),
        [
            "step.interrupted@0",
            "run.resumed",
            "step.started@1",
            "step.decided@1"
        ]
    );
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"after": "interruption"})
    );
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(h.tool_calls.len(), 1, "nothing ran again");
}

#[test]
fn an_unknown_outcome_of_a_side_effect_pauses_on_an_interrupted_side_effect_approval() {
    let mut h = Harness::scripted(vec![call("write_local", json!({"n": 1}))]);
    h.reconcile("a");
    let effects = h.unknown("a");
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
    assert_eq!(h.status().phase, RunPhase::WaitingForApproval);
    assert_eq!(
        h.approval("tools-0-1")["spec"]["kind"],
        json!("interrupted_side_effect")
    );
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_successful_terminal_tool_completes_the_run_with_its_content_together_with_its_step() {
    let mut h = Harness::scripted(vec![call("finish", json!({}))]);
    h.reconcile("a");
    let effects = h.result("a", json!({"answer": 42}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.reason, Some(TerminalReason::GoalCompleted));
    assert_eq!(status.result, Some(json!({"answer": 42})));
    assert_eq!(status.steps[0].status, StepStatus::Done);
    assert_words!(h.journal_tail(2), ["step.tool_finished@0", "run.finished"]);
}

#[test]
fn a_tool_answer_that_asks_to_abort_ends_the_run_tool_abort() {
    let mut h = Harness::scripted(vec![call("read", json!({})), complete(json!(1))]);
    h.reconcile("a");
    h.finish_tool(
        "a",
        ToolOutcome::Abort {
            detail: "account frozen".into(),
            content: json!({"abort": true}),
            duration_ms: 2,
        },
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::ToolAbort));
    assert_eq!(status.reason_detail.as_deref(), Some("account frozen"));
    assert_eq!(status.steps[0].status, StepStatus::Failed);
    assert_words!(
        h.journal_tail(3),
        ["step.tool_finished@0", "step.failed@0", "run.finished"]
    );
}

#[test]
fn a_finished_tool_adds_the_steps_duration_to_active_seconds() {
    let mut h = Harness::scripted(vec![
        call("read", json!({})),
        call("read", json!({"n": 2})),
        complete(json!(1)),
    ]);
    h.reconcile("a");
    h.advance(3);
    h.result("a", json!(1));
    h.advance_millis(1500);
    h.error("a", json!("x"));
    assert_eq!(h.status().active_seconds, 4.5);
    assert_eq!(h.events()[6].data.clone().unwrap()["durationMs"], json!(5));
}

#[test]
fn content_over_the_step_budget_is_cut_keeping_its_size_and_sha256() {
    let mut h = Harness::scripted(vec![call("read", json!({})), complete(json!(1))]);
    h.budgets.step_content_bytes = 1024;
    h.reconcile("a");
    let big = json!({"text": "x".repeat(10_000)});
    let full_hash = content_hash(&big).unwrap();
    h.result("a", big.clone());
    let observation = h.steps()[0].observation.clone().unwrap();
    assert_eq!(observation.content_hash, full_hash);
    assert_eq!(
        observation.truncated,
        Some(Truncation {
            original_bytes: serde_json::to_string(&big).unwrap().len() as i64,
            sha256: full_hash.clone(),
        })
    );
    let kept = serde_json::to_string(observation.content.as_ref().unwrap()).unwrap();
    assert!(kept.len() <= 1024, "{} bytes kept", kept.len());
    assert_eq!(observation.content.unwrap()["truncated"], json!(true));
}

#[test]
fn a_tool_outcome_applied_again_changes_nothing() {
    let mut h = Harness::scripted(vec![call("read", json!({})), call("read", json!({"n": 1}))]);
    h.reconcile("a");
    h.result("a", json!(1));
    let before = h.run.status.clone();
    let effects = h.step(
        "a",
        Input::ToolFinished {
            step: StepIndex(0),
            attempt: 1,
            outcome: ToolOutcome::Result {
                status: 200,
                content: json!(1),
                duration_ms: 5,
            },
        },
    );
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert_eq!(h.run.status, before);
    assert_eq!(h.tool_calls.len(), 2, "step 1 is not started again");
}

#[test]
fn a_tool_outcome_for_a_step_that_does_not_exist_is_refused() {
    let mut h = Harness::scripted(vec![call("read", json!({}))]);
    h.reconcile("a");
    let result = crate::engine::step(
        &h.run,
        &[],
        &crate::engine::Caller {
            holder: "a".into(),
            now: h.now,
            draining: false,
            admin: Default::default(),
        },
        &h.budgets,
        Input::ToolFinished {
            step: StepIndex(7),
            attempt: 1,
            outcome: ToolOutcome::Unknown {
                detail: String::new(),
                duration_ms: 0,
            },
        },
    );
    assert!(result.is_err());
}

#[test]
fn a_draining_replica_records_the_outcome_and_starts_nothing_further() {
    // Two LocalMutation calls: a graceful shutdown after the first must not record the second
    // as started, or the next holder would ask a person about a call that never happened.
    let mut h = Harness::scripted(vec![
        call("write_local", json!({"n": 1})),
        call("write_local", json!({"n": 2})),
        complete(json!("ok")),
    ]);
    h.reconcile("a");
    h.draining = true;
    let effects = h.result("a", json!({"written": 1}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let steps = h.steps();
    assert_eq!(steps.len(), 1, "no second step was started");
    assert_eq!(steps[0].status, StepStatus::Done);
    assert_words!(h.journal_tail(1), ["step.tool_finished@0"]);
    assert!(h.lease.is_none(), "the lease was released");
    // The next holder finds nothing in flight: it takes over and calls the second tool
    // without pausing on an approval.
    h.draining = false;
    let effects = h.reconcile("b");
    assert!(
        kinds(&effects).iter().any(|k| k.starts_with("CallTool")),
        "{:?}",
        kinds(&effects)
    );
    assert!(
        h.approvals.is_empty(),
        "no interrupted_side_effect approval"
    );
    // The released Lease names nobody; the takeover still names the previous holder.
    assert_eq!(h.last_event("lease.taken_over")["previousHolder"], "a");
    assert!(!h.journal().contains(&"step.interrupted@1".to_string()));
}
