//! The sample model: a tiny, scripted OpenAI-compatible chat-completions endpoint
//! (`POST /v1/chat/completions` on the sample tools' address) so the `openai` sample runs with
//! no external model. It is not a model: it reads the conversation and follows a fixed script,
//! answering with tool calls as a real model would:
//! - no tool result yet: call the first offered tool that takes an `order`, with the first
//!   number in the goal (or `agentrt_fail` when there is no such tool or number);
//! - a tool result: call `agentrt_complete` with the order's `order`, `status` and `damaged`
//!   fields (or `agentrt_fail` when the last observation was not a `tool_result`).
//!
//! It reports usage (prompt tokens ≈ request bytes / 4, a fixed 24 completion tokens, within
//! `max_tokens`) so the run's accounting has something to count. It ignores any API key.
//!
//! It knows the agent's wire only as JSON (this room does not import `agents`); that it
//! understands what `agents::openai` sends is `tests/sample_model.rs`.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

/// The model name the sample answers as (any name is accepted).
pub const SAMPLE_MODEL: &str = "agentrt-sample";

const COMPLETION_TOKENS: i64 = 24;

/// `POST /v1/chat/completions`.
pub async fn chat_completions(body: Bytes) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    let request: Value = serde_json::from_slice(&body).map_err(|err| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": format!("the body is not JSON: {err}")}})),
        )
    })?;
    let call = next_call(&request);
    let prompt_tokens = i64::try_from(body.len() / 4 + 1).unwrap_or(i64::MAX);
    let completion_tokens = request
        .get("max_tokens")
        .and_then(Value::as_i64)
        .map_or(COMPLETION_TOKENS, |cap| cap.min(COMPLETION_TOKENS));
    Ok(Json(json!({
        "id": "chatcmpl-agentrt-sample",
        "object": "chat.completion",
        "model": request.get("model").cloned().unwrap_or(json!(SAMPLE_MODEL)),
        "choices": [{
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_sample",
                    "type": "function",
                    "function": {"name": call.0, "arguments": call.1.to_string()},
                }],
            },
        }],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens.saturating_add(completion_tokens),
        },
    })))
}

/// The function to call and its arguments, from the conversation so far.
fn next_call(request: &Value) -> (String, Value) {
    let fail = |message: &str| ("agentrt_fail".to_string(), json!({"message": message}));
    let messages = request
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let last_tool = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("tool"));
    if let Some(message) = last_tool {
        let observation: Value = message
            .get("content")
            .and_then(Value::as_str)
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or(Value::Null);
        if observation.get("kind").and_then(Value::as_str) != Some("tool_result") {
            let summary = observation
                .get("summary")
                .and_then(Value::as_str)
                .unwrap_or("no result");
            return fail(&format!("the lookup did not succeed: {summary}"));
        }
        let order = &observation["content"];
        let result = json!({
            "order": order.get("order").cloned().unwrap_or(Value::Null),
            "status": order.get("status").cloned().unwrap_or(Value::Null),
            "damaged": order.get("damaged").cloned().unwrap_or(Value::Null),
        });
        return ("agentrt_complete".to_string(), json!({"result": result}));
    }
    let goal = messages
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(number) = first_number(goal) else {
        return fail("the goal names no order number");
    };
    let tool = request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("function"))
        .find(|f| f.pointer("/parameters/properties/order").is_some())
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str);
    match tool {
        Some(name) => (name.to_string(), json!({"order": number})),
        None => fail("no offered tool takes an order"),
    }
}

fn first_number(text: &str) -> Option<i64> {
    let digits: String = text
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}
