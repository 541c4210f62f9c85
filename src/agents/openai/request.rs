//! Rendering a chat-completions request from the run's record. Pure and deterministic: the
//! same goal, agent, tools and recorded steps give the same bytes on every replica, so a
//! replica that takes a run over asks the model exactly what the previous holder would have.

use serde_json::{json, Map, Value};

use crate::api::{DecisionRecord, ObservationKind, OpenAiAgent, Step, StepStatus, ToolSpec};
use crate::engine::canonical::canonical_json;

/// The built-in function a model calls to finish the run with a result (any JSON).
pub const COMPLETE_FUNCTION: &str = "agentrt_complete";
/// The built-in function a model calls to give up with a message.
pub const FAIL_FUNCTION: &str = "agentrt_fail";

/// The system prompt when `spec.agent.openai.systemPrompt` is not set.
pub const DEFAULT_SYSTEM_PROMPT: &str = "You are an agent run by agentrt. Work towards the \
user's goal by calling the functions you are given, exactly one per reply. Each call is checked \
against the function's schema and a policy before it runs, and some calls wait for a person to \
approve them. After each call you see its result, an error, or a note that it was denied, \
invalid or interrupted; decide the next call from that. When the goal is reached, call \
agentrt_complete with the result. If it cannot be reached, call agentrt_fail with the reason.";

/// The chat-completions request body for deciding the next step.
///
/// - `model`; `messages`: the system prompt (`agent.systemPrompt`, or
///   [`DEFAULT_SYSTEM_PROMPT`]), the goal as the user message, then each recorded step (below);
/// - `tools`: the run's tools sorted by name as `{type: function, function: {name,
///   description, parameters: inputSchema}}`, then the built-ins [`COMPLETE_FUNCTION`]
///   (`{result: any JSON}`: the goal is reached, `result` becomes the run's result) and
///   [`FAIL_FUNCTION`] (`{message: string}`: the goal cannot be reached, `message` becomes the
///   run's detail). These two are how a model gives its final answer; a run tool that uses
///   either name is left out, since a call to that name always means the built-in;
/// - `max_tokens` when `max_output_tokens` is set (the call's output cap); `temperature` when
///   `agent.temperature` is set and finite. No `tool_choice` (servers differ in what they
///   accept; a reply without a call is an invalid decision the model then sees).
///
/// Each step with a recorded decision becomes:
/// - a call (`tool_call`, or `complete`/`fail` as a call to the built-in): an assistant message
///   whose one tool call has id `call_<step index>` and the args as canonical JSON text (or
///   `invalidArgs` verbatim), then a `tool` message answering that id with the observation;
/// - any other decision (an invalid reply, an unknown kind): an assistant message with the
///   reply's text (or the recorded decision as JSON when it had none), then a `user` message
///   with the observation.
///
/// The observation is canonical JSON text `{kind, summary, content}`, plus `truncated` when the
/// content was cut and a plain `note` for `interrupted`, `policy_denied` and
/// `invalid_decision`. A step with no observation yet says so. A step with no recorded decision
/// (the one being decided, or one interrupted before its decision was recorded) adds nothing:
/// the model gave no answer there and nothing ran.
pub fn render_request(
    goal: &str,
    agent: &OpenAiAgent,
    tools: &[ToolSpec],
    steps: &[Step],
    max_output_tokens: Option<i64>,
) -> Value {
    let system = agent
        .system_prompt
        .as_deref()
        .unwrap_or(DEFAULT_SYSTEM_PROMPT);
    let mut messages = vec![
        json!({"role": "system", "content": system}),
        json!({"role": "user", "content": goal}),
    ];
    for step in steps {
        render_step(step, &mut messages);
    }
    let mut body = Map::new();
    body.insert("model".into(), Value::String(agent.model.clone()));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("tools".into(), Value::Array(render_tools(tools)));
    if let Some(cap) = max_output_tokens {
        body.insert("max_tokens".into(), Value::from(cap));
    }
    if let Some(temperature) = agent.temperature.filter(|t| t.is_finite()) {
        body.insert("temperature".into(), Value::from(temperature));
    }
    Value::Object(body)
}

/// The bytes sent for `body`: its canonical JSON (RFC 8785), so the projection
/// (`engine::model::Projection::new(bytes.len(), …)`) and the request agree on every replica.
pub fn encode(body: &Value) -> Vec<u8> {
    match canonical_json(body) {
        Ok(text) => text.into_bytes(),
        // Unreachable for a serde_json `Value` (it holds no non-finite number).
        Err(_) => serde_json::to_vec(body).unwrap_or_default(),
    }
}

fn render_tools(tools: &[ToolSpec]) -> Vec<Value> {
    let mut offered: Vec<&ToolSpec> = tools
        .iter()
        .filter(|t| t.name != COMPLETE_FUNCTION && t.name != FAIL_FUNCTION)
        .collect();
    offered.sort_by(|a, b| a.name.cmp(&b.name));
    let function = |name: &str, description: &str, parameters: Value| {
        json!({
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        })
    };
    let mut out: Vec<Value> = offered
        .iter()
        .map(|t| function(&t.name, &t.description, t.input_schema.clone()))
        .collect();
    out.push(function(
        COMPLETE_FUNCTION,
        "Finish the run: the goal is reached. `result` becomes the run's result; any JSON value.",
        json!({
            "type": "object",
            "properties": {"result": {"description": "The run's result, any JSON value."}},
            "required": ["result"],
        }),
    ));
    out.push(function(
        FAIL_FUNCTION,
        "Give up: the goal cannot be reached. `message` says why.",
        json!({
            "type": "object",
            "properties": {"message": {"type": "string", "description": "Why the goal cannot be reached."}},
            "required": ["message"],
        }),
    ));
    out
}

fn render_step(step: &Step, messages: &mut Vec<Value>) {
    let Some(decision) = &step.decision else {
        return;
    };
    let observation = observation_text(step);
    match as_call(decision) {
        Some((name, arguments)) => {
            let id = format!("call_{}", step.index);
            messages.push(json!({
                "role": "assistant",
                "content": "",
                "tool_calls": [{
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }],
            }));
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": observation}));
        }
        None => {
            messages.push(json!({"role": "assistant", "content": reply_text(decision)}));
            messages.push(json!({"role": "user", "content": observation}));
        }
    }
}

/// The function name and arguments text of a decision that is a call.
fn as_call(decision: &DecisionRecord) -> Option<(String, String)> {
    let args_text = |args: &Option<Value>| encode_text(args.as_ref().unwrap_or(&Value::Null));
    match decision.kind.as_deref() {
        Some("tool_call") => {
            let tool = decision.tool.clone()?;
            let arguments = match (&decision.invalid_args, &decision.args) {
                (Some(raw), None) => raw.clone(),
                (_, args) => args_text(args),
            };
            Some((tool, arguments))
        }
        Some("complete") => Some((
            COMPLETE_FUNCTION.to_string(),
            encode_text(&json!({"result": decision.result.clone().unwrap_or(Value::Null)})),
        )),
        Some("fail") => Some((
            FAIL_FUNCTION.to_string(),
            encode_text(&json!({"message": decision.message.clone().unwrap_or_default()})),
        )),
        _ => None,
    }
}

/// What the model said in a reply that was not a usable call: the text of the recorded
/// message, or the whole recorded decision as canonical JSON when it had no text.
fn reply_text(decision: &DecisionRecord) -> String {
    let text = decision
        .extra
        .get("content")
        .and_then(|content| content.get("content"))
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty());
    match text {
        Some(text) => text.to_string(),
        None => serde_json::to_value(decision)
            .map(|v| encode_text(&v))
            .unwrap_or_default(),
    }
}

fn observation_text(step: &Step) -> String {
    let Some(observation) = &step.observation else {
        let status = serde_json::to_value(step.status).unwrap_or(Value::Null);
        return encode_text(&json!({
            "kind": null,
            "note": "No outcome has been recorded for this step.",
            "status": status,
        }));
    };
    let kind = serde_json::to_value(observation.kind).unwrap_or(Value::Null);
    let mut text = json!({
        "kind": kind,
        "summary": observation.summary,
        "content": observation.content.clone().unwrap_or(Value::Null),
    });
    if let Some(cut) = &observation.truncated {
        text["truncated"] = json!({"originalBytes": cut.original_bytes, "sha256": cut.sha256});
    }
    let note = match observation.kind {
        ObservationKind::PolicyDenied => {
            Some("The policy did not allow this call; it was not run.")
        }
        ObservationKind::InvalidDecision => {
            Some("This decision could not be used; nothing was run.")
        }
        ObservationKind::Interrupted => Some(interrupted_note(observation.content.as_ref())),
        ObservationKind::ToolResult | ObservationKind::ToolError => None,
    };
    if let Some(note) = note {
        text["note"] = Value::String(note.to_string());
    }
    encode_text(&text)
}

fn interrupted_note(content: Option<&Value>) -> &'static str {
    let previous = content
        .and_then(|c| c.get("previousStatus"))
        .and_then(|s| serde_json::from_value::<StepStatus>(s.clone()).ok());
    match previous {
        Some(StepStatus::Deciding | StepStatus::AwaitingApproval) => {
            "The runtime stopped before this call ran; it was not run."
        }
        _ => {
            "The runtime stopped while this call was running, so whether it took effect is \
             unknown."
        }
    }
}

fn encode_text(value: &Value) -> String {
    String::from_utf8(encode(value)).unwrap_or_default()
}
