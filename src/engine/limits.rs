//! The limits checked before each step, in this order: steps, consecutive failures, active
//! time, elapsed time, loop detection (docs/design.md section 6; docs/behaviours.md 4-6). The first that
//! fires ends the run with its reason, writing `limit.exceeded` {limit, value, max} (or
//! `loop.detected`) then `run.finished`; no step starts.

use serde_json::{json, Map, Value};

use super::canonical::content_hash;
use super::record::Txn;
use crate::api::{DecisionKind, EventType, ObservationKind, Step, TerminalReason};

/// Checks the limits; when one fires, ends the run and returns true.
pub(crate) fn check(txn: &mut Txn) -> bool {
    let Some((reason, event, data)) = first_exceeded(txn) else {
        return false;
    };
    txn.event(event, None, data);
    txn.end_run(reason, Some(detail(reason)), None);
    true
}

fn detail(reason: TerminalReason) -> String {
    match reason {
        TerminalReason::LimitSteps => "spec.limits.maxSteps reached",
        TerminalReason::RepeatedToolFailures => "spec.limits.maxConsecutiveToolFailures reached",
        TerminalReason::LimitActiveTime => "spec.limits.maxActiveSeconds reached",
        TerminalReason::LimitElapsedTime => "spec.limits.maxElapsedSeconds reached",
        _ => "the same tool call kept returning the same observation (spec.limits.loopThreshold)",
    }
    .to_string()
}

fn first_exceeded(txn: &Txn) -> Option<(TerminalReason, EventType, Value)> {
    let limits = &txn.run.spec.limits;
    let status = &txn.status;
    let exceeded =
        |limit: &str, value: Value, max: i64| json!({"limit": limit, "value": value, "max": max});
    // Sealed steps count (docs/design.md section 4a): the last step's index + 1.
    let steps = super::record::step_count(status);
    if steps >= limits.max_steps {
        return Some((
            TerminalReason::LimitSteps,
            EventType::LimitExceeded,
            exceeded("maxSteps", json!(steps), limits.max_steps),
        ));
    }
    let failures = consecutive_failures(&status.steps);
    if failures >= limits.max_consecutive_tool_failures {
        return Some((
            TerminalReason::RepeatedToolFailures,
            EventType::LimitExceeded,
            exceeded(
                "maxConsecutiveToolFailures",
                json!(failures),
                limits.max_consecutive_tool_failures,
            ),
        ));
    }
    if let Some(max) = limits.max_active_seconds {
        if status.active_seconds >= max as f64 {
            return Some((
                TerminalReason::LimitActiveTime,
                EventType::LimitExceeded,
                exceeded("maxActiveSeconds", json!(status.active_seconds), max),
            ));
        }
    }
    if let (Some(max), Some(started)) = (limits.max_elapsed_seconds, status.started_at) {
        let elapsed_millis = txn.now().as_millis().saturating_sub(started.as_millis());
        if elapsed_millis >= max.saturating_mul(1000) {
            return Some((
                TerminalReason::LimitElapsedTime,
                EventType::LimitExceeded,
                exceeded(
                    "maxElapsedSeconds",
                    json!(elapsed_millis as f64 / 1000.0),
                    max,
                ),
            ));
        }
    }
    looping(&status.steps, limits.loop_threshold)
        .map(|data| (TerminalReason::LoopDetected, EventType::LoopDetected, data))
}

/// Failures in a row at the end of the run (docs/behaviours.md 5): tool errors, policy denials,
/// invalid decisions and interruptions count; a `tool_result` resets the count.
pub(crate) fn consecutive_failures(steps: &[Step]) -> i64 {
    let mut count = 0;
    for step in steps.iter().rev() {
        match step.observation.as_ref().map(|o| o.kind) {
            Some(
                ObservationKind::ToolError
                | ObservationKind::PolicyDenied
                | ObservationKind::InvalidDecision
                | ObservationKind::Interrupted,
            ) => count += 1,
            _ => break,
        }
    }
    count
}

/// How many settled steps at the end of `steps` are the same tool call with the same
/// observation (what [`looping`] compares), 0 when the last is not a valid tool call.
pub(crate) fn trailing_repeats(steps: &[Step]) -> usize {
    let mut keys = steps.iter().rev().map(call_key);
    let Some(Some(last)) = keys.next() else {
        return 0;
    };
    1 + keys.take_while(|key| key.as_ref() == Some(&last)).count()
}

/// Loop detection (docs/behaviours.md 6): the last `threshold` steps are tool calls of one tool
/// with one canonical args hash and one observation content hash. Anything else among them (an
/// invalid decision, a changed observation) breaks the sequence.
fn looping(steps: &[Step], threshold: i64) -> Option<Value> {
    let threshold = usize::try_from(threshold).ok().filter(|t| *t > 0)?;
    if steps.len() < threshold {
        return None;
    }
    let mut key: Option<(String, String, String)> = None;
    for step in &steps[steps.len() - threshold..] {
        let this = call_key(step)?;
        match &key {
            None => key = Some(this),
            Some(first) if *first == this => {}
            Some(_) => return None,
        }
    }
    let (tool, args_hash, content_hash) = key?;
    Some(json!({
        "tool": tool,
        "count": threshold,
        "argsHash": args_hash,
        "contentHash": content_hash,
    }))
}

/// (tool, args hash, observation content hash) of a finished, valid tool-call step.
fn call_key(step: &Step) -> Option<(String, String, String)> {
    let decision = step.decision.as_ref()?;
    if decision.kind.as_deref().and_then(DecisionKind::parse) != Some(DecisionKind::ToolCall) {
        return None;
    }
    let observation = step.observation.as_ref()?;
    if observation.kind == ObservationKind::InvalidDecision {
        return None;
    }
    let args = decision
        .args
        .clone()
        .unwrap_or_else(|| Value::Object(Map::new()));
    let args_hash = content_hash(&args).ok()?;
    Some((
        decision.tool.clone()?,
        args_hash,
        observation.content_hash.clone(),
    ))
}
