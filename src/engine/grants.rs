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

use super::approvals::{record_decision, requested_event, write_status, Origin};
use super::calls::{self, Grant};
use super::hash::approval_hash;
use super::loop_::{check_args, start_step, CallProblem, Flow};
use super::outcome;
use super::record::{observation, Txn};
use crate::api::{
    Approval, ApprovalDecision, ApprovalPhase, ApprovalStatus, EventType, ObservationKind,
    RunPhase, StepApproval, StepStatus, TerminalReason, Verdict, INTERRUPTED_SIDE_EFFECT,
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

/// Checks the stored Approval (its hash over its fields, that its request is this run's step
/// `index` and names one of the run's tools), copies the decision into the record and resumes
/// the run under this holder (`run.resumed` {approval, holder, epoch, previousHolder}).
/// Returns the tool's position in `spec.tools`, or the flow when the run ended instead.
pub(crate) fn resume(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    approval: &Approval,
    decision: &ApprovalDecision,
) -> Result<usize, Flow> {
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
        return Err(Flow::Continue);
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
        return Err(Flow::Continue);
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
    Ok(tool)
}

/// Marks step `index`'s approval `name` spent (`executed`) in the record, so it never acts
/// twice.
pub(crate) fn spend(txn: &mut Txn, index: usize, name: &str) {
    if let Some(spent) = txn
        .step_mut(index)
        .approvals
        .iter_mut()
        .find(|a| a.name == name)
    {
        spent.executed = true;
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
    let tool = match resume(txn, index, latest, approval, decision) {
        Ok(tool) => tool,
        Err(flow) => return flow,
    };
    let spec = &approval.spec;
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

/// Settles an interrupted call on a person's word, running nothing (docs/design.md section 5),
/// holding the lease: `TookEffect` records `decision.result` as the step's `tool_result`
/// (bounded as a tool's answer is; a terminal tool completes the run with it) and
/// `step.tool_finished` {tool, attempt, settledBy {approval, verdict, approver}}; without a
/// result (the CRD refuses that) the run fails `internal_error`. `DidNotTakeEffect` leaves the
/// step `interrupted` with an `interrupted` observation saying it was not executed and who
/// said so, and the agent decides again. The Approval becomes `Settled`; the record marks it
/// spent (`executed`) so it never acts twice.
pub(crate) fn settle(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    approval: &Approval,
    decision: &ApprovalDecision,
    status: ApprovalStatus,
) -> Flow {
    let tool = match resume(txn, index, latest, approval, decision) {
        Ok(tool) => tool,
        Err(flow) => return flow,
    };
    let now = txn.now();
    let settled_by = json!({
        "approval": latest.name,
        "verdict": decision.verdict,
        "approver": decision.approver,
    });
    spend(txn, index, &latest.name);
    let spec_tool = txn.run.spec.tools[tool].clone();
    let flow = match (decision.verdict, &decision.result) {
        (Verdict::TookEffect, Some(result)) => {
            outcome::settled_result(txn, index, &spec_tool, settled_by, result.clone());
            Flow::Continue
        }
        (Verdict::TookEffect, None) => {
            let detail = format!(
                "Approval {}: TookEffect without spec.decision.result; nothing is recorded",
                latest.name
            );
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            Flow::Continue
        }
        _ => {
            let content = json!({
                "previousStatus": StepStatus::Executing,
                "executed": false,
                "settledBy": settled_by,
            });
            let summary = format!(
                "{} was interrupted and did not take effect, as {} said on Approval {}; it was \
                 not run again",
                spec_tool.name,
                decision.approver.as_deref().unwrap_or("a person"),
                latest.name
            );
            let record = txn.step_mut(index);
            record.status = StepStatus::Interrupted;
            record.finished_at = Some(now);
            record.observation = Some(observation(ObservationKind::Interrupted, content, summary));
            start_step(txn)
        }
    };
    let mut status = status;
    status.phase = ApprovalPhase::Settled;
    status.executed_at = Some(now);
    write_status(txn, &latest.name, status);
    flow
}
