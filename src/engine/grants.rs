//! Executing a grant (docs/design.md sections 3 guarantee 5, 5; docs/behaviours.md 21-22, 26, 35): the
//! hash is verified over the stored Approval as read (a mismatch is never executed:
//! `internal_error`), the person's decision is copied into the record (`approval.decided`), the
//! run resumes (`run.resumed` {approval}, the step's active time restarting), the args are
//! checked against the tool's current schema (`invalid_decision` and the loop goes on) and the
//! current policy is evaluated again ([`calls::evaluate`]: allow, or the same requirement,
//! executes; another requirement pauses again; deny fails the step; abort fails the run).
//!
//! The write that starts the tool marks the approval executed (`steps[i].approvals[k].executed`)
//! together with `step.tool_started`, so a grant executes at most once whatever crashes; the
//! Approval's `Executed` status is a projection written after it.

use serde_json::{json, Value};

use super::approvals::{record_decision, requested_event, Origin};
use super::calls::{self, Grant};
use super::hash::approval_hash;
use super::loop_::{check_args, CallProblem, Flow};
use super::record::Txn;
use crate::api::{
    Approval, ApprovalDecision, ApprovalStatus, EventType, RunPhase, StepApproval, TerminalReason,
    INTERRUPTED_SIDE_EFFECT,
};

fn origin_of(txn: &Txn, latest: &StepApproval) -> Origin {
    let recorded = requested_event(txn, &latest.name)
        .and_then(|d| d.get("origin").and_then(Value::as_str).map(str::to_string));
    match recorded.as_deref() {
        Some("interruption") => Origin::Interruption,
        Some("reconcile") => Origin::Reconcile,
        Some(_) => Origin::Policy,
        None if latest.kind == INTERRUPTED_SIDE_EFFECT => Origin::Interruption,
        None => Origin::Policy,
    }
}

/// Executes the latest approval's grant (docs/behaviours.md 21-22, 26, 35), holding the lease.
pub(crate) fn execute_grant(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    approval: &Approval,
    decision: &ApprovalDecision,
    status: ApprovalStatus,
) -> Flow {
    let spec = &approval.spec;
    let verified = approval_hash(
        &spec.kind,
        spec.capability.as_ref(),
        spec.presentation.as_ref(),
        &spec.request,
    );
    if verified.as_ref().ok() != Some(&spec.hash) {
        let detail = format!(
            "Approval {}: its stored fields do not hash to spec.hash; it is never executed",
            latest.name
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return Flow::Continue;
    }
    let run = txn.run;
    // The tool by name: its current schema and the current policy judge the args again.
    let tool = run
        .spec
        .tools
        .iter()
        .position(|t| t.name == spec.request.tool.name);
    let belongs = spec.run_uid == run.uid
        && spec.request.run.uid == run.uid
        && spec.request.step == txn.index_at(index)
        && spec.step_index == txn.index_at(index);
    let Some(tool) = tool.filter(|_| belongs) else {
        let detail = format!(
            "Approval {}: its request is not for step {} of this run or names a tool the \
             run does not have; it is never executed",
            latest.name,
            txn.index_at(index)
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return Flow::Continue;
    };
    record_decision(txn, index, latest, decision);
    txn.status.phase = RunPhase::Running;
    // docs/behaviours.md 81: who resumes, at which epoch, and who held the run before when
    // that was another replica, in the write that records its first action.
    let previous_holder = txn.holder().map(str::to_string);
    txn.take_lease();
    let epoch = txn.status.lease.as_ref().map_or(0, |l| l.epoch);
    let mut resumed = json!({
        "approval": latest.name,
        "holder": txn.caller.holder,
        "epoch": epoch,
    });
    if previous_holder.as_deref() != Some(txn.caller.holder.as_str()) {
        resumed["previousHolder"] = json!(previous_holder);
    }
    txn.event(EventType::RunResumed, Some(txn.index_at(index)), resumed);
    let now = txn.now();
    txn.step_mut(index).started_at = Some(now);
    match check_args(txn, tool, &spec.request.args) {
        Err(CallProblem::Invalid(invalid)) => {
            txn.fail_step(index, invalid.observation());
            Flow::Continue
        }
        Err(CallProblem::Internal(detail)) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            Flow::Continue
        }
        Ok((tool, args)) => {
            let grant = Grant {
                name: latest.name.clone(),
                hash: latest.hash.clone(),
                origin: origin_of(txn, latest),
                status,
            };
            calls::evaluate(txn, index, tool, args, Some(grant))
        }
    }
}
