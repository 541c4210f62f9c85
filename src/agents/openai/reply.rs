//! Reading a chat-completions reply into the decision to record and the usage it reported.
//! Pure: the decision is what the engine records verbatim (`step.decided`) before it
//! validates it (docs/behaviours.md 7-8).

use serde_json::{json, Map, Value};

use crate::api::DeciderFailure;
use crate::engine::conversation::{COMPLETE_FUNCTION, FAIL_FUNCTION};
use crate::engine::model::ReportedUsage;

/// A reply read: the decision as it is to be recorded, and the usage it reported.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedReply {
    /// One of:
    /// - `{kind: tool_call, tool, args}`; `{kind: tool_call, tool, invalidArgs: "<raw>"}` when
    ///   the arguments text is not JSON;
    /// - `{kind: complete, result}` (a call to `agentrt_complete`);
    /// - `{kind: fail, message}` (a call to `agentrt_fail`);
    /// - `{kind: invalid, failure: no_tool_call | truncated | unparseable, content}` where
    ///   `content` is the reply's message as received (the body as text when there is no
    ///   message); a `no_tool_call` whose choice ended `finish_reason: stop` also carries
    ///   `finishReason: stop`, so the engine can read a text in it as the final answer
    ///   (`spec.agent.openai.textAnswer`, docs/behaviours.md 72).
    ///
    /// When the reply holds several calls the first is taken and
    /// `ignoredToolCalls: [names of the others]` is added.
    pub decision: Value,
    /// `usage` of the reply: `prompt_tokens` (input, cached included),
    /// `prompt_tokens_details.cached_tokens` (0 when absent) and `completion_tokens` (output),
    /// kept as reported, negative ones included. `None` when absent or not integers.
    pub usage: Option<ReportedUsage>,
}

/// Reads a 2xx chat-completions reply `body`.
///
/// The first choice decides. It is `truncated` when its `finish_reason` is `length`, or when a
/// server gives no `finish_reason` and the reported output reached `output_cap`; it is
/// `no_tool_call` when its message has no `tool_calls` (nor legacy `function_call`). Tool-call
/// arguments are a JSON text (some servers send the object itself, which is taken as is).
pub fn parse_reply(body: &[u8], output_cap: Option<i64>) -> ParsedReply {
    let Ok(reply) = serde_json::from_slice::<Value>(body) else {
        let text = String::from_utf8_lossy(body).into_owned();
        return ParsedReply {
            decision: invalid(DeciderFailure::Unparseable, Value::String(text)),
            usage: None,
        };
    };
    let usage = reported_usage(reply.get("usage"));
    let choice = reply
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first());
    let Some(message) = choice
        .and_then(|c| c.get("message"))
        .filter(|m| m.is_object())
    else {
        return ParsedReply {
            decision: invalid(DeciderFailure::Unparseable, reply),
            usage,
        };
    };
    let finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str);
    let at_cap = match (output_cap, usage) {
        (Some(cap), Some(usage)) => usage.output_tokens >= cap,
        _ => false,
    };
    let decision = if finish_reason == Some("length") || (finish_reason.is_none() && at_cap) {
        invalid(DeciderFailure::Truncated, message.clone())
    } else {
        let mut decision = decide(message);
        let no_tool_call = decision["failure"] == json!(DeciderFailure::NoToolCall);
        if let (true, Some("stop"), Value::Object(fields)) =
            (no_tool_call, finish_reason, &mut decision)
        {
            fields.insert("finishReason".into(), json!("stop"));
        }
        decision
    };
    ParsedReply { decision, usage }
}

fn invalid(failure: DeciderFailure, content: Value) -> Value {
    json!({"kind": "invalid", "failure": failure, "content": content})
}

/// The decision of one assistant message.
fn decide(message: &Value) -> Value {
    let calls: Vec<&Value> = match message.get("tool_calls").and_then(Value::as_array) {
        Some(calls) if !calls.is_empty() => calls
            .iter()
            .map(|call| call.get("function").unwrap_or(&Value::Null))
            .collect(),
        _ => message.get("function_call").into_iter().collect(),
    };
    let Some((first, others)) = calls.split_first() else {
        return invalid(DeciderFailure::NoToolCall, message.clone());
    };
    let Some(name) = first.get("name").and_then(Value::as_str) else {
        return invalid(DeciderFailure::Unparseable, message.clone());
    };
    let args = match first.get("arguments") {
        // Arguments the Kubernetes API would not store exactly stay text (`invalidArgs`).
        Some(Value::String(text)) => {
            crate::agents::exact_json::read_exact(text.as_bytes()).map_err(|_| text.clone())
        }
        Some(Value::Null) | None => Err(String::new()),
        Some(object) => Ok(object.clone()),
    };
    let mut decision = match name {
        COMPLETE_FUNCTION => match args.ok().as_ref().and_then(|a| a.get("result")) {
            Some(result) => json!({"kind": "complete", "result": result}),
            None => return invalid(DeciderFailure::Unparseable, message.clone()),
        },
        FAIL_FUNCTION => {
            match args
                .ok()
                .as_ref()
                .and_then(|a| a.get("message"))
                .and_then(Value::as_str)
            {
                Some(text) => json!({"kind": "fail", "message": text}),
                None => return invalid(DeciderFailure::Unparseable, message.clone()),
            }
        }
        tool => match args {
            Ok(args) => json!({"kind": "tool_call", "tool": tool, "args": args}),
            Err(raw) => json!({"kind": "tool_call", "tool": tool, "invalidArgs": raw}),
        },
    };
    if !others.is_empty() {
        let names: Vec<Value> = others
            .iter()
            .map(|call| call.get("name").cloned().unwrap_or(Value::Null))
            .collect();
        if let Value::Object(fields) = &mut decision {
            fields.insert("ignoredToolCalls".into(), Value::Array(names));
        }
    }
    decision
}

fn reported_usage(usage: Option<&Value>) -> Option<ReportedUsage> {
    let usage: &Map<String, Value> = usage?.as_object()?;
    let input_tokens = usage.get("prompt_tokens")?.as_i64()?;
    let output_tokens = usage.get("completion_tokens")?.as_i64()?;
    let cached = usage
        .get("prompt_tokens_details")
        .and_then(|details| details.get("cached_tokens"))
        .filter(|cached| !cached.is_null());
    let cached_input_tokens = match cached {
        Some(cached) => cached.as_i64()?,
        None => 0,
    };
    Some(ReportedUsage {
        input_tokens,
        cached_input_tokens,
        output_tokens,
    })
}
