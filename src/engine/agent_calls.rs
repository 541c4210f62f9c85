//! The webhook agent's attempts (docs/design.md section 6; docs/behaviours.md 10, 66): what it
//! is sent, and what follows an attempt that brought no decision.
//!
//! - [`dispatch`] asks for step `index`'s decision with [`ExternalCall::Agent`]: the request
//!   ([`agent_request`]), the attempt's number, the wait before it and how long it may take.
//! - [`failed`]: every failed attempt is written to the journal as `agent.failed` {attempt,
//!   status, error, transient, retryInMs}. A transient one (no answer, 408, 425, 429, 5xx) is
//!   asked again after a backoff ([`backoff_millis`], or the server's `Retry-After` when
//!   longer), in the same write, while the whole decision fits in
//!   `spec.agent.webhook.timeoutSeconds` counted from the step's start; asking again is safe,
//!   as nothing was executed. Otherwise, or once the budget is spent, the run ends
//!   `agent_error` naming the attempts.
//!
//! Must not: sleep or read a clock (the executor waits `delay_millis`; time is `Txn::now`).

use serde_json::{json, Value};

use super::loop_::Flow;
use super::record::{to_value, Txn};
use super::{takeover, AgentFailure, ExternalCall};
use crate::api::{EventType, TerminalReason};

/// The wait before the second attempt, in milliseconds; it doubles up to
/// [`BACKOFF_CAP_MILLIS`] (the reconcile hook's pace).
pub const BACKOFF_START_MILLIS: u64 = 250;
/// The longest backoff between two attempts, in milliseconds (a `Retry-After` may ask for
/// more, as long as it fits in the budget).
pub const BACKOFF_CAP_MILLIS: u64 = 5_000;

/// The backoff after failed attempt number `attempt` (1-based): 250 ms, 500 ms, 1 s, ... capped
/// at [`BACKOFF_CAP_MILLIS`].
pub fn backoff_millis(attempt: u32) -> u64 {
    let doublings = attempt.saturating_sub(1).min(32);
    BACKOFF_START_MILLIS
        .saturating_mul(1u64 << doublings)
        .min(BACKOFF_CAP_MILLIS)
}

/// `spec.agent.webhook.timeoutSeconds` in milliseconds (at least 1 s).
fn budget_millis(txn: &Txn) -> u64 {
    let seconds = txn
        .run
        .spec
        .agent
        .webhook
        .as_ref()
        .map_or(30, |w| w.timeout_seconds.max(1));
    u64::try_from(seconds).unwrap_or(1).saturating_mul(1000)
}

/// Milliseconds since step `index` started (when its decision was first asked for).
fn elapsed_millis(txn: &Txn, index: usize) -> u64 {
    let now = txn.now().as_millis();
    let started = txn.status.steps[index]
        .started_at
        .map_or(now, |t| t.as_millis());
    u64::try_from(now.saturating_sub(started)).unwrap_or(0)
}

/// Asks the webhook agent for step `index`'s decision: attempt number `attempt`, sent after
/// `delay_millis`, allowed what is left of the budget after that wait.
pub(crate) fn dispatch(txn: &mut Txn, index: usize, attempt: u32, delay_millis: u64) -> Flow {
    let left = budget_millis(txn)
        .saturating_sub(elapsed_millis(txn, index))
        .saturating_sub(delay_millis);
    let request = agent_request(txn, index);
    txn.call(ExternalCall::Agent {
        step: txn.index_at(index),
        request,
        attempt,
        delay_millis,
        timeout_millis: left.max(1),
    });
    Flow::Halt
}

/// The number of the attempt that just failed: one more than the `agent.failed` events step
/// `index` already has (the step is deciding, so all of them are in the window).
fn failed_attempt(txn: &Txn, index: usize) -> u32 {
    let step = txn.index_at(index);
    let earlier = txn
        .status
        .events
        .iter()
        .filter(|e| e.type_ == EventType::AgentFailed && e.step == Some(step))
        .count();
    u32::try_from(earlier).unwrap_or(u32::MAX).saturating_add(1)
}

/// What follows an attempt of step `index`'s decision that brought none: `agent.failed`, then
/// another attempt after the backoff, or the run's end `agent_error` (module comment).
pub(crate) fn failed(txn: &mut Txn, index: usize, failure: AgentFailure) -> Flow {
    let attempt = failed_attempt(txn, index);
    let step = txn.index_at(index);
    let budget = budget_millis(txn);
    let wait = backoff_millis(attempt).max(failure.retry_after_millis.unwrap_or(0));
    let fits = elapsed_millis(txn, index).saturating_add(wait) < budget;
    let retry = failure.transient && fits;
    txn.event(
        EventType::AgentFailed,
        Some(step),
        json!({
            "attempt": attempt,
            "status": failure.status,
            "error": failure.detail,
            "transient": failure.transient,
            "retryAfterMs": failure.retry_after_millis,
            "retryInMs": retry.then_some(wait),
        }),
    );
    if retry {
        return dispatch(txn, index, attempt.saturating_add(1), wait);
    }
    let detail = if failure.transient {
        format!(
            "the agent gave no decision for step {step} within spec.agent.webhook.timeoutSeconds \
             ({} s, {attempt} attempts); the last: {}",
            budget / 1000,
            failure.detail
        )
    } else if attempt > 1 {
        format!(
            "the agent failed deciding step {step} (attempt {attempt}): {}",
            failure.detail
        )
    } else {
        format!("the agent failed deciding step {step}: {}", failure.detail)
    };
    txn.end_run(TerminalReason::AgentError, Some(detail), None);
    Flow::Continue
}

/// The body a webhook agent receives: the run, its goal, the step to decide, its tools (as
/// specified), the window's steps (the step being decided last, `deciding`), `archive`
/// (`status.archive` as stored, `null` when nothing is sealed: bounded, the newest 8 index
/// entries, `count` and `head`; an agent that needs older steps reads the segments, walking back
/// through each one's `previous`: docs/design.md section 4a) and its approvals. The README shows
/// an example.
pub(crate) fn agent_request(txn: &Txn, index: usize) -> Value {
    let run = txn.run;
    let tools: Vec<Value> = run
        .spec
        .tools
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": t.description,
                "inputSchema": t.input_schema,
                "sideEffect": t.side_effect,
                "timeoutSeconds": t.timeout_seconds,
                "terminal": t.terminal,
            })
        })
        .collect();
    json!({
        "run": {"namespace": run.namespace, "name": run.name, "uid": run.uid},
        "goal": run.spec.goal,
        "step": txn.index_at(index),
        "tools": tools,
        "steps": to_value(&txn.status.steps),
        "archive": to_value(&txn.status.archive),
        "approvals": takeover::approvals_view(txn),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_a_quarter_second_to_five_seconds() {
        let waits: Vec<u64> = (1..=7).map(backoff_millis).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(backoff_millis(u32::MAX), BACKOFF_CAP_MILLIS);
    }
}
