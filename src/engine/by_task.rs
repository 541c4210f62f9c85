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
//!
//! A task that asks for input (`input_required`, its server's `elicitation/create`) pauses the
//! step on an Approval of kind `input_required` ([`input_required`]) showing the question and
//! the schema of the answer; approved, the person's `answer` is checked against that schema
//! and sent as the response (`accept`, or `decline` saying why when it does not match), and
//! the task is followed on ([`answer`]); rejected, the run ends as on any rejection.

use serde_json::{json, Value};

use super::approvals::{self, write_status, Origin, Requirement};
use super::loop_::{check_call, drive, executing_attempt, Flow};
use super::record::Txn;
use super::validate::ToolSchema;
use super::{EngineError, ExternalCall, McpTask, TaskInput, TaskReply, ToolCall, TASK_LOST};
use crate::api::{
    Approval, ApprovalDecision, ApprovalPhase, ApprovalStatus, EventType, StepApproval, StepIndex,
    StepStatus, INPUT_REQUIRED,
};

/// Most bytes of a server's question kept in an `input_required` Approval.
const MAX_MESSAGE_BYTES: usize = 4096;

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
        reply: None,
    })
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
    let (step_index, attempt) = super::takeover::interrupted_attempt(txn, index, TASK_LOST)?;
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
    let Some(index) = executing_attempt(txn, step, attempt) else {
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

/// `text` cut to at most `max` bytes on a character boundary.
fn bounded(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// [`super::Input::TaskInputRequired`]: the step's task asks for input. The step pauses on an
/// `input_required` Approval whose presentation shows the tool, the args, the task, the
/// server's question (`message`, at most 4 KiB), the schema of the answer (`requestedSchema`)
/// and the request's id, all bound by the Approval's hash. A stale input changes nothing.
pub(crate) fn input_required(txn: &mut Txn, step: StepIndex, attempt: i64, input: TaskInput) {
    let Some(index) = executing_attempt(txn, step, attempt) else {
        drive(txn);
        return;
    };
    let Some(decision) = txn.status.steps[index].decision.clone() else {
        drive(txn);
        return;
    };
    let Ok((tool, args)) = check_call(txn, &decision) else {
        drive(txn);
        return;
    };
    let spec_tool = &txn.run.spec.tools[tool];
    let mut presentation = json!({
        "tool": spec_tool.name,
        "args": args,
        "sideEffect": spec_tool.side_effect,
        "task": {"taskId": input.task_id, "requestId": input.request_id},
        "message": bounded(&input.message, MAX_MESSAGE_BYTES),
        "requestedSchema": input.requested_schema,
    });
    if let Some(mcp) = super::calls::mcp_presentation(txn, spec_tool) {
        presentation["mcp"] = mcp;
    }
    let requirement = Requirement {
        kind: INPUT_REQUIRED.to_string(),
        reason: Some(format!(
            "the MCP task of {} (step {step}) asks for input",
            spec_tool.name
        )),
        capability: None,
        presentation: Some(presentation),
        origin: Origin::TaskInput,
    };
    approvals::pause(txn, index, tool, args, requirement);
}

/// Whether `answer` matches the `requestedSchema` of an `input_required` Approval's
/// `presentation` (docs/design.md section 6, "MCP tasks"); the one rule the engine, the CLI
/// and the console apply.
///
/// # Errors
/// The violations (or why the schema does not compile), as `path: message` sentences.
pub fn check_answer(presentation: &Value, answer: &Value) -> Result<(), Vec<String>> {
    let schema = presentation
        .get("requestedSchema")
        .cloned()
        .unwrap_or(json!({}));
    ToolSchema::compile_at("requestedSchema", &schema)
        .map_err(|e| vec![e])
        .and_then(|compiled| compiled.check(answer))
}

/// The reply an approved `input_required` Approval sends: `accept` with the answer when it
/// matches the requested schema, else `decline`; and the violations that made it a decline.
fn reply_of(presentation: &Value, answer: Option<&Value>) -> (Value, Vec<String>) {
    let checked = match answer {
        None => Err(vec!["no answer was given".to_string()]),
        Some(answer) => check_answer(presentation, answer),
    };
    match (checked, answer) {
        (Ok(()), Some(answer)) => (json!({"action": "accept", "content": answer}), vec![]),
        (Err(violations), _) => (json!({"action": "decline"}), violations),
        (Ok(()), None) => (json!({"action": "decline"}), vec![]),
    }
}

/// Executes an approved `input_required` Approval (holding the lease): the decision is
/// recorded, the step goes back to `executing` under the same attempt, `step.input_answered`
/// says what is sent, the Approval becomes `Executed`, and the executor sends the reply in the
/// task's session and follows the task on. Without a recorded task (the record cannot say
/// where to send it) the run ends `internal_error`.
pub(crate) fn answer(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    approval: &Approval,
    decision: &ApprovalDecision,
    status: ApprovalStatus,
) -> Flow {
    if let Err(flow) = super::grants::resume(txn, index, latest, approval, decision) {
        return flow;
    }
    let presentation = approval.spec.presentation.clone().unwrap_or(Value::Null);
    let step = txn.index_at(index);
    let attempt = txn.status.steps[index].attempts;
    let Some(mut task) = recorded(txn, step, attempt) else {
        let detail = format!(
            "Approval {}: step {step} has no recorded task to answer",
            latest.name
        );
        txn.end_run(
            crate::api::TerminalReason::InternalError,
            Some(detail),
            None,
        );
        return Flow::Continue;
    };
    let request_id = presentation
        .pointer("/task/requestId")
        .cloned()
        .unwrap_or(Value::Null);
    let (result, violations) = reply_of(&presentation, decision.answer.as_ref());
    txn.event(
        EventType::StepInputAnswered,
        Some(step),
        json!({
            "approval": latest.name,
            "taskId": task.id,
            "requestId": request_id,
            "action": result["action"],
            "violations": violations,
        }),
    );
    super::grants::spend(txn, index, &latest.name);
    txn.step_mut(index).status = StepStatus::Executing;
    let mut status = status;
    status.phase = ApprovalPhase::Executed;
    status.executed_at = Some(txn.now());
    write_status(txn, &latest.name, status);
    task.reply = Some(TaskReply { request_id, result });
    match follow(txn, index, attempt, task) {
        Some(call) => {
            txn.call(ExternalCall::Tool(call));
            Flow::Halt
        }
        None => Flow::Continue,
    }
}
