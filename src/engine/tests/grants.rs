//! docs/behaviours.md 21-25: executing a grant (at most once, re-checked against the schema and the
//! policy), a rejection, and the expiry of a pending Approval or of a grant.

use serde_json::json;

use super::approvals::{paused, rule, NAME};
use super::harness::*;
use crate::api::{ObservationKind, PolicyOutcome, RunPhase, StepStatus, TerminalReason, Verdict};
use crate::engine::Input;

#[test]
fn a_grant_executed_by_the_holder_that_paused_names_it_and_no_previous_holder() {
    let mut h = paused();
    h.approve(NAME);
    h.reconcile("a");
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"approval": NAME, "holder": "a", "epoch": 2})
    );
}

#[test]
fn executing_a_grant_writes_resumed_policy_and_tool_started_together() {
    let mut h = paused();
    h.advance(600);
    h.approve(NAME);
    let observed = h.decide(
        "b",
        Observe {
            lease: h.lease_view(),
        },
    );
    assert_effects!(
        observed,
        [
            "WriteApprovalStatus(refund-1042-1-1:Approved)",
            "AcquireLease"
        ]
    );
    let before = h.events().len();
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Executed)",
            "CallTool(issue_refund#1)"
        ]
    );
    assert_words!(
        h.journal_from(before),
        [
            "approval.decided@1",
            "run.resumed@1",
            "step.policy@1",
            "step.tool_started@1"
        ]
    );
    assert_eq!(
        h.last_event("approval.decided"),
        json!({"approval": NAME, "verdict": "Approved", "approver": "alice"})
    );
    // Holder b takes the run over from a at epoch 2: the journal says so in this write.
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"approval": NAME, "holder": "b", "epoch": 2, "previousHolder": "a"})
    );
    assert_eq!(
        h.last_event("step.tool_started"),
        json!({"tool": "issue_refund", "args": {"amount": 250, "order": 1042}, "attempt": 1, "approval": NAME})
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Running);
    assert_eq!(
        status.lease.as_ref().map(|l| (l.holder.as_str(), l.epoch)),
        Some(("b", 2))
    );
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::Executing);
    assert_eq!(step.started_at, Some(h.now), "the wait is not active time");
    assert_eq!(step.attempts, 1);
    assert!(step.approvals[0].executed);
    assert_eq!(step.approvals[0].verdict, Some(Verdict::Approved));
    let approval = h.approval(NAME);
    assert_eq!(approval["status"]["phase"], json!("Executed"));
    assert_eq!(approval["status"]["executedAt"], json!(h.now));
    h.result("b", json!({"refunded": 250}));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(
        status.active_seconds, 0.0,
        "600 s of waiting are not active time"
    );
}

#[test]
fn a_grant_executes_at_most_once_whatever_crashes() {
    let mut h = paused();
    h.approve(NAME);
    // b writes the grant's execution and dies before the Approval's status and the call.
    h.step(
        "b",
        Observe {
            lease: h.lease_view(),
        },
    );
    assert!(h.win_lease("b"));
    h.crash_after = Some(1);
    h.step("b", Input::LeaseAcquired { takeover: None });
    h.crash_after = None;
    assert!(h.tool_calls.len() == 1, "only the lookup ran");
    assert!(h.status().steps[1].approvals[0].executed);
    assert_eq!(h.approval(NAME)["status"]["phase"], json!("Approved"));
    // The same input applied again on the record that contains it starts nothing.
    let effects = h.step("b", Input::LeaseAcquired { takeover: None });
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    // A takeover finds the step executing with an unknown outcome: a new approval, never the
    // spent grant.
    h.expire_lease();
    let effects = h.reconcile("c");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(refund-1042-1-2)",
            "WriteApprovalStatus(refund-1042-1-2:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    assert_eq!(h.tool_calls.len(), 1);
    for _ in 0..3 {
        assert!(h.reconcile("d").is_empty());
    }
    assert_eq!(h.tool_calls.len(), 1);
    assert_eq!(h.status().steps[1].approvals.len(), 2);
}

#[test]
fn a_grant_whose_args_no_longer_pass_the_schema_fails_the_step_invalid_decision_and_continues() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().tools[1].input_schema =
        json!({"type": "object", "properties": {"amount": {"type": "number", "maximum": 100}}});
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Cancelled)",
            "ReleaseLease",
            "Stop"
        ]
    );
    // An approved Approval that can no longer execute never stays Approved (issue 16).
    assert_eq!(h.approval(NAME)["status"]["reason"], "invalid_decision");
    let status = h.status();
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::Failed);
    assert_eq!(
        step.observation.as_ref().unwrap().kind,
        ObservationKind::InvalidDecision
    );
    assert_eq!(
        status.phase,
        RunPhase::Completed,
        "the loop went on to the next decision"
    );
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_grant_under_a_policy_that_now_denies_fails_the_step_and_continues() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().policy.rules = vec![rule("no-refunds", PolicyOutcome::Deny, None)];
    h.reconcile("b");
    let status = h.status();
    assert_eq!(
        status.steps[1].observation.as_ref().unwrap().kind,
        ObservationKind::PolicyDenied
    );
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_grant_under_a_policy_that_now_aborts_fails_the_run() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().policy.rules = vec![rule("stop", PolicyOutcome::Abort, None)];
    h.reconcile("b");
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::PolicyAbort));
    assert_eq!(status.steps[1].status, StepStatus::Failed);
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_grant_under_a_policy_that_now_allows_executes() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().policy.rules = vec![rule("fine", PolicyOutcome::Allow, None)];
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Executed)",
            "CallTool(issue_refund#1)"
        ]
    );
}

#[test]
fn a_rejection_cancels_the_run_approval_rejected_with_the_note() {
    let mut h = paused();
    h.reject(NAME, "refund is too large");
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Rejected)"
        ]
    );
    assert!(h.lease.is_none(), "no lease was needed");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.reason, Some(TerminalReason::ApprovalRejected));
    assert_eq!(status.reason_detail.as_deref(), Some("refund is too large"));
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::Failed);
    let observation = step.observation.clone().unwrap();
    assert_eq!(observation.kind, ObservationKind::PolicyDenied);
    assert_eq!(
        observation.content,
        Some(json!({"approval": NAME, "verdict": "Rejected", "note": "refund is too large"}))
    );
    assert_eq!(step.approvals[0].verdict, Some(Verdict::Rejected));
    assert_words!(
        h.journal_tail(3),
        ["approval.decided@1", "step.failed@1", "run.finished"]
    );
    assert_eq!(
        h.last_event("approval.decided"),
        json!({"approval": NAME, "verdict": "Rejected", "approver": "alice", "note": "refund is too large"})
    );
    assert_eq!(h.approval(NAME)["status"]["phase"], json!("Rejected"));
    assert_eq!(h.tool_calls.len(), 1);
    assert!(h.reconcile("b").is_empty(), "a terminal run is left alone");
}

#[test]
fn a_pending_approval_past_expires_at_expires_the_run() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().limits.approval_ttl_seconds = Some(60);
    h.reconcile("a");
    h.result("a", json!({}));
    h.advance(20);
    let effects = h.reconcile("b");
    assert_effects!(effects, ["RequeueAfter(40000)"]);
    h.advance(40);
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Expired)"
        ]
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(status.reason, Some(TerminalReason::ApprovalExpired));
    assert_eq!(status.steps[1].status, StepStatus::Failed);
    assert_eq!(h.approval(NAME)["status"]["phase"], json!("Expired"));
    // Approving after the expiry changes nothing: the run ended.
    h.approve(NAME);
    assert!(h.reconcile("b").is_empty());
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_grant_older_than_grant_ttl_expires_and_nothing_executes() {
    let mut h = paused();
    h.spec_mut().limits.grant_ttl_seconds = Some(30);
    h.approve(NAME);
    // The decision is first seen now; the lease cannot be had (someone else holds it).
    h.lease = Some(FakeLease {
        holder: "z".into(),
        renewed_at: h.now,
        duration_seconds: 3600,
    });
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteApprovalStatus(refund-1042-1-1:Approved)",
            "AcquireLease"
        ]
    );
    assert_eq!(h.approval(NAME)["status"]["decidedAt"], json!(h.now));
    h.advance(31);
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Expired)"
        ]
    );
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ApprovalExpired));
    assert_words!(
        h.journal_tail(3),
        ["approval.decided@1", "step.failed@1", "run.finished"]
    );
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn approval_ttl_alone_never_expires_a_grant() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().limits.approval_ttl_seconds = Some(60);
    h.reconcile("a");
    h.result("a", json!({}));
    h.advance(10);
    h.approve(NAME);
    // A replica sees the decision before the expiry (the lease is busy elsewhere), which
    // records when it was decided...
    h.lease = Some(FakeLease {
        holder: "z".into(),
        renewed_at: h.now,
        duration_seconds: 500,
    });
    h.reconcile("b");
    // ...so the grant outlives the approval's TTL.
    h.advance(1000);
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Executed)",
            "CallTool(issue_refund#1)"
        ]
    );
}

#[test]
fn a_decision_first_seen_after_the_expiry_fails_closed_and_expires() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().limits.approval_ttl_seconds = Some(60);
    h.reconcile("a");
    h.result("a", json!({}));
    // No replica looks until after expiresAt; then the approval turns out decided, with no
    // record of when: it cannot be shown to predate the expiry, so it does not grant.
    h.advance(61);
    h.approve(NAME);
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Expired)"
        ]
    );
    assert_eq!(h.status().reason, Some(TerminalReason::ApprovalExpired));
    assert_eq!(h.tool_calls.len(), 1, "the refund never ran");
}

#[test]
fn the_api_servers_managed_fields_time_dates_a_decision() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().limits.approval_ttl_seconds = Some(60);
    h.reconcile("a");
    h.result("a", json!({}));
    let decided = h.now.plus_seconds(30);
    h.advance(61);
    h.approve(NAME);
    h.approvals.get_mut(NAME).expect("approval")["metadata"]["managedFields"] = json!([
        {"manager": "kubectl-patch", "operation": "Update", "time": decided,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:decision": {".": {}}}}}
    ]);
    let effects = h.reconcile("b");
    assert!(
        kinds(&effects).contains(&"CallTool(issue_refund#1)".to_string()),
        "decided before the expiry, it grants: {:?}",
        kinds(&effects)
    );
}

/// Issue 14: a grant approved while no controller ran and found past grantTTLSeconds expired
/// with no `decidedAt`, although the journal records `approval.decided`.
#[test]
fn a_grant_expired_unseen_keeps_when_it_was_decided() {
    let mut h = paused();
    h.spec_mut().limits.grant_ttl_seconds = Some(3);
    let decided = h.now.plus_seconds(1);
    h.approve(NAME);
    h.approvals.get_mut(NAME).expect("approval")["metadata"]["managedFields"] = json!([
        {"manager": "kubectl-patch", "operation": "Update", "time": decided,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:decision": {".": {}}}}}
    ]);
    h.advance(30);
    let effects = h.reconcile("b");
    assert!(
        kinds(&effects).contains(&"WriteApprovalStatus(refund-1042-1-1:Expired)".to_string()),
        "{:?}",
        kinds(&effects)
    );
    assert_eq!(h.approval(NAME)["status"]["phase"], json!("Expired"));
    assert_eq!(h.approval(NAME)["status"]["decidedAt"], json!(decided));
    assert_words!(
        h.journal_tail(3),
        ["approval.decided@1", "step.failed@1", "run.finished"]
    );
}
