//! The MCP calls an executor makes (docs/design.md section 6, the `mcp` tool; docs/behaviours.md
//! 60-63): listing the servers before a run starts ([`list_servers`]) and one `tools/call`
//! ([`call_mcp_tool`]), with the server's headers resolved from Secrets like an `http` tool's.
//!
//! Owns: performing them with `tools::mcp::McpClient` and mapping a [`CallOutcome`] onto the
//! engine's [`ToolOutcome`]. Must not: decide whether a pin still holds (it asks the engine's
//! pure [`pins::check`]) or retry a call.

use std::time::Duration;

use serde_json::{json, Value};

use super::oauth::{server_auth, ServerAuth};
use super::ToolStep;
use crate::api::{McpServer, ToolFailure, ToolPin};
use crate::controller::cluster::RunState;
use crate::controller::context::Context;
use crate::controller::fault::{self, FaultPoint};
use crate::engine::{pins, McpTask, ServerListing, ToolCall, ToolOutcome};
use crate::tools::http::millis;
use crate::tools::mcp::{CallOutcome, McpClient, ToolsCall};

/// Lists every server (`initialize`, `tools/list` through every page), in order: one
/// [`ServerListing`] each, its error a sentence naming the server and no header value.
pub async fn list_servers(
    ctx: &Context,
    state: &RunState,
    servers: &[McpServer],
) -> Vec<ServerListing> {
    let mut out = Vec::with_capacity(servers.len());
    for server in servers {
        let mut protocol = None;
        let mut server_info = None;
        let auth = server_auth(
            ctx,
            state,
            &server.url,
            &server.headers,
            server.oauth.as_ref(),
        )
        .await;
        let tools = match auth {
            Err(err) => Err(err),
            Ok(auth) => {
                let mut client = McpClient::new(
                    ctx.executors.http.clone(),
                    &server.url,
                    auth.headers.clone(),
                );
                let listed = list(ctx, &auth, &mut client)
                    .await
                    .map_err(|err| err.to_string());
                protocol = client.session().map(|s| s.protocol.as_str().to_string());
                server_info = client.session().map(|s| identity(&s.server_info));
                listed
            }
        };
        if let Err(err) = &tools {
            tracing::warn!(server = %server.url, %err, "the MCP server cannot be listed");
        }
        out.push(ServerListing {
            url: server.url.clone(),
            tools,
            protocol,
            server_info,
        });
    }
    out
}

fn error(failure: ToolFailure, content: Value, duration_ms: u64) -> ToolOutcome {
    ToolOutcome::Error {
        failure,
        status: None,
        content,
        duration_ms,
    }
}

/// Performs one `mcp` tool call: lists the server, refuses the call `definition_changed`
/// when [`pins::check`] finds the definition changed or gone (nothing sent), else sends
/// `tools/call` once with the step's idempotency key and attempt; as a task when the pinned
/// definition allows one and the server offers them ([`ToolStep::TaskCreated`] when the server
/// created it; docs/design.md section 6, "MCP tasks").
pub async fn call_mcp_tool(ctx: &Context, state: &RunState, call: ToolCall) -> ToolStep {
    match call_mcp(ctx, state, call).await {
        Ok(step) => step,
        Err(outcome) => ToolStep::Finished(outcome),
    }
}

/// The margin a task is kept after the tool's timeout (its `ttl` beyond `timeoutSeconds`), so
/// that a replica taking the run over still finds it: 10 minutes.
const TASK_TTL_MARGIN: Duration = Duration::from_secs(600);

async fn call_mcp(
    ctx: &Context,
    state: &RunState,
    call: ToolCall,
) -> Result<ToolStep, ToolOutcome> {
    let snapshot = &state.run.snapshot;
    let Some(mcp) = call.tool.mcp.as_deref() else {
        return Err(error(
            ToolFailure::NoExecutor,
            json!(format!("tool {} has no mcp executor", call.tool.name)),
            0,
        ));
    };
    let Some(pin) = call.pin.as_ref() else {
        return Err(error(
            ToolFailure::DefinitionChanged,
            json!(format!(
                "tool {} has no pin in status.toolPins; the call was not sent",
                call.tool.name
            )),
            0,
        ));
    };
    let auth = match server_auth(ctx, state, &mcp.url, &mcp.headers, mcp.oauth.as_ref()).await {
        Ok(auth) => auth,
        Err(err) => return Err(error(ToolFailure::HeaderUnavailable, json!(err), 0)),
    };
    let started = std::time::Instant::now();
    let mut client = McpClient::new(ctx.executors.http.clone(), &mcp.url, auth.headers.clone());
    let listed = match list(ctx, &auth, &mut client).await {
        Ok(listed) => listed,
        Err(err) => {
            return Err(error(
                ToolFailure::ConnectionRefused,
                json!(format!(
                "the MCP server could not be listed to check the pin; the call was not sent: {err}"
            )),
                millis(started),
            ))
        }
    };
    if let Some(refused) = refuse_unless_pinned(pin, &mcp.url, &listed, millis(started)) {
        return Err(refused);
    }
    let now = client.session().map(|s| identity(&s.server_info));
    if let Some(refused) = refuse_another_server(pin, now.as_ref(), millis(started)) {
        return Err(refused);
    }
    let mut session = client.session().cloned();
    let as_task = pins::allows_tasks(pin) && session.as_ref().is_some_and(|s| s.tasks);
    if as_task && session.as_ref().is_some_and(|s| s.id.is_some()) {
        // A task may ask for input: its session declares that agentrt answers (through an
        // input_required Approval). A fresh session, so the listing's stays as it was.
        client = client.answering_input();
        if let Err(err) = client.initialize().await {
            return Err(error(
                ToolFailure::ConnectionRefused,
                json!(format!(
                    "a session for the task could not be opened; the call was not sent: {err}"
                )),
                millis(started),
            ));
        }
        session = client.session().cloned();
    }
    let timeout = Duration::from_secs(u64::try_from(call.tool.timeout_seconds.max(1)).unwrap_or(1));
    let request = ToolsCall {
        name: pin.server_tool.clone(),
        arguments: call.args.clone(),
        idempotency_key: call.idempotency_key.clone(),
        attempt: call.attempt,
        run: format!("{}/{}", snapshot.namespace, snapshot.name),
        holder: ctx.settings.holder.as_str().to_string(),
        timeout,
        task_ttl: as_task.then(|| timeout + TASK_TTL_MARGIN),
    };
    tracing::info!(tool = %call.tool.name, server = %mcp.url, attempt = call.attempt, as_task, "calling the MCP tool");
    let in_flight = client.call_tool(&request);
    tokio::pin!(in_flight);
    let outcome = tokio::select! {
        outcome = &mut in_flight => outcome,
        _ = tokio::time::sleep(Duration::from_millis(200)) => {
            fault::check(FaultPoint::DuringTool, Some(call.step.get()));
            in_flight.await
        }
    };
    if let CallOutcome::TaskCreated { task, .. } = &outcome {
        let Some(session) = session else {
            return Err(tool_outcome(outcome));
        };
        tracing::info!(tool = %call.tool.name, task = %task.id, "the MCP server created a task for the call");
        fault::check(FaultPoint::AfterTaskCreated, Some(call.step.get()));
        return Ok(ToolStep::TaskCreated(McpTask {
            id: task.id.clone(),
            poll_interval_millis: task.poll_interval_ms.unwrap_or(1000),
            session: session.id,
            protocol_version: session.protocol.as_str().to_string(),
            reply: None,
        }));
    }
    Ok(ToolStep::Finished(checked_outcome(pin, outcome)))
}

/// A `tools/call`'s (or a task's) outcome as the engine records it, `structuredContent`
/// checked against the pinned `outputSchema` first.
pub(super) fn checked_outcome(pin: &ToolPin, outcome: CallOutcome) -> ToolOutcome {
    if let Some(refused) = refuse_unless_output_matches(pin, &outcome) {
        return refused;
    }
    tool_outcome(outcome)
}

/// `tools/list` of `client`; a 401 (the server no longer takes the OAuth token) renews the
/// token once and lists again.
async fn list(
    ctx: &Context,
    auth: &ServerAuth,
    client: &mut McpClient,
) -> Result<Vec<Value>, crate::tools::mcp::McpError> {
    match client.list_tools().await {
        Err(crate::tools::mcp::McpError::HttpStatus { status: 401, .. })
            if auth.renew(ctx, client).await =>
        {
            client.list_tools().await
        }
        listed => listed,
    }
}

/// A result's `structuredContent` checked against the pinned `outputSchema` (docs/design.md
/// section 6, "MCP revisions"): a `tool_error` `invalid_content` naming the violations when it
/// does not pass (or the schema does not compile), `None` when it passes or there is nothing
/// to check (no outputSchema, no structuredContent, not a result).
fn refuse_unless_output_matches(pin: &ToolPin, outcome: &CallOutcome) -> Option<ToolOutcome> {
    let CallOutcome::Result {
        content,
        structured: true,
        duration_ms,
        ..
    } = outcome
    else {
        return None;
    };
    let violations = pins::check_output(pin, content).err()?;
    tracing::warn!(tool = %pin.tool, "the MCP tool's structuredContent does not match its outputSchema");
    Some(error(
        ToolFailure::InvalidContent,
        json!({
            "error": "the tool's structuredContent does not match its pinned outputSchema",
            "tool": pin.server_tool,
            "violations": violations,
            "structuredContent": content,
        }),
        *duration_ms,
    ))
}

/// A server's identity as pinned: the `name` and `version` of what it said it is.
fn identity(server_info: &Value) -> Value {
    json!({"name": server_info.get("name"), "version": server_info.get("version")})
}

/// `definition_changed` when the pin records who the server was and it now says otherwise
/// (docs/design.md section 6, "MCP revisions"); `None` when it is the same or the pin
/// recorded no identity.
fn refuse_another_server(
    pin: &ToolPin,
    now: Option<&Value>,
    duration_ms: u64,
) -> Option<ToolOutcome> {
    let pinned = pins::another_server(pin, now)?;
    tracing::warn!(tool = %pin.tool, "the MCP server is not the one pinned; refused");
    Some(error(
        ToolFailure::DefinitionChanged,
        json!({
            "error": "the server is not the one the tool was pinned on (its name or version changed); the call was not sent",
            "tool": pin.server_tool,
            "pinned": pinned,
            "current": now,
        }),
        duration_ms,
    ))
}

/// `definition_changed` unless the server's current listing holds the pinned definition.
fn refuse_unless_pinned(
    pin: &ToolPin,
    url: &str,
    listed: &[Value],
    duration_ms: u64,
) -> Option<ToolOutcome> {
    let checked = pins::definitions(url, listed)
        .map_err(|err| err.to_string())
        .and_then(|current| pins::check(pin, &current).map_err(|err| err.to_string()));
    let content = match checked {
        Ok(pins::PinCheck::Unchanged) => return None,
        Ok(pins::PinCheck::Changed { pinned, current }) => json!({
            "error": "the server's definition of the tool is not the pinned one; the call was not sent",
            "tool": pin.server_tool,
            "pinned": pinned,
            "current": current,
        }),
        Ok(pins::PinCheck::Gone) => json!({
            "error": "the server no longer lists the tool; the call was not sent",
            "tool": pin.server_tool,
            "pinned": pin.sha256,
        }),
        Err(err) => json!({
            "error": "the server's listing cannot be compared with the pin; the call was not sent",
            "tool": pin.server_tool,
            "detail": err,
        }),
    };
    tracing::warn!(tool = %pin.tool, "the MCP tool's definition changed; refused");
    Some(error(ToolFailure::DefinitionChanged, content, duration_ms))
}

/// docs/design.md section 6, outcomes: how a `tools/call` ended, as the engine records it.
pub fn tool_outcome(outcome: CallOutcome) -> ToolOutcome {
    match outcome {
        CallOutcome::Result {
            content,
            duration_ms,
            ..
        } => ToolOutcome::Result {
            status: 200,
            content,
            duration_ms,
        },
        CallOutcome::ToolReportedError {
            content,
            duration_ms,
            ..
        } => error(ToolFailure::ToolReportedError, content, duration_ms),
        CallOutcome::RpcError {
            code,
            message,
            data,
            duration_ms,
        } => {
            let mut content = json!({"code": code, "message": message});
            if let Some(data) = data {
                content["data"] = data;
            }
            error(ToolFailure::McpError, content, duration_ms)
        }
        CallOutcome::NotSent {
            detail,
            duration_ms,
        } => error(ToolFailure::ConnectionRefused, json!(detail), duration_ms),
        CallOutcome::Unknown {
            detail,
            duration_ms,
        } => ToolOutcome::Unknown {
            detail,
            duration_ms,
        },
        CallOutcome::TooLarge {
            max,
            answer,
            duration_ms,
        } => error(
            ToolFailure::ResponseTooLarge,
            json!({
                "error": format!("the answer is over {max} bytes"),
                "bytes": answer.bytes,
                "sha256": answer.sha256,
            }),
            duration_ms,
        ),
        // Followed by the caller; reaching here means it could not be (no session to find
        // it in): whether the tool ran is unknown.
        CallOutcome::TaskCreated { task, duration_ms } => ToolOutcome::Unknown {
            detail: format!(
                "the server created task {} that cannot be followed",
                task.id
            ),
            duration_ms,
        },
        CallOutcome::InvalidAnswer {
            detail,
            answer,
            duration_ms,
        } => error(
            ToolFailure::InvalidContent,
            json!({"error": detail, "bytes": answer.bytes, "sha256": answer.sha256}),
            duration_ms,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ToolDefinition;
    use crate::tools::mcp::AnswerStats;

    fn pin_with(output_schema: Option<Value>) -> ToolPin {
        let definition = ToolDefinition {
            name: "total".into(),
            input_schema: json!({"type": "object"}),
            output_schema,
            ..ToolDefinition::default()
        };
        let mut pin = pins::pin("total", "http://mcp", definition).unwrap();
        pin.protocol_version = Some("2026-07-28".into());
        pin
    }

    fn answered(content: Value, structured: bool) -> CallOutcome {
        CallOutcome::Result {
            content,
            structured,
            answer: AnswerStats {
                bytes: 10,
                sha256: "sha256:00".into(),
                complete: true,
            },
            duration_ms: 3,
        }
    }

    #[test]
    fn structured_content_against_the_output_schema_passes_or_is_invalid_content() {
        let schema = json!({"type": "object", "required": ["total"],
                            "properties": {"total": {"type": "integer"}}});
        let pin = pin_with(Some(schema));
        assert_eq!(
            refuse_unless_output_matches(&pin, &answered(json!({"total": 250}), true)),
            None
        );
        match refuse_unless_output_matches(&pin, &answered(json!({"total": "many"}), true)) {
            Some(ToolOutcome::Error {
                failure: ToolFailure::InvalidContent,
                content,
                ..
            }) => {
                assert_eq!(content["tool"], "total");
                assert_eq!(content["structuredContent"], json!({"total": "many"}));
                let said = content["violations"][0].as_str().unwrap_or_default();
                assert!(said.starts_with("/total:"), "{content}");
            }
            other => panic!("{other:?}"),
        }
        // Content blocks (no structuredContent) and a tool without an outputSchema: nothing to
        // check.
        assert_eq!(
            refuse_unless_output_matches(&pin, &answered(json!([{"type": "text"}]), false)),
            None
        );
        assert_eq!(
            refuse_unless_output_matches(&pin_with(None), &answered(json!({"total": "x"}), true)),
            None
        );
    }

    #[test]
    fn a_server_that_says_it_is_another_is_refused_as_a_changed_definition() {
        let mut pin = pin_with(None);
        let shop = identity(&json!({"name": "shop", "version": "1.0", "title": "Shop"}));
        assert_eq!(shop, json!({"name": "shop", "version": "1.0"}));
        // A pin without an identity (made before it was recorded) checks nothing.
        assert_eq!(refuse_another_server(&pin, None, 1), None);
        pin.server_info = Some(shop.clone());
        assert_eq!(refuse_another_server(&pin, Some(&shop), 1), None);
        let upgraded = identity(&json!({"name": "shop", "version": "2.0"}));
        match refuse_another_server(&pin, Some(&upgraded), 1) {
            Some(ToolOutcome::Error {
                failure: ToolFailure::DefinitionChanged,
                content,
                ..
            }) => {
                assert_eq!(content["pinned"], shop);
                assert_eq!(content["current"], upgraded);
            }
            other => panic!("{other:?}"),
        }
    }
}
