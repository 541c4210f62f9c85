//! The conversation a model is asked to continue (docs/design.md section 6; docs/behaviours.md 10,
//! 46), in no provider's shape: the system prompt, the goal, the functions offered and one turn per
//! recorded decision, built from the run's record alone. Pure and deterministic: the same goal,
//! agent, tools and recorded steps give the same conversation on every replica, so a replica that
//! takes a run over asks the model exactly what the previous holder would have.
//!
//! Owns: what the model is told (the prompt, the built-in functions [`COMPLETE_FUNCTION`] and
//! [`FAIL_FUNCTION`], how a step's decision and observation read). Must not: know a provider's
//! wire format. A provider hands its wire in as a [`ModelWire`] (carried in
//! [`super::Budgets`]): it renders the conversation as its request body and encodes that body
//! into the bytes it sends, and the engine projects the attempt over exactly those bytes
//! (docs/behaviours.md 46). The openai agent's wire is `agents::openai::WIRE`.
//!
//! The conversation of a deciding openai agent is rendered from the run's whole history, the
//! sealed steps the executor read ([`super::archive::SealedHistory`]) and the window, bounded by
//! `spec.agent.openai.maxContextBytes` as the wire encodes it: in `budget`
//! ([`Conversation::from_history`]; docs/design.md section 4a, docs/behaviours.md 59).

mod budget;

use serde::Serialize;
use serde_json::{json, Value};

use super::canonical::canonical_json;
use crate::api::{DecisionRecord, ObservationKind, OpenAiAgent, Step, StepStatus, ToolSpec};

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

/// What a model is asked to continue: everything a provider's request is rendered from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    /// `spec.agent.openai.model`.
    pub model: String,
    /// `spec.agent.openai.systemPrompt`, or [`DEFAULT_SYSTEM_PROMPT`].
    pub system: String,
    /// `spec.goal`: the first thing the user says.
    pub goal: String,
    /// The run's tools sorted by name (a tool named like a built-in is left out, since a call
    /// to that name always means the built-in), then [`COMPLETE_FUNCTION`] (`{result: any
    /// JSON}`: the goal is reached, `result` becomes the run's result) and [`FAIL_FUNCTION`]
    /// (`{message: string}`: the goal cannot be reached, `message` becomes the run's detail).
    pub functions: Vec<Function>,
    /// One turn per step with a recorded decision, in step order. A step with no recorded
    /// decision (the one being decided, or one interrupted before its decision was recorded)
    /// adds nothing: the model gave no answer there and nothing ran.
    pub turns: Vec<Turn>,
    /// The attempt's output cap in tokens (`engine::model::output_cap`), when there is one.
    pub max_output_tokens: Option<i64>,
    /// `spec.agent.openai.temperature`, when set and finite.
    pub temperature: Option<f64>,
}

/// A function offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Function {
    /// The tool's name.
    pub name: String,
    /// What the model reads about it.
    pub description: String,
    /// The JSON Schema of its arguments (the tool's `inputSchema`).
    pub parameters: Value,
}

/// One recorded decision and what the model saw after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Turn {
    /// A call (`tool_call`, or `complete`/`fail` as a call to the built-in).
    Call {
        /// `call_<step index>`: ties the answer to the call.
        id: String,
        /// The function called.
        name: String,
        /// The arguments as canonical JSON text (or the recorded `invalidArgs` verbatim).
        arguments: String,
        /// [`Turn::observation`]'s text.
        observation: String,
    },
    /// Any other decision (an invalid reply, an unknown kind).
    Reply {
        /// The reply's text, or the recorded decision as canonical JSON when it had none.
        text: String,
        /// [`Turn::observation`]'s text.
        observation: String,
    },
    /// A line the runtime says about the history itself (steps left out to keep the request
    /// within `maxContextBytes`, or sealed steps that could not be read): no decision, no
    /// observation.
    Note {
        /// What the model is told.
        text: String,
    },
}

impl Turn {
    /// What the model is told happened after the decision: canonical JSON text `{kind, summary,
    /// content}`, plus `truncated` when the content was cut and a plain `note` for
    /// `interrupted`, `policy_denied` and `invalid_decision`; a step with no observation yet
    /// says so. A [`Turn::Note`] has none (empty).
    pub fn observation(&self) -> &str {
        match self {
            Turn::Call { observation, .. } | Turn::Reply { observation, .. } => observation,
            Turn::Note { .. } => "",
        }
    }
}

/// A provider's wire format, handed to the engine (through [`super::Budgets`]) so that the
/// engine, which knows no provider, can render the request it asks for and project the attempt
/// over the exact bytes that will be sent (docs/behaviours.md 46).
#[derive(Debug, Clone, Copy)]
pub struct ModelWire {
    /// The request body for a conversation, in the provider's shape (what
    /// `Effect::CallModel.request` carries).
    pub render: fn(&Conversation) -> Value,
    /// The bytes sent for a body rendered by `render`; the executor sends exactly these.
    pub encode: fn(&Value) -> Vec<u8>,
}

impl ModelWire {
    /// No provider's shape: the conversation as its own JSON, sent as canonical JSON. The
    /// default of [`super::Budgets`]; the controller hands in the openai agent's wire.
    pub const NEUTRAL: ModelWire = ModelWire {
        render: |conversation| serde_json::to_value(conversation).unwrap_or(Value::Null),
        encode: canonical_bytes,
    };
}

impl PartialEq for ModelWire {
    /// Two wires are the same when they render and encode with the same functions.
    fn eq(&self, other: &ModelWire) -> bool {
        std::ptr::fn_addr_eq(self.render, other.render)
            && std::ptr::fn_addr_eq(self.encode, other.encode)
    }
}

impl Eq for ModelWire {}

/// `value` as canonical JSON (RFC 8785) bytes: the same bytes on every replica.
pub fn canonical_bytes(value: &Value) -> Vec<u8> {
    match canonical_json(value) {
        Ok(text) => text.into_bytes(),
        // Unreachable for a serde_json `Value` (it holds no non-finite number).
        Err(_) => serde_json::to_vec(value).unwrap_or_default(),
    }
}

fn canonical_text(value: &Value) -> String {
    String::from_utf8(canonical_bytes(value)).unwrap_or_default()
}

impl Conversation {
    /// The conversation for deciding the next step of a run with `goal`, `agent`, `tools` and
    /// the recorded `steps` (all of them whole, unbounded), with the attempt's output cap
    /// `max_output_tokens`. A run that sealed steps is asked through
    /// [`Conversation::from_history`], which also bounds the request.
    pub fn from_record(
        goal: &str,
        agent: &OpenAiAgent,
        tools: &[ToolSpec],
        steps: &[Step],
        max_output_tokens: Option<i64>,
    ) -> Conversation {
        Conversation {
            model: agent.model.clone(),
            system: agent
                .system_prompt
                .clone()
                .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
            goal: goal.to_string(),
            functions: functions(tools),
            turns: steps.iter().filter_map(|s| turn(s, None)).collect(),
            max_output_tokens,
            temperature: agent.temperature.filter(|t| t.is_finite()),
        }
    }
}

fn functions(tools: &[ToolSpec]) -> Vec<Function> {
    let mut offered: Vec<&ToolSpec> = tools
        .iter()
        .filter(|t| t.name != COMPLETE_FUNCTION && t.name != FAIL_FUNCTION)
        .collect();
    offered.sort_by(|a, b| a.name.cmp(&b.name));
    let function = |name: &str, description: &str, parameters: Value| Function {
        name: name.to_string(),
        description: description.to_string(),
        parameters,
    };
    let mut out: Vec<Function> = offered
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

/// The turn of a step with a recorded decision; with `content_budget`, its observation's
/// content cut to that many bytes of canonical JSON (`engine::content::bound`: head, size,
/// sha256), its summary form.
fn turn(step: &Step, content_budget: Option<usize>) -> Option<Turn> {
    let decision = step.decision.as_ref()?;
    let observation = observation_text(step, content_budget);
    Some(match as_call(decision) {
        Some((name, arguments)) => Turn::Call {
            id: format!("call_{}", step.index),
            name,
            arguments,
            observation,
        },
        None => Turn::Reply {
            text: reply_text(decision),
            observation,
        },
    })
}

/// The function name and arguments text of a decision that is a call.
fn as_call(decision: &DecisionRecord) -> Option<(String, String)> {
    let args_text = |args: &Option<Value>| canonical_text(args.as_ref().unwrap_or(&Value::Null));
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
            canonical_text(&json!({"result": decision.result.clone().unwrap_or(Value::Null)})),
        )),
        Some("fail") => Some((
            FAIL_FUNCTION.to_string(),
            canonical_text(&json!({"message": decision.message.clone().unwrap_or_default()})),
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
            .map(|v| canonical_text(&v))
            .unwrap_or_default(),
    }
}

fn observation_text(step: &Step, content_budget: Option<usize>) -> String {
    let Some(observation) = &step.observation else {
        let status = serde_json::to_value(step.status).unwrap_or(Value::Null);
        return canonical_text(&json!({
            "kind": null,
            "note": "No outcome has been recorded for this step.",
            "status": status,
        }));
    };
    let kind = serde_json::to_value(observation.kind).unwrap_or(Value::Null);
    let content = observation.content.clone().unwrap_or(Value::Null);
    let (content, cut) = match content_budget {
        Some(budget) => {
            let bounded = super::content::bound(content, budget);
            // Cut before (in the record), the original's size and hash are the ones to keep.
            let cut = observation.truncated.clone().or(bounded.truncated);
            (bounded.content, cut)
        }
        None => (content, observation.truncated.clone()),
    };
    let mut text = json!({
        "kind": kind,
        "summary": observation.summary,
        "content": content,
    });
    if let Some(cut) = &cut {
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
    canonical_text(&text)
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
