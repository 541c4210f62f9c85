//! The sample MCP server (`POST /mcp` on the sample tools' address; docs/design.md section 6):
//! the shop of the sample tools over the Streamable HTTP transport, for runs with `mcp` tools
//! and toolsets that `agentrt dev` can run without any other server.
//!
//! It speaks the stateless revision 2026-07-28 (`server/discover`, then requests carrying the
//! `_meta` envelope and `MCP-Protocol-Version: 2026-07-28`, no session), and through
//! `initialize` 2025-11-25, 2025-06-18 and 2025-03-26 (it answers the one asked, else
//! 2025-11-25), giving each `initialize` an `Mcp-Session-Id`, answering 404 for a session it
//! does not know (`DELETE /mcp` ends one). Every answer is `application/json`. Tools:
//! - `lookup_order` {order} (annotated read-only): the order, as `POST /lookup_order` answers.
//! - `issue_refund` {order, amount} (annotated idempotent): a refund recorded once per
//!   idempotency key (`_meta["agentrt.dev/idempotencyKey"]`, else the `Idempotency-Key`
//!   header) in the same ledger as `POST /issue_refund`, so the sample hook finds it; a repeat
//!   answers the first refund with `replayed: true`.
//!
//! A demonstration, not part of the runtime.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{idempotency_key, Samples};

/// The revisions of the initialize handshake it answers, highest first.
const VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
/// The stateless revision.
const STATELESS: &str = "2026-07-28";

/// The tools it lists, as `tools/list` answers them.
pub fn tool_definitions() -> Value {
    json!([
        {
            "name": "lookup_order",
            "title": "Look up an order",
            "description": "Read an order: its customer, status, items and whether it arrived damaged.",
            "inputSchema": {"type": "object", "required": ["order"], "properties": {"order": {"type": "integer"}}},
            "annotations": {"readOnlyHint": true, "openWorldHint": false}
        },
        {
            "name": "issue_refund",
            "title": "Refund an order",
            "description": "Refund an amount of an order, once per idempotency key.",
            "inputSchema": {"type": "object", "required": ["order", "amount"], "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}},
            "annotations": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true}
        }
    ])
}

fn session_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// `POST /mcp`: one JSON-RPC message in, its response (or 202 for a notification) out.
pub(super) async fn post(
    State(samples): State<Samples>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(message) = serde_json::from_slice::<Value>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(rpc_error(&Value::Null, -32700, "not JSON")),
        )
            .into_response();
    };
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    let version_header = headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok());
    if version_header == Some(STATELESS) {
        return stateless(&samples, &headers, &message, method, id);
    }
    if method == "initialize" {
        let asked = message
            .pointer("/params/protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let version = VERSIONS
            .iter()
            .find(|v| **v == asked)
            .unwrap_or(&VERSIONS[0]);
        let session = uuid::Uuid::new_v4().simple().to_string();
        if let Ok(mut sessions) = samples.sessions.lock() {
            sessions.insert(session.clone());
        }
        let result = json!({
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": false}},
            "serverInfo": {"name": "agentrt-sample-shop", "version": env!("CARGO_PKG_VERSION")}
        });
        return (
            [("mcp-session-id", session)],
            Json(json!({"jsonrpc": "2.0", "id": id, "result": result})),
        )
            .into_response();
    }
    let known = session_of(&headers).is_some_and(|s| {
        samples
            .sessions
            .lock()
            .is_ok_and(|sessions| sessions.contains(&s))
    });
    if !known {
        let (status, text) = match session_of(&headers) {
            Some(_) => (
                StatusCode::NOT_FOUND,
                "session not found; initialize a new one",
            ),
            None => (
                StatusCode::BAD_REQUEST,
                "no Mcp-Session-Id; initialize first",
            ),
        };
        return (status, Json(rpc_error(&id, -32600, text))).into_response();
    }
    if message.get("id").is_none() {
        return StatusCode::ACCEPTED.into_response();
    }
    let result = match method {
        "ping" => json!({}),
        "tools/list" => json!({"tools": tool_definitions()}),
        "tools/call" => call(
            &samples,
            &headers,
            message.get("params").unwrap_or(&Value::Null),
        ),
        _ => return Json(rpc_error(&id, -32601, "method not found")).into_response(),
    };
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// A 2026-07-28 request: it stands alone (the envelope in `_meta`, `Mcp-Method` naming the
/// method); `server/discover` lists the revisions and says who the server is.
fn stateless(
    samples: &Samples,
    headers: &HeaderMap,
    message: &Value,
    method: &str,
    id: Value,
) -> Response {
    let envelope = message.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion");
    if envelope.and_then(Value::as_str) != Some(STATELESS)
        || message
            .pointer("/params/_meta/io.modelcontextprotocol~1clientCapabilities")
            .is_none()
    {
        let text =
            "params._meta must carry the 2026-07-28 envelope (protocolVersion, clientCapabilities)";
        return (StatusCode::BAD_REQUEST, Json(rpc_error(&id, -32602, text))).into_response();
    }
    if headers.get("mcp-method").and_then(|v| v.to_str().ok()) != Some(method) {
        let text = "Mcp-Method does not match the method";
        return (StatusCode::BAD_REQUEST, Json(rpc_error(&id, -32020, text))).into_response();
    }
    if message.get("id").is_none() {
        return StatusCode::ACCEPTED.into_response();
    }
    let server_info = json!({"name": "agentrt-sample-shop", "version": env!("CARGO_PKG_VERSION")});
    let mut result = match method {
        "server/discover" => {
            let mut supported = vec![STATELESS];
            supported.extend(VERSIONS);
            json!({"supportedVersions": supported, "capabilities": {"tools": {"listChanged": false}}})
        }
        "tools/list" => json!({"tools": tool_definitions()}),
        "tools/call" => call(
            samples,
            headers,
            message.get("params").unwrap_or(&Value::Null),
        ),
        _ => return Json(rpc_error(&id, -32601, "method not found")).into_response(),
    };
    result["resultType"] = json!("complete");
    result["_meta"] = json!({"io.modelcontextprotocol/serverInfo": server_info});
    Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// `DELETE /mcp`: ends the session.
pub(super) async fn delete(State(samples): State<Samples>, headers: HeaderMap) -> StatusCode {
    let removed = session_of(&headers).is_some_and(|s| {
        samples
            .sessions
            .lock()
            .is_ok_and(|mut sessions| sessions.remove(&s))
    });
    if removed {
        StatusCode::OK
    } else {
        StatusCode::NOT_FOUND
    }
}

fn text_result(value: Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": value.to_string()}],
        "structuredContent": value,
        "isError": is_error
    })
}

fn call(samples: &Samples, headers: &HeaderMap, params: &Value) -> Value {
    let args = params.get("arguments").cloned().unwrap_or(Value::Null);
    let order = args.get("order").and_then(Value::as_i64);
    match (params.get("name").and_then(Value::as_str), order) {
        (Some("lookup_order"), Some(order)) => text_result(super::order(order), false),
        (Some("issue_refund"), Some(order)) => {
            let Some(amount) = args.get("amount").and_then(Value::as_f64) else {
                return text_result(json!({"error": "amount must be a number"}), true);
            };
            let key = params
                .pointer("/_meta/agentrt.dev~1idempotencyKey")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| idempotency_key(headers));
            match samples.record_refund(&key, order, amount) {
                Some(refund) => text_result(refund, false),
                None => text_result(json!({"error": "the ledger is unavailable"}), true),
            }
        }
        (Some("lookup_order" | "issue_refund"), None) => {
            text_result(json!({"error": "order must be an integer"}), true)
        }
        (name, _) => text_result(json!({"error": format!("no tool {name:?}")}), true),
    }
}
