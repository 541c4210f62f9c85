//! The external calls an executor makes once the write recording their start landed and the
//! lease check passed (docs/design.md sections 4 and 6): the tool (http), the webhook agent, the
//! reconcile hook, the model; an MCP server's listing and `tools/call` in `mcp`. Each returns how the call ended, as the engine's next input wants it; none
//! writes the record or decides what happens next.

pub mod job;
mod mcp;
mod oauth;
mod task;

use std::time::Duration;

use super::cluster::RunState;
use super::context::Context;
use super::fault::{self, FaultPoint};
use crate::agents::openai;
use crate::engine::{AgentFailure, ModelOutcome, StatusAnswer, StatusQuery, ToolCall, ToolOutcome};
use crate::tools::http::{self, HttpCall, SecretSource};

pub use mcp::list_servers;
pub use task::{follow_task, FollowStep};

/// How a call sent by [`call_tool`] went on: it ended, or its MCP server created a task that
/// the engine records before it is followed ([`follow_task`]; docs/design.md section 6, "MCP
/// tasks").
#[derive(Debug)]
pub enum ToolStep {
    /// The call ended: its outcome.
    Finished(ToolOutcome),
    /// The server created this task for the call.
    TaskCreated(crate::engine::McpTask),
}

/// The Secrets of one run's namespace, read for that run (its consent checked on each read).
struct ApiSecrets<'a> {
    ctx: &'a Context,
    run: &'a str,
}

impl<'a> ApiSecrets<'a> {
    fn of(ctx: &'a Context, state: &'a RunState) -> ApiSecrets<'a> {
        ApiSecrets {
            ctx,
            run: &state.run.snapshot.name,
        }
    }
}

impl SecretSource for ApiSecrets<'_> {
    async fn secret_value(
        &self,
        namespace: &str,
        secret: &crate::api::SecretKeyRef,
    ) -> Result<String, String> {
        self.ctx.api.secret_value(namespace, self.run, secret).await
    }
}

/// What every request to an `http` tool carries besides its own: the tool's headers (Secret
/// values read now, with their owner's consent), `Agentrt-Run` (`namespace/name`) and
/// `Agentrt-Holder`. Errs with why a header cannot be resolved (naming the Secret, never a
/// value).
async fn http_context(
    ctx: &Context,
    state: &RunState,
    spec: &crate::api::HttpTool,
) -> Result<(Vec<(String, String)>, String, String), String> {
    let snapshot = &state.run.snapshot;
    let headers =
        http::resolve_headers(spec, &snapshot.namespace, &ApiSecrets::of(ctx, state)).await?;
    let run = format!("{}/{}", snapshot.namespace, snapshot.name);
    Ok((headers, run, ctx.settings.holder.as_str().to_string()))
}

/// Whether the run of `state` asks to be cancelled now (`spec.cancel`, read live; a run gone
/// counts as cancelled, one that cannot be read as not). For the tools that act on a cancel
/// while they run (`job.onCancel: Delete`, `mcp.onCancel: Cancel`).
async fn run_cancelled(ctx: &Context, state: &RunState) -> bool {
    let snapshot = &state.run.snapshot;
    match ctx.api.get_run(&snapshot.namespace, &snapshot.name).await {
        Ok(Some(run)) => run.snapshot.spec.cancel,
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Performs one tool call (its `step.tool_started` write landed) and says how it ended, or
/// that its MCP server created a task for it.
pub async fn call_tool(ctx: &Context, state: &RunState, call: ToolCall) -> ToolStep {
    if call.tool.mcp.is_some() {
        return mcp::call_mcp_tool(ctx, state, call).await;
    }
    ToolStep::Finished(call_http_tool(ctx, state, call).await)
}

/// Performs one `http` tool call.
async fn call_http_tool(ctx: &Context, state: &RunState, call: ToolCall) -> ToolOutcome {
    let Some(spec) = call.tool.http.as_ref() else {
        return ToolOutcome::Error {
            failure: crate::api::ToolFailure::NoExecutor,
            status: None,
            content: serde_json::json!(format!(
                "tool {} has no executor (set http or mcp)",
                call.tool.name
            )),
            duration_ms: 0,
        };
    };
    let (headers, run, holder) = match http_context(ctx, state, spec).await {
        Ok(context) => context,
        Err(err) => {
            return ToolOutcome::Error {
                failure: crate::api::ToolFailure::HeaderUnavailable,
                status: None,
                content: serde_json::json!(err),
                duration_ms: 0,
            }
        }
    };
    let request = HttpCall {
        url: spec.url.clone(),
        args: call.args.clone(),
        idempotency_key: call.idempotency_key.clone(),
        attempt: call.attempt,
        run,
        holder,
        headers,
        timeout: Duration::from_secs(u64::try_from(call.tool.timeout_seconds.max(1)).unwrap_or(1)),
    };
    tracing::info!(tool = %call.tool.name, attempt = call.attempt, "calling the tool");
    let in_flight = http::call(&ctx.executors.http, request);
    tokio::pin!(in_flight);
    tokio::select! {
        outcome = &mut in_flight => outcome,
        _ = tokio::time::sleep(Duration::from_millis(200)) => {
            fault::check(FaultPoint::DuringTool, Some(call.step.get()));
            in_flight.await
        }
    }
}

/// Asks an `http` tool's status URL what became of an interrupted call
/// ([`crate::engine::StatusQuery`], docs/design.md section 5): the tool's headers (Secrets read
/// now, with consent as for a call), asked again while it says running, within the query's
/// timeout. A header that cannot be resolved is an unsettled answer saying so.
pub async fn ask_status(ctx: &Context, state: &RunState, query: StatusQuery) -> StatusAnswer {
    let Some(spec) = query.tool.http.as_ref() else {
        return StatusAnswer::Unsettled {
            said: serde_json::json!({"error": format!("tool {} is not an http tool", query.tool.name)}),
        };
    };
    let (headers, run, holder) = match http_context(ctx, state, spec).await {
        Ok(context) => context,
        Err(err) => {
            return StatusAnswer::Unsettled {
                said: serde_json::json!({"error": err}),
            }
        }
    };
    let request = http::status::StatusRequest {
        url: query.url,
        idempotency_key: query.idempotency_key,
        run,
        holder,
        headers,
        timeout: Duration::from_millis(query.timeout_millis),
    };
    tracing::info!(tool = %query.tool.name, url = %request.url, "asking the tool's status URL about an interrupted call");
    let answer = http::status::ask(&ctx.executors.http, &request).await;
    match &answer {
        // What it said is bounded (a body's first KiB); a result is not logged.
        StatusAnswer::Unsettled { said } => {
            tracing::warn!(tool = %query.tool.name, url = %request.url, %said, "the tool's status URL cannot tell what became of the interrupted call");
        }
        StatusAnswer::Succeeded { .. } => {
            tracing::info!(tool = %query.tool.name, "the tool's status URL says the call succeeded");
        }
        StatusAnswer::Failed { .. } => {
            tracing::info!(tool = %query.tool.name, "the tool's status URL says the call failed");
        }
        StatusAnswer::NotFound => {
            tracing::info!(tool = %query.tool.name, "the tool's status URL does not know the call (404)");
        }
    }
    fault::check(FaultPoint::AfterStatusAnswered, Some(query.step.get()));
    answer
}

/// Sends one attempt of the webhook agent for a decision, bounded by `timeout_millis` (what the
/// engine left of `spec.agent.webhook.timeoutSeconds`); the engine decides on retries.
pub async fn call_agent(
    ctx: &Context,
    state: &RunState,
    request: &serde_json::Value,
    timeout_millis: u64,
) -> Result<serde_json::Value, AgentFailure> {
    let Some(webhook) = state.run.snapshot.spec.agent.webhook.as_ref() else {
        return Err(
            "the engine asked for a webhook agent but spec.agent.webhook is not set".into(),
        );
    };
    let timeout = Duration::from_millis(timeout_millis.max(1));
    crate::agents::webhook::call_agent(&ctx.executors.http, &webhook.url, timeout, request).await
}

pub async fn call_hook(
    ctx: &Context,
    state: &RunState,
    view: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let Some(webhook) = state
        .run
        .snapshot
        .spec
        .reconcile
        .as_ref()
        .and_then(|reconcile| reconcile.webhook.as_ref())
    else {
        return Err(
            "the engine asked for the reconcile hook but spec.reconcile.webhook is not set".into(),
        );
    };
    let timeout = Duration::from_secs(u64::try_from(webhook.timeout_seconds.max(1)).unwrap_or(1));
    crate::agents::webhook::call_reconcile_hook(&ctx.executors.http, &webhook.url, timeout, view)
        .await
}

/// Sends one model attempt (the chat-completions body the engine rendered) for step `step` and
/// says how it ended; the engine charges it and decides on retries. The attempt is bounded by
/// `spec.agent.openai.timeoutSeconds`.
pub async fn call_model(
    ctx: &Context,
    state: &RunState,
    step: crate::api::StepIndex,
    request: &serde_json::Value,
    max_output_tokens: Option<i64>,
) -> ModelOutcome {
    let snapshot = &state.run.snapshot;
    let Some(agent) = snapshot.spec.agent.openai.as_ref() else {
        return ModelOutcome::NotSent {
            detail: "the engine asked for a model call but spec.agent.openai is not set".into(),
            retryable: false,
        };
    };
    let key = match &agent.api_key_secret_ref {
        None => None,
        Some(secret) => match ctx
            .api
            .secret_value(&snapshot.namespace, &snapshot.name, secret)
            .await
        {
            Ok(key) => Some(openai::ApiKey::new(key.trim().to_string())),
            Err(err) => {
                return ModelOutcome::NotSent {
                    detail: format!(
                        "spec.agent.openai.apiKeySecretRef: cannot read key {:?} of Secret {}/{}: {err}",
                        secret.key, snapshot.namespace, secret.name
                    ),
                    retryable: true,
                }
            }
        },
    };
    let client = match openai::build_client() {
        Ok(client) => client,
        Err(err) => {
            return ModelOutcome::NotSent {
                detail: err.to_string(),
                retryable: false,
            }
        }
    };
    let timeout = Duration::from_secs(u64::try_from(agent.timeout_seconds.max(1)).unwrap_or(1));
    tracing::info!(model = %agent.model, "calling the model");
    let in_flight = openai::call(&client, agent, key.as_ref(), request, timeout);
    tokio::pin!(in_flight);
    let answered = tokio::select! {
        answered = &mut in_flight => answered,
        _ = tokio::time::sleep(Duration::from_millis(200)) => {
            fault::check(FaultPoint::DuringModel, Some(step.get()));
            in_flight.await
        }
    };
    match answered {
        // A reply over the bound is a failed attempt whatever its status: it was not read to
        // its end (docs/design.md section 6, "Answers").
        Ok(answer) if answer.too_large => ModelOutcome::Failed {
            status: answer.status,
            retry_after_ms: answer.retry_after_millis,
            detail: format!(
                "the reply is over {} bytes; reading stopped there",
                openai::MAX_REPLY_BYTES
            ),
            latency_ms: answer.latency_ms,
        },
        Ok(answer) if (200..300).contains(&answer.status) => {
            let parsed = openai::parse_reply(&answer.body, max_output_tokens);
            ModelOutcome::Answered {
                decision: parsed.decision,
                usage: parsed.usage,
                latency_ms: answer.latency_ms,
            }
        }
        Ok(answer) => ModelOutcome::Failed {
            status: answer.status,
            retry_after_ms: answer.retry_after_millis,
            detail: String::from_utf8_lossy(&answer.body)
                .chars()
                .take(300)
                .collect(),
            latency_ms: answer.latency_ms,
        },
        Err(err) => match err {
            openai::ModelCallError::Ambiguous { latency_ms, .. } => ModelOutcome::NoAnswer {
                detail: err.to_string(),
                latency_ms,
            },
            other => ModelOutcome::NotSent {
                retryable: other.retryable(),
                detail: other.to_string(),
            },
        },
    }
}
