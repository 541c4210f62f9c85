//! Tool outcomes (docs/design.md sections 3, 6; docs/behaviours.md 15-18, 33, 44).
//!
//! A result becomes a `tool_result` observation (content cut to the per-step budget, its size
//! and hash kept), the step `done` and `step.tool_finished` {tool, durationMs, summary,
//! contentHash}; a terminal tool completes the run with it in the same write. An error keeps
//! the body in a `tool_error` observation with `step.tool_finished` {error} and `step.failed`.
//! An abort ends the run `tool_abort`. An unknown outcome is an interruption, resolved as a
//! takeover would ([`takeover::resume_interrupted`]). The step's active time is added to
//! `activeSeconds`. An outcome for a run that ended meanwhile (cancel) is appended after
//! `run.finished` as `step.tool_finished` {late: true, observation}, changing nothing else.

use serde_json::{json, Value};

use super::content::bound;
use super::loop_::{drive, unexpected};
use super::record::Txn;
use super::takeover;
use super::{EngineError, ToolOutcome};
use crate::api::{EventType, Observation, ObservationKind, StepIndex, StepStatus, TerminalReason};

/// Longest summary line, in characters.
const SUMMARY_CHARS: usize = 120;

/// [`super::Input::ToolFinished`] for a running run.
pub(crate) fn tool_finished(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    outcome: ToolOutcome,
) -> Result<(), EngineError> {
    let index = step_index(txn, step)?;
    let current = &txn.status.steps[index];
    if current.status != StepStatus::Executing || current.attempts != attempt {
        // Applied already (or a stale attempt): go on from the record.
        drive(txn);
        return Ok(());
    }
    let tool_name = tool_name(txn, index);
    let terminal = txn
        .run
        .spec
        .tools
        .iter()
        .any(|t| t.name == tool_name && t.terminal);
    let now = txn.now();
    match outcome {
        ToolOutcome::Unknown {
            detail,
            duration_ms: _,
        } => {
            txn.add_active_time(index);
            takeover::interrupt(txn, index, Some(&detail));
        }
        ToolOutcome::Result {
            status,
            content,
            duration_ms,
        } => {
            let observation = observe(txn, ObservationKind::ToolResult, content, None);
            txn.event(
                EventType::StepToolFinished,
                Some(step),
                json!({
                    "tool": tool_name,
                    "attempt": attempt,
                    "status": status,
                    "durationMs": duration_ms,
                    "summary": observation.summary,
                    "contentHash": observation.content_hash,
                }),
            );
            txn.add_active_time(index);
            let result = observation.content.clone();
            let record = txn.step_mut(index);
            record.status = StepStatus::Done;
            record.finished_at = Some(now);
            record.observation = Some(observation);
            if terminal {
                txn.end_run(TerminalReason::GoalCompleted, None, result);
            }
        }
        ToolOutcome::Error {
            failure,
            status,
            content,
            duration_ms,
        } => {
            let headline = match status {
                Some(code) => format!("{tool_name} failed: {failure} (HTTP {code})"),
                None => format!("{tool_name} failed: {failure}"),
            };
            let observation = observe(txn, ObservationKind::ToolError, content, Some(headline));
            txn.event(
                EventType::StepToolFinished,
                Some(step),
                json!({
                    "tool": tool_name,
                    "attempt": attempt,
                    "durationMs": duration_ms,
                    "error": {"failure": failure, "status": status},
                    "contentHash": observation.content_hash,
                }),
            );
            txn.add_active_time(index);
            txn.fail_step(index, observation);
        }
        ToolOutcome::Abort {
            detail,
            content,
            duration_ms,
        } => {
            let headline = format!("{tool_name} asked to abort the run: {detail}");
            let observation = observe(txn, ObservationKind::ToolError, content, Some(headline));
            txn.event(
                EventType::StepToolFinished,
                Some(step),
                json!({
                    "tool": tool_name,
                    "attempt": attempt,
                    "durationMs": duration_ms,
                    "abort": detail,
                    "contentHash": observation.content_hash,
                }),
            );
            txn.add_active_time(index);
            txn.fail_step(index, observation);
            txn.end_run(TerminalReason::ToolAbort, Some(detail), None);
        }
    }
    drive(txn);
    Ok(())
}

/// Records `result` as step `index`'s tool result without the tool answering it now (a person's
/// `TookEffect`, a status URL's `succeeded`; docs/design.md section 5): bounded and hashed as
/// an answer, `step.tool_finished` {tool, attempt, settledBy, summary, contentHash}, the step
/// `done`; a terminal tool completes the run with it.
pub(crate) fn settled_result(
    txn: &mut Txn,
    index: usize,
    tool: &crate::api::ToolSpec,
    settled_by: Value,
    result: Value,
) {
    let now = txn.now();
    let attempt = txn.status.steps[index].attempts;
    let observation = observe(txn, ObservationKind::ToolResult, result, None);
    txn.event(
        EventType::StepToolFinished,
        Some(txn.index_at(index)),
        json!({
            "tool": tool.name,
            "attempt": attempt,
            "settledBy": settled_by,
            "summary": observation.summary,
            "contentHash": observation.content_hash,
        }),
    );
    let result = observation.content.clone();
    let record = txn.step_mut(index);
    record.status = StepStatus::Done;
    record.finished_at = Some(now);
    record.observation = Some(observation);
    if tool.terminal {
        txn.end_run(TerminalReason::GoalCompleted, None, result);
    }
}

/// Records `content` as step `index`'s tool error without the tool answering it now (a status
/// URL's `failed`; docs/design.md section 5): a `tool_error` observation headed `headline`,
/// `step.tool_finished` {tool, attempt, error {failure}, settledBy, contentHash}, the step
/// failed.
pub(crate) fn settled_error(
    txn: &mut Txn,
    index: usize,
    tool: &crate::api::ToolSpec,
    settled_by: Value,
    failure: crate::api::ToolFailure,
    content: Value,
    headline: String,
) {
    let attempt = txn.status.steps[index].attempts;
    let observation = observe(txn, ObservationKind::ToolError, content, Some(headline));
    txn.event(
        EventType::StepToolFinished,
        Some(txn.index_at(index)),
        json!({
            "tool": tool.name,
            "attempt": attempt,
            "error": {"failure": failure, "status": null},
            "settledBy": settled_by,
            "contentHash": observation.content_hash,
        }),
    );
    txn.fail_step(index, observation);
}

/// docs/behaviours.md 44: the outcome of a tool that returned after its run ended is appended as
/// `step.tool_finished` {late: true, observation}; the run and the step keep what they are.
pub(crate) fn late(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    outcome: ToolOutcome,
) -> Result<(), EngineError> {
    let index = step_index(txn, step)?;
    let current = &txn.status.steps[index];
    let recorded = txn.status.events.iter().any(|e| {
        e.type_ == EventType::StepToolFinished
            && e.step == Some(step)
            && e.data.as_ref().and_then(|d| d.get("attempt")) == Some(&json!(attempt))
    });
    if current.status == StepStatus::Executing || current.attempts != attempt || recorded {
        return Ok(());
    }
    let tool_name = tool_name(txn, index);
    let (kind, content, headline, duration_ms) = match outcome {
        ToolOutcome::Result {
            content,
            duration_ms,
            ..
        } => (ObservationKind::ToolResult, content, None, duration_ms),
        ToolOutcome::Error {
            failure,
            content,
            duration_ms,
            ..
        } => (
            ObservationKind::ToolError,
            content,
            Some(format!("{tool_name} failed: {failure}")),
            duration_ms,
        ),
        ToolOutcome::Abort {
            detail,
            content,
            duration_ms,
        } => (
            ObservationKind::ToolError,
            content,
            Some(format!("{tool_name} asked to abort the run: {detail}")),
            duration_ms,
        ),
        ToolOutcome::Unknown {
            detail,
            duration_ms,
        } => (
            ObservationKind::Interrupted,
            json!({"previousStatus": StepStatus::Executing, "detail": detail}),
            Some("the outcome is unknown".to_string()),
            duration_ms,
        ),
    };
    let observation = observe(txn, kind, content, headline);
    txn.event(
        EventType::StepToolFinished,
        Some(step),
        json!({
            "late": true,
            "tool": tool_name,
            "attempt": attempt,
            "durationMs": duration_ms,
            "observation": observation,
        }),
    );
    Ok(())
}

fn step_index(txn: &Txn, step: StepIndex) -> Result<usize, EngineError> {
    txn.position(step).ok_or_else(|| {
        unexpected(
            txn,
            format!("a tool outcome for step {step}, which does not exist"),
        )
    })
}

fn tool_name(txn: &Txn, index: usize) -> String {
    txn.status.steps[index]
        .decision
        .as_ref()
        .and_then(|d| d.tool.clone())
        .unwrap_or_default()
}

/// An observation of tool content, cut to the per-step budget (docs/behaviours.md 50).
fn observe(
    txn: &Txn,
    kind: ObservationKind,
    content: Value,
    headline: Option<String>,
) -> Observation {
    let bounded = bound(content, txn.budgets.step_content_bytes);
    let summary = headline.unwrap_or_else(|| summarize(&bounded.content));
    Observation {
        kind,
        content: Some(bounded.content),
        summary,
        content_hash: bounded.content_hash,
        truncated: bounded.truncated,
    }
}

/// A short line: the compact JSON, cut to [`SUMMARY_CHARS`].
pub(crate) fn summarize(content: &Value) -> String {
    let text = content.to_string();
    if text.chars().count() <= SUMMARY_CHARS {
        return text;
    }
    let mut head: String = text.chars().take(SUMMARY_CHARS - 1).collect();
    head.push('…');
    head
}
