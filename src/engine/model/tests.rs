//! Tests of model accounting, named for docs/behaviours.md 45-48, with exact figures.

use proptest::prelude::*;
use serde_json::json;

use super::*;

fn usage(model_calls: i64, input: i64, output: i64, cost: i64) -> Usage {
    Usage {
        model_calls,
        input_tokens: input,
        output_tokens: output,
        estimated_cost_micros: cost,
    }
}

/// $2 per million input tokens, $0.50 cached, $8 output.
fn prices() -> ModelPrices {
    ModelPrices {
        input_micros_per_million: 2_000_000,
        cached_input_micros_per_million: 500_000,
        output_micros_per_million: 8_000_000,
    }
}

fn reported(input: i64, cached: i64, output: i64) -> ReportedUsage {
    ReportedUsage {
        input_tokens: input,
        cached_input_tokens: cached,
        output_tokens: output,
    }
}

// --- docs/behaviours.md 46: projection and the checks before each attempt ---

#[test]
fn projection_is_body_bytes_over_three_plus_one_and_the_output_cap() {
    assert_eq!(
        Projection::new(3000, Some(500)),
        Projection {
            input_tokens: 1001,
            output_tokens: 500
        }
    );
    assert_eq!(
        Projection::new(2, None),
        Projection {
            input_tokens: 1,
            output_tokens: 0
        }
    );
    assert_eq!(Projection::new(3000, Some(500)).total_tokens(), 1501);
}

#[test]
fn output_cap_is_the_smaller_of_the_agent_cap_and_the_per_call_limit() {
    let mut limits = Limits::default();
    assert_eq!(output_cap(None, &limits), None);
    assert_eq!(output_cap(Some(800), &limits), Some(800));
    limits.max_output_tokens_per_call = Some(500);
    assert_eq!(output_cap(None, &limits), Some(500));
    assert_eq!(output_cap(Some(800), &limits), Some(500));
    assert_eq!(output_cap(Some(300), &limits), Some(300));
}

#[test]
fn call_limit_counts_the_attempt_about_to_be_sent() {
    let limits = Limits {
        max_model_calls: Some(3),
        ..Limits::default()
    };
    let projection = Projection::new(300, Some(100));
    assert_eq!(
        check_before_attempt(&limits, &usage(2, 0, 0, 0), &projection, true, None),
        Ok(())
    );
    let hit = check_before_attempt(&limits, &usage(3, 0, 0, 0), &projection, true, None)
        .expect_err("a fourth call passes maxModelCalls 3");
    assert_eq!(hit.reason, TerminalReason::LimitModelCalls);
    assert_eq!(
        hit.data(),
        json!({"limit": "maxModelCalls", "value": 4, "max": 3})
    );
    assert_eq!(
        hit.detail(),
        "spec.limits.maxModelCalls 3 would be exceeded by the next model call (would reach 4)"
    );
}

#[test]
fn token_limit_counts_recorded_totals_plus_the_projection() {
    let limits = Limits {
        max_total_tokens: Some(2000),
        ..Limits::default()
    };
    let totals = usage(1, 600, 300, 0);
    // 1797 bytes → 600 input tokens; + 500 output cap; 600 + 300 + 600 + 500 = 2000: allowed.
    let exactly = Projection::new(1797, Some(500));
    assert_eq!(
        check_before_attempt(&limits, &totals, &exactly, true, None),
        Ok(())
    );
    // 1800 bytes → 601 input tokens: 2001.
    let over = Projection::new(1800, Some(500));
    let hit = check_before_attempt(&limits, &totals, &over, true, None)
        .expect_err("2001 tokens pass maxTotalTokens 2000");
    assert_eq!(hit.reason, TerminalReason::LimitTokens);
    assert_eq!(
        hit.data(),
        json!({"limit": "maxTotalTokens", "value": 2001, "max": 2000})
    );
}

#[test]
fn cost_limit_counts_recorded_cost_plus_the_projected_cost() {
    let limits = Limits {
        max_estimated_cost_micros: Some(10_000),
        ..Limits::default()
    };
    // 3000 bytes → 1001 input tokens at $2/M = 2002 µ; 500 output at $8/M = 4000 µ: 6002 µ.
    let projection = Projection::new(3000, Some(500));
    let p = prices();
    assert_eq!(
        check_before_attempt(&limits, &usage(1, 0, 0, 3998), &projection, true, Some(&p)),
        Ok(())
    );
    let hit = check_before_attempt(&limits, &usage(1, 0, 0, 3999), &projection, true, Some(&p))
        .expect_err("10001 µ pass maxEstimatedCostMicros 10000");
    assert_eq!(hit.reason, TerminalReason::LimitCost);
    assert_eq!(
        hit.data(),
        json!({"limit": "maxEstimatedCostMicros", "value": 10_001, "max": 10_000})
    );
}

#[test]
fn uncapped_request_is_refused_under_a_token_limit() {
    let limits = Limits {
        max_total_tokens: Some(1_000_000),
        ..Limits::default()
    };
    let projection = Projection::new(300, None);
    let hit = check_before_attempt(&limits, &usage(0, 0, 0, 0), &projection, false, None)
        .expect_err("no output cap under a token limit");
    assert_eq!(hit.reason, TerminalReason::LimitTokens);
    assert_eq!(
        hit.data(),
        json!({"limit": "maxTotalTokens", "value": 101, "max": 1_000_000, "missingOutputCap": true})
    );
    assert!(hit.detail().contains("maxOutputTokensPerCall"));
}

#[test]
fn uncapped_request_is_refused_under_a_cost_limit() {
    let limits = Limits {
        max_estimated_cost_micros: Some(1_000_000),
        ..Limits::default()
    };
    let p = prices();
    let hit = check_before_attempt(
        &limits,
        &usage(0, 0, 0, 0),
        &Projection::new(300, None),
        false,
        Some(&p),
    )
    .expect_err("no output cap under a cost limit");
    assert_eq!(hit.reason, TerminalReason::LimitCost);
    assert!(hit.missing_output_cap);
}

#[test]
fn uncapped_request_is_sent_when_no_token_or_cost_limit_is_set() {
    let limits = Limits {
        max_model_calls: Some(10),
        ..Limits::default()
    };
    assert_eq!(
        check_before_attempt(
            &limits,
            &usage(9, i64::MAX, i64::MAX, i64::MAX),
            &Projection::new(usize::MAX, None),
            false,
            None
        ),
        Ok(())
    );
}

#[test]
fn model_limits_are_checked_calls_then_tokens_then_cost() {
    let limits = Limits {
        max_model_calls: Some(1),
        max_total_tokens: Some(1),
        max_estimated_cost_micros: Some(1),
        ..Limits::default()
    };
    let p = prices();
    let all_over = usage(1, 10, 10, 10);
    let projection = Projection::new(300, Some(100));
    let reason = |totals: &Usage| {
        check_before_attempt(&limits, totals, &projection, true, Some(&p)).map_err(|h| h.reason)
    };
    assert_eq!(reason(&all_over), Err(TerminalReason::LimitModelCalls));
    assert_eq!(
        reason(&usage(0, 10, 10, 10)),
        Err(TerminalReason::LimitTokens)
    );
    let loose_tokens = Limits {
        max_total_tokens: Some(1_000),
        ..limits.clone()
    };
    assert_eq!(
        check_before_attempt(
            &loose_tokens,
            &usage(0, 0, 0, 10),
            &projection,
            true,
            Some(&p)
        )
        .map_err(|h| h.reason),
        Err(TerminalReason::LimitCost)
    );
}

// --- the cost estimate ---

#[test]
fn cost_is_priced_per_million_tokens_with_cached_input_at_its_own_price() {
    let p = ModelPrices {
        input_micros_per_million: 2_500_000,
        cached_input_micros_per_million: 1_250_000,
        output_micros_per_million: 10_000_000,
    };
    // 600 uncached × 2.5 + 400 cached × 1.25 + 200 output × 10 = 1500 + 500 + 2000 µ.
    assert_eq!(cost_micros(&p, 1000, 400, 200), 4000);
    assert_eq!(cost_micros(&p, 0, 0, 0), 0);
}

#[test]
fn cost_rounds_up_to_the_next_micro() {
    let p = ModelPrices {
        input_micros_per_million: 1,
        cached_input_micros_per_million: 0,
        output_micros_per_million: 0,
    };
    assert_eq!(cost_micros(&p, 1, 0, 0), 1);
    assert_eq!(cost_micros(&p, 1_000_000, 0, 0), 1);
    assert_eq!(cost_micros(&p, 1_000_001, 0, 0), 2);
    assert_eq!(cost_micros(&ModelPrices::default(), 1_000_000, 0, 0), 0);
}

#[test]
fn cost_saturates_and_ignores_negative_counts() {
    let huge = ModelPrices {
        input_micros_per_million: i64::MAX,
        cached_input_micros_per_million: i64::MAX,
        output_micros_per_million: i64::MAX,
    };
    assert_eq!(cost_micros(&huge, i64::MAX, 0, i64::MAX), i64::MAX);
    assert_eq!(cost_micros(&prices(), -5, -5, -5), 0);
    // Cached counts at most up to the input: 10 tokens at the cached price, 5 µ.
    assert_eq!(cost_micros(&prices(), 10, 50, 0), 5);
}

// --- docs/behaviours.md 45 and 47: charging an attempt ---

#[test]
fn every_attempt_is_counted_when_it_is_dispatched() {
    assert_eq!(record_dispatch(&usage(2, 10, 20, 30)), usage(3, 10, 20, 30));
    assert_eq!(
        record_dispatch(&usage(i64::MAX, 0, 0, 0)).model_calls,
        i64::MAX
    );
}

#[test]
fn reported_usage_is_charged_as_reported() {
    let p = prices();
    let charged = charge(
        &usage(1, 100, 50, 10),
        &AttemptOutcome::Replied(Some(reported(1200, 200, 300))),
        &Projection::new(3000, Some(500)),
        Some(500),
        Some(&p),
    );
    // 1000 × 2 + 200 × 0.5 + 300 × 8 = 2000 + 100 + 2400 = 4500 µ.
    assert_eq!(charged.totals, usage(1, 1300, 350, 4510));
    assert_eq!(charged.basis, ChargeBasis::Reported);
    assert_eq!(charged.ends_run(), None);
    assert_eq!(
        charged.data(),
        json!({"inputTokens": 1200, "cachedInputTokens": 200, "outputTokens": 300,
               "costMicros": 4500, "charged": "reported"})
    );
}

#[test]
fn attempt_with_no_answer_is_charged_its_projection() {
    let p = prices();
    let charged = charge(
        &usage(1, 100, 50, 10),
        &AttemptOutcome::NoAnswer,
        &Projection::new(3000, Some(500)),
        Some(500),
        Some(&p),
    );
    // 1001 × 2 + 500 × 8 = 6002 µ.
    assert_eq!(charged.totals, usage(1, 1101, 550, 6012));
    assert_eq!(charged.basis, ChargeBasis::Projection);
    assert_eq!(charged.ends_run(), None);
}

#[test]
fn server_error_is_charged_its_projection_and_a_refusal_nothing() {
    let p = prices();
    let projection = Projection::new(3000, Some(500));
    let at = |outcome| {
        charge(
            &usage(1, 0, 0, 0),
            &outcome,
            &projection,
            Some(500),
            Some(&p),
        )
    };
    assert_eq!(
        at(AttemptOutcome::ErrorStatus(502)).totals,
        usage(1, 1001, 500, 6002)
    );
    assert_eq!(
        at(AttemptOutcome::ErrorStatus(429)).totals,
        usage(1, 0, 0, 0)
    );
    assert_eq!(
        at(AttemptOutcome::ErrorStatus(429)).basis,
        ChargeBasis::Nothing
    );
    assert_eq!(at(AttemptOutcome::NotSent).totals, usage(1, 0, 0, 0));
}

#[test]
fn missing_usage_is_charged_the_projection_and_ends_the_run_model_unavailable() {
    let charged = charge(
        &usage(1, 0, 0, 0),
        &AttemptOutcome::Replied(None),
        &Projection::new(3000, Some(500)),
        Some(500),
        None,
    );
    assert_eq!(charged.totals, usage(1, 1001, 500, 0));
    assert_eq!(charged.basis, ChargeBasis::Projection);
    assert_eq!(charged.ends_run(), Some(TerminalReason::ModelUnavailable));
    assert_eq!(
        charged.data()["unusableUsage"],
        json!("the reply reported no usage")
    );
}

#[test]
fn negative_or_inconsistent_usage_is_replaced_by_the_projection_and_ends_the_run() {
    let projection = Projection::new(3000, Some(500));
    let cases = [
        (
            reported(-1, 0, 10),
            "the reply reported negative usage (input -1, cached 0, output 10)",
        ),
        (
            reported(100, 0, -10),
            "the reply reported negative usage (input 100, cached 0, output -10)",
        ),
        (
            reported(100, 101, 10),
            "the reply reported more cached input tokens (101) than input tokens (100)",
        ),
        (
            reported(100, 0, 501),
            "the reply reported 501 output tokens, over the call's cap of 500",
        ),
    ];
    for (report, why) in cases {
        let charged = charge(
            &usage(1, 7, 7, 7),
            &AttemptOutcome::Replied(Some(report)),
            &projection,
            Some(500),
            None,
        );
        assert_eq!(charged.totals, usage(1, 1008, 507, 7), "{why}");
        assert_eq!(charged.unusable_usage.as_deref(), Some(why));
        assert_eq!(charged.ends_run(), Some(TerminalReason::ModelUnavailable));
    }
    // Exactly the cap is consistent.
    let at_cap = charge(
        &usage(1, 0, 0, 0),
        &AttemptOutcome::Replied(Some(reported(100, 0, 500))),
        &projection,
        Some(500),
        None,
    );
    assert_eq!(at_cap.basis, ChargeBasis::Reported);
}

#[test]
fn totals_saturate_instead_of_overflowing() {
    let huge = ModelPrices {
        input_micros_per_million: i64::MAX,
        cached_input_micros_per_million: i64::MAX,
        output_micros_per_million: i64::MAX,
    };
    let charged = charge(
        &usage(i64::MAX, i64::MAX - 1, i64::MAX - 1, i64::MAX - 1),
        &AttemptOutcome::Replied(Some(reported(i64::MAX, 0, i64::MAX))),
        &Projection::new(usize::MAX, None),
        None,
        Some(&huge),
    );
    assert_eq!(
        charged.totals,
        usage(i64::MAX, i64::MAX, i64::MAX, i64::MAX)
    );
    assert_eq!(charged.cost_micros, i64::MAX);
}

fn arb_usage() -> impl Strategy<Value = Usage> {
    (any::<i64>(), any::<i64>(), any::<i64>(), any::<i64>())
        .prop_map(|(c, i, o, m)| usage(c, i, o, m))
}

fn arb_outcome() -> impl Strategy<Value = AttemptOutcome> {
    let report = (any::<i64>(), any::<i64>(), any::<i64>()).prop_map(|(i, c, o)| reported(i, c, o));
    prop_oneof![
        Just(AttemptOutcome::NotSent),
        Just(AttemptOutcome::NoAnswer),
        (100u16..600).prop_map(AttemptOutcome::ErrorStatus),
        proptest::option::of(report).prop_map(AttemptOutcome::Replied),
    ]
}

fn arb_prices() -> impl Strategy<Value = Option<ModelPrices>> {
    proptest::option::of(
        (any::<i64>(), any::<i64>(), any::<i64>()).prop_map(|(i, c, o)| ModelPrices {
            input_micros_per_million: i,
            cached_input_micros_per_million: c,
            output_micros_per_million: o,
        }),
    )
}

proptest! {
    #[test]
    fn totals_never_overflow_and_never_decrease(
        start in arb_usage(),
        attempts in proptest::collection::vec(
            (arb_outcome(), any::<usize>(), proptest::option::of(any::<i64>())),
            1..8,
        ),
        prices in arb_prices(),
    ) {
        let mut totals = start;
        for (outcome, body_bytes, cap) in attempts {
            let dispatched = record_dispatch(&totals);
            prop_assert!(dispatched.model_calls >= totals.model_calls);
            let projection = Projection::new(body_bytes, cap);
            let charged = charge(&dispatched, &outcome, &projection, cap, prices.as_ref());
            let next = charged.totals;
            prop_assert!(next.model_calls == dispatched.model_calls);
            prop_assert!(next.input_tokens >= totals.input_tokens);
            prop_assert!(next.output_tokens >= totals.output_tokens);
            prop_assert!(next.estimated_cost_micros >= totals.estimated_cost_micros);
            prop_assert!(charged.input_tokens >= 0 && charged.output_tokens >= 0);
            prop_assert!(charged.cost_micros >= 0);
            totals = next;
        }
    }
}

fn arb_limits() -> impl Strategy<Value = Limits> {
    let opt = || proptest::option::of(any::<i64>());
    (opt(), opt(), opt(), opt(), opt(), opt()).prop_map(
        |(calls, tokens, per_call, cost, active, elapsed)| Limits {
            max_model_calls: calls,
            max_total_tokens: tokens,
            max_output_tokens_per_call: per_call,
            max_estimated_cost_micros: cost,
            max_active_seconds: active,
            max_elapsed_seconds: elapsed,
            ..Limits::default()
        },
    )
}

proptest! {
    #[test]
    fn checks_and_retry_plans_never_panic_and_a_retry_always_fits_its_limits(
        limits in arb_limits(),
        totals in arb_usage(),
        body_bytes in any::<usize>(),
        agent_cap in proptest::option::of(any::<i64>()),
        prices in arb_prices(),
        status in proptest::option::of(any::<u16>()),
        retry_after in proptest::option::of(any::<u64>()),
        attempt in any::<u32>(),
        elapsed in any::<u64>(),
        active in any::<u64>(),
    ) {
        let cap = output_cap(agent_cap, &limits);
        let projection = Projection::new(body_bytes, cap);
        let _ = check_before_attempt(&limits, &totals, &projection, cap.is_some(), prices.as_ref());
        let clock = RunClock { elapsed_millis: elapsed, active_millis: active };
        if let RetryDecision::RetryAfter { millis } =
            retry_plan(status, retry_after, attempt, &limits, &clock)
        {
            prop_assert!(is_transient(status));
            prop_assert!(attempt < MAX_ATTEMPTS);
            prop_assert!(millis <= MAX_RETRY_AFTER_MILLIS);
            for (max, so_far) in [(limits.max_active_seconds, active), (limits.max_elapsed_seconds, elapsed)] {
                if let Some(max) = max {
                    prop_assert!(i128::from(so_far) + i128::from(millis) < i128::from(max) * 1000);
                }
            }
        }
    }
}

// --- docs/behaviours.md 48: retries ---

fn retry(status: Option<u16>, retry_after: Option<u64>, attempt: u32) -> RetryDecision {
    retry_plan(
        status,
        retry_after,
        attempt,
        &Limits::default(),
        &RunClock::default(),
    )
}

fn gave_up(decision: RetryDecision) -> GiveUp {
    match decision {
        RetryDecision::GiveUp(give_up) => give_up,
        other => panic!("expected GiveUp, got {other:?}"),
    }
}

#[test]
fn transient_failures_are_retried_with_exponential_backoff() {
    for status in [
        None,
        Some(408),
        Some(409),
        Some(425),
        Some(429),
        Some(500),
        Some(503),
    ] {
        let waits: Vec<_> = (1..MAX_ATTEMPTS).map(|n| retry(status, None, n)).collect();
        assert_eq!(
            waits,
            [1000, 2000, 4000, 8000].map(|millis| RetryDecision::RetryAfter { millis }),
            "{status:?}"
        );
    }
    assert_eq!(backoff_millis(5), 16_000);
    assert_eq!(backoff_millis(6), 30_000);
    assert_eq!(backoff_millis(u32::MAX), 30_000);
}

#[test]
fn retry_after_is_honoured_when_longer_than_the_backoff() {
    assert_eq!(
        retry(Some(429), Some(7_000), 1),
        RetryDecision::RetryAfter { millis: 7_000 }
    );
    assert_eq!(
        retry(Some(429), Some(500), 2),
        RetryDecision::RetryAfter { millis: 2_000 }
    );
    assert_eq!(
        retry(Some(503), Some(MAX_RETRY_AFTER_MILLIS), 1),
        RetryDecision::RetryAfter {
            millis: MAX_RETRY_AFTER_MILLIS
        }
    );
}

#[test]
fn retry_after_longer_than_agentrt_waits_ends_the_run_model_unavailable() {
    let give_up = gave_up(retry(Some(429), Some(MAX_RETRY_AFTER_MILLIS + 1), 1));
    assert_eq!(give_up.reason, TerminalReason::ModelUnavailable);
    assert_eq!(
        give_up.data,
        json!({"limit": "retryAfterMillis", "value": 300_001, "max": 300_000})
    );
}

#[test]
fn more_than_max_attempts_ends_the_run_model_unavailable() {
    let give_up = gave_up(retry(Some(500), None, MAX_ATTEMPTS));
    assert_eq!(give_up.reason, TerminalReason::ModelUnavailable);
    assert_eq!(
        give_up.data,
        json!({"limit": "modelAttempts", "value": 5, "max": 5})
    );
    assert_eq!(
        give_up.detail,
        "the model endpoint failed 5 attempts in a row (the last answered HTTP 500)"
    );
}

#[test]
fn non_transient_status_ends_the_run_model_unavailable_at_once() {
    for status in [400, 401, 403, 404, 422, 307, 200] {
        let give_up = gave_up(retry(Some(status), Some(1_000), 1));
        assert_eq!(give_up.reason, TerminalReason::ModelUnavailable);
        assert_eq!(give_up.data, json!({"status": status, "transient": false}));
    }
}

#[test]
fn wait_that_cannot_fit_the_elapsed_limit_ends_the_run_without_sleeping() {
    let limits = Limits {
        max_elapsed_seconds: Some(60),
        ..Limits::default()
    };
    let fits = RunClock {
        elapsed_millis: 57_999,
        active_millis: 0,
    };
    // Attempt 2 failed: a 2 s backoff ends at 59.999 s, inside 60 s.
    assert_eq!(
        retry_plan(Some(503), None, 2, &limits, &fits),
        RetryDecision::RetryAfter { millis: 2_000 }
    );
    let too_late = RunClock {
        elapsed_millis: 58_000,
        active_millis: 0,
    };
    let give_up = gave_up(retry_plan(Some(503), None, 2, &limits, &too_late));
    assert_eq!(give_up.reason, TerminalReason::ModelUnavailable);
    assert_eq!(
        give_up.data,
        json!({"limit": "maxElapsedSeconds", "value": 60, "max": 60})
    );
    // A Retry-After that overruns the limit gives up the same way.
    let give_up = gave_up(retry_plan(Some(429), Some(30_000), 1, &limits, &fits));
    assert_eq!(
        give_up.data,
        json!({"limit": "maxElapsedSeconds", "value": 88, "max": 60})
    );
}

#[test]
fn wait_that_cannot_fit_the_active_limit_ends_the_run_without_sleeping() {
    let limits = Limits {
        max_active_seconds: Some(10),
        max_elapsed_seconds: Some(10_000),
        ..Limits::default()
    };
    let clock = RunClock {
        elapsed_millis: 100_000,
        active_millis: 9_500,
    };
    let give_up = gave_up(retry_plan(None, None, 1, &limits, &clock));
    assert_eq!(
        give_up.data,
        json!({"limit": "maxActiveSeconds", "value": 11, "max": 10})
    );
    assert_eq!(
        give_up.detail,
        "the model endpoint gave no answer; the 1000 ms wait before retrying would leave \
         no time under spec.limits.maxActiveSeconds 10"
    );
}
