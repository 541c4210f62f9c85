//! Interrupted `mcp` calls settled by following their task (docs/design.md section 6, "MCP
//! tasks"; section 5's resume table).
//!
//! A call to an `mcp` tool that allows tasks (`execution.taskSupport` `optional` or
//! `required`) on a server that offers task-augmented `tools/call` is sent as a task. Its start
//! is recorded (`step.tool_started`) before the call, as any call's; the task the server
//! creates is recorded the moment it is known (`step.task_created` {taskId,
//! pollIntervalMillis, session, protocolVersion, attempt}, one status write), and the executor
//! then follows it ([`ToolCall::task`]). After a takeover:
//! - a step whose attempt has `step.task_created` on the record goes back to `executing` under
//!   the same attempt (`run.resumed` {after: interruption, reconciliation: task, step, taskId})
//!   and the executor follows the task: its result is the step's, nobody is asked and nothing
//!   is sent again;
//! - a step without one (the process stopped between sending the call and recording the task)
//!   is put to someone as today: whether the server created a task is unknown;
//! - a task that can no longer be followed (the server forgot it or its session: an unknown
//!   outcome whose detail starts with [`TASK_LOST`]) is put to someone as well.

use serde_json::{json, Value};

use super::loop_::{check_call, drive, Flow};
use super::record::{previous_status, Txn};
use super::{EngineError, ExternalCall, McpTask, ToolCall, TASK_LOST};
use crate::api::{EventType, StepIndex, StepStatus};

/// The task `step.task_created` records for `step`'s attempt `attempt`, if it does.
fn recorded(txn: &Txn, step: StepIndex, attempt: i64) -> Option<McpTask> {
    let data = txn.status.events.iter().rev().find_map(|e| {
        let data = e.data.as_ref()?;
        (e.type_ == EventType::StepTaskCreated
            && e.step == Some(step)
            && data.get("attempt") == Some(&json!(attempt)))
        .then_some(data)
    })?;
    Some(McpTask {
        id: data.get("taskId")?.as_str()?.to_string(),
        poll_interval_millis: data
            .get("pollIntervalMillis")
            .and_then(Value::as_u64)
            .unwrap_or(1000),
        session: data
            .get("session")
            .and_then(Value::as_str)
            .map(str::to_string),
        protocol_version: data
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

/// Whether step `index`'s last interruption was its task found lost (then someone is asked).
fn interrupted_as_lost(txn: &Txn, step: StepIndex) -> bool {
    txn.status
        .events
        .iter()
        .rev()
        .find(|e| e.type_ == EventType::StepInterrupted && e.step == Some(step))
        .and_then(|e| e.data.as_ref()?.get("detail")?.as_str().map(str::to_string))
        .is_some_and(|detail| detail.starts_with(TASK_LOST))
}

/// The call that follows `task` for step `index`'s attempt `attempt`, when the step's decision
/// names an `mcp` tool and still checks.
fn follow(txn: &Txn, index: usize, attempt: i64, task: McpTask) -> Option<ToolCall> {
    let decision = txn.status.steps[index].decision.as_ref()?;
    let (tool, args) = check_call(txn, decision).ok()?;
    let spec_tool = &txn.run.spec.tools[tool];
    spec_tool.mcp.as_ref()?;
    Some(ToolCall {
        step: txn.index_at(index),
        attempt,
        tool: spec_tool.clone(),
        args,
        idempotency_key: super::takeover::idempotency_key(txn, index),
        pin: super::calls::pin_of(txn, &spec_tool.name, true).map(Box::new),
        delay_millis: 0,
        job: None,
        task: Some(task),
    })
}

/// The task of step `index`'s last attempt, when the record holds one (the Approval of an
/// interrupted call shows it).
pub(crate) fn last_task(txn: &Txn, index: usize) -> Option<McpTask> {
    let step = &txn.status.steps[index];
    recorded(txn, txn.index_at(index), step.attempts)
}

/// How the interrupted step `index` goes on when its attempt's task is on the record: back to
/// `executing` under the same attempt, the executor following the task. `None` for any other
/// step, or when the task was already found lost (someone is asked).
pub(crate) fn resume(txn: &mut Txn, index: usize) -> Option<Flow> {
    let step = &txn.status.steps[index];
    if step.status != StepStatus::Interrupted
        || previous_status(step) != Some(StepStatus::Executing)
        || step.attempts < 1
    {
        return None;
    }
    let step_index = txn.index_at(index);
    let attempt = step.attempts;
    if interrupted_as_lost(txn, step_index) {
        return None;
    }
    let task = recorded(txn, step_index, attempt)?;
    let task_id = task.id.clone();
    let call = follow(txn, index, attempt, task)?;
    if txn.caller.draining {
        // The next holder follows the task; this one is shutting down.
        txn.release_and_stop();
        return Some(Flow::Halt);
    }
    txn.event(
        EventType::RunResumed,
        None,
        json!({
            "after": "interruption",
            "reconciliation": "task",
            "step": step_index,
            "taskId": task_id,
        }),
    );
    txn.step_mut(index).status = StepStatus::Executing;
    txn.call(ExternalCall::Tool(call));
    Some(Flow::Halt)
}

/// Records `step.task_created` for `step`'s attempt unless the record holds it.
fn record_created(txn: &mut Txn, step: StepIndex, attempt: i64, task: &McpTask) {
    if recorded(txn, step, attempt).is_none() {
        txn.event(
            EventType::StepTaskCreated,
            Some(step),
            json!({
                "taskId": task.id,
                "pollIntervalMillis": task.poll_interval_millis,
                "session": task.session,
                "protocolVersion": task.protocol_version,
                "attempt": attempt,
            }),
        );
    }
}

/// [`super::Input::TaskCreated`] for a running run: records `step.task_created` (once per
/// attempt) and follows the task.
pub(crate) fn created(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    task: McpTask,
) -> Result<(), EngineError> {
    let pending = txn
        .last_position()
        .filter(|i| txn.index_at(*i) == step)
        .filter(|i| {
            let s = &txn.status.steps[*i];
            s.status == StepStatus::Executing && s.attempts == attempt
        });
    let Some(index) = pending else {
        // Applied already, or a stale attempt: go on from the record.
        drive(txn);
        return Ok(());
    };
    record_created(txn, step, attempt, &task);
    match follow(txn, index, attempt, task) {
        Some(call) => txn.call(ExternalCall::Tool(call)),
        None => drive(txn),
    }
    Ok(())
}

/// [`super::Input::TaskCreated`] once the run ended (cancelled while the call was on its way):
/// the task is recorded and followed, so that its outcome is appended late as any tool's
/// (docs/design.md section 5, "cancel"); the lease is kept until then. `false` when there is
/// nothing to follow.
pub(crate) fn created_late(txn: &mut Txn, step: StepIndex, attempt: i64, task: McpTask) -> bool {
    let Some(index) = txn.position(step) else {
        return false;
    };
    record_created(txn, step, attempt, &task);
    match follow(txn, index, attempt, task) {
        Some(call) => {
            txn.call(ExternalCall::Tool(call));
            true
        }
        None => false,
    }
}
