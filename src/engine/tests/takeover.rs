//! docs/behaviours.md 30-40: leases, takeovers, interrupted side effects and the reconcile hook.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{ObservationKind, RunPhase, StepStatus, TerminalReason};
use crate::engine::{Input, LeaseView, PreviousHolder, INTERRUPTED_NOTICE};

/// A run of the `tools` fixture whose holder `a` is executing `tool` on step 0.
fn executing(tool: &str) -> Harness {
    let mut h = Harness::scripted(vec![call(tool, json!({"n": 1})), complete(json!("ok"))]);
    h.reconcile("a");
    assert_eq!(h.steps()[0].status, StepStatus::Executing);
    h
}

#[test]
fn resume_of_a_live_run_changes_nothing() {
    let mut h = executing("write_local");
    h.advance(10);
    let before = h.run.status.clone();
    for holder in ["b", "a"] {
        let effects = h.reconcile(holder);
        assert_effects!(effects, ["RequeueAfter(20000)"]);
    }
    assert_eq!(h.run.status, before);
    assert_eq!(h.tool_calls.len(), 1);
}

/// The Lease of `h` as a replica sees it that first saw it as it is `unchanged_for_ms` ago and
/// judges with a 500 ms margin.
fn seen(h: &Harness, unchanged_for_ms: u64) -> LeaseView {
    LeaseView {
        unchanged_for_ms,
        takeover_margin_ms: 500,
        ..h.lease_view()
    }
}

#[test]
fn a_lease_first_seen_waits_a_full_duration() {
    let mut h = executing("write_local");
    // By the observer's clock the holder's renewTime is an hour old: it does not matter.
    h.advance(3600);
    let effects = h.decide("b", Observe { lease: seen(&h, 0) });
    assert_effects!(effects, ["RequeueAfter(30500)"]);
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_lease_seen_changing_is_never_expired() {
    let mut h = executing("write_local");
    // Renewed every 10 s: each renewal is first seen as it lands, so the observation never
    // ages past 10 s, whether the observer's clock runs an hour ahead or an hour behind.
    for skew in [3600, -7200] {
        h.advance(skew);
        for unchanged_for_ms in [0, 5_000, 10_000] {
            let effects = h.decide(
                "b",
                Observe {
                    lease: seen(&h, unchanged_for_ms),
                },
            );
            assert_effects!(
                effects,
                [format!("RequeueAfter({})", 30_500 - unchanged_for_ms).as_str()],
                "skew {skew} s, unchanged for {unchanged_for_ms} ms"
            );
        }
    }
}

#[test]
fn a_lease_seen_unchanged_for_its_duration_and_margin_is_taken_over() {
    let mut h = executing("write_local");
    let expiry = h.now.plus_seconds(30);
    // The observer's clock runs an hour behind the holder's: the renewTime looks like the
    // future, and the Lease is taken all the same once it stopped changing.
    h.advance(-3600);
    let effects = h.decide(
        "b",
        Observe {
            lease: seen(&h, 30_499),
        },
    );
    assert_effects!(effects, ["RequeueAfter(1)"]);
    let effects = h.decide(
        "b",
        Observe {
            lease: seen(&h, 30_500),
        },
    );
    assert_effects!(effects, ["AcquireLease(takeover)"]);
    // previousExpiry records what the Lease claimed, by its holder's clock.
    assert!(effects.contains(&Effect::AcquireLease {
        takeover: Some(PreviousHolder {
            holder: Some("a".into()),
            expired_at: Some(expiry),
            // When the observer first saw the Lease, plus its duration, by the observer's clock.
            stopped_by: Some(
                crate::api::Time::from_millis(h.now.as_millis() - 30_500).plus_seconds(30)
            ),
        })
    }));
}

#[test]
fn a_takeover_marks_in_flight_steps_interrupted_with_lease_taken_over_in_one_write() {
    let mut h = executing("read");
    let expiry = h.now.plus_seconds(30);
    h.expire_lease();
    let observed = h.decide(
        "b",
        Observe {
            lease: h.lease_view(),
        },
    );
    assert_effects!(observed, ["AcquireLease(takeover)"]);
    let before = h.events().len();
    let writes = h.writes.len();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    assert_eq!(h.writes.len(), writes + 1);
    assert_words!(
        h.journal_from(before),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "run.resumed",
            "step.started@1",
            "step.decided@1",
            "run.finished"
        ]
    );
    assert_eq!(
        h.last_event("lease.taken_over"),
        // The harness's observer first saw the Lease at its renewal: the holder started
        // nothing after renewTime + duration, by the taker's clock.
        json!({"previousHolder": "a", "previousExpiry": expiry, "previousStoppedBy": expiry,
               "holder": "b", "epoch": 2})
    );
    assert_eq!(
        h.last_event("step.interrupted"),
        json!({"previousStatus": "executing"})
    );
    let status = h.status();
    assert_eq!(
        status.lease.as_ref().map(|l| (l.holder.as_str(), l.epoch)),
        Some(("b", 2))
    );
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Interrupted);
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::Interrupted);
    assert_eq!(
        observation.content,
        Some(json!({"previousStatus": "executing"}))
    );
    assert_eq!(
        status.phase,
        RunPhase::Completed,
        "the loop went on to complete"
    );
}

#[test]
fn of_two_replicas_taking_over_one_wins_and_the_other_changes_nothing() {
    let mut h = executing("write_local");
    h.expire_lease();
    h.reconcile("b");
    let after_b = h.run.status.clone();
    let effects = h.reconcile("c");
    assert!(
        effects.is_empty(),
        "a waiting run: c sees the pause: {effects:?}"
    );
    assert_eq!(h.run.status, after_b);
    // The deposed holder's late outcome is not recorded as the step's outcome.
    let effects = h.step(
        "a",
        Input::ToolFinished {
            step: StepIndex(0),
            attempt: 1,
            outcome: crate::engine::ToolOutcome::Result {
                status: 200,
                content: json!(1),
                duration_ms: 1,
            },
        },
    );
    assert_effects!(effects, ["Stop"]);
    assert_eq!(h.run.status, after_b);
}

#[test]
fn the_loser_of_the_lease_race_gets_no_lease_acquired_and_writes_nothing() {
    let mut h = executing("read");
    h.expire_lease();
    let lease = h.lease_view();
    // Both observe the expired lease; b wins the Lease first.
    let b = h.decide(
        "b",
        Observe {
            lease: lease.clone(),
        },
    );
    let c = h.decide("c", Observe { lease });
    assert_eq!(kinds(&b), kinds(&c));
    assert!(h.win_lease("b"));
    assert!(
        !h.win_lease("c"),
        "the Lease's compare-and-set lets one win"
    );
}

#[test]
fn taking_over_ones_own_expired_lease_is_recorded_as_a_takeover() {
    let mut h = executing("read");
    h.expire_lease();
    h.reconcile("a");
    let taken = h.last_event("lease.taken_over");
    assert_eq!(taken["previousHolder"], json!("a"));
    assert_eq!(taken["holder"], json!("a"));
    assert_eq!(h.status().lease.unwrap().epoch, 2);
    // Applied again (the write's answer was lost): no second takeover.
    let before = h.run.status.clone();
    let effects = h.step(
        "a",
        Input::LeaseAcquired {
            takeover: Some(previous(
                "a",
                serde_json::from_value(taken["previousExpiry"].clone()).unwrap(),
            )),
        },
    );
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert_eq!(h.run.status, before);
}

#[test]
fn acquiring_renewing_and_releasing_write_no_events() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    h.result("a", json!({}));
    let journal = h.journal();
    assert!(h.lease.is_none(), "released at the pause");
    assert!(
        !journal.iter().any(|w| w.starts_with("lease.")),
        "{journal:?}"
    );
}

#[test]
fn a_loop_that_lost_its_lease_stops_and_records_nothing() {
    let mut h = executing("write_local");
    let before = h.run.status.clone();
    let effects = h.step("a", Input::LeaseLost);
    assert_effects!(effects, ["Stop"]);
    assert_eq!(h.run.status, before);
}

#[test]
fn interrupted_side_effect_waits_for_an_operator() {
    let mut h = executing("write_local");
    h.expire_lease();
    let effects = h.reconcile("b");
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
    assert_eq!(h.tool_calls.len(), 1, "nothing is re-run");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::AwaitingApproval);
    assert_eq!(
        step.observation.clone().unwrap().content,
        Some(json!({"previousStatus": "executing"}))
    );
    let spec = &h.approval("tools-0-1")["spec"];
    assert_eq!(spec["kind"], json!("interrupted_side_effect"));
    assert_eq!(
        spec["presentation"],
        json!({
            "tool": "write_local",
            "args": {"n": 1},
            "sideEffect": "LocalMutation",
            "notice": INTERRUPTED_NOTICE,
            // Started at T0 by the first holder; taken over at T0 + 30 s (the taker's clock
            // says the holder stopped by then); the tool's timeout is 10 s.
            "firstAttempt": {
                "attempt": 1,
                "startedAt": "2026-01-01T00:00:00.000Z",
                "mayRunUntil": "2026-01-01T00:00:40.000Z",
                "idempotencyKey": "uid-1/0",
            },
        })
    );
    let waiting = status
        .conditions
        .iter()
        .find(|c| c.type_ == "WaitingForApproval");
    assert!(
        waiting.is_some_and(|c| c.message.contains("may run until 2026-01-01T00:00:40.000Z")),
        "the condition says until when: {waiting:?}"
    );
    assert!(INTERRUPTED_NOTICE.contains("unknown"));
    assert_eq!(
        h.last_event("approval.requested")["origin"],
        json!("interruption")
    );
    assert_words!(
        h.journal_tail(3),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "approval.requested@0"
        ]
    );
}

#[test]
fn approving_an_interrupted_side_effect_runs_the_same_request_once_more_on_the_same_step() {
    let mut h = executing("write_local");
    h.expire_lease();
    h.reconcile("b");
    h.approve("tools-0-1");
    // Approved at once: the first attempt may run until takeover + timeout (10 s), so an
    // observer marks the grant and waits that out, asking for no lease.
    let effects = h.reconcile("c");
    assert_effects!(
        effects,
        [
            "WriteApprovalStatus(tools-0-1:Approved)",
            "RequeueAfter(10000)"
        ]
    );
    assert_eq!(h.tool_calls.len(), 1);
    h.advance(10);
    let effects = h.reconcile("c");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(tools-0-1:Executed)",
            "CallTool(write_local#2)"
        ]
    );
    let first = &h.tool_calls[0];
    let again = &h.tool_calls[1];
    assert_eq!((again.step, &again.args), (first.step, &first.args));
    assert_eq!(again.idempotency_key, first.idempotency_key);
    h.result("c", json!({"ok": true}));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.steps[0].status, StepStatus::Done);
    assert_eq!(h.tool_calls.len(), 2);
}

#[test]
fn rejecting_an_interrupted_side_effect_cancels_the_run_without_calling_the_tool() {
    let mut h = executing("write_local");
    h.expire_lease();
    h.reconcile("b");
    h.reject("tools-0-1", "it already ran");
    h.reconcile("c");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.reason, Some(TerminalReason::ApprovalRejected));
    assert_eq!(status.reason_detail.as_deref(), Some("it already ran"));
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn an_interrupted_call_whose_args_now_fail_the_schema_fails_reconcile_conflict() {
    let mut h = executing("write_local");
    h.spec_mut().tools[1].input_schema = json!({"type": "object", "required": ["zzz"]});
    h.expire_lease();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ReconcileConflict));
    assert!(h.approvals.is_empty());
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn an_interrupted_read_only_step_does_not_pause_and_the_agent_sees_the_interruption() {
    let mut h = executing("read");
    h.expire_lease();
    h.reconcile("b");
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"after": "interruption"})
    );
    assert!(h.approvals.is_empty());
    assert_eq!(h.steps()[0].status, StepStatus::Interrupted);
    assert_eq!(h.status().phase, RunPhase::Completed);
}

fn webhook_without_hook() -> Harness {
    let mut h = Harness::new(WEBHOOK);
    h.spec_mut().reconcile = None;
    h
}

#[test]
fn an_interrupted_deciding_step_does_not_pause_and_the_agent_decides_again() {
    let mut h = webhook_without_hook();
    h.reconcile("a");
    assert_eq!(h.steps()[0].status, StepStatus::Deciding);
    h.expire_lease();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "CallAgent(1)"]);
    assert_words!(
        h.journal_tail(4),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "run.resumed",
            "step.started@1"
        ]
    );
    let (_, request) = h.pending_agent.clone().unwrap();
    assert_eq!(
        request["steps"][0]["observation"]["kind"],
        json!("interrupted")
    );
    assert_eq!(
        request["steps"][0]["observation"]["content"],
        json!({"previousStatus": "deciding"})
    );
}

#[test]
fn a_takeover_with_nothing_in_flight_resumes_the_loop() {
    let mut h = webhook_without_hook();
    h.reconcile("a");
    h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(call("send", json!({"n": "bad"}))),
        },
    );
    // Step 0 failed invalid_decision and step 1 is deciding: a takeover interrupts step 1 only.
    h.expire_lease();
    h.reconcile("b");
    let steps = h.steps();
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert_eq!(steps[1].status, StepStatus::Interrupted);
}

/// A hook run whose step 0 is executing `send` under holder `a`.
fn hooked_executing() -> Harness {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(call("send", json!({"n": 1}))),
        },
    );
    assert_eq!(h.tool_calls.len(), 1);
    h
}

#[test]
fn a_takeover_that_died_before_pausing_leaves_the_step_for_the_next_takeover() {
    let mut h = hooked_executing();
    h.expire_lease();
    // b marks the step interrupted and asks the hook, then dies.
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "CallReconcileHook"]);
    assert_eq!(h.steps()[0].status, StepStatus::Interrupted);
    // c, still with the hook: asks it again about the same step.
    h.expire_lease();
    let effects = h.reconcile("c");
    assert_effects!(effects, ["WriteStatus", "CallReconcileHook"]);
    assert_eq!(h.pending_hook.clone().unwrap()["interruptedStep"], json!(0));
    // d, after the hook was removed from the spec: pauses the step whose outcome is unknown.
    h.spec_mut().reconcile = None;
    h.expire_lease();
    let effects = h.reconcile("d");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(hooked-0-1)",
            "WriteApprovalStatus(hooked-0-1:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    assert_eq!(
        h.approval("hooked-0-1")["spec"]["kind"],
        json!("interrupted_side_effect")
    );
    assert_eq!(h.tool_calls.len(), 1);
}

/// The hook run taken over by `b`, the hook's answer awaited.
fn hook_asked() -> Harness {
    let mut h = hooked_executing();
    h.expire_lease();
    h.reconcile("b");
    h
}

fn answer(h: &mut Harness, reconciliation: Result<Value, String>) -> Vec<String> {
    let effects = h.step(
        "b",
        Input::Reconciled {
            answer: reconciliation,
        },
    );
    kinds(&effects)
}

#[test]
fn the_reconcile_hook_receives_the_run_its_steps_and_its_approvals() {
    let h = hook_asked();
    let view = h.pending_hook.clone().unwrap();
    assert_eq!(
        view["run"],
        json!({"namespace": "default", "name": "hooked", "uid": "uid-1"})
    );
    assert_eq!(view["spec"]["goal"], json!("Send a message once."));
    assert_eq!(view["steps"][0]["status"], json!("interrupted"));
    assert_eq!(view["steps"][0]["decision"]["tool"], json!("send"));
    assert_eq!(view["approvals"], json!([]));
    assert_eq!(view["interruptedStep"], json!(0));
}

#[test]
fn reconcile_continue_proceeds_and_the_agent_sees_the_interruption() {
    let mut h = hook_asked();
    let effects = answer(&mut h, Ok(json!({"outcome": "continue"})));
    assert_words!(effects, ["WriteStatus", "CallAgent(1)"]);
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"after": "interruption", "reconciliation": "continue"})
    );
    assert_eq!(h.tool_calls.len(), 1);
    // The same answer again changes nothing.
    let before = h.run.status.clone();
    answer(&mut h, Ok(json!({"outcome": "continue"})));
    assert_eq!(h.run.status, before);
}

#[test]
fn reconcile_completed_ends_the_run_completed_with_its_json_result() {
    let mut h = hook_asked();
    let effects = answer(
        &mut h,
        Ok(json!({"outcome": "completed", "result": {"sent": 1}})),
    );
    assert_words!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.result, Some(json!({"sent": 1})));
}

#[test]
fn reconcile_conflict_ends_the_run_reconcile_conflict_with_its_detail() {
    let mut h = hook_asked();
    answer(
        &mut h,
        Ok(json!({"outcome": "conflict", "detail": "sent twice upstream"})),
    );
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ReconcileConflict));
    assert_eq!(status.reason_detail.as_deref(), Some("sent twice upstream"));
}

#[test]
fn reconcile_waiting_pauses_the_interrupted_call_on_the_supplied_decision() {
    let mut h = hook_asked();
    let pause = json!({
        "decision": "require_approval",
        "kind": "verify-send",
        "reason": "check the outbox first",
        "presentation": {"outbox": "https://example.com/outbox"},
    });
    let effects = answer(&mut h, Ok(json!({"outcome": "waiting", "pause": pause})));
    assert_words!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(hooked-0-1)",
            "WriteApprovalStatus(hooked-0-1:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    let spec = h.approval("hooked-0-1")["spec"].clone();
    assert_eq!(spec["kind"], json!("verify-send"));
    assert_eq!(spec["reason"], json!("check the outbox first"));
    assert_eq!(spec["request"]["args"], json!({"n": 1}));
    h.approve("hooked-0-1");
    h.advance(10);
    let effects = h.reconcile("c");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(hooked-0-1:Executed)",
            "CallTool(send#2)"
        ]
    );
}

fn assert_ends(h: &Harness, reason: TerminalReason) {
    let status = h.status();
    assert_eq!(status.reason, Some(reason), "{:?}", status.reason_detail);
    assert!(h.approvals.is_empty());
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn reconcile_waiting_without_a_pause_fails_reconcile_conflict() {
    let mut h = hook_asked();
    answer(&mut h, Ok(json!({"outcome": "waiting"})));
    assert_ends(&h, TerminalReason::ReconcileConflict);
}

#[test]
fn reconcile_waiting_for_a_call_that_no_longer_checks_ends_the_step_invalid_then_conflict() {
    let mut h = hook_asked();
    h.spec_mut().tools[0].input_schema = json!({"type": "object", "required": ["zzz"]});
    answer(
        &mut h,
        Ok(json!({"outcome": "waiting", "pause": {"decision": "require_approval"}})),
    );
    assert_ends(&h, TerminalReason::ReconcileConflict);
    let step = &h.steps()[0];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.as_ref().unwrap().kind,
        ObservationKind::InvalidDecision
    );
}

#[test]
fn reconcile_waiting_for_a_step_that_was_deciding_fails_reconcile_conflict() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    h.expire_lease();
    h.reconcile("b");
    answer(
        &mut h,
        Ok(json!({"outcome": "waiting", "pause": {"decision": "require_approval"}})),
    );
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ReconcileConflict));
}

#[test]
fn a_pause_that_is_not_require_approval_fails_internal_error() {
    let mut h = hook_asked();
    answer(
        &mut h,
        Ok(json!({"outcome": "waiting", "pause": {"decision": "allow"}})),
    );
    assert_ends(&h, TerminalReason::InternalError);
}

#[test]
fn an_unknown_reconciliation_outcome_fails_internal_error() {
    let mut h = hook_asked();
    answer(&mut h, Ok(json!({"outcome": "retry"})));
    assert_ends(&h, TerminalReason::InternalError);
}

#[test]
fn a_hook_failure_fails_internal_error() {
    let mut h = hook_asked();
    answer(&mut h, Err("HTTP 500 after 3 attempts".into()));
    assert_ends(&h, TerminalReason::InternalError);
    assert!(h.status().reason_detail.unwrap().contains("HTTP 500"));
}

#[test]
fn a_completed_reconciliation_without_a_json_result_fails_internal_error() {
    let mut h = hook_asked();
    answer(&mut h, Ok(json!({"outcome": "completed"})));
    assert_ends(&h, TerminalReason::InternalError);
}

/// An `interrupted_side_effect` Approval of `executing("write_local")` taken over by `b`.
fn interrupted_send() -> Harness {
    let mut h = executing("write_local");
    h.expire_lease();
    h.reconcile("b");
    assert_eq!(h.status().phase, RunPhase::WaitingForApproval);
    h
}

fn settle(h: &mut Harness, verdict: &str, result: Option<Value>) {
    h.decide_approval("tools-0-1", verdict, None);
    if let Some(result) = result {
        h.approvals.get_mut("tools-0-1").unwrap()["spec"]["decision"]["result"] = result;
    }
}

#[test]
fn took_effect_records_the_given_result_as_the_steps_outcome_and_runs_nothing() {
    let mut h = interrupted_send();
    settle(&mut h, "TookEffect", Some(json!({"ticket": "closed"})));
    // No wait: nothing runs.
    h.reconcile("c");
    let status = h.status();
    assert_eq!(h.tool_calls.len(), 1, "the tool is not called again");
    assert_eq!(status.phase, RunPhase::Completed);
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Done);
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::ToolResult);
    assert_eq!(observation.content, Some(json!({"ticket": "closed"})));
    assert!(step.approvals[0].executed, "the decision is spent once");
    let finished = h.last_event("step.tool_finished");
    assert_eq!(
        finished["settledBy"],
        json!({"approval": "tools-0-1", "verdict": "TookEffect", "approver": "alice"})
    );
    assert_eq!(h.approval("tools-0-1")["status"]["phase"], json!("Settled"));
}

#[test]
fn did_not_take_effect_waits_out_the_first_attempt_then_the_agent_sees_it_not_executed() {
    let mut h = interrupted_send();
    settle(&mut h, "DidNotTakeEffect", None);
    let effects = h.reconcile("c");
    assert_effects!(effects, ["RequeueAfter(10000)"]);
    h.advance(10);
    h.reconcile("c");
    let status = h.status();
    assert_eq!(h.tool_calls.len(), 1, "the tool is not called again");
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Interrupted);
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::Interrupted);
    assert_eq!(
        observation.content.as_ref().unwrap()["executed"],
        json!(false)
    );
    assert!(observation.summary.contains("did not take effect"));
    // The agent was asked again (its next decision completes the run).
    assert_eq!(status.steps.len(), 2);
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(h.approval("tools-0-1")["status"]["phase"], json!("Settled"));
}

#[test]
fn a_rerun_waits_for_the_takers_bound_when_the_first_holders_clock_was_behind() {
    // The first holder's clock ran an hour behind: its recorded start says the attempt ended
    // long ago. The taker's own bound (when it first saw the Lease, plus its duration) holds.
    let mut h = Harness::scripted(vec![
        call("write_local", json!({"n": 1})),
        complete(json!("ok")),
    ]);
    h.advance(-3600);
    h.reconcile("a");
    h.advance(3600);
    // `b` has seen the Lease unchanged for its duration and margin, on its own clock.
    let effects = h.step(
        "b",
        Observe {
            lease: seen(&h, 31_000),
        },
    );
    let takeover = effects.iter().find_map(|e| match e {
        Effect::AcquireLease { takeover } => Some(takeover.clone()),
        _ => None,
    });
    assert!(h.win_lease("b"));
    h.step(
        "b",
        Input::LeaseAcquired {
            takeover: takeover.expect("asks for the lease"),
        },
    );
    h.approve("tools-0-1");
    let effects = h.reconcile("c");
    // The holder stopped starting anything by 1 s ago (first seen 31 s ago + 30 s), so the
    // attempt may run 9 s more, whatever its recorded start says.
    assert_effects!(
        effects,
        [
            "WriteApprovalStatus(tools-0-1:Approved)",
            "RequeueAfter(9000)"
        ]
    );
    assert_eq!(h.tool_calls.len(), 1);
    h.advance_millis(9_000);
    h.reconcile("c");
    assert_eq!(
        h.tool_calls.len(),
        2,
        "the re-run starts once the first attempt is over"
    );
}
