//! Interrupted `job` calls, settled by reading the Job (docs/design.md section 6, "Job tools";
//! section 5's resume table).
//!
//! A Job tool's call is a Kubernetes Job named from the run's uid, the step and the attempt
//! ([`super::job_name`]). The start is recorded (`step.tool_started`) before the Job is created,
//! its creation after (`step.job_created` {job, uid, attempt}); the Job keeps a finalizer until
//! the write recording its outcome landed, so a Job that was created never looks like one that
//! was not. After a takeover the step is never put to a person while the Job can say:
//! - the step goes back to `executing` under the same attempt (`run.resumed` {after:
//!   interruption, reconciliation: job, step, job}) and the executor reads the Job by name
//!   ([`JobStage::Resume`]): present and the run's, it waits for it; absent and never recorded
//!   as created, nothing started and it creates it; a Job of the name that is not the run's ends
//!   the run `reconcile_conflict`;
//! - absent although the record says it was created (removed by hand, its finalizer taken off):
//!   the outcome is unknown ([`JOB_GONE`]) and someone is asked as for any tool (the reconcile
//!   hook, else an `interrupted_side_effect` Approval whose presentation names the Job).

use serde_json::json;

use super::loop_::{check_call, drive, executing_attempt, Flow};
use super::record::Txn;
use super::{job_name, EngineError, ExternalCall, JobStage, ToolCall, JOB_GONE};
use crate::api::{EventType, StepIndex, StepStatus, TerminalReason};

/// The run's tool index of step `index`'s decision, when it names a `job` tool.
fn job_tool(txn: &Txn, index: usize) -> Option<usize> {
    let name = txn.status.steps[index].decision.as_ref()?.tool.as_deref()?;
    let tool = txn.run.spec.tools.iter().position(|t| t.name == name)?;
    txn.run.spec.tools[tool].job.is_some().then_some(tool)
}

/// Whether the record holds `step.job_created` for `step`'s attempt `attempt`.
fn recorded(txn: &Txn, step: StepIndex, attempt: i64) -> bool {
    txn.status.events.iter().any(|e| {
        e.type_ == EventType::StepJobCreated
            && e.step == Some(step)
            && e.data.as_ref().and_then(|d| d.get("attempt")) == Some(&json!(attempt))
    })
}

/// The name of the Job of step `index`'s last attempt, when it ran a `job` tool.
pub(crate) fn last_job(txn: &Txn, index: usize) -> Option<String> {
    job_tool(txn, index)?;
    let step = &txn.status.steps[index];
    (step.attempts > 0).then(|| job_name(&txn.run.uid, txn.index_at(index), step.attempts))
}

/// The call that reads step `index`'s Job of attempt `attempt` and waits for it, when the step
/// ran a `job` tool whose call still checks.
fn read_job(txn: &Txn, index: usize, attempt: i64, recorded: bool) -> Option<ToolCall> {
    job_tool(txn, index)?;
    let (tool, args) = check_call(txn, txn.status.steps[index].decision.as_ref()?).ok()?;
    Some(ToolCall {
        step: txn.index_at(index),
        attempt,
        tool: txn.run.spec.tools[tool].clone(),
        args,
        idempotency_key: super::takeover::idempotency_key(txn, index),
        pin: None,
        delay_millis: 0,
        job: Some(JobStage::Resume { recorded }),
        task: None,
    })
}

/// How the interrupted step `index` goes on when it was executing a `job` tool: back to
/// `executing` under the same attempt, the executor reading its Job. `None` for any other step,
/// or when its Job was already found gone (someone is asked).
pub(crate) fn resume(txn: &mut Txn, index: usize) -> Option<Flow> {
    let (step_index, attempt) = super::takeover::interrupted_attempt(txn, index, JOB_GONE)?;
    let call = read_job(txn, index, attempt, recorded(txn, step_index, attempt))?;
    if txn.caller.draining {
        // The next holder reads the Job; this one is shutting down.
        txn.release_and_stop();
        return Some(Flow::Halt);
    }
    let name = job_name(&txn.run.uid, step_index, attempt);
    txn.event(
        EventType::RunResumed,
        None,
        json!({
            "after": "interruption",
            "reconciliation": "job",
            "step": step_index,
            "job": name,
        }),
    );
    txn.step_mut(index).status = StepStatus::Executing;
    txn.call(ExternalCall::Tool(call));
    Some(Flow::Halt)
}

/// Records `step.job_created` for `step`'s attempt unless the record holds it.
fn record_created(txn: &mut Txn, step: StepIndex, attempt: i64, name: &str, uid: &str) {
    if !recorded(txn, step, attempt) {
        txn.event(
            EventType::StepJobCreated,
            Some(step),
            json!({"job": name, "uid": uid, "attempt": attempt}),
        );
    }
}

/// [`super::Input::JobCreated`] for a running run: records `step.job_created` (once per attempt)
/// and waits for the Job; a conflict ends the run `reconcile_conflict`.
pub(crate) fn created(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    name: String,
    job: Result<String, String>,
) -> Result<(), EngineError> {
    let Some(index) = executing_attempt(txn, step, attempt) else {
        // Applied already, or a stale attempt: go on from the record.
        drive(txn);
        return Ok(());
    };
    let uid = match job {
        Ok(uid) => uid,
        Err(detail) => {
            txn.add_active_time(index);
            let detail = format!(
                "step {step}: the Job {name} exists and is not this run's ({detail}); it is \
                 never adopted"
            );
            txn.end_run(TerminalReason::ReconcileConflict, Some(detail), None);
            return Ok(());
        }
    };
    record_created(txn, step, attempt, &name, &uid);
    match read_job(txn, index, attempt, true) {
        Some(call) => txn.call(ExternalCall::Tool(call)),
        None => drive(txn),
    }
    Ok(())
}

/// [`super::Input::JobCreated`] once the run ended (cancelled between the start and the Job's
/// creation): the creation is recorded and the Job waited for, so that its outcome is appended
/// late as any tool's (docs/design.md section 5, "cancel"); the lease is kept until then.
/// `false` when there is nothing to wait for.
pub(crate) fn created_late(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    name: &str,
    job: &Result<String, String>,
) -> bool {
    let Ok(uid) = job else {
        return false;
    };
    let Some(index) = txn.position(step) else {
        return false;
    };
    record_created(txn, step, attempt, name, uid);
    match read_job(txn, index, attempt, true) {
        Some(call) => {
            txn.call(ExternalCall::Tool(call));
            true
        }
        None => false,
    }
}
