//! docs/behaviours.md 66-70 (issue 14, Kubernetes users' habits): a finished run's Job-like
//! `Complete`/`Failed` condition, a plain-text final answer of the openai agent, and
//! `spec.changed` when policy or limits are edited on a live run.

use serde_json::json;

use super::approvals::{paused, NAME};
use super::harness::*;
use crate::api::{AgentRunStatus, RunPhase};

/// The condition of `type_` as (status, reason, message), if the run has it.
fn condition(status: &AgentRunStatus, type_: &str) -> Option<(String, String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn a_completed_run_has_the_condition_complete_true_and_no_failed() {
    let mut h = Harness::scripted(vec![complete(json!({"refunded": 250}))]);
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(
        condition(&status, "Complete"),
        Some((
            "True".into(),
            "GoalCompleted".into(),
            "the run completed its goal".into()
        ))
    );
    assert_eq!(condition(&status, "Failed"), None);
}

#[test]
fn a_rejected_run_has_the_condition_failed_true_with_its_reason_in_camel_case() {
    let mut h = paused();
    assert_eq!(condition(&h.status(), "Failed"), None, "absent while live");
    assert_eq!(
        condition(&h.status(), "Complete"),
        None,
        "absent while live"
    );
    h.reject(NAME, "refund is too large");
    h.reconcile("b");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(
        condition(&status, "Failed"),
        Some((
            "True".into(),
            "ApprovalRejected".into(),
            "refund is too large".into()
        )),
        "approval_rejected becomes ApprovalRejected, the note its message"
    );
    assert_eq!(condition(&status, "Complete"), None);
    assert_eq!(status.conditions[0].type_, "Ready", "Ready stays first");
}

#[test]
fn a_failed_run_has_the_condition_failed_true() {
    let mut h = Harness::scripted(vec![
        json!({"kind": "fail", "message": "the order does not exist"}),
    ]);
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(
        condition(&status, "Failed"),
        Some((
            "True".into(),
            "GoalFailed".into(),
            "the order does not exist".into()
        ))
    );
}
