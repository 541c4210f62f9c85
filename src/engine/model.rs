//! Model accounting (docs/design.md section 6; docs/behaviours.md 10, 45-48): what a model attempt may
//! use before it is sent, what it is charged after, and whether a failed attempt is retried.
//!
//! Owns: the projection of a request, the call/token/cost limit checks, the cost estimate, the
//! charge of an attempt (reported usage, or the projection when there is no trustworthy
//! report), and the retry plan of a failed attempt. Must not: do I/O, read a clock, sleep or
//! know the wire format of any provider (that comes in as a `conversation::ModelWire`); every
//! time comes in as an input.
//!
//! Units, everywhere in this module: tokens and micros (millionths of a currency unit) as
//! `i64`, durations as milliseconds in `u64`. Totals never overflow: every sum saturates at
//! `i64::MAX`, and nothing ever subtracts from a total.
//!
//! How the engine uses it for one model attempt:
//! 1. `cap = output_cap(agent.maxOutputTokens, limits)`; render the request with that cap;
//!    `projection = Projection::new(body_bytes.len(), cap)` over the exact bytes that will be
//!    sent (the wire's `encode` of its `render` of the `conversation::Conversation`).
//! 2. [`check_before_attempt`]: on `Err(hit)` the run ends with `hit.reason`, writing
//!    `limit.exceeded` with [`ModelLimitHit::data`]; nothing is sent.
//! 3. `model.dispatched` is written with the totals [`record_dispatch`] returns (the attempt is
//!    counted before it is sent, so an attempt lost to a crash still counts).
//! 4. After the attempt, [`charge`] gives the new totals and the `model.completed` /
//!    `model.failed` payload ([`Charged::data`]); when [`Charged::unusable_usage`] is set the run
//!    ends `model_unavailable`.
//! 5. A failed attempt asks [`retry_plan`]: `RetryAfter` waits (a requeue, not a sleep here)
//!    and starts again at step 1 — each retry is a new checked attempt; `GiveUp` ends the run
//!    `model_unavailable` at once, writing `limit.exceeded` with [`GiveUp::data`].

use serde_json::{json, Value};

use crate::api::{Limits, ModelPrices, TerminalReason, Usage};

/// Most attempts of one model call (the first plus retries) before the run ends
/// `model_unavailable`.
pub const MAX_ATTEMPTS: u32 = 5;
/// The wait before the first retry, in milliseconds; it doubles for each further retry.
pub const BACKOFF_BASE_MILLIS: u64 = 1_000;
/// The longest backoff, in milliseconds (a `Retry-After` may ask for more, up to
/// [`MAX_RETRY_AFTER_MILLIS`]).
pub const BACKOFF_CAP_MILLIS: u64 = 30_000;
/// The longest `Retry-After` honoured, in milliseconds; a server asking for more ends the run
/// `model_unavailable` rather than parking it.
pub const MAX_RETRY_AFTER_MILLIS: u64 = 300_000;

const MICROS_PER_MILLION_TOKENS: i128 = 1_000_000;

/// What one request is expected to use, in tokens, before it is sent (docs/behaviours.md 46).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Projection {
    /// Request body bytes / 3 + 1 (a deliberately generous tokens-per-byte estimate).
    pub input_tokens: i64,
    /// The call's output cap; 0 when the call has none (such a call is refused under a token or
    /// cost limit, so the 0 never understates a limit that is checked).
    pub output_tokens: i64,
}

impl Projection {
    /// The projection of a request whose body is `request_body_bytes` long and whose output is
    /// capped at `output_cap` tokens (see [`output_cap`]).
    pub fn new(request_body_bytes: usize, output_cap: Option<i64>) -> Projection {
        let thirds = i64::try_from(request_body_bytes / 3).unwrap_or(i64::MAX);
        Projection {
            input_tokens: thirds.saturating_add(1),
            output_tokens: output_cap.unwrap_or(0).max(0),
        }
    }

    /// Input plus output tokens (saturating).
    pub fn total_tokens(&self) -> i64 {
        self.input_tokens
            .max(0)
            .saturating_add(self.output_tokens.max(0))
    }

    fn cost_micros(&self, prices: Option<&ModelPrices>) -> i64 {
        prices.map_or(0, |p| {
            cost_micros(p, self.input_tokens, 0, self.output_tokens)
        })
    }
}

/// The output token cap of one call: `min(agent.maxOutputTokens, limits.maxOutputTokensPerCall)`
/// when both are set, whichever is set otherwise, `None` when neither is.
pub fn output_cap(agent_max_output_tokens: Option<i64>, limits: &Limits) -> Option<i64> {
    match (agent_max_output_tokens, limits.max_output_tokens_per_call) {
        (Some(agent), Some(limit)) => Some(agent.min(limit)),
        (agent, limit) => agent.or(limit),
    }
}

/// A model limit that stops an attempt before it is sent (docs/behaviours.md 10, 46).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLimitHit {
    /// `limit_model_calls`, `limit_tokens` or `limit_cost`: the run ends with it.
    pub reason: TerminalReason,
    /// The limit's field in `spec.limits`: `maxModelCalls`, `maxTotalTokens`,
    /// `maxEstimatedCostMicros`.
    pub limit: &'static str,
    /// What the total would reach with this attempt (calls; tokens; micros).
    pub value: i64,
    /// The limit (same unit as `value`).
    pub max: i64,
    /// Set when the request was refused because it has no output cap (under a token or cost
    /// limit an uncapped request could use anything); `value` may then be within `max`.
    pub missing_output_cap: bool,
}

impl ModelLimitHit {
    /// The `limit.exceeded` event payload: `{limit, value, max}`, plus `missingOutputCap: true`
    /// when that is why.
    pub fn data(&self) -> Value {
        let mut data = json!({"limit": self.limit, "value": self.value, "max": self.max});
        if self.missing_output_cap {
            data["missingOutputCap"] = Value::Bool(true);
        }
        data
    }

    /// The run's `reasonDetail`: what was exceeded and how to fix it.
    pub fn detail(&self) -> String {
        if self.missing_output_cap {
            format!(
                "spec.limits.{} is set, so every model call needs an output cap: set \
                 spec.agent.openai.maxOutputTokens or spec.limits.maxOutputTokensPerCall",
                self.limit
            )
        } else {
            format!(
                "spec.limits.{} {} would be exceeded by the next model call (would reach {})",
                self.limit, self.max, self.value
            )
        }
    }
}

/// The words of the openai agent's refusal to send an API key over plain http to a host that
/// is not a loopback address (`agents::openai`), part of the `modelEndpoint` detail it ends the
/// run with; the Kubernetes Event of that refusal is a Warning `InsecureModelEndpoint`
/// (docs/behaviours.md 77).
pub const INSECURE_KEY_REFUSAL: &str =
    "refusing to send the API key over plain http to a host that is not a loopback address";

/// Checks the call, token and cost limits, in that order, before an attempt is sent
/// (docs/behaviours.md 46), against the recorded `totals` plus this attempt's `projection`:
/// - `maxModelCalls`: `totals.modelCalls + 1` may not exceed it;
/// - `maxTotalTokens`: recorded input + output tokens + `projection.total_tokens()` may not
///   exceed it;
/// - `maxEstimatedCostMicros`: recorded cost + the projection priced at `prices` (all input
///   uncached; no prices means a cost of 0) may not exceed it.
///
/// Under a token or cost limit a request without an output cap (`has_output_cap` false) is
/// refused outright: its output could be anything. Reaching a limit exactly is allowed.
///
/// # Errors
/// The first limit that the attempt would pass, as a [`ModelLimitHit`].
pub fn check_before_attempt(
    limits: &Limits,
    totals: &Usage,
    projection: &Projection,
    has_output_cap: bool,
    prices: Option<&ModelPrices>,
) -> Result<(), ModelLimitHit> {
    let hit = |reason, limit, value, max, missing_output_cap| ModelLimitHit {
        reason,
        limit,
        value,
        max,
        missing_output_cap,
    };
    if let Some(max) = limits.max_model_calls {
        let value = totals.model_calls.max(0).saturating_add(1);
        if value > max {
            return Err(hit(
                TerminalReason::LimitModelCalls,
                "maxModelCalls",
                value,
                max,
                false,
            ));
        }
    }
    if let Some(max) = limits.max_total_tokens {
        let value = totals
            .input_tokens
            .max(0)
            .saturating_add(totals.output_tokens.max(0))
            .saturating_add(projection.total_tokens());
        if !has_output_cap || value > max {
            return Err(hit(
                TerminalReason::LimitTokens,
                "maxTotalTokens",
                value,
                max,
                !has_output_cap,
            ));
        }
    }
    if let Some(max) = limits.max_estimated_cost_micros {
        let value = totals
            .estimated_cost_micros
            .max(0)
            .saturating_add(projection.cost_micros(prices));
        if !has_output_cap || value > max {
            return Err(hit(
                TerminalReason::LimitCost,
                "maxEstimatedCostMicros",
                value,
                max,
                !has_output_cap,
            ));
        }
    }
    Ok(())
}

/// The estimated cost of a call in micros: uncached input (`input_tokens −
/// cached_input_tokens`, as providers count cached tokens within the input) at the input price,
/// cached input at the cached price, output at the output price, prices being micros per
/// million tokens. The sum is divided by one million rounding up (a call that costs anything
/// costs at least 1), and saturates at `i64::MAX`. Negative counts and prices count as 0;
/// cached tokens count at most up to the input.
pub fn cost_micros(
    prices: &ModelPrices,
    input_tokens: i64,
    cached_input_tokens: i64,
    output_tokens: i64,
) -> i64 {
    let input = i128::from(input_tokens.max(0));
    let cached = i128::from(cached_input_tokens.max(0)).min(input);
    let output = i128::from(output_tokens.max(0));
    let price = |micros: i64| i128::from(micros.max(0));
    let total = (input - cached)
        .saturating_mul(price(prices.input_micros_per_million))
        .saturating_add(cached.saturating_mul(price(prices.cached_input_micros_per_million)))
        .saturating_add(output.saturating_mul(price(prices.output_micros_per_million)));
    let whole = total / MICROS_PER_MILLION_TOKENS;
    let rounded = if total % MICROS_PER_MILLION_TOKENS == 0 {
        whole
    } else {
        whole + 1
    };
    i64::try_from(rounded).unwrap_or(i64::MAX)
}

/// The totals with one more attempt counted (`modelCalls + 1`, saturating): written with
/// `model.dispatched`, before the attempt is sent (docs/behaviours.md 45).
pub fn record_dispatch(totals: &Usage) -> Usage {
    Usage {
        model_calls: totals.model_calls.saturating_add(1),
        ..totals.clone()
    }
}

/// Usage as the provider reported it, in tokens. `input_tokens` includes the cached ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportedUsage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: i64,
    /// Of those, the ones served from the provider's cache (0 when not reported).
    pub cached_input_tokens: i64,
    /// Completion tokens.
    pub output_tokens: i64,
}

/// How one sent (or unsendable) attempt ended, as far as accounting cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Nothing was sent (connection refused, bad configuration): charged nothing.
    NotSent,
    /// Sent, and no answer came (timeout, lost connection): charged its projection.
    NoAnswer,
    /// The server answered this non-2xx status. 5xx is charged its projection (a gateway may
    /// fail after the model ran); any other status is charged nothing (refused before work).
    ErrorStatus(u16),
    /// A 2xx reply with the usage it reported (`None` when it reported none).
    Replied(Option<ReportedUsage>),
}

/// What an attempt was charged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeBasis {
    /// The usage the reply reported.
    Reported,
    /// The projection (no answer, a 5xx, or a report that could not be trusted).
    Projection,
    /// Nothing (nothing was sent, or a non-5xx error status).
    Nothing,
}

impl ChargeBasis {
    fn as_str(self) -> &'static str {
        match self {
            ChargeBasis::Reported => "reported",
            ChargeBasis::Projection => "projection",
            ChargeBasis::Nothing => "nothing",
        }
    }
}

/// The charge of one attempt and the run's new totals (docs/behaviours.md 47).
#[derive(Debug, Clone, PartialEq)]
pub struct Charged {
    /// The run's totals after this charge (tokens and cost added, saturating; `modelCalls` as
    /// given, since [`record_dispatch`] counted the attempt).
    pub totals: Usage,
    /// Input tokens charged (cached included).
    pub input_tokens: i64,
    /// Of those, cached.
    pub cached_input_tokens: i64,
    /// Output tokens charged.
    pub output_tokens: i64,
    /// Cost charged, in micros.
    pub cost_micros: i64,
    /// What the charge was computed from.
    pub basis: ChargeBasis,
    /// Set when the reply's usage was missing, negative or inconsistent: the projection was
    /// charged instead and the run must end `model_unavailable` with this detail.
    pub unusable_usage: Option<String>,
}

impl Charged {
    /// The usage part of the `model.completed` / `model.failed` payload: `{inputTokens,
    /// cachedInputTokens, outputTokens, costMicros, charged: reported|projection|nothing}`, plus
    /// `unusableUsage` when set. The engine adds status and latency.
    pub fn data(&self) -> Value {
        let mut data = json!({
            "inputTokens": self.input_tokens,
            "cachedInputTokens": self.cached_input_tokens,
            "outputTokens": self.output_tokens,
            "costMicros": self.cost_micros,
            "charged": self.basis.as_str(),
        });
        if let Some(detail) = &self.unusable_usage {
            data["unusableUsage"] = Value::String(detail.clone());
        }
        data
    }

    /// `model_unavailable` when the usage could not be trusted, else `None`.
    pub fn ends_run(&self) -> Option<TerminalReason> {
        self.unusable_usage
            .as_ref()
            .map(|_| TerminalReason::ModelUnavailable)
    }
}

/// Charges one attempt to `totals` (docs/behaviours.md 47).
///
/// A reply's reported usage is charged when it is trustworthy: present, no count negative,
/// cached input within input, and output within `output_cap` when there is one. Otherwise the
/// projection is charged and [`Charged::unusable_usage`] says why. An attempt with no answer,
/// or a 5xx, is charged its projection; one not sent, or refused with another status, nothing.
/// Cost uses `prices` (none: 0). Every total only grows, saturating at `i64::MAX`.
pub fn charge(
    totals: &Usage,
    outcome: &AttemptOutcome,
    projection: &Projection,
    output_cap: Option<i64>,
    prices: Option<&ModelPrices>,
) -> Charged {
    let projected = ReportedUsage {
        input_tokens: projection.input_tokens.max(0),
        cached_input_tokens: 0,
        output_tokens: projection.output_tokens.max(0),
    };
    let nothing = ReportedUsage {
        input_tokens: 0,
        cached_input_tokens: 0,
        output_tokens: 0,
    };
    let (usage, basis, unusable_usage) = match outcome {
        AttemptOutcome::NotSent => (nothing, ChargeBasis::Nothing, None),
        AttemptOutcome::NoAnswer => (projected, ChargeBasis::Projection, None),
        AttemptOutcome::ErrorStatus(status) if (500..600).contains(status) => {
            (projected, ChargeBasis::Projection, None)
        }
        AttemptOutcome::ErrorStatus(_) => (nothing, ChargeBasis::Nothing, None),
        AttemptOutcome::Replied(None) => (
            projected,
            ChargeBasis::Projection,
            Some("the reply reported no usage".to_string()),
        ),
        AttemptOutcome::Replied(Some(reported)) => match untrusted(reported, output_cap) {
            None => (*reported, ChargeBasis::Reported, None),
            Some(why) => (projected, ChargeBasis::Projection, Some(why)),
        },
    };
    let cost = prices.map_or(0, |p| {
        cost_micros(
            p,
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens,
        )
    });
    let add = |total: i64, more: i64| total.saturating_add(more.max(0));
    Charged {
        totals: Usage {
            model_calls: totals.model_calls,
            input_tokens: add(totals.input_tokens, usage.input_tokens),
            output_tokens: add(totals.output_tokens, usage.output_tokens),
            estimated_cost_micros: add(totals.estimated_cost_micros, cost),
        },
        input_tokens: usage.input_tokens,
        cached_input_tokens: usage.cached_input_tokens,
        output_tokens: usage.output_tokens,
        cost_micros: cost,
        basis,
        unusable_usage,
    }
}

/// Why a reported usage cannot be charged, or `None` when it can.
fn untrusted(usage: &ReportedUsage, output_cap: Option<i64>) -> Option<String> {
    let ReportedUsage {
        input_tokens,
        cached_input_tokens,
        output_tokens,
    } = *usage;
    if input_tokens < 0 || cached_input_tokens < 0 || output_tokens < 0 {
        return Some(format!(
            "the reply reported negative usage (input {input_tokens}, cached \
             {cached_input_tokens}, output {output_tokens})"
        ));
    }
    if cached_input_tokens > input_tokens {
        return Some(format!(
            "the reply reported more cached input tokens ({cached_input_tokens}) than input \
             tokens ({input_tokens})"
        ));
    }
    match output_cap {
        Some(cap) if output_tokens > cap => Some(format!(
            "the reply reported {output_tokens} output tokens, over the call's cap of {cap}"
        )),
        _ => None,
    }
}

/// Where the run stands in time when an attempt failed, in milliseconds (the engine computes
/// these from its records and the caller's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunClock {
    /// Since the run started (`status.startedAt` to now).
    pub elapsed_millis: u64,
    /// Active time so far, the current step's included (a retry wait is active time: the run
    /// is deciding).
    pub active_millis: u64,
}

/// Why a failed model call is not retried: the run ends with `reason`.
#[derive(Debug, Clone, PartialEq)]
pub struct GiveUp {
    /// Always `model_unavailable`.
    pub reason: TerminalReason,
    /// The run's `reasonDetail`.
    pub detail: String,
    /// The `limit.exceeded` payload: `{status, transient: false}` for a status that is not
    /// retried; `{limit: "modelAttempts", value, max}`; `{limit: "retryAfterMillis", value,
    /// max}`; `{limit: "maxActiveSeconds" | "maxElapsedSeconds", value, max}` where `value` is
    /// the seconds (rounded up) the run would reach by the end of the wait.
    pub data: Value,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryDecision {
    /// Wait this many milliseconds, then make a new attempt (checked again by
    /// [`check_before_attempt`]).
    RetryAfter {
        /// Milliseconds to wait.
        millis: u64,
    },
    /// End the run; nothing waits.
    GiveUp(GiveUp),
}

/// Whether a failure is worth another attempt: no answer at all (`status` `None`: connection
/// refused, timeout, lost connection), 408, 409, 425, 429, or any 5xx. Every other status —
/// 400, 401, 403, 404, 422, a 3xx redirect (redirects are not followed) — will not change by
/// asking again.
pub fn is_transient(status: Option<u16>) -> bool {
    match status {
        None => true,
        Some(code) => matches!(code, 408 | 409 | 425 | 429) || (500..600).contains(&code),
    }
}

/// The backoff before the retry that follows attempt `attempt_number` (1-based): 1 s, 2 s,
/// 4 s, … capped at [`BACKOFF_CAP_MILLIS`].
pub fn backoff_millis(attempt_number: u32) -> u64 {
    let doublings = attempt_number.saturating_sub(1).min(32);
    BACKOFF_BASE_MILLIS
        .saturating_mul(1u64 << doublings)
        .min(BACKOFF_CAP_MILLIS)
}

/// Plans what follows the failed attempt number `attempt_number` (1-based) of a model call
/// (docs/behaviours.md 48).
///
/// `status` is the HTTP status, `None` when no answer came; `retry_after_millis` the server's
/// `Retry-After` (or `retry-after-ms`). In order:
/// 1. a status that is not transient ([`is_transient`]) gives up at once;
/// 2. after [`MAX_ATTEMPTS`] attempts, give up;
/// 3. the wait is the larger of [`backoff_millis`] and `Retry-After`; a `Retry-After` over
///    [`MAX_RETRY_AFTER_MILLIS`] gives up;
/// 4. a wait that would bring active time (`maxActiveSeconds`) or elapsed time
///    (`maxElapsedSeconds`) to or past its limit gives up: no time would be left to make the
///    attempt, so the run ends now instead of sleeping first;
/// 5. otherwise retry after the wait.
pub fn retry_plan(
    status: Option<u16>,
    retry_after_millis: Option<u64>,
    attempt_number: u32,
    limits: &Limits,
    clock: &RunClock,
) -> RetryDecision {
    let give_up = |detail: String, data: Value| {
        RetryDecision::GiveUp(GiveUp {
            reason: TerminalReason::ModelUnavailable,
            detail,
            data,
        })
    };
    let what = match status {
        Some(code) => format!("answered HTTP {code}"),
        None => "gave no answer".to_string(),
    };
    if !is_transient(status) {
        return give_up(
            format!("the model endpoint {what}, which is not retried"),
            json!({"status": status, "transient": false}),
        );
    }
    if attempt_number >= MAX_ATTEMPTS {
        return give_up(
            format!(
                "the model endpoint failed {attempt_number} attempts in a row (the last {what})"
            ),
            json!({"limit": "modelAttempts", "value": attempt_number, "max": MAX_ATTEMPTS}),
        );
    }
    if let Some(asked) = retry_after_millis.filter(|&ms| ms > MAX_RETRY_AFTER_MILLIS) {
        return give_up(
            format!(
                "the model endpoint {what} asking to retry after {asked} ms, longer \
                 than the {MAX_RETRY_AFTER_MILLIS} ms agentrt waits"
            ),
            json!({"limit": "retryAfterMillis", "value": asked, "max": MAX_RETRY_AFTER_MILLIS}),
        );
    }
    let wait = backoff_millis(attempt_number).max(retry_after_millis.unwrap_or(0));
    let windows = [
        (
            "maxActiveSeconds",
            limits.max_active_seconds,
            clock.active_millis,
        ),
        (
            "maxElapsedSeconds",
            limits.max_elapsed_seconds,
            clock.elapsed_millis,
        ),
    ];
    for (limit, max_seconds, so_far) in windows {
        let Some(max_seconds) = max_seconds else {
            continue;
        };
        let after_wait = so_far.saturating_add(wait);
        let max_millis = u64::try_from(max_seconds.max(0))
            .unwrap_or(0)
            .saturating_mul(1000);
        if after_wait >= max_millis {
            return give_up(
                format!(
                    "the model endpoint {what}; the {wait} ms wait before retrying \
                     would leave no time under spec.limits.{limit} {max_seconds}"
                ),
                json!({"limit": limit, "value": after_wait.div_ceil(1000), "max": max_seconds}),
            );
        }
    }
    RetryDecision::RetryAfter { millis: wait }
}

#[cfg(test)]
mod tests;
