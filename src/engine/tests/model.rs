//! docs/behaviours.md 10 and 45-48: model attempts and their accounting.

use serde_json::{json, Value};

use super::harness::*;
use crate::agents::openai::encode;
use crate::api::{RunPhase, StepStatus, TerminalReason};
use crate::engine::model::ReportedUsage;
use crate::engine::{Input, ModelOutcome};

/// The projection `dispatch` makes of the request in `effects`.
fn projected_input(effects: &[Effect]) -> i64 {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::CallModel { request, .. } => Some((encode(request).len() / 3 + 1) as i64),
            _ => None,
        })
        .expect("a model call")
}

fn answer(h: &mut Harness, outcome: ModelOutcome) -> Vec<String> {
    let (step, attempt) = h.pending_model.take().expect("a model call is pending");
    let effects = h.step(
        "a",
        Input::ModelAnswered {
            step,
            attempt,
            outcome,
        },
    );
    kinds(&effects)
}

fn reply(decision: Value, usage: Option<ReportedUsage>) -> ModelOutcome {
    ModelOutcome::Answered {
        decision,
        usage,
        latency_ms: 1200,
    }
}

fn usage(input: i64, output: i64, cached: i64) -> Option<ReportedUsage> {
    Some(ReportedUsage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
    })
}

#[test]
fn every_model_attempt_writes_dispatched_before_it_is_sent_and_completed_after() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "CallModel(0#1+0ms)"]);
    let input = projected_input(&effects);
    assert_eq!(h.steps()[0].status, StepStatus::Deciding);
    assert_eq!(h.status().usage.model_calls, 1);
    assert_eq!(
        h.last_event("model.dispatched"),
        json!({
            "attempt": 1,
            "model": "small-model",
            "delayMs": 0,
            "maxOutputTokens": 100,
            "projection": {
                "inputTokens": input,
                "outputTokens": 100,
                "costMicros": input * 2 + 100 * 8,
            },
        })
    );
    let effects = answer(
        &mut h,
        reply(call("read", json!({"n": 1})), usage(1000, 50, 200)),
    );
    assert_words!(effects, ["WriteStatus", "CallTool(read#1)"]);
    assert_eq!(
        h.last_event("model.completed"),
        json!({
            "attempt": 1,
            "inputTokens": 1000,
            "outputTokens": 50,
            "cachedInputTokens": 200,
            "costMicros": 2100,
            "charged": "reported",
            "latencyMs": 1200,
        })
    );
    assert_eq!(
        h.status().usage,
        crate::api::Usage {
            model_calls: 1,
            input_tokens: 1000,
            output_tokens: 50,
            estimated_cost_micros: 2100,
        }
    );
    assert_words!(
        h.journal()[2..8].to_vec(),
        [
            "step.started@0",
            "model.dispatched@0",
            "model.completed@0",
            "step.decided@0",
            "step.policy@0",
            "step.tool_started@0"
        ]
    );
}

#[test]
fn the_call_limit_is_checked_before_each_attempt() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_model_calls = Some(1);
    h.reconcile("a");
    answer(&mut h, reply(call("read", json!({})), usage(10, 10, 0)));
    let effects = h.result("a", json!({}));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LimitModelCalls));
    assert_eq!(
        status.usage.model_calls, 1,
        "the refused attempt was never counted"
    );
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxModelCalls", "value": 2, "max": 1})
    );
    assert_eq!(status.steps[1].status, StepStatus::Failed);
}

#[test]
fn the_token_limit_counts_recorded_totals_plus_the_projection() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_total_tokens = Some(5);
    let effects = h.reconcile("a");
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LimitTokens));
    assert_eq!(status.usage.model_calls, 0, "nothing was sent");
    let exceeded = h.last_event("limit.exceeded");
    assert_eq!(exceeded["limit"], json!("maxTotalTokens"));
    assert!(exceeded["value"].as_i64().unwrap() > 100);
}

#[test]
fn the_cost_limit_counts_recorded_totals_plus_the_projection() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_estimated_cost_micros = Some(100);
    h.reconcile("a");
    assert_eq!(h.status().reason, Some(TerminalReason::LimitCost));
    assert_eq!(
        h.last_event("limit.exceeded")["limit"],
        json!("maxEstimatedCostMicros")
    );
}

#[test]
fn under_a_token_limit_a_request_with_no_output_cap_is_refused_before_it_is_sent() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut()
        .agent
        .openai
        .as_mut()
        .unwrap()
        .max_output_tokens = None;
    h.spec_mut().limits.max_total_tokens = Some(1_000_000);
    let effects = h.reconcile("a");
    assert!(!kinds(&effects).iter().any(|k| k.starts_with("CallModel")));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LimitTokens));
    assert_eq!(
        h.last_event("limit.exceeded")["missingOutputCap"],
        json!(true)
    );
    assert!(status.reason_detail.unwrap().contains("output cap"));
}

#[test]
fn the_per_call_output_cap_is_the_smaller_of_agent_and_limit() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_output_tokens_per_call = Some(40);
    let effects = h.reconcile("a");
    let cap = effects.iter().find_map(|e| match e {
        Effect::CallModel {
            max_output_tokens, ..
        } => Some(*max_output_tokens),
        _ => None,
    });
    assert_eq!(cap, Some(Some(40)));
}

#[test]
fn an_attempt_with_no_answer_is_charged_its_projection_and_tried_again() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    let input = projected_input(&effects);
    let effects = answer(
        &mut h,
        ModelOutcome::NoAnswer {
            detail: "timed out".into(),
            latency_ms: 30_000,
        },
    );
    assert_words!(effects, ["WriteStatus", "CallModel(0#2+1000ms)"]);
    let status = h.status();
    assert_eq!(status.usage.model_calls, 2);
    assert_eq!(status.usage.input_tokens, input);
    assert_eq!(status.usage.output_tokens, 100);
    let failed = h.last_event("model.failed");
    assert_eq!(failed["charged"], json!("projection"));
    assert_eq!(failed["outcome"], json!("no_answer"));
    assert_words!(h.journal_tail(2), ["model.failed@0", "model.dispatched@0"]);
}

#[test]
fn reported_usage_that_is_inconsistent_is_replaced_by_the_projection_and_ends_the_run() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    let input = projected_input(&effects);
    answer(&mut h, reply(complete(json!(1)), usage(10, 5, 20)));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::ModelUnavailable));
    assert_eq!(status.usage.input_tokens, input);
    assert_eq!(status.usage.output_tokens, 100);
    assert_words!(
        h.journal_tail(4),
        [
            "model.failed@0",
            "limit.exceeded",
            "step.failed@0",
            "run.finished"
        ]
    );
    assert_eq!(status.result, None, "the reply was not used");
}

#[test]
fn negative_usage_or_output_over_the_cap_is_inconsistent() {
    for bad in [usage(-1, 5, 0), usage(10, 101, 0)] {
        let mut h = Harness::new(OPENAI);
        h.reconcile("a");
        answer(&mut h, reply(complete(json!(1)), bad));
        assert_eq!(h.status().reason, Some(TerminalReason::ModelUnavailable));
    }
}

#[test]
fn usage_totals_saturate_instead_of_overflowing() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let mut status = h.status();
    status.usage.input_tokens = i64::MAX - 5;
    status.usage.estimated_cost_micros = i64::MAX - 5;
    h.run.status = serde_json::to_value(&status).unwrap();
    answer(&mut h, reply(complete(json!(1)), usage(90, 90, 0)));
    let usage = h.status().usage;
    assert_eq!(usage.input_tokens, i64::MAX);
    assert_eq!(usage.estimated_cost_micros, i64::MAX);
    assert_eq!(h.status().phase, RunPhase::Completed);
}

#[test]
fn transient_failures_are_retried_honouring_retry_after() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let effects = answer(
        &mut h,
        ModelOutcome::Failed {
            status: 429,
            retry_after_ms: Some(5_000),
            detail: "slow down".into(),
            latency_ms: 20,
        },
    );
    assert_words!(effects, ["WriteStatus", "CallModel(0#2+5000ms)"]);
    assert_eq!(
        h.last_event("model.failed"),
        json!({
            "attempt": 1,
            "status": 429,
            "detail": "slow down",
            "latencyMs": 20,
            "inputTokens": 0,
            "cachedInputTokens": 0,
            "outputTokens": 0,
            "costMicros": 0,
            "charged": "nothing",
        })
    );
    let effects = answer(
        &mut h,
        ModelOutcome::Failed {
            status: 503,
            retry_after_ms: None,
            detail: "overloaded".into(),
            latency_ms: 20,
        },
    );
    assert_words!(effects, ["WriteStatus", "CallModel(0#3+2000ms)"]);
}

#[test]
fn a_failure_that_is_not_transient_ends_the_run_model_unavailable() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let effects = answer(
        &mut h,
        ModelOutcome::Failed {
            status: 401,
            retry_after_ms: None,
            detail: "bad key".into(),
            latency_ms: 20,
        },
    );
    assert_words!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ModelUnavailable));
    assert!(status.reason_detail.unwrap().contains("HTTP 401"));
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"status": 401, "transient": false})
    );
}

#[test]
fn a_refused_connection_is_retried_and_an_unusable_endpoint_ends_the_run() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let effects = answer(
        &mut h,
        ModelOutcome::NotSent {
            detail: "connection refused".into(),
            retryable: true,
        },
    );
    assert_words!(effects, ["WriteStatus", "CallModel(0#2+1000ms)"]);
    assert_eq!(h.last_event("model.failed")["charged"], json!("nothing"));
    answer(
        &mut h,
        ModelOutcome::NotSent {
            detail: "the key would go over plain http".into(),
            retryable: false,
        },
    );
    assert_eq!(h.status().reason, Some(TerminalReason::ModelUnavailable));
}

#[test]
fn retries_stop_after_the_last_attempt() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    for _ in 0..5 {
        answer(
            &mut h,
            ModelOutcome::Failed {
                status: 500,
                retry_after_ms: None,
                detail: "boom".into(),
                latency_ms: 1,
            },
        );
    }
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ModelUnavailable));
    assert_eq!(status.usage.model_calls, 5);
    assert!(status.reason_detail.unwrap().contains("failed 5 attempts"));
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "modelAttempts", "value": 5, "max": 5})
    );
}

#[test]
fn a_wait_that_cannot_fit_the_limits_ends_the_run_without_sleeping() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_elapsed_seconds = Some(60);
    h.reconcile("a");
    let effects = answer(
        &mut h,
        ModelOutcome::Failed {
            status: 429,
            retry_after_ms: Some(120_000),
            detail: "come back later".into(),
            latency_ms: 1,
        },
    );
    assert_words!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ModelUnavailable));
    assert!(status.reason_detail.unwrap().contains("maxElapsedSeconds"));
}

#[test]
fn an_attempt_a_takeover_finds_open_is_charged_its_projection() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    let input = projected_input(&effects);
    h.expire_lease();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "CallModel(1#1+0ms)"]);
    let failed = h
        .events()
        .into_iter()
        .find(|e| {
            e.step == Some(StepIndex(0))
                && serde_json::to_value(e.type_).unwrap() == json!("model.failed")
        })
        .and_then(|e| e.data)
        .unwrap();
    assert_eq!(failed["outcome"], json!("unknown"));
    assert_eq!(failed["inputTokens"], json!(input));
    let totals = h.status().usage;
    assert_eq!(totals.model_calls, 2);
    assert!(totals.input_tokens >= input);
    // The old attempt's answer, from the deposed holder, changes nothing.
    let before = h.run.status.clone();
    h.step(
        "a",
        Input::ModelAnswered {
            step: StepIndex(0),
            attempt: 1,
            outcome: reply(complete(json!(1)), usage(1, 1, 0)),
        },
    );
    assert_eq!(h.run.status, before);
}

#[test]
fn a_model_answer_applied_again_changes_nothing() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    answer(&mut h, reply(call("read", json!({})), usage(10, 10, 0)));
    let before = h.run.status.clone();
    let effects = h.step(
        "a",
        Input::ModelAnswered {
            step: StepIndex(0),
            attempt: 1,
            outcome: reply(call("read", json!({})), usage(10, 10, 0)),
        },
    );
    assert_effects!(effects, ["ReleaseLease", "Stop"]);
    assert_eq!(h.run.status, before);
}

#[test]
fn a_reply_that_reports_no_usage_is_charged_its_projection_and_ends_the_run() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    let input = projected_input(&effects);
    answer(&mut h, reply(complete(json!(1)), None));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::ModelUnavailable));
    assert_eq!(status.usage.input_tokens, input);
    assert_eq!(h.last_event("model.failed")["charged"], json!("projection"));
}

#[test]
fn the_request_is_rendered_from_the_record_and_projected_over_its_bytes() {
    let mut h = Harness::new(OPENAI);
    let effects = h.reconcile("a");
    let Some(Effect::CallModel { request, .. }) = effects.last() else {
        panic!("a model call: {effects:?}");
    };
    assert_eq!(request["model"], json!("small-model"));
    assert_eq!(request["max_tokens"], json!(100));
    assert_eq!(
        request["messages"][1]["content"],
        json!("Look something up.")
    );
    let projected = h.last_event("model.dispatched")["projection"]["inputTokens"].clone();
    assert_eq!(projected, json!(encode(request).len() / 3 + 1));
}

#[test]
fn a_reply_with_no_tool_call_or_cut_off_is_an_invalid_decision_naming_its_failure() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    for (failure, step) in [("no_tool_call", 0usize), ("truncated", 1)] {
        let decision = json!({"kind": "invalid", "failure": failure, "content": {"role": "assistant", "content": "hm"}});
        let effects = answer(&mut h, reply(decision, usage(100, 10, 0)));
        assert_eq!(effects[0], "WriteStatus", "{effects:?}");
        let record = &h.steps()[step];
        assert_eq!(record.status, StepStatus::Failed);
        assert_eq!(
            record.decision.as_ref().and_then(|d| d.kind.as_deref()),
            Some("invalid"),
            "recorded verbatim"
        );
        let observation = record.observation.as_ref().expect("observed");
        assert_eq!(
            serde_json::to_value(observation.kind).unwrap(),
            json!("invalid_decision")
        );
        let content = observation.content.as_ref().expect("content");
        assert_eq!(content["failure"], json!(failure), "{content}");
        assert!(
            !content["error"]
                .as_str()
                .unwrap_or("")
                .contains("unknown decision kind"),
            "{content}"
        );
    }
    assert_eq!(h.status().phase, RunPhase::Running, "the loop goes on");
}
