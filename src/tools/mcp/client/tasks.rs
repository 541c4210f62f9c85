//! MCP tasks (the experimental Tasks of revision 2025-11-25, SEP-1686; docs/design.md section
//! 6, "MCP tasks"): whether a server offers task-augmented `tools/call`, the task a call
//! created, and following it (`tasks/get`, `tasks/result`, `tasks/cancel`) in the session it
//! belongs to, from this process or from another replica after a takeover
//! ([`McpClient::resume_session`]).
//!
//! Owns: the shapes of these messages. Must not: open a new session for a task (a task belongs
//! to the session that created it, so a 404 for the session means the task is lost), or send
//! `tools/call` again.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{Failure, McpClient};
use crate::tools::mcp::{CallOutcome, McpError, Session};

/// Where a task stands (`status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStatus {
    /// `working`: not done yet.
    Working,
    /// `input_required`: the server waits for the client to answer a request of its own.
    InputRequired,
    /// `completed`: `tasks/result` holds the tool's result.
    Completed,
    /// `failed`: the task ended without a result.
    Failed,
    /// `cancelled`: the task was cancelled.
    Cancelled,
    /// Any other word (a newer revision's): treated as not done.
    Other(String),
}

impl TaskStatus {
    fn parse(word: &str) -> TaskStatus {
        match word {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            other => TaskStatus::Other(other.to_string()),
        }
    }

    /// Whether the task has ended (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
}

/// A task as the server describes it (`CreateTaskResult.task`, or `tasks/get`'s result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// `taskId`.
    pub id: String,
    /// `status`.
    pub status: TaskStatus,
    /// `statusMessage`, when given, at most 1 KiB of it.
    pub status_message: Option<String>,
    /// `pollInterval` in milliseconds, when given.
    pub poll_interval_ms: Option<u64>,
}

/// Whether an `initialize` (or `server/discover`) result offers task-augmented `tools/call`.
pub(super) fn offered(result: &Value) -> bool {
    result
        .pointer("/capabilities/tasks/requests/tools/call")
        .is_some_and(Value::is_object)
}

/// The task described by `value` (an object with `taskId` and `status`).
fn task_of(value: &Value) -> Option<Task> {
    let id = value.get("taskId")?.as_str()?.to_string();
    let status = TaskStatus::parse(value.get("status")?.as_str()?);
    let status_message = value.get("statusMessage").and_then(Value::as_str).map(|m| {
        let mut end = m.len().min(1024);
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m[..end].to_string()
    });
    Some(Task {
        id,
        status,
        status_message,
        poll_interval_ms: value.get("pollInterval").and_then(Value::as_u64),
    })
}

/// The task a task-augmented `tools/call`'s response created (`result.task`), if it is one.
pub(super) fn created(response: &Value) -> Option<Task> {
    task_of(response.pointer("/result/task")?)
}

/// A task's request for input (`elicitation/create`, on its `tasks/result` stream).
#[derive(Debug, Clone, PartialEq)]
pub struct InputRequest {
    /// The JSON-RPC id of the server's request (answered by it).
    pub request_id: Value,
    /// `params.message`.
    pub message: String,
    /// `params.requestedSchema` (`{}` when absent).
    pub requested_schema: Value,
}

/// What a `tasks/result` of a task that waits for input brought ([`McpClient::task_input`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TaskAnswer {
    /// The server's request for input, before any response.
    Input(InputRequest),
    /// The response (the task ended), or why none came.
    Ended(CallOutcome),
}

impl McpClient {
    /// Declares the `elicitation` capability at `initialize`, so that a task may ask for input
    /// (answered through an `input_required` Approval; docs/design.md section 6, "MCP tasks").
    pub fn answering_input(mut self) -> McpClient {
        self.elicitation = true;
        self
    }

    /// `tasks/result` of a task that waits for input: the server's `elicitation/create` on
    /// that stream ([`TaskAnswer::Input`]; the stream is then dropped, the request stays
    /// open at the server), or the response when the task ended first.
    pub async fn task_input(&mut self, id: &str, timeout: Duration) -> TaskAnswer {
        let started = Instant::now();
        let asked = self
            .exchange_until(
                "tasks/result",
                json!({"taskId": id}),
                &[],
                timeout,
                Some("elicitation/create"),
            )
            .await;
        match asked {
            Ok((message, _, _)) if message.get("method").is_some() => {
                let params = message.get("params").cloned().unwrap_or(Value::Null);
                TaskAnswer::Input(InputRequest {
                    request_id: message.get("id").cloned().unwrap_or(Value::Null),
                    message: params
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    requested_schema: params.get("requestedSchema").cloned().unwrap_or(json!({})),
                })
            }
            Ok((response, _, stats)) => TaskAnswer::Ended(self.answered(response, stats, started)),
            Err(Failure::SessionNotFound) => TaskAnswer::Ended(CallOutcome::Unknown {
                detail: format!("{} no longer knows the session of task {id}", self.url),
                duration_ms: crate::tools::http::millis(started),
            }),
            Err(failure) => TaskAnswer::Ended(self.failed_call(failure, started)),
        }
    }

    /// Answers the server's request `request_id` with `result` (a JSON-RPC response POSTed in
    /// the session; the server acknowledges it with 202).
    ///
    /// # Errors
    /// [`McpError`]: not sent, or refused (a 4xx: the session is gone).
    pub async fn reply(&mut self, request_id: &Value, result: &Value) -> Result<(), McpError> {
        let body = json!({"jsonrpc": "2.0", "id": request_id, "result": result});
        let timeout = self.handshake_timeout;
        self.send(self.request(&body, &[], timeout))
            .await
            .map(drop)
            .map_err(|failure| self.error("a response to the server's request", failure))
    }

    /// Speaks in `session` (recorded when a task was created, possibly by another replica)
    /// without a handshake: the task belongs to it.
    pub fn resume_session(mut self, session: Session) -> McpClient {
        self.session = Some(session);
        self
    }

    /// `tasks/get`: where task `id` stands.
    ///
    /// # Errors
    /// [`McpError`]: `HttpStatus` 404 when the server no longer knows the session (the task is
    /// lost with it; no new session is opened), `Rpc` when it does not know the task,
    /// `NoAnswer`/`NotSent` when it could not be asked (asking again is safe).
    pub async fn get_task(&mut self, id: &str) -> Result<Task, McpError> {
        self.task_request("tasks/get", id).await
    }

    /// `method` (`tasks/get` or `tasks/cancel`) of task `id`, its answer read as a task.
    async fn task_request(&mut self, method: &str, id: &str) -> Result<Task, McpError> {
        let timeout = self.handshake_timeout;
        let response = match self
            .exchange(method, json!({"taskId": id}), &[], timeout)
            .await
        {
            Ok((response, _, _)) => response,
            Err(failure) => return Err(self.error(method, failure)),
        };
        let result = self.result_of(method, response)?;
        // The task's fields, or (some servers) the task under `task`.
        task_of(&result)
            .or_else(|| result.get("task").and_then(task_of))
            .ok_or_else(|| self.invalid(method, "the result is not a task (taskId, status)"))
    }

    /// `tasks/result`: the outcome of task `id` as a `tools/call`'s (the server answers once
    /// the task has ended), waiting at most `timeout`. A 404 for the session is
    /// [`CallOutcome::Unknown`] (the task is lost with it); asking again is safe, as this
    /// only reads.
    pub async fn task_result(&mut self, id: &str, timeout: Duration) -> CallOutcome {
        let started = Instant::now();
        match self
            .exchange("tasks/result", json!({"taskId": id}), &[], timeout)
            .await
        {
            Ok((response, _, stats)) => self.answered(response, stats, started),
            Err(Failure::SessionNotFound) => CallOutcome::Unknown {
                detail: format!("{} no longer knows the session of task {id}", self.url),
                duration_ms: crate::tools::http::millis(started),
            },
            Err(failure) => self.failed_call(failure, started),
        }
    }

    /// `tasks/cancel`: asks the server to cancel task `id`; returns the task as it answers.
    ///
    /// # Errors
    /// [`McpError`] as for [`McpClient::get_task`].
    pub async fn cancel_task(&mut self, id: &str) -> Result<Task, McpError> {
        self.task_request("tasks/cancel", id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_task_and_the_capability_are_read_from_the_server_s_words() {
        let response = json!({"jsonrpc": "2.0", "id": 3, "result": {"task": {
            "taskId": "t-1", "status": "working", "pollInterval": 1000, "ttl": 60000,
            "createdAt": "2026-12-06T00:00:00Z"}}});
        let task = created(&response).expect("a task");
        assert_eq!(task.id, "t-1");
        assert_eq!(task.status, TaskStatus::Working);
        assert_eq!(task.poll_interval_ms, Some(1000));
        assert!(!task.status.is_terminal());
        // A plain result is not a task.
        let plain = json!({"jsonrpc": "2.0", "id": 3, "result": {"content": []}});
        assert_eq!(created(&plain), None);
        assert!(offered(
            &json!({"capabilities": {"tasks": {"requests": {"tools": {"call": {}}}}}})
        ));
        assert!(!offered(&json!({"capabilities": {"tasks": {"list": {}}}})));
        let long = "é".repeat(1000);
        let said = task_of(&json!({"taskId": "t", "status": "failed", "statusMessage": long}))
            .expect("a task");
        assert_eq!(said.status, TaskStatus::Failed);
        assert!(said.status_message.is_some_and(|m| m.len() <= 1024));
    }
}
