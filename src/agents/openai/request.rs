//! The chat-completions request body: the engine's provider-neutral
//! [`Conversation`](crate::engine::conversation::Conversation) in OpenAI's shape, and the bytes
//! sent for it. [`WIRE`] is what the controller hands the engine (through `engine::Budgets`),
//! so the engine projects each attempt over exactly these bytes (docs/behaviours.md 46).

use serde_json::{json, Map, Value};

use crate::api::{OpenAiAgent, Step, ToolSpec};
use crate::engine::conversation::{canonical_bytes, Conversation, ModelWire, Turn};

/// The openai agent's wire: [`render`] and [`encode`].
pub const WIRE: ModelWire = ModelWire { render, encode };

/// The chat-completions request body for a conversation.
///
/// - `model`; `messages`: the system prompt, the goal as the user message, then each turn
///   (below);
/// - `tools`: the conversation's functions as `{type: function, function: {name,
///   description, parameters}}`, in its order (the run's tools by name, then the built-ins);
/// - `max_tokens` when the conversation has an output cap; `temperature` when it has one. No
///   `tool_choice` (servers differ in what they accept; a reply without a call is an invalid
///   decision the model then sees).
///
/// Each turn becomes:
/// - a call: an assistant message whose one tool call has the turn's id and arguments text,
///   then a `tool` message answering that id with the observation;
/// - a reply: an assistant message with the reply's text, then a `user` message with the
///   observation;
/// - a note (steps left out, or sealed steps that could not be read): a `user` message with
///   its text.
pub fn render(conversation: &Conversation) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": conversation.system}),
        json!({"role": "user", "content": conversation.goal}),
    ];
    for turn in &conversation.turns {
        match turn {
            Turn::Call {
                id,
                name,
                arguments,
                observation,
            } => {
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
            Turn::Reply { text, observation } => {
                messages.push(json!({"role": "assistant", "content": text}));
                messages.push(json!({"role": "user", "content": observation}));
            }
            Turn::Note { text } => {
                messages.push(json!({"role": "user", "content": text}));
            }
        }
    }
    let tools: Vec<Value> = conversation
        .functions
        .iter()
        .map(|f| {
            json!({
                "type": "function",
                "function": {"name": f.name, "description": f.description, "parameters": f.parameters},
            })
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), Value::String(conversation.model.clone()));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("tools".into(), Value::Array(tools));
    if let Some(cap) = conversation.max_output_tokens {
        body.insert("max_tokens".into(), Value::from(cap));
    }
    if let Some(temperature) = conversation.temperature {
        body.insert("temperature".into(), Value::from(temperature));
    }
    Value::Object(body)
}

/// The request body for deciding the next step of a run: [`render`] of
/// [`Conversation::from_record`] (what the engine asks for, through [`WIRE`]).
pub fn render_request(
    goal: &str,
    agent: &OpenAiAgent,
    tools: &[ToolSpec],
    steps: &[Step],
    max_output_tokens: Option<i64>,
) -> Value {
    render(&Conversation::from_record(
        goal,
        agent,
        tools,
        steps,
        max_output_tokens,
    ))
}

/// The bytes sent for `body`: its canonical JSON (RFC 8785), so the projection
/// (`engine::model::Projection::new(bytes.len(), …)`) and the request agree on every replica.
pub fn encode(body: &Value) -> Vec<u8> {
    canonical_bytes(body)
}
