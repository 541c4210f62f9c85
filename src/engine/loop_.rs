//! The loop: starting steps and taking the agent's decisions (docs/design.md sections 4 and 6;
//! docs/behaviours.md 4, 7-10).
//!
//! [`drive`] runs a run "until the next external action": while nothing external happens
//! (a denial, an invalid decision, a scripted agent's next decision) the steps share one status
//! write. A step starts after the limits ([`super::limits`]); a scripted agent's decision i is
//! `spec.agent.scripted.decisions[i]`, a webhook agent is asked with [`ExternalCall::Agent`], a
//! model with [`ExternalCall::Model`] ([`super::model_calls`]). The decision is recorded verbatim
//! (`step.decided`, `steps[i].decision`, args that are not usable JSON in `invalidArgs`) before
//! it is validated; an unusable one fails the step `invalid_decision` and the loop goes on,
//! except a model's final answer in plain text, which completes the run with `{text}` unless
//! `spec.agent.openai.textAnswer` is `Invalid`. A started step is never started again of
//! its own accord (guarantee 1): an `executing` step found on the loop's way stops it.

use serde_json::{json, Map, Value};

use super::calls;
use super::canonical::canonical_json;
use super::limits;
use super::record::{observation, Txn};
use super::takeover;
use super::validate::{check_storable, ToolSchema};
use super::{AgentFailure, EngineError};
use crate::api::{
    DeciderFailure, DecisionKind, DecisionRecord, EventType, ObservationKind, Step, StepIndex,
    StepStatus, TerminalReason, TextAnswer,
};

/// Whether a transition goes on deciding or has reached its external action (or its end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Nothing external happened; the loop may take its next move.
    Continue,
    /// The effects after the write are set (a call, a pause, a stop).
    Halt,
}

/// Runs the loop from the record as it is until the next external action or the run's end.
pub(crate) fn drive(txn: &mut Txn) {
    loop {
        if txn.status.phase.is_terminal() {
            txn.release_and_stop();
            return;
        }
        let flow = match txn.status.steps.last().map(|s| s.status) {
            // A draining replica records the outcome it has and starts no further step.
            None | Some(StepStatus::Done | StepStatus::Failed) if txn.caller.draining => {
                txn.release_and_stop();
                Flow::Halt
            }
            None | Some(StepStatus::Done | StepStatus::Failed) => start_step(txn),
            Some(StepStatus::Deciding) => decide(txn),
            // Guarantee 1: a started step is not started again; a takeover resolves it.
            Some(StepStatus::Executing) => {
                txn.release_and_stop();
                Flow::Halt
            }
            Some(StepStatus::Interrupted) => takeover::resume_interrupted(txn),
            Some(StepStatus::AwaitingApproval) => {
                super::waiting::waiting(txn);
                Flow::Halt
            }
        };
        if flow == Flow::Halt {
            return;
        }
    }
}

/// Starts the next step: limits in order (docs/behaviours.md 4), then `step.started` and the
/// agent's decision.
pub(crate) fn start_step(txn: &mut Txn) -> Flow {
    if limits::check(txn) {
        return Flow::Continue;
    }
    let step = super::record::next_index(&txn.status);
    txn.status.steps.push(Step {
        index: step,
        status: StepStatus::Deciding,
        decision: None,
        policy: None,
        observation: None,
        approvals: Vec::new(),
        attempts: 0,
        started_at: Some(txn.now()),
        finished_at: None,
    });
    txn.event(EventType::StepStarted, Some(step), Value::Null);
    decide(txn)
}

/// The position of step `step` when it is the last one and `executing` under `attempt`: the
/// step an executor's input about that attempt applies to (`None`: applied already, or a stale
/// attempt).
pub(crate) fn executing_attempt(txn: &Txn, step: StepIndex, attempt: i64) -> Option<usize> {
    txn.last_position()
        .filter(|i| txn.index_at(*i) == step)
        .filter(|i| {
            let s = &txn.status.steps[*i];
            s.status == StepStatus::Executing && s.attempts == attempt
        })
}

/// Gets the decision of the last step (which is `deciding`).
fn decide(txn: &mut Txn) -> Flow {
    let Some(index) = txn.last_position() else {
        return Flow::Continue;
    };
    let agent = &txn.run.spec.agent;
    if let Some(scripted) = &agent.scripted {
        // Every sealed step took a decision: a scripted step is decided in the write that
        // starts it, and only a step that failed deciding (the run's end) has none.
        let sealed = usize::try_from(super::record::window_start(&txn.status)).unwrap_or(0);
        let consumed = sealed
            + txn.status.steps[..index]
                .iter()
                .filter(|s| s.decision.is_some())
                .count();
        return match scripted.decisions.get(consumed) {
            Some(decision) => apply_decision(txn, index, decision.clone()),
            None => {
                let detail = format!("scripted agent has no decision {consumed}");
                txn.end_run(TerminalReason::AgentError, Some(detail), None);
                Flow::Continue
            }
        };
    }
    if agent.openai.is_some() {
        return super::model_calls::dispatch(txn, index, 0);
    }
    if agent.webhook.is_some() {
        return super::agent_calls::dispatch(txn, index, 1, 0);
    }
    let detail = "spec.agent sets none of scripted, openai, webhook".to_string();
    txn.end_run(TerminalReason::AgentError, Some(detail), None);
    Flow::Continue
}

/// [`super::Input::AgentAnswered`]: the decision of a `deciding` step, or the agent's error.
pub(crate) fn agent_answered(
    txn: &mut Txn,
    step: StepIndex,
    decision: Result<Value, AgentFailure>,
) -> Result<(), EngineError> {
    let index = txn
        .position(step)
        .ok_or_else(|| unexpected(txn, format!("no step {step} to decide")))?;
    let current = txn.last_position() == Some(index)
        && txn.status.steps[index].status == StepStatus::Deciding;
    if current {
        match decision {
            Ok(decision) => {
                if apply_decision(txn, index, decision) == Flow::Halt {
                    return Ok(());
                }
            }
            Err(failure) => {
                if super::agent_calls::failed(txn, index, failure) == Flow::Halt {
                    return Ok(());
                }
            }
        }
    }
    // An answer already applied (or for a step no longer deciding) changes nothing.
    drive(txn);
    Ok(())
}

pub(crate) fn unexpected(txn: &Txn, detail: String) -> EngineError {
    EngineError::UnexpectedInput {
        namespace: txn.run.namespace.clone(),
        name: txn.run.name.clone(),
        detail,
    }
}

/// Records `raw` as step `index`'s decision (verbatim, `step.decided`), then validates and
/// acts on it (docs/behaviours.md 7-9).
pub(crate) fn apply_decision(txn: &mut Txn, index: usize, raw: Value) -> Flow {
    let record = decision_record(&raw);
    let mut data = json!({"kind": record.kind, "tool": record.tool});
    if text_answer(txn, &record).is_some() {
        data["textAnswer"] = json!(true);
    }
    txn.step_mut(index).decision = Some(record.clone());
    txn.event(EventType::StepDecided, Some(txn.index_at(index)), data);
    match validate(txn, &raw, &record) {
        Ok(Valid::Complete(result)) => {
            let now = txn.now();
            let step = txn.step_mut(index);
            step.status = StepStatus::Done;
            step.finished_at = Some(now);
            txn.add_active_time(index);
            txn.end_run(TerminalReason::GoalCompleted, None, result);
            Flow::Continue
        }
        Ok(Valid::Fail(message)) => {
            let now = txn.now();
            let step = txn.step_mut(index);
            step.status = StepStatus::Failed;
            step.finished_at = Some(now);
            txn.add_active_time(index);
            txn.end_run(TerminalReason::GoalFailed, message, None);
            Flow::Continue
        }
        Ok(Valid::Call { tool, args }) => calls::evaluate(txn, index, tool, args, None),
        Err(Reject::Invalid(invalid)) => {
            txn.add_active_time(index);
            txn.fail_step(index, invalid.observation());
            Flow::Continue
        }
        Err(Reject::Internal(detail)) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            Flow::Continue
        }
    }
}

/// The decision as the agent gave it. Values the API server could not store exactly are kept
/// as their JSON text (args in `invalidArgs`), never in a field that holds JSON.
pub(crate) fn decision_record(raw: &Value) -> DecisionRecord {
    let mut record = DecisionRecord::default();
    let Value::Object(map) = raw else {
        record.extra.insert("value".into(), storable_or_text(raw));
        return record;
    };
    for (key, value) in map {
        match (key.as_str(), value) {
            ("kind", Value::String(kind)) => record.kind = Some(kind.clone()),
            ("tool", Value::String(tool)) => record.tool = Some(tool.clone()),
            ("message", Value::String(message)) => record.message = Some(message.clone()),
            ("invalidArgs", Value::String(text)) => record.invalid_args = Some(text.clone()),
            ("args", args) => match check_storable(args) {
                Ok(()) => record.args = Some(args.clone()),
                Err(_) => record.invalid_args = Some(args.to_string()),
            },
            ("result", result) if check_storable(result).is_ok() => {
                record.result = Some(result.clone());
            }
            (key @ ("kind" | "tool" | "message" | "invalidArgs" | "result"), other) => {
                let mut chars = key.chars();
                let renamed = chars
                    .next()
                    .map(|c| format!("invalid{}{}", c.to_ascii_uppercase(), chars.as_str()))
                    .unwrap_or_default();
                record
                    .extra
                    .insert(renamed, Value::String(other.to_string()));
            }
            (key, other) => {
                record
                    .extra
                    .insert(key.to_string(), storable_or_text(other));
            }
        }
    }
    record
}

fn storable_or_text(value: &Value) -> Value {
    match check_storable(value) {
        Ok(()) => value.clone(),
        Err(_) => Value::String(value.to_string()),
    }
}

/// A usable decision.
enum Valid {
    Complete(Option<Value>),
    Fail(Option<String>),
    Call { tool: usize, args: Value },
}

/// Why a decision cannot be used.
enum Reject {
    /// The step fails `invalid_decision`; the loop continues.
    Invalid(Invalid),
    /// The run fails `internal_error` (a schema that no longer compiles, an unencodable value).
    Internal(String),
}

/// An `invalid_decision` observation's content.
pub(crate) struct Invalid {
    pub error: String,
    pub details: Vec<String>,
    /// The model reply's failure word (`no_tool_call`, `truncated`, `unparseable`), when the
    /// decision was a reply the decider could not read as one.
    pub failure: Option<String>,
}

impl Invalid {
    pub fn new(error: impl Into<String>) -> Invalid {
        Invalid {
            error: error.into(),
            details: Vec::new(),
            failure: None,
        }
    }

    pub fn observation(&self) -> crate::api::Observation {
        let mut content = Map::new();
        content.insert("error".into(), json!(self.error));
        if !self.details.is_empty() {
            content.insert("details".into(), json!(self.details));
        }
        if let Some(failure) = &self.failure {
            content.insert("failure".into(), json!(failure));
        }
        observation(
            ObservationKind::InvalidDecision,
            Value::Object(content),
            self.error.clone(),
        )
    }
}

fn validate(txn: &Txn, raw: &Value, record: &DecisionRecord) -> Result<Valid, Reject> {
    if !raw.is_object() {
        return Err(Reject::Invalid(Invalid::new(
            "the decision is not a JSON object",
        )));
    }
    let Some(kind) = record.kind.as_deref() else {
        return Err(Reject::Invalid(Invalid::new(
            "the decision has no kind (expected tool_call, complete or fail)",
        )));
    };
    match DecisionKind::parse(kind) {
        None if kind == INVALID_REPLY => match text_answer(txn, record) {
            Some(text) => Ok(Valid::Complete(Some(json!({"text": text})))),
            None => Err(Reject::Invalid(invalid_reply(record))),
        },
        None => Err(Reject::Invalid(Invalid::new(format!(
            "unknown decision kind {kind:?} (expected tool_call, complete or fail)"
        )))),
        Some(DecisionKind::Complete) => {
            if record.extra.contains_key("invalidResult") {
                return Err(Reject::Invalid(Invalid::new(
                    "the result is not JSON the record can store exactly",
                )));
            }
            Ok(Valid::Complete(record.result.clone()))
        }
        Some(DecisionKind::Fail) => Ok(Valid::Fail(record.message.clone())),
        Some(DecisionKind::ToolCall) => {
            let (tool, args) = check_call(txn, record).map_err(|r| match r {
                CallProblem::Invalid(i) => Reject::Invalid(i),
                CallProblem::Internal(d) => Reject::Internal(d),
            })?;
            Ok(Valid::Call { tool, args })
        }
    }
}

/// The kind a decider records for a reply it could not read as a decision (`{kind: invalid,
/// failure, content}`; `agents::openai::parse_reply`).
const INVALID_REPLY: &str = "invalid";

/// docs/behaviours.md 8: a model reply with no tool call, cut off at its output cap, or not a chat
/// completion at all is an invalid decision; the observation names the failure so the model
/// can do better next time.
fn invalid_reply(record: &DecisionRecord) -> Invalid {
    // The word is kept as recorded (a webhook agent may send any); the known ones say more.
    let failure = record
        .extra
        .get("failure")
        .and_then(Value::as_str)
        .unwrap_or(DeciderFailure::Unparseable.as_str());
    let error = match DeciderFailure::parse(failure) {
        Some(DeciderFailure::NoToolCall) => {
            "the reply has no tool call; answer by calling one of the tools, agentrt_complete \
             (the goal is reached) or agentrt_fail (it cannot be reached)"
        }
        Some(DeciderFailure::Truncated) => {
            "the reply was cut off at its output token cap before it finished; answer with \
             one shorter tool call"
        }
        Some(DeciderFailure::Unstorable) => {
            "the answer holds JSON the Kubernetes API cannot store exactly (nesting deeper than \
             100 levels, an integer outside int64 or a number outside float64); send plainer \
             JSON, big numbers as strings"
        }
        Some(DeciderFailure::Unparseable) | None => "the reply could not be read as a decision",
    };
    Invalid {
        failure: Some(failure.to_string()),
        ..Invalid::new(error)
    }
}

/// docs/behaviours.md 72: the text of a model's final answer in plain text, the ecosystem's
/// convention: a reply with no tool call (`no_tool_call`) that ended `finish_reason: stop` with
/// non-empty text, to an openai agent whose `textAnswer` is `Complete` (the default). `None`
/// otherwise, and always under `textAnswer: Invalid`, which keeps it an `invalid_decision`.
fn text_answer<'a>(txn: &Txn, record: &'a DecisionRecord) -> Option<&'a str> {
    let openai = txn.run.spec.agent.openai.as_ref()?;
    let said = |key: &str| record.extra.get(key).and_then(Value::as_str);
    let answered = openai.text_answer == TextAnswer::Complete
        && record.kind.as_deref() == Some(INVALID_REPLY)
        && said("failure") == Some(DeciderFailure::NoToolCall.as_str())
        && said("finishReason") == Some("stop");
    record
        .extra
        .get("content")
        .and_then(|message| message.get("content"))
        .and_then(Value::as_str)
        .filter(|text| answered && !text.trim().is_empty())
}

/// Why a recorded tool call cannot run.
pub(crate) enum CallProblem {
    Invalid(Invalid),
    Internal(String),
}

/// Checks a recorded tool call against the run's tools and the tool's current schema: the
/// tool's index and the canonical args (docs/behaviours.md 8, 11). Used by the loop, by grants
/// (docs/behaviours.md 21) and by the resume table (docs/behaviours.md 36).
pub(crate) fn check_call(
    txn: &Txn,
    record: &DecisionRecord,
) -> Result<(usize, Value), CallProblem> {
    let tools = &txn.run.spec.tools;
    let Some(name) = record.tool.as_deref() else {
        return Err(CallProblem::Invalid(Invalid::new(
            "a tool_call decision must name a tool",
        )));
    };
    let Some(index) = tools.iter().position(|t| t.name == name) else {
        let known: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        return Err(CallProblem::Invalid(Invalid::new(format!(
            "unknown tool {name:?}; the run's tools are {known:?}"
        ))));
    };
    if let Some(text) = &record.invalid_args {
        let shown: String = text.chars().take(200).collect();
        return Err(CallProblem::Invalid(Invalid::new(format!(
            "the args of {name:?} are not usable JSON: {shown}"
        ))));
    }
    let args = record
        .args
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    check_args(txn, index, &args)
}

/// Checks `args` against `spec.tools[index]`'s schema and returns their canonical form.
pub(crate) fn check_args(
    txn: &Txn,
    index: usize,
    args: &Value,
) -> Result<(usize, Value), CallProblem> {
    let tool = &txn.run.spec.tools[index];
    if let Err(err) = check_storable(args) {
        return Err(CallProblem::Invalid(Invalid::new(format!(
            "the args of {:?}: {err}",
            tool.name
        ))));
    }
    let schema = ToolSchema::compiled(index, tool).map_err(CallProblem::Internal)?;
    if let Err(details) = schema.check(args) {
        return Err(CallProblem::Invalid(Invalid {
            error: format!(
                "the args do not match spec.tools[{index}].inputSchema ({})",
                tool.name
            ),
            details,
            failure: None,
        }));
    }
    canonical_args(args)
        .map(|canonical| (index, canonical))
        .map_err(|err| CallProblem::Internal(format!("the args of {:?}: {err}", tool.name)))
}

/// The args as the policy, the hash and the tool see them: parsed back from their canonical
/// JSON, so every evaluation sees the same bytes (docs/behaviours.md 11).
pub(crate) fn canonical_args(args: &Value) -> Result<Value, String> {
    let text = canonical_json(args).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}
