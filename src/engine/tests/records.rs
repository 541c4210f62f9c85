//! docs/behaviours.md 41-44 and 49-50: records that will not decode, cancel, the journal, the
//! object budget; and the Kubernetes Events projected from the journal.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{RunPhase, StepStatus, TerminalReason};
use crate::engine::{kube_events, Input, KubeEventType, ToolOutcome};

fn executing(tool: &str) -> Harness {
    let mut h = Harness::scripted(vec![call(tool, json!({"n": 1})), complete(json!("ok"))]);
    h.reconcile("a");
    h
}

fn result_input(content: Value) -> Input {
    Input::ToolFinished {
        step: StepIndex(0),
        attempt: 1,
        outcome: ToolOutcome::Result {
            status: 200,
            content,
            duration_ms: 7,
        },
    }
}

/// Everything but the fields a terminal patch may touch.
fn without_terminal_fields(status: &Value) -> Value {
    let mut status = status.clone();
    for field in ["phase", "reason", "reasonDetail", "finishedAt", "events"] {
        status.as_object_mut().unwrap().remove(field);
    }
    status
}

#[test]
fn a_step_that_will_not_decode_fails_the_run_internal_error_without_rewriting_it() {
    let mut h = executing("write_local");
    h.run.status["steps"][0]["status"] = json!("teleporting");
    let stored = h.run.status.clone();
    let effects = h.step("a", result_input(json!(1)));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let written = &h.run.status;
    assert_eq!(
        without_terminal_fields(written),
        without_terminal_fields(&stored)
    );
    assert_eq!(written["phase"], json!("Failed"));
    assert_eq!(written["reason"], json!("internal_error"));
    let detail = written["reasonDetail"].as_str().unwrap();
    assert!(
        detail.contains("status.steps[0] does not decode"),
        "{detail}"
    );
    assert_eq!(written["finishedAt"], json!(h.now));
    let events = written["events"].as_array().unwrap();
    assert_eq!(events.len(), stored["events"].as_array().unwrap().len() + 1);
    assert_eq!(events.last().unwrap()["type"], json!("run.finished"));
    assert_eq!(
        events.last().unwrap()["seq"],
        json!(events.len()),
        "seq continues without a gap"
    );
    // The run can still be listed: a terminal undecodable run is left alone.
    assert!(h.reconcile("b").is_empty());
}

#[test]
fn an_undecodable_journal_gets_no_event_it_cannot_encode() {
    let mut h = executing("write_local");
    h.run.status["events"][0]["seq"] = json!("one");
    let stored = h.run.status.clone();
    h.expire_lease();
    h.reconcile("b");
    assert_eq!(h.run.status["events"], stored["events"]);
    assert_eq!(h.run.status["reason"], json!("internal_error"));
}

#[test]
fn an_undecodable_run_held_by_a_live_lease_is_left_to_its_holder() {
    let mut h = executing("write_local");
    h.run.status["steps"][0]["status"] = json!(7);
    let stored = h.run.status.clone();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["RequeueAfter(30000)"]);
    assert_eq!(h.run.status, stored);
}

#[test]
fn an_undecodable_run_can_still_be_cancelled() {
    let mut h = executing("write_local");
    h.run.status["steps"][0]["status"] = json!("teleporting");
    let stored = h.run.status.clone();
    h.spec_mut().cancel = true;
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus"]);
    assert_eq!(h.run.status["phase"], json!("Cancelled"));
    assert_eq!(h.run.status["reason"], json!("operator_cancelled"));
    assert_eq!(h.run.status["steps"], stored["steps"]);
}

#[test]
fn an_approval_that_will_not_decode_fails_the_run_internal_error_and_is_not_rewritten() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    h.result("a", json!({}));
    let name = "refund-1042-1-1";
    h.approvals.get_mut(name).unwrap()["spec"]["request"] = json!(5);
    let object = h.approval(name).clone();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::InternalError));
    assert!(status.reason_detail.unwrap().contains("does not decode"));
    assert_eq!(h.approval(name), &object);
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn cancel_needs_no_lease_and_fails_every_step_in_flight() {
    let mut h = executing("write_local");
    h.spec_mut().cancel = true;
    let lease_before = h.lease.clone().map(|l| l.holder);
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus"]);
    assert_eq!(
        h.lease.clone().map(|l| l.holder),
        lease_before,
        "no lease taken"
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.reason, Some(TerminalReason::OperatorCancelled));
    assert_eq!(
        (
            status.conditions[0].type_.as_str(),
            status.conditions[0].reason.as_str()
        ),
        ("Ready", "OperatorCancelled"),
        "the record says operator_cancelled, its condition OperatorCancelled"
    );
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.clone().unwrap().content,
        Some(json!({"previousStatus": "executing"}))
    );
    assert_words!(h.journal_tail(2), ["step.failed@0", "run.finished"]);
    assert_eq!(
        h.last_event("run.finished"),
        json!({"phase": "Cancelled", "reason": "operator_cancelled"})
    );
    assert!(h.reconcile("b").is_empty(), "done once");
}

#[test]
fn cancel_ends_a_pending_approval_cancelled_with_the_runs_reason() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    h.result("a", json!({}));
    let before = h.approval("refund-1042-1-1").clone();
    h.spec_mut().cancel = true;
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Cancelled)"
        ]
    );
    let after = h.approval("refund-1042-1-1");
    assert_eq!(after["spec"], before["spec"], "the spec is never touched");
    assert_eq!(after["status"]["phase"], "Cancelled");
    assert_eq!(after["status"]["reason"], "run cancelled");
    assert_eq!(after["status"]["shortHash"], before["status"]["shortHash"]);
    assert!(
        h.reconcile("c").is_empty(),
        "a terminal run changes nothing more"
    );
    let step = &h.steps()[1];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.clone().unwrap().content,
        Some(json!({"previousStatus": "awaiting_approval"}))
    );
}

#[test]
fn cancel_of_a_new_run_ends_it_before_any_step() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().cancel = true;
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert!(status.steps.is_empty());
    assert_words!(h.journal(), ["run.finished"]);
}

#[test]
fn a_terminal_run_is_left_unchanged_by_cancel() {
    let mut h = Harness::scripted(vec![complete(json!(1))]);
    h.reconcile("a");
    let before = h.run.status.clone();
    h.spec_mut().cancel = true;
    assert!(h.reconcile("b").is_empty());
    assert_eq!(h.run.status, before);
}

#[test]
fn a_live_loop_finds_the_cancellation_at_its_next_write_and_stops() {
    let mut h = executing("write_local");
    h.spec_mut().cancel = true;
    let effects = h.step("a", result_input(json!({"done": true})));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.steps[0].status, StepStatus::Failed);
    assert_words!(
        h.journal_tail(3),
        ["step.failed@0", "run.finished", "step.tool_finished@0"]
    );
    assert_eq!(h.last_event("step.tool_finished")["late"], json!(true));
}

#[test]
fn a_tool_that_returns_after_cancel_has_its_outcome_appended_late() {
    let mut h = executing("write_local");
    h.spec_mut().cancel = true;
    h.reconcile("b");
    let cancelled = h.status();
    let effects = h.step("a", result_input(json!({"done": true})));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(
        status.steps, cancelled.steps,
        "the step keeps what cancel wrote"
    );
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.reason, cancelled.reason);
    assert_words!(h.journal_tail(2), ["run.finished", "step.tool_finished@0"]);
    let late = h.last_event("step.tool_finished");
    assert_eq!(late["late"], json!(true));
    assert_eq!(late["tool"], json!("write_local"));
    assert_eq!(late["durationMs"], json!(7));
    assert_eq!(late["observation"]["kind"], json!("tool_result"));
    assert_eq!(late["observation"]["content"], json!({"done": true}));
    let before = h.run.status.clone();
    let effects = h.step("a", result_input(json!({"done": true})));
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert_eq!(h.run.status, before, "appended once");
}

#[test]
fn events_are_numbered_without_gaps_and_written_with_their_state() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    h.result("a", json!({"order": 1042}));
    h.approve("refund-1042-1-1");
    h.reconcile("b");
    h.result("b", json!({"refunded": 250}));
    assert_eq!(h.status().phase, RunPhase::Completed);
    let mut previous: Vec<Value> = Vec::new();
    for write in &h.writes {
        let events = write["events"].as_array().unwrap().clone();
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event["seq"], json!(i + 1));
        }
        assert_eq!(
            events[..previous.len()].to_vec(),
            previous,
            "history is never rewritten"
        );
        assert!(
            events.len() > previous.len(),
            "every write records what changed"
        );
        previous = events;
    }
}

#[test]
fn a_record_over_the_object_budget_fails_record_too_large_in_a_write_that_fits() {
    let mut h = Harness::scripted((0..40).map(|i| call("read", json!({"n": i}))).collect());
    h.budgets.object_bytes = 24 * 1024;
    h.reconcile("a");
    let mut steps = 0;
    loop {
        let effects = h.result("a", json!({"text": "y".repeat(2000)}));
        steps += 1;
        if !kinds(&effects).iter().any(|k| k.starts_with("CallTool")) {
            assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
            break;
        }
        assert!(steps < 40, "the budget never fired");
    }
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::RecordTooLarge));
    // The detail measures the same thing the budget bounds (the whole object), and the
    // number it prints is over the budget it names.
    let detail = status.reason_detail.clone().unwrap();
    let measured: usize = detail
        .split("the object would be ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no object size in {detail:?}"));
    assert!(measured > h.budgets.object_bytes, "{detail}");
    assert!(
        detail.contains(&format!(
            "over the object budget of {} bytes",
            h.budgets.object_bytes
        )),
        "{detail}"
    );
    let last = status.steps.last().unwrap();
    assert_eq!(last.status, StepStatus::Failed, "nothing is left executing");
    let failed = format!("step.failed@{}", last.index);
    assert_eq!(h.journal_tail(2), vec![failed, "run.finished".to_string()]);
    for write in &h.writes {
        let bytes = serde_json::to_vec(write).unwrap().len()
            + serde_json::to_vec(&*h.run.spec).unwrap().len();
        assert!(bytes <= h.budgets.object_bytes, "{bytes} bytes written");
    }
}

/// Steps of 2,000-byte answers of `text` a run takes before its record would outgrow a 24 KiB
/// object budget, with `metadata_bytes` of metadata read with the run; and the harness.
fn steps_until_too_large(text: &str, metadata_bytes: usize) -> (usize, Harness) {
    let mut h = Harness::scripted((0..40).map(|i| call("read", json!({"n": i}))).collect());
    h.budgets.object_bytes = 24 * 1024;
    h.run.metadata_bytes = metadata_bytes;
    h.reconcile("a");
    let mut steps = 0;
    loop {
        let effects = h.result("a", json!({ "text": text.repeat(2000) }));
        steps += 1;
        if !kinds(&effects).iter().any(|k| k.starts_with("CallTool")) {
            assert_eq!(h.status().reason, Some(TerminalReason::RecordTooLarge));
            return (steps, h);
        }
        assert!(steps < 40, "the budget never fired");
    }
}

#[test]
fn the_object_budget_counts_the_escapes_the_api_server_writes_and_the_metadata_read() {
    // kube-apiserver writes `<` as `\u003c`: six bytes each in what etcd is sent.
    let (plain, _) = steps_until_too_large("y", 0);
    let (html, h) = steps_until_too_large("<", 0);
    assert!(html < plain, "{html} steps of HTML, {plain} of plain text");
    let spec = serde_json::to_vec(&*h.run.spec).unwrap().len();
    for write in &h.writes {
        let text = serde_json::to_string(write).unwrap();
        let escaped = text.len() + 5 * text.matches(['<', '>', '&']).count();
        assert!(
            escaped + spec <= h.budgets.object_bytes,
            "{escaped} bytes of status written as the API server stores it"
        );
    }
    // Metadata counts too (a client-side apply's copy of the spec in an annotation).
    let (with_metadata, h) = steps_until_too_large("y", 8 * 1024);
    assert!(with_metadata < plain, "{with_metadata} against {plain}");
    let detail = h.status().reason_detail.unwrap();
    assert!(detail.contains("metadata 8192"), "{detail}");
}

#[test]
fn kubernetes_events_project_phase_changes_approvals_and_takeovers() {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    let started = h.run.status.clone();
    let projected = kube_events(&Value::Null, &started);
    assert_eq!(projected.len(), 1);
    assert_eq!(projected[0].reason, "Started");
    assert_eq!(projected[0].type_, KubeEventType::Normal);
    h.result("a", json!({}));
    let paused = h.run.status.clone();
    let reasons: Vec<String> = kube_events(&started, &paused)
        .into_iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(reasons, vec!["ApprovalRequested".to_string()]);
    h.approve("refund-1042-1-1");
    h.reconcile("b");
    let resumed = h.run.status.clone();
    let reasons: Vec<String> = kube_events(&paused, &resumed)
        .into_iter()
        .map(|e| e.reason)
        .collect();
    assert_eq!(
        reasons,
        vec!["ApprovalDecided".to_string(), "Resumed".to_string()]
    );
    assert_eq!(
        kube_events(&paused, &resumed)[0].message,
        "Approval refund-1042-1-1 was Approved by alice"
    );
    // A decision that names no approver (it is optional) says so, not "by -".
    let mut anonymous = resumed.clone();
    for event in anonymous["events"].as_array_mut().into_iter().flatten() {
        if event["type"] == "approval.decided" {
            if let Some(data) = event["data"].as_object_mut() {
                data.remove("approver");
            }
        }
    }
    assert_eq!(
        kube_events(&paused, &anonymous)[0].message,
        "Approval refund-1042-1-1 was Approved (no approver named)"
    );
    h.expire_lease();
    h.reconcile("c");
    let taken = kube_events(&resumed, &h.run.status);
    assert_eq!(taken[0].reason, "TakenOver");
    assert_eq!(taken[0].type_, KubeEventType::Warning);
    assert_eq!(taken[1].reason, "StepInterrupted");
    let before = h.run.status.clone();
    h.reject("refund-1042-1-2", "no");
    h.reconcile("c");
    let ended = kube_events(&before, &h.run.status);
    let last = ended.last().unwrap();
    assert_eq!(
        (last.type_, last.reason.as_str()),
        (KubeEventType::Warning, "Cancelled")
    );
    assert!(
        last.message.contains("approval_rejected"),
        "{}",
        last.message
    );
}

#[test]
fn a_finished_run_set_back_to_running_by_hand_stays_finished() {
    let mut h = executing("write_local");
    h.spec_mut().cancel = true;
    h.reconcile("b");
    assert_eq!(h.status().phase, RunPhase::Cancelled);
    // Someone with status-write rights sets the phase back; the journal still says it ended.
    h.run.status["phase"] = json!("Running");
    h.run.status["lease"] = json!(null);
    h.lease = None;
    h.spec_mut().cancel = false;
    let before = h.run.status.clone();
    assert!(
        h.reconcile("c").is_empty(),
        "a replica finding it does nothing"
    );
    let effects = h.step("c", Input::LeaseAcquired { takeover: None });
    assert_effects!(effects, ["Stop"]);
    assert_eq!(h.run.status, before, "nothing is written");
}

#[test]
fn a_null_the_api_server_prunes_is_not_written() {
    // A tool answering `null`, then a `complete` decision whose result is `null`. kube-apiserver
    // drops a `null` in a field the CRD declares and does not mark nullable, so the engine
    // writes none there: what it writes is what is stored, and the record it hands to its next
    // step is its write decoded (the harness checks that on every transition).
    let mut h = Harness::scripted(vec![call("read", json!({"n": 1})), complete(json!(null))]);
    h.reconcile("a");
    h.step("a", result_input(Value::Null));
    assert_eq!(h.status().phase, RunPhase::Completed);
    let last = h.writes.last().expect("the run was written");
    assert_eq!(last["result"], Value::Null);
    assert!(last.get("result").is_none(), "no `result: null` is written");
    let steps = last["steps"].as_array().expect("steps");
    let observation = &steps[0]["observation"];
    assert_eq!(observation["kind"], json!("tool_result"));
    assert!(observation.get("content").is_none(), "{observation}");
    let decision = &steps[1]["decision"];
    assert_eq!(decision["kind"], json!("complete"));
    assert!(decision.get("result").is_none(), "{decision}");
    for write in &h.writes {
        for event in write["events"].as_array().into_iter().flatten() {
            assert_ne!(event.get("data"), Some(&Value::Null), "{event}");
        }
    }
}

/// A takeover's Kubernetes Event names the expiry it went by, and says so when there was none: a
/// Lease released by a replica that stopped cleanly, or a run never held.
#[test]
fn a_takeover_event_says_whether_the_lease_expired_or_was_released() {
    let message = |data: Value| {
        let status = json!({"events": [{"seq": 1, "type": "lease.taken_over", "data": data}]});
        let events = kube_events(&Value::Null, &status);
        assert_eq!(events.len(), 1, "{events:?}");
        events[0].message.clone()
    };
    assert_eq!(
        message(json!({"holder": "b", "previousHolder": "a",
            "previousExpiry": "2026-12-05T02:00:00.000Z"})),
        "b took the run over from a (lease expired 2026-12-05T02:00:00.000Z)"
    );
    assert_eq!(
        message(json!({"holder": "b", "previousHolder": "a"})),
        "b took the run over from a, whose lease was released or deleted"
    );
    assert_eq!(
        message(json!({"holder": "b"})),
        "b took the run over (no previous holder)"
    );
}
