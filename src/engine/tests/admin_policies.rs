//! docs/behaviours.md 83-86: the admins' `AgentPolicy` and `ClusterAgentPolicy` at a run's
//! decisions: an admin requirement holds over a run that allows the call, the step and the
//! Approval name the admin policy, and a ceiling lowered on a live run applies at its next
//! decision.

use std::sync::Arc;

use serde_json::json;

use super::harness::*;
use crate::api::{
    AdminSideEffects, LimitCeilings, PolicyOutcome, RunPhase, StepStatus, TerminalReason,
};
use crate::engine::policy::admin::{AdminKind, AdminPolicies, AdminPolicy};

fn four_eyes(generation: i64) -> AdminPolicy {
    AdminPolicy {
        kind: AdminKind::AgentPolicy,
        namespace: Some("default".into()),
        name: "four-eyes".into(),
        generation,
        side_effects: AdminSideEffects {
            remote_mutation: Some(PolicyOutcome::RequireApproval),
            ..AdminSideEffects::default()
        },
        rules: vec![],
        limits: LimitCeilings::default(),
    }
}

/// The refund example with its own policy allowing every RemoteMutation call.
fn refund_allowing_everything() -> Harness {
    let mut h = Harness::new(REFUND);
    h.spec_mut().policy.side_effects.remote_mutation = PolicyOutcome::Allow;
    h
}

#[test]
fn an_admin_policy_requiring_approval_pauses_a_run_whose_policy_allows_the_call() {
    let mut h = refund_allowing_everything();
    h.admin = Arc::new(AdminPolicies::Known(vec![four_eyes(4)]));
    h.reconcile("a");
    h.result("a", json!({"order": 1042, "damaged": true}));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::AwaitingApproval);
    let policy = step.policy.as_ref().expect("step.policy");
    let source = policy.source.as_ref().expect("the admin policy decided");
    assert_eq!(
        (
            source.kind.as_str(),
            source.namespace.as_deref(),
            source.name.as_str(),
            source.generation,
            source.rule_index
        ),
        ("AgentPolicy", Some("default"), "four-eyes", 4, None)
    );
    assert_eq!(h.last_event("step.policy")["source"]["name"], "four-eyes");
    let name = &step.approvals[0].name;
    let presentation = &h.approval(name)["spec"]["presentation"];
    assert_eq!(
        presentation["policy"],
        json!({"kind": "AgentPolicy", "namespace": "default", "name": "four-eyes",
               "rule": null, "ruleIndex": null})
    );
    assert_eq!(presentation["tool"], "issue_refund");
}

#[test]
fn without_admin_policies_the_runs_own_policy_decides_alone() {
    let mut h = refund_allowing_everything();
    h.reconcile("a");
    let effects = h.result("a", json!({"order": 1042, "damaged": true}));
    assert_eq!(
        kinds(&effects).last().map(String::as_str),
        Some("CallTool(issue_refund#1)")
    );
    assert_eq!(
        h.status().steps[1]
            .policy
            .as_ref()
            .and_then(|p| p.source.clone()),
        None
    );
}

#[test]
fn an_edit_of_the_admin_policy_applies_at_the_next_decision() {
    let mut h = Harness::scripted(vec![
        call("read", json!({"n": 1})),
        call("read", json!({"n": 2})),
        complete(json!({})),
    ]);
    h.reconcile("a");
    // The first read was allowed; now an admin denies ReadOnly tools.
    let mut deny = four_eyes(2);
    deny.side_effects = AdminSideEffects {
        read_only: Some(PolicyOutcome::Deny),
        ..AdminSideEffects::default()
    };
    h.admin = Arc::new(AdminPolicies::Known(vec![deny]));
    h.result("a", json!({"v": 1}));
    let status = h.status();
    let second = &status.steps[1];
    assert_eq!(second.status, StepStatus::Failed);
    let source = second
        .policy
        .as_ref()
        .and_then(|p| p.source.clone())
        .expect("source");
    assert_eq!((source.name.as_str(), source.generation), ("four-eyes", 2));
    assert!(status.steps[0]
        .policy
        .as_ref()
        .and_then(|p| p.source.clone())
        .is_none());
}

#[test]
fn a_ceiling_lowered_on_a_live_run_ends_it_at_its_next_decision() {
    let mut h = Harness::scripted((0..5).map(|n| call("read", json!({"n": n}))).collect());
    h.reconcile("a");
    h.result("a", json!({"v": 1}));
    let mut ceiling = four_eyes(7);
    ceiling.side_effects = AdminSideEffects::default();
    ceiling.limits.max_steps = Some(2);
    h.admin = Arc::new(AdminPolicies::Known(vec![ceiling]));
    h.result("a", json!({"v": 2}));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::LimitSteps));
    assert_eq!(status.steps.len(), 2);
    assert_eq!(h.last_event("limit.exceeded")["max"], 2);
}

#[test]
fn unreadable_admin_policies_pause_even_a_read_only_call() {
    let mut h = Harness::scripted(vec![call("read", json!({"n": 1}))]);
    h.admin = Arc::new(AdminPolicies::Unavailable(
        "the AgentPolicy watch failed".into(),
    ));
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    assert_eq!(
        status.steps[0].approvals[0].kind,
        "admin_policy_unavailable"
    );
    assert_eq!(h.tool_calls.len(), 0);
}
