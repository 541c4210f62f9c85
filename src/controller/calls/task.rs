//! Following an MCP task to its outcome (docs/design.md section 6, "MCP tasks"): the task a
//! step's `tools/call` created, as `step.task_created` records it, asked about in the session
//! it belongs to (`tasks/get` every poll interval the server asked for, then `tasks/result`),
//! by the replica that sent the call or by one that took the run over.
//!
//! Owns: mapping the task's end onto the engine's [`ToolOutcome`]: `completed` is the result
//! `tasks/result` gives (checked against the pinned `outputSchema` as any result); `failed` and
//! `cancelled` are `tool_error`s; a task the server no longer knows (or whose session it
//! forgot), or one still working when the tool's `timeoutSeconds` have passed since the
//! following began, is an unknown outcome whose detail starts with [`TASK_LOST`] (someone is
//! asked, as for any interrupted call). A task that waits for input (`input_required`) is
//! asked for its request (`tasks/result` brings the server's `elicitation/create`), which
//! becomes an `input_required` Approval ([`FollowStep::InputRequired`]); the answer a person
//! gives comes back in [`crate::engine::McpTask::reply`] and is sent first when the task is
//! followed on. Must not: send `tools/call` again.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::{McpOnCancel, ToolFailure};
use crate::controller::cluster::RunState;
use crate::controller::context::Context;
use crate::engine::{TaskInput, ToolCall, ToolOutcome, TASK_LOST};
use crate::tools::http::millis;
use crate::tools::mcp::{
    CallOutcome, McpClient, McpError, ProtocolVersion, Session, TaskAnswer, TaskStatus,
};

/// Shortest wait between two `tasks/get` (a server asking for less is asked this often).
const MIN_POLL: Duration = Duration::from_millis(200);
/// Longest wait between two `tasks/get`.
const MAX_POLL: Duration = Duration::from_secs(30);

fn lost(detail: String, started: Instant) -> ToolOutcome {
    ToolOutcome::Unknown {
        detail: format!("{TASK_LOST}: {detail}"),
        duration_ms: millis(started),
    }
}

fn failed(content: Value, started: Instant) -> ToolOutcome {
    ToolOutcome::Error {
        failure: ToolFailure::ToolReportedError,
        status: None,
        content,
        duration_ms: millis(started),
    }
}

/// How following a task went ([`follow_task`]).
#[derive(Debug)]
pub enum FollowStep {
    /// The call ended: its outcome.
    Finished(ToolOutcome),
    /// The task asks for input: a person answers it on an `input_required` Approval.
    InputRequired(TaskInput),
}

/// Follows the task of `call` ([`ToolCall::task`]), first sending the answer it carries, until
/// it ends (its outcome) or asks for input. A call without a task or an MCP executor is a
/// `tool_error` `no_executor` (nothing is sent).
pub async fn follow_task(ctx: &Context, state: &RunState, call: &ToolCall) -> FollowStep {
    match follow(ctx, state, call).await {
        Ok(step) => step,
        Err(outcome) => FollowStep::Finished(outcome),
    }
}

async fn follow(
    ctx: &Context,
    state: &RunState,
    call: &ToolCall,
) -> Result<FollowStep, ToolOutcome> {
    let started = Instant::now();
    let (Some(task), Some(mcp)) = (call.task.as_ref(), call.tool.mcp.as_deref()) else {
        return Err(ToolOutcome::Error {
            failure: ToolFailure::NoExecutor,
            status: None,
            content: json!("the call has no MCP task to follow"),
            duration_ms: 0,
        });
    };
    let auth = super::oauth::server_auth(ctx, state, &mcp.url, &mcp.headers, mcp.oauth.as_ref())
        .await
        // The task goes on regardless; without the headers it cannot be asked about.
        .map_err(|err| {
            lost(
                format!("the server's headers cannot be read: {err}"),
                started,
            )
        })?;
    let headers = auth.headers.clone();
    let mut renewed = false;
    let protocol = ProtocolVersion::parse(&task.protocol_version).ok_or_else(|| {
        let revision = &task.protocol_version;
        lost(
            format!("the task's revision {revision:?} is not one agentrt speaks"),
            started,
        )
    })?;
    let session = Session {
        id: task.session.clone(),
        protocol,
        server_info: Value::Null,
        tasks: true,
    };
    let mut client =
        McpClient::new(ctx.executors.http.clone(), &mcp.url, headers).resume_session(session);
    let timeout = Duration::from_secs(u64::try_from(call.tool.timeout_seconds.max(1)).unwrap_or(1));
    let deadline = started + timeout;
    let interval = Duration::from_millis(task.poll_interval_millis).clamp(MIN_POLL, MAX_POLL);
    if let Some(reply) = &task.reply {
        // The answer a person decided; the server answers 202 and the task goes on.
        client
            .reply(&reply.request_id, &reply.result)
            .await
            .map_err(|err| {
                lost(
                    format!("the answer to task {} could not be sent: {err}", task.id),
                    started,
                )
            })?;
        tracing::info!(task = %task.id, action = %reply.result["action"], "answered the MCP task's request for input");
    }
    tracing::info!(tool = %call.tool.name, task = %task.id, "following the MCP task");
    let cancel_on_cancel = mcp.on_cancel == Some(McpOnCancel::Cancel);
    let mut cancel_sent = false;
    let status = loop {
        if cancel_on_cancel && !cancel_sent && super::run_cancelled(ctx, state).await {
            // The tool asks for its task to be cancelled with the run; the call ends as the
            // task then does (docs/design.md section 6, "MCP tasks").
            let answered = client.cancel_task(&task.id).await;
            tracing::info!(task = %task.id, ?answered, "the run is cancelled and its tool says onCancel: Cancel; tasks/cancel sent");
            cancel_sent = true;
        }
        match client.get_task(&task.id).await {
            Ok(now) if now.status.is_terminal() => break now,
            Ok(now) if now.status == TaskStatus::InputRequired => {
                let left = deadline.saturating_duration_since(Instant::now());
                match client.task_input(&task.id, left).await {
                    TaskAnswer::Input(request) => {
                        tracing::info!(task = %task.id, "the MCP task asks for input");
                        return Ok(FollowStep::InputRequired(TaskInput {
                            task_id: task.id.clone(),
                            request_id: request.request_id,
                            message: request.message,
                            requested_schema: request.requested_schema,
                        }));
                    }
                    // Its request was answered already (or it ended meanwhile): asked again.
                    TaskAnswer::Ended(_) => continue,
                }
            }
            Ok(_) => {}
            // The OAuth token expired or was revoked: a new one, once, and ask again.
            Err(McpError::HttpStatus { status: 401, .. })
                if !renewed && auth.renew(ctx, &mut client).await =>
            {
                renewed = true;
                continue;
            }
            // 404 is the transport's word for a forgotten session; some servers say 400.
            Err(McpError::HttpStatus { status, body, .. }) if (400..500).contains(&status) => {
                return Err(lost(
                    format!(
                        "{} refused to say what became of task {} (HTTP {status}: {body}); its \
                         session is likely gone",
                        mcp.url, task.id
                    ),
                    started,
                ));
            }
            Err(McpError::Rpc { code, message, .. }) => {
                return Err(lost(
                    format!(
                        "{} does not know task {} ({code}: {message})",
                        mcp.url, task.id
                    ),
                    started,
                ));
            }
            // Not reached, or no whole answer: asking again is safe.
            Err(err) => {
                tracing::debug!(task = %task.id, %err, "the MCP task could not be asked about")
            }
        }
        if Instant::now() + interval > deadline {
            return Err(lost(
                format!(
                    "task {} was not done within the tool's timeoutSeconds ({} s) of following it",
                    task.id,
                    timeout.as_secs()
                ),
                started,
            ));
        }
        tokio::time::sleep(interval).await;
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(5));
    let outcome = client.task_result(&task.id, left).await;
    Ok(FollowStep::Finished(match status.status {
        TaskStatus::Completed => match (call.pin.as_deref(), outcome) {
            (_, CallOutcome::Unknown { detail, .. }) => lost(detail, started),
            (Some(pin), outcome) => super::mcp::checked_outcome(pin, outcome),
            (None, outcome) => super::mcp::tool_outcome(outcome),
        },
        ended => {
            let word = if ended == TaskStatus::Cancelled {
                "cancelled"
            } else {
                "failed"
            };
            let said = match super::mcp::tool_outcome(outcome) {
                ToolOutcome::Result { content, .. }
                | ToolOutcome::Error { content, .. }
                | ToolOutcome::Abort { content, .. } => content,
                ToolOutcome::Unknown { detail, .. } => json!(detail),
            };
            failed(
                json!({
                    "error": format!("the MCP task {word}"),
                    "taskId": task.id,
                    "statusMessage": status.status_message,
                    "result": said,
                }),
                started,
            )
        }
    }))
}
