//! Model attempts and their accounting (DESIGN.md section 6; BEHAVIOURS.md 10, 45-48).
//!
//! Before each attempt the call, token and cost limits are checked against the recorded totals
//! plus this request's projection (input ≈ bytes/3 + 1 tokens, output = its cap); under a token
//! or cost limit a request with no output cap is refused before it is sent. The write before
//! [`Effect::CallModel`] records `model.dispatched` {attempt, projection} and counts the call;
//! the answer records `model.completed` or `model.failed` with usage, cost in micros and latency.
//! An attempt with no answer is charged its projection, and so is one a takeover or a cancel
//! finds open; reported usage that is negative or inconsistent is replaced by the projection and
//! ends the run `model_unavailable`. Totals saturate. Transient failures (408, 409, 425, 429,
//! 5xx, no answer) are tried again with backoff honouring Retry-After, each retry a new checked
//! attempt; a wait that cannot fit the time limits ends the run `model_unavailable` at once.

use serde_json::{json, Value};

use super::loop_::{agent_request, apply_decision, drive, unexpected, Flow};
use super::record::Txn;
use super::{Effect, EngineError, ModelOutcome, ModelUsage};
use crate::api::{EventType, ModelPrices, StepStatus, TerminalReason};

/// Attempts per step before the model counts as unavailable.
pub const MAX_MODEL_ATTEMPTS: i64 = 5;
/// The first retry's backoff; each further retry doubles it.
const BACKOFF_BASE_MILLIS: u64 = 1_000;
/// The longest backoff (a Retry-After may ask for more).
const BACKOFF_CAP_MILLIS: u64 = 30_000;

/// What one attempt is projected to use (BEHAVIOURS.md 46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Projection {
    input_tokens: i64,
    output_tokens: i64,
    cost_micros: i64,
}

/// The output cap of a request: `spec.agent.openai.maxOutputTokens` and
/// `spec.limits.maxOutputTokensPerCall`, the smaller.
fn output_cap(txn: &Txn) -> Option<i64> {
    let agent = txn
        .run
        .spec
        .agent
        .openai
        .as_ref()
        .and_then(|o| o.max_output_tokens);
    let limit = txn.run.spec.limits.max_output_tokens_per_call;
    match (agent, limit) {
        (Some(a), Some(l)) => Some(a.min(l)),
        (a, l) => a.or(l),
    }
}

/// Estimated cost in micros, rounded up, saturating.
fn cost(prices: Option<&ModelPrices>, usage: ModelUsage) -> i64 {
    let Some(prices) = prices else { return 0 };
    let cached = i128::from(
        usage
            .cached_input_tokens
            .clamp(0, usage.input_tokens.max(0)),
    );
    let fresh = i128::from(usage.input_tokens.max(0)) - cached;
    let total = fresh * i128::from(prices.input_micros_per_million)
        + cached * i128::from(prices.cached_input_micros_per_million)
        + i128::from(usage.output_tokens.max(0)) * i128::from(prices.output_micros_per_million);
    let micros = (total + 999_999) / 1_000_000;
    i64::try_from(micros).unwrap_or(i64::MAX)
}

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
    let request = agent_request(txn, index);
    let bytes = serde_json::to_vec(&request).map_or(0, |b| b.len());
    let cap = output_cap(txn);
    let input_tokens = i64::try_from(bytes / 3 + 1).unwrap_or(i64::MAX);
    let output_tokens = cap.unwrap_or(0);
    let projection = Projection {
        input_tokens,
        output_tokens,
        cost_micros: cost(
            prices(txn),
            ModelUsage {
                input_tokens,
                output_tokens,
                cached_input_tokens: 0,
            },
        ),
    };
    if let Some((reason, data)) = exceeded(txn, cap, projection) {
        txn.event(EventType::LimitExceeded, None, data);
        txn.end_run(reason, Some(limit_detail(reason)), None);
        return Flow::Continue;
    }
    let attempt = dispatched(txn, index).saturating_add(1);
    txn.status.usage.model_calls = txn.status.usage.model_calls.saturating_add(1);
    let model = txn.run.spec.agent.openai.as_ref().map(|o| o.model.clone());
    txn.event(
        EventType::ModelDispatched,
        Some(index as i64),
        json!({
            "attempt": attempt,
            "model": model,
            "delayMs": delay_millis,
            "maxOutputTokens": cap,
            "projection": {
                "inputTokens": projection.input_tokens,
                "outputTokens": projection.output_tokens,
                "costMicros": projection.cost_micros,
            },
        }),
    );
    txn.after.push(Effect::CallModel {
        step: index as i64,
        attempt,
        request,
        max_output_tokens: cap,
        delay_millis,
    });
    Flow::Halt
}

fn limit_detail(reason: TerminalReason) -> String {
    match reason {
        TerminalReason::LimitModelCalls => "spec.limits.maxModelCalls reached",
        TerminalReason::LimitTokens => "spec.limits.maxTotalTokens would be passed",
        _ => "spec.limits.maxEstimatedCostMicros would be passed",
    }
    .to_string()
}

/// The first model limit the next attempt would pass (BEHAVIOURS.md 46).
fn exceeded(txn: &Txn, cap: Option<i64>, p: Projection) -> Option<(TerminalReason, Value)> {
    let limits = &txn.run.spec.limits;
    let usage = &txn.status.usage;
    if let Some(max) = limits.max_model_calls {
        if usage.model_calls >= max {
            let value = usage.model_calls.saturating_add(1);
            let data = json!({"limit": "maxModelCalls", "value": value, "max": max});
            return Some((TerminalReason::LimitModelCalls, data));
        }
    }
    let guarded = [
        (
            limits.max_total_tokens,
            "maxTotalTokens",
            TerminalReason::LimitTokens,
        ),
        (
            limits.max_estimated_cost_micros,
            "maxEstimatedCostMicros",
            TerminalReason::LimitCost,
        ),
    ];
    if cap.is_none() {
        if let Some((Some(max), limit, reason)) = guarded.into_iter().find(|g| g.0.is_some()) {
            let detail = "a request with no output cap cannot be bounded; set \
                          spec.agent.openai.maxOutputTokens or spec.limits.maxOutputTokensPerCall";
            let data = json!({"limit": limit, "value": null, "max": max, "detail": detail});
            return Some((reason, data));
        }
    }
    if let Some(max) = limits.max_total_tokens {
        let value = usage
            .input_tokens
            .saturating_add(usage.output_tokens)
            .saturating_add(p.input_tokens)
            .saturating_add(p.output_tokens);
        if value > max {
            let data = json!({"limit": "maxTotalTokens", "value": value, "max": max});
            return Some((TerminalReason::LimitTokens, data));
        }
    }
    if let Some(max) = limits.max_estimated_cost_micros {
        let value = usage.estimated_cost_micros.saturating_add(p.cost_micros);
        if value > max {
            let data = json!({"limit": "maxEstimatedCostMicros", "value": value, "max": max});
            return Some((TerminalReason::LimitCost, data));
        }
    }
    None
}

/// How many attempts step `index` has dispatched.
fn dispatched(txn: &Txn, index: usize) -> i64 {
    txn.status
        .events
        .iter()
        .filter(|e| e.type_ == EventType::ModelDispatched && e.step == Some(index as i64))
        .count() as i64
}

/// The projection of step `index`'s attempt `attempt` if it is dispatched and has no outcome.
fn open_attempt(txn: &Txn, index: usize, attempt: i64) -> Option<Projection> {
    let mut open = None;
    for event in &txn.status.events {
        if event.step != Some(index as i64) {
            continue;
        }
        let Some(data) = &event.data else { continue };
        if data.get("attempt").and_then(Value::as_i64) != Some(attempt) {
            continue;
        }
        match event.type_ {
            EventType::ModelDispatched => {
                let p = &data["projection"];
                let field = |name: &str| p.get(name).and_then(Value::as_i64).unwrap_or(0);
                open = Some(Projection {
                    input_tokens: field("inputTokens"),
                    output_tokens: field("outputTokens"),
                    cost_micros: field("costMicros"),
                });
            }
            EventType::ModelCompleted | EventType::ModelFailed => open = None,
            _ => {}
        }
    }
    open
}

/// Adds one attempt's usage to the totals (saturating).
fn charge(txn: &mut Txn, input: i64, output: i64, cost_micros: i64) {
    let usage = &mut txn.status.usage;
    usage.input_tokens = usage.input_tokens.saturating_add(input);
    usage.output_tokens = usage.output_tokens.saturating_add(output);
    usage.estimated_cost_micros = usage.estimated_cost_micros.saturating_add(cost_micros);
}

fn charge_projection(txn: &mut Txn, p: Projection) -> Value {
    charge(txn, p.input_tokens, p.output_tokens, p.cost_micros);
    json!({
        "inputTokens": p.input_tokens,
        "outputTokens": p.output_tokens,
        "costMicros": p.cost_micros,
        "charged": "projection",
    })
}

/// Charges the projection of step `index`'s open attempt, if any, with `model.failed`: its
/// answer will never be recorded (a takeover, a cancel).
pub(crate) fn close_open_attempt(txn: &mut Txn, index: usize, why: &str) {
    let attempt = dispatched(txn, index);
    let Some(projection) = open_attempt(txn, index, attempt) else {
        return;
    };
    let mut data = charge_projection(txn, projection);
    data["attempt"] = json!(attempt);
    data["outcome"] = json!("unknown");
    data["detail"] = json!(why);
    txn.event(EventType::ModelFailed, Some(index as i64), data);
}

/// [`super::Input::ModelAnswered`].
pub(crate) fn answered(
    txn: &mut Txn,
    step: i64,
    attempt: i64,
    outcome: ModelOutcome,
) -> Result<(), EngineError> {
    let index = usize::try_from(step)
        .ok()
        .filter(|i| *i < txn.status.steps.len())
        .ok_or_else(|| {
            unexpected(
                txn,
                format!("a model answer for step {step}, which does not exist"),
            )
        })?;
    let deciding =
        txn.last_index() == Some(index) && txn.status.steps[index].status == StepStatus::Deciding;
    let open = open_attempt(txn, index, attempt).filter(|_| deciding);
    let Some(projection) = open else {
        // Applied already, or an attempt that is no longer open: go on from the record.
        drive(txn);
        return Ok(());
    };
    let flow = settle(txn, index, attempt, projection, outcome);
    if flow == Flow::Continue {
        drive(txn);
    }
    Ok(())
}

fn settle(
    txn: &mut Txn,
    index: usize,
    attempt: i64,
    projection: Projection,
    outcome: ModelOutcome,
) -> Flow {
    let step = Some(index as i64);
    match outcome {
        ModelOutcome::Answered {
            decision,
            usage,
            latency_ms,
        } => {
            let cap = output_cap(txn);
            match usage {
                Some(u) if !consistent(u, cap) => {
                    let mut data = charge_projection(txn, projection);
                    data["attempt"] = json!(attempt);
                    data["latencyMs"] = json!(latency_ms);
                    data["reported"] = json!({
                        "inputTokens": u.input_tokens,
                        "outputTokens": u.output_tokens,
                        "cachedInputTokens": u.cached_input_tokens,
                    });
                    data["detail"] = json!("reported usage is negative or inconsistent");
                    txn.event(EventType::ModelFailed, step, data);
                    unavailable(
                        txn,
                        "the model reported usage that is negative or inconsistent",
                    )
                }
                _ => {
                    let (u, source) = match usage {
                        Some(u) => (u, "reported"),
                        None => (
                            ModelUsage {
                                input_tokens: projection.input_tokens,
                                output_tokens: projection.output_tokens,
                                cached_input_tokens: 0,
                            },
                            "projection",
                        ),
                    };
                    let cost_micros = cost(prices(txn), u);
                    charge(txn, u.input_tokens, u.output_tokens, cost_micros);
                    txn.event(
                        EventType::ModelCompleted,
                        step,
                        json!({
                            "attempt": attempt,
                            "inputTokens": u.input_tokens,
                            "outputTokens": u.output_tokens,
                            "cachedInputTokens": u.cached_input_tokens,
                            "costMicros": cost_micros,
                            "charged": source,
                            "latencyMs": latency_ms,
                        }),
                    );
                    apply_decision(txn, index, decision)
                }
            }
        }
        ModelOutcome::NoAnswer { detail, latency_ms } => {
            let mut data = charge_projection(txn, projection);
            data["attempt"] = json!(attempt);
            data["outcome"] = json!("no_answer");
            data["detail"] = json!(detail);
            data["latencyMs"] = json!(latency_ms);
            txn.event(EventType::ModelFailed, step, data);
            retry(txn, index, attempt, None, &detail)
        }
        ModelOutcome::Failed {
            status,
            retry_after_ms,
            detail,
            latency_ms,
        } => {
            txn.event(
                EventType::ModelFailed,
                step,
                json!({
                    "attempt": attempt,
                    "status": status,
                    "detail": detail,
                    "latencyMs": latency_ms,
                    "inputTokens": 0,
                    "outputTokens": 0,
                    "costMicros": 0,
                }),
            );
            if transient(status) {
                retry(txn, index, attempt, retry_after_ms, &detail)
            } else {
                unavailable(txn, &format!("the model answered HTTP {status}: {detail}"))
            }
        }
        ModelOutcome::Unreachable { detail } => {
            txn.event(
                EventType::ModelFailed,
                step,
                json!({"attempt": attempt, "outcome": "unreachable", "detail": detail}),
            );
            unavailable(txn, &format!("the model is unreachable: {detail}"))
        }
    }
}

/// Reported usage the record can take as it is.
fn consistent(u: ModelUsage, cap: Option<i64>) -> bool {
    u.input_tokens >= 0
        && u.output_tokens >= 0
        && u.cached_input_tokens >= 0
        && u.cached_input_tokens <= u.input_tokens
        && cap.is_none_or(|cap| u.output_tokens <= cap)
}

/// 408, 409, 425, 429 and 5xx (BEHAVIOURS.md 48).
fn transient(status: u16) -> bool {
    matches!(status, 408 | 409 | 425 | 429 | 500..=599)
}

/// The next attempt after a transient failure, if it and its wait fit.
fn retry(
    txn: &mut Txn,
    index: usize,
    attempt: i64,
    retry_after_ms: Option<u64>,
    detail: &str,
) -> Flow {
    if attempt >= MAX_MODEL_ATTEMPTS {
        let why = format!("no usable answer after {attempt} attempts (last: {detail})");
        return unavailable(txn, &why);
    }
    let shift = u32::try_from(attempt.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(16);
    let backoff = BACKOFF_BASE_MILLIS
        .saturating_mul(1 << shift)
        .min(BACKOFF_CAP_MILLIS);
    let delay = backoff.max(retry_after_ms.unwrap_or(0));
    let delay_i64 = i64::try_from(delay).unwrap_or(i64::MAX);
    let now = txn.now().as_millis();
    let limits = &txn.run.spec.limits;
    if let (Some(max), Some(started)) = (limits.max_elapsed_seconds, txn.status.started_at) {
        let deadline = started.as_millis().saturating_add(max.saturating_mul(1000));
        if now.saturating_add(delay_i64) >= deadline {
            let why =
                format!("waiting {delay} ms to try again would pass spec.limits.maxElapsedSeconds");
            return unavailable(txn, &why);
        }
    }
    if let Some(max) = limits.max_active_seconds {
        let step_started = txn.status.steps[index]
            .started_at
            .map_or(now, |t| t.as_millis());
        let active_millis = (txn.status.active_seconds * 1000.0) as i64;
        let projected = active_millis
            .saturating_add(now.saturating_sub(step_started))
            .saturating_add(delay_i64);
        if projected >= max.saturating_mul(1000) {
            let why =
                format!("waiting {delay} ms to try again would pass spec.limits.maxActiveSeconds");
            return unavailable(txn, &why);
        }
    }
    dispatch(txn, index, delay)
}

/// BEHAVIOURS.md 10: the run ends `model_unavailable`, with `limit.exceeded`.
fn unavailable(txn: &mut Txn, detail: &str) -> Flow {
    txn.event(
        EventType::LimitExceeded,
        None,
        json!({"limit": "modelAvailable", "detail": detail}),
    );
    txn.end_run(
        TerminalReason::ModelUnavailable,
        Some(detail.to_string()),
        None,
    );
    Flow::Continue
}
