//! Model attempts in the loop (docs/design.md sections 4 and 6; docs/behaviours.md 10, 45-48): when, in
//! which write, and with what record a step's decision is asked of a model. The accounting
//! rules themselves (projection, limits, charges, retry plan) are [`super::model`]'s; what the
//! model is asked is the [`Conversation`] of the record, rendered and encoded by the provider's
//! wire ([`super::Budgets::model_wire`]), and the projection is over the bytes that wire's
//! `encode` gives, exactly what is sent (docs/behaviours.md 46).
//!
//! - Before each attempt the model limits are checked ([`model::check_before_attempt`]); one
//!   that fires writes `limit.exceeded` and ends the run, nothing is sent.
//! - The write before [`ExternalCall::Model`] counts the attempt ([`model::record_dispatch`]) and
//!   records `model.dispatched` {attempt, projection, maxOutputTokens, delayMs}.
//! - The answer is charged ([`model::charge`]) with `model.completed` (then the decision is
//!   recorded and the loop goes on) or `model.failed`; usage that cannot be trusted ends the
//!   run `model_unavailable`. A failure asks [`model::retry_plan`]: a retry is a new checked
//!   attempt sent after its wait (`delayMs`, waited by the executor); giving up ends the run
//!   `model_unavailable` with `limit.exceeded`, without waiting.
//! - An attempt a takeover or a cancel finds open is charged as one with no answer.
//! - The conversation is the whole history (the sealed steps the executor handed in with the
//!   run, then the window), bounded by `maxContextBytes` ([`Conversation::from_history`];
//!   docs/behaviours.md 59), and the projection is over exactly that request's bytes.

use serde_json::{json, Value};

use super::conversation::Conversation;
use super::loop_::{apply_decision, drive, unexpected, Flow};
use super::model::{self, AttemptOutcome, Projection, RetryDecision, RunClock};
use super::record::Txn;
use super::{EngineError, ExternalCall, ModelCall, ModelOutcome};
use crate::api::{EventType, ModelPrices, StepIndex, StepStatus, TerminalReason};

fn prices<'a>(txn: &Txn<'a>) -> Option<&'a ModelPrices> {
    txn.run
        .spec
        .agent
        .openai
        .as_ref()
        .and_then(|o| o.prices.as_ref())
}

/// Sends the next attempt of step `index` (which is deciding), after `delay_millis`.
pub(crate) fn dispatch(txn: &mut Txn, index: usize, delay_millis: u64) -> Flow {
    let spec = &txn.run.spec;
    let Some(agent) = spec.agent.openai.as_ref() else {
        let detail = "spec.agent.openai is not set".to_string();
        txn.end_run(TerminalReason::AgentError, Some(detail), None);
        return Flow::Continue;
    };
    let cap = model::output_cap(agent.max_output_tokens, &spec.limits);
    let wire = txn.budgets.model_wire;
    let window = Conversation::from_record(&spec.goal, agent, &spec.tools, &txn.status.steps, cap);
    // docs/design.md section 4a: the whole history, bounded by maxContextBytes.
    let conversation = Conversation::from_history(
        window,
        &txn.run.sealed,
        &txn.status.steps,
        wire,
        usize::try_from(agent.max_context_bytes).unwrap_or(0),
    );
    let request = (wire.render)(&conversation);
    let projection = Projection::new((wire.encode)(&request).len(), cap);
    let prices = prices(txn);
    let checked = model::check_before_attempt(
        &spec.limits,
        &txn.status.usage,
        &projection,
        cap.is_some(),
        prices,
    );
    if let Err(hit) = checked {
        txn.event(EventType::LimitExceeded, None, hit.data());
        txn.end_run(hit.reason, Some(hit.detail()), None);
        return Flow::Continue;
    }
    let attempt = dispatched(txn, index).saturating_add(1);
    txn.status.usage = model::record_dispatch(&txn.status.usage);
    let cost = prices.map_or(0, |p| {
        model::cost_micros(p, projection.input_tokens, 0, projection.output_tokens)
    });
    txn.event(
        EventType::ModelDispatched,
        Some(txn.index_at(index)),
        json!({
            "attempt": attempt,
            "model": agent.model,
            "delayMs": delay_millis,
            "maxOutputTokens": cap,
            "projection": {
                "inputTokens": projection.input_tokens,
                "outputTokens": projection.output_tokens,
                "costMicros": cost,
            },
        }),
    );
    txn.call(ExternalCall::Model(ModelCall {
        step: txn.index_at(index),
        attempt,
        request,
        max_output_tokens: cap,
        delay_millis,
    }));
    Flow::Halt
}

/// How many attempts step `index` has dispatched.
fn dispatched(txn: &Txn, index: usize) -> i64 {
    txn.status
        .events
        .iter()
        .filter(|e| e.type_ == EventType::ModelDispatched && e.step == Some(txn.index_at(index)))
        .count() as i64
}

/// An attempt dispatched and not yet answered: its projection and output cap.
struct Open {
    projection: Projection,
    cap: Option<i64>,
}

fn open_attempt(txn: &Txn, index: usize, attempt: i64) -> Option<Open> {
    let mut open = None;
    for event in &txn.status.events {
        let Some(data) = event
            .data
            .as_ref()
            .filter(|_| event.step == Some(txn.index_at(index)))
        else {
            continue;
        };
        if data.get("attempt").and_then(Value::as_i64) != Some(attempt) {
            continue;
        }
        match event.type_ {
            EventType::ModelDispatched => {
                let field = |name: &str| data["projection"].get(name).and_then(Value::as_i64);
                open = Some(Open {
                    projection: Projection {
                        input_tokens: field("inputTokens").unwrap_or(0),
                        output_tokens: field("outputTokens").unwrap_or(0),
                    },
                    cap: data.get("maxOutputTokens").and_then(Value::as_i64),
                });
            }
            EventType::ModelCompleted | EventType::ModelFailed => open = None,
            _ => {}
        }
    }
    open
}

/// Charges one attempt to the totals and returns the usage part of its event.
fn charge(txn: &mut Txn, outcome: &AttemptOutcome, open: &Open) -> model::Charged {
    let charged = model::charge(
        &txn.status.usage,
        outcome,
        &open.projection,
        open.cap,
        prices(txn),
    );
    txn.status.usage = charged.totals.clone();
    charged
}

/// Closes step `index`'s open attempt, if any, as one with no answer (`model.failed`, charged
/// its projection): a takeover or a cancel will never record its answer.
pub(crate) fn close_open_attempt(txn: &mut Txn, index: usize, why: &str) {
    let attempt = dispatched(txn, index);
    let Some(open) = open_attempt(txn, index, attempt) else {
        return;
    };
    let charged = charge(txn, &AttemptOutcome::NoAnswer, &open);
    let mut data = charged.data();
    data["attempt"] = json!(attempt);
    data["outcome"] = json!("unknown");
    data["detail"] = json!(why);
    txn.event(EventType::ModelFailed, Some(txn.index_at(index)), data);
}

/// [`super::Input::ModelAnswered`].
pub(crate) fn answered(
    txn: &mut Txn,
    step: StepIndex,
    attempt: i64,
    outcome: ModelOutcome,
) -> Result<(), EngineError> {
    let index = txn.position(step).ok_or_else(|| {
        unexpected(
            txn,
            format!("a model answer for step {step}, which does not exist"),
        )
    })?;
    let deciding = txn.last_position() == Some(index)
        && txn.status.steps[index].status == StepStatus::Deciding;
    let Some(open) = open_attempt(txn, index, attempt).filter(|_| deciding) else {
        // Applied already, or an attempt that is no longer open: go on from the record.
        drive(txn);
        return Ok(());
    };
    if settle(txn, index, attempt, &open, outcome) == Flow::Continue {
        drive(txn);
    }
    Ok(())
}

fn settle(txn: &mut Txn, index: usize, attempt: i64, open: &Open, outcome: ModelOutcome) -> Flow {
    let step = Some(txn.index_at(index));
    match outcome {
        ModelOutcome::Answered {
            decision,
            usage,
            latency_ms,
        } => {
            let charged = charge(txn, &AttemptOutcome::Replied(usage), open);
            let mut data = charged.data();
            data["attempt"] = json!(attempt);
            data["latencyMs"] = json!(latency_ms);
            match charged.unusable_usage {
                Some(why) => {
                    txn.event(EventType::ModelFailed, step, data);
                    let exceeded = json!({"limit": "reportedUsage", "detail": why});
                    txn.event(EventType::LimitExceeded, None, exceeded);
                    let detail = format!("the model's reply cannot be accounted for: {why}");
                    txn.end_run(TerminalReason::ModelUnavailable, Some(detail), None);
                    Flow::Continue
                }
                None => {
                    txn.event(EventType::ModelCompleted, step, data);
                    apply_decision(txn, index, decision)
                }
            }
        }
        ModelOutcome::Failed {
            status,
            retry_after_ms,
            detail,
            latency_ms,
        } => {
            let charged = charge(txn, &AttemptOutcome::ErrorStatus(status), open);
            let mut data = charged.data();
            data["attempt"] = json!(attempt);
            data["status"] = json!(status);
            data["detail"] = json!(detail);
            data["latencyMs"] = json!(latency_ms);
            txn.event(EventType::ModelFailed, step, data);
            retry(txn, index, attempt, Some(status), retry_after_ms)
        }
        ModelOutcome::NoAnswer { detail, latency_ms } => {
            let charged = charge(txn, &AttemptOutcome::NoAnswer, open);
            let mut data = charged.data();
            data["attempt"] = json!(attempt);
            data["outcome"] = json!("no_answer");
            data["detail"] = json!(detail);
            data["latencyMs"] = json!(latency_ms);
            txn.event(EventType::ModelFailed, step, data);
            retry(txn, index, attempt, None, None)
        }
        ModelOutcome::NotSent { detail, retryable } => {
            let charged = charge(txn, &AttemptOutcome::NotSent, open);
            let mut data = charged.data();
            data["attempt"] = json!(attempt);
            data["outcome"] = json!("not_sent");
            data["detail"] = json!(detail);
            txn.event(EventType::ModelFailed, step, data);
            if retryable {
                return retry(txn, index, attempt, None, None);
            }
            let exceeded = json!({"limit": "modelEndpoint", "detail": detail});
            txn.event(EventType::LimitExceeded, None, exceeded);
            let detail = format!("the model endpoint cannot be used: {detail}");
            txn.end_run(TerminalReason::ModelUnavailable, Some(detail), None);
            Flow::Continue
        }
    }
}

/// What follows a failed attempt ([`model::retry_plan`]).
fn retry(
    txn: &mut Txn,
    index: usize,
    attempt: i64,
    status: Option<u16>,
    retry_after_ms: Option<u64>,
) -> Flow {
    let now = txn.now().as_millis();
    let since = |from: Option<crate::api::Time>| {
        u64::try_from(now.saturating_sub(from.map_or(now, |t| t.as_millis()))).unwrap_or(0)
    };
    let active_so_far = (txn.status.active_seconds.max(0.0) * 1000.0) as u64;
    let clock = RunClock {
        elapsed_millis: since(txn.status.started_at),
        active_millis: active_so_far.saturating_add(since(txn.status.steps[index].started_at)),
    };
    let attempt_number = u32::try_from(attempt).unwrap_or(u32::MAX);
    let limits = &txn.run.spec.limits;
    match model::retry_plan(status, retry_after_ms, attempt_number, limits, &clock) {
        RetryDecision::RetryAfter { millis } => dispatch(txn, index, millis),
        RetryDecision::GiveUp(give_up) => {
            txn.event(EventType::LimitExceeded, None, give_up.data);
            txn.end_run(give_up.reason, Some(give_up.detail), None);
            Flow::Continue
        }
    }
}
