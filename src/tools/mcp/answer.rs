//! Reading one HTTP answer of the Streamable HTTP transport, bounded (docs/design.md section
//! 3 guarantee 8 and section 6): an `application/json` body (one JSON-RPC message, or a batch)
//! or a `text/event-stream` read event by event until the response to the request's id.
//!
//! Owns: the bounds and the answer's size and SHA-256. At most `max_answer_bytes` of a body (of
//! one SSE event) are kept; past that the bytes are still counted and hashed as they stream by,
//! up to `max_stream_bytes`, where reading stops and the connection is dropped, so no answer,
//! however big or endless, wedges a call longer than its timeout. Also: what a `tools/call`
//! response says ([`outcome_of`]) and the head of a refused answer's body. Must not: retry or
//! resend.

use std::time::Instant;

use sha2::{Digest, Sha256};

use serde_json::Value;

use super::sse::{SseEvent, SseParser};
use super::CallOutcome;
use crate::tools::http::millis;

/// What was read of an answer's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerStats {
    /// Body bytes read (all of them when `complete`; for an SSE answer, up to the response).
    pub bytes: u64,
    /// `sha256:<hex>` of those bytes.
    pub sha256: String,
    /// Whether the body was read to its end (false when reading stopped at the response of an
    /// SSE stream, or at `max_stream_bytes`).
    pub complete: bool,
}

/// How reading an answer ended.
#[derive(Debug)]
pub enum Read {
    /// The JSON-RPC response to the request (`id` matched, with `result` or `error`).
    Response(Value, AnswerStats),
    /// The body ended without that response (a 202, notifications only, another id).
    NoResponse(AnswerStats),
    /// The body (or an SSE event) passed `max_answer_bytes`.
    TooLarge(AnswerStats),
    /// A body that is not JSON-RPC.
    Invalid(String, AnswerStats),
    /// The connection broke or timed out while reading.
    Lost(reqwest::Error, AnswerStats),
    /// A request of the server with the method asked for ([`read_until_request`]), before the
    /// response: the whole JSON-RPC message.
    Request(Value, AnswerStats),
}

/// The bounds of one read.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Most bytes of a body (or of one SSE event) kept and parsed.
    pub max_answer_bytes: usize,
    /// Most bytes read of a body at all.
    pub max_stream_bytes: u64,
}

struct Tally {
    hasher: Sha256,
    bytes: u64,
}

impl Tally {
    fn add(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes += chunk.len() as u64;
    }

    fn stats(&self, complete: bool) -> AnswerStats {
        AnswerStats {
            bytes: self.bytes,
            sha256: format!("sha256:{}", hex::encode(self.hasher.clone().finalize())),
            complete,
        }
    }
}

/// Whether `message` is the response to request `id`.
pub fn is_response(message: &Value, id: i64) -> bool {
    message.get("id").and_then(Value::as_i64) == Some(id)
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// Reads `response`'s body as its Content-Type says (SSE for `text/event-stream`, else JSON),
/// up to the response to `id`; with `method`, stops instead at the first request of the
/// server with that method (in an SSE answer: the `elicitation/create` of a task asking for
/// input, docs/design.md section 6, "MCP tasks"), returning it as [`Read::Request`].
pub async fn read_until_request(
    mut response: reqwest::Response,
    id: i64,
    bounds: Bounds,
    method: Option<&str>,
) -> Read {
    let sse = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let mut tally = Tally {
        hasher: Sha256::new(),
        bytes: 0,
    };
    let mut kept: Vec<u8> = Vec::new();
    let mut over = false;
    let mut parser = SseParser::new(bounds.max_answer_bytes);
    let mut events = Vec::new();
    loop {
        let chunk = match response.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(err) => return Read::Lost(err, tally.stats(false)),
        };
        tally.add(&chunk);
        if sse {
            parser.feed(&chunk, &mut events);
            for event in events.drain(..) {
                match event {
                    SseEvent::Oversize => over = true,
                    SseEvent::Message { event, data } if event == "message" => {
                        let Ok(message) = serde_json::from_slice::<Value>(&data) else {
                            continue;
                        };
                        let asked = method.is_some_and(|m| {
                            message.get("method").and_then(Value::as_str) == Some(m)
                                && message.get("id").is_some()
                        });
                        if asked {
                            return Read::Request(message, tally.stats(false));
                        }
                        if let Some(found) = find_in(message, id) {
                            return Read::Response(found, tally.stats(false));
                        }
                    }
                    SseEvent::Message { .. } => {}
                }
            }
        } else if !over {
            if kept.len() + chunk.len() > bounds.max_answer_bytes {
                over = true;
                kept = Vec::new();
            } else {
                kept.extend_from_slice(&chunk);
            }
        }
        if tally.bytes >= bounds.max_stream_bytes {
            // Dropping the response closes the connection: nothing more is read.
            return Read::TooLarge(tally.stats(false));
        }
    }
    let stats = tally.stats(true);
    if over {
        return Read::TooLarge(stats);
    }
    if sse || kept.is_empty() {
        return Read::NoResponse(stats);
    }
    match serde_json::from_slice::<Value>(&kept) {
        Ok(message) => match find_in(message, id) {
            Some(found) => Read::Response(found, stats),
            None => Read::NoResponse(stats),
        },
        Err(err) => Read::Invalid(format!("the answer is not JSON: {err}"), stats),
    }
}

/// The response to `id` in a message or a batch of them (2025-03-26 allows batches).
fn find_in(message: Value, id: i64) -> Option<Value> {
    match message {
        Value::Array(items) => items.into_iter().find(|m| is_response(m, id)),
        message if is_response(&message, id) => Some(message),
        _ => None,
    }
}

/// The outcome a JSON-RPC response to `tools/call` says.
pub(super) fn outcome_of(response: Value, answer: AnswerStats, started: Instant) -> CallOutcome {
    let duration_ms = millis(started);
    if let Some(error) = response.get("error") {
        return CallOutcome::RpcError {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            data: error.get("data").cloned(),
            duration_ms,
        };
    }
    let Some(result) = response.get("result").and_then(Value::as_object) else {
        return CallOutcome::InvalidAnswer {
            detail: "result is not an object".to_string(),
            answer,
            duration_ms,
        };
    };
    if let Some(kind) = result
        .get("resultType")
        .and_then(Value::as_str)
        .filter(|k| *k != "complete")
    {
        return CallOutcome::InvalidAnswer {
            detail: format!(
                "resultType {kind}: the server asks for more before it answers \
                 (input_required), which agentrt does not give; the call has no result"
            ),
            answer,
            duration_ms,
        };
    }
    let (content, structured) = match result.get("structuredContent") {
        Some(s) if !s.is_null() => (s.clone(), true),
        _ => (
            result
                .get("content")
                .cloned()
                .unwrap_or(Value::Array(vec![])),
            false,
        ),
    };
    if result.get("isError") == Some(&Value::Bool(true)) {
        CallOutcome::ToolReportedError {
            content,
            answer,
            duration_ms,
        }
    } else {
        CallOutcome::Result {
            content,
            structured,
            answer,
            duration_ms,
        }
    }
}

/// At most 512 bytes of a refused answer's body, as text.
pub(super) async fn body_snippet(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < 512 {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(512);
    String::from_utf8_lossy(&bytes).into_owned()
}
