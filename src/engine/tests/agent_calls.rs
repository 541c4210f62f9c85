//! docs/behaviours.md 10 and 66: the webhook agent survives a blip. A transient failure is
//! asked again with backoff (Retry-After honoured) within `spec.agent.webhook.timeoutSeconds`,
//! each failed attempt in the journal (`agent.failed`); `agent_error` only after that.

use serde_json::json;

use super::harness::*;
use crate::api::{RunPhase, StepIndex, StepStatus, TerminalReason};
use crate::engine::{AgentFailure, Input};

fn transient(status: Option<u16>, retry_after_millis: Option<u64>) -> AgentFailure {
    AgentFailure {
        detail: format!("POST http://127.0.0.1:8090/decide: {status:?}"),
        status,
        transient: true,
        retry_after_millis,
    }
}

fn failed(h: &mut Harness, failure: AgentFailure) -> Vec<Effect> {
    h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Err(failure),
        },
    )
}

/// The (attempt, delay, timeout) of the one agent call in `effects`.
fn agent_call(effects: &[Effect]) -> (u32, u64, u64) {
    effects
        .iter()
        .find_map(|e| match e {
            Effect::CallAgent {
                attempt,
                delay_millis,
                timeout_millis,
                ..
            } => Some((*attempt, *delay_millis, *timeout_millis)),
            _ => None,
        })
        .expect("an agent call")
}

#[test]
fn a_refused_connection_and_a_500_are_asked_again_and_the_run_goes_on() {
    let mut h = Harness::new(WEBHOOK);
    let effects = h.reconcile("a");
    assert_eq!(agent_call(&effects), (1, 0, 30_000));
    h.advance_millis(10);
    let effects = failed(&mut h, transient(None, None));
    assert_effects!(effects, ["WriteStatus", "CallAgent(0)"]);
    assert_eq!(agent_call(&effects), (2, 250, 29_740));
    h.advance_millis(300);
    let effects = failed(&mut h, transient(Some(500), None));
    assert_eq!(agent_call(&effects).0, 3);
    assert_eq!(agent_call(&effects).1, 500);
    let effects = h.step(
        "a",
        Input::AgentAnswered {
            step: StepIndex(0),
            decision: Ok(call("send", json!({"n": 1}))),
        },
    );
    assert_effects!(effects, ["WriteStatus", "CallTool(send#1)"]);
    let attempts: Vec<_> = h
        .events()
        .into_iter()
        .filter(|e| e.type_ == crate::api::EventType::AgentFailed)
        .map(|e| e.data.unwrap())
        .collect();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["attempt"], json!(1));
    assert_eq!(attempts[0]["retryInMs"], json!(250));
    assert!(attempts[0].get("status").is_none());
    assert_eq!(attempts[1]["attempt"], json!(2));
    assert_eq!(attempts[1]["status"], json!(500));
    assert_eq!(attempts[1]["transient"], json!(true));
    assert_eq!(h.status().phase, RunPhase::Running);
}

#[test]
fn a_retry_after_longer_than_the_backoff_is_waited() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    let effects = failed(&mut h, transient(Some(429), Some(3_000)));
    assert_eq!(agent_call(&effects).1, 3_000);
    assert_eq!(h.last_event("agent.failed")["retryAfterMs"], json!(3_000));
}

#[test]
fn an_agent_that_keeps_failing_ends_agent_error_once_its_timeout_is_spent() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    let mut attempts = 0;
    loop {
        attempts += 1;
        let effects = failed(&mut h, transient(Some(503), None));
        if h.status().phase.is_terminal() {
            assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
            break;
        }
        let (_, delay, timeout) = agent_call(&effects);
        h.advance_millis(i64::try_from(delay + timeout.min(1_000)).unwrap());
        assert!(attempts < 50, "never gave up");
    }
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::AgentError));
    let detail = status.reason_detail.unwrap();
    assert!(
        detail.contains("timeoutSeconds") && detail.contains(&format!("{attempts} attempts")),
        "{detail}"
    );
    assert_eq!(status.steps[0].status, StepStatus::Failed);
    let failed_events = h
        .events()
        .into_iter()
        .filter(|e| e.type_ == crate::api::EventType::AgentFailed)
        .count();
    assert_eq!(failed_events, attempts);
    assert!(h.last_event("agent.failed").get("retryInMs").is_none());
}

#[test]
fn a_retry_after_that_does_not_fit_the_timeout_ends_the_run_at_once() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    failed(&mut h, transient(Some(503), Some(60_000)));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::AgentError));
    assert!(status.reason_detail.unwrap().contains("1 attempts"));
}

#[test]
fn a_failure_that_is_not_transient_is_not_asked_again() {
    let mut h = Harness::new(WEBHOOK);
    h.reconcile("a");
    let effects = failed(
        &mut h,
        AgentFailure {
            status: Some(400),
            ..AgentFailure::from("POST http://127.0.0.1:8090/decide: HTTP 400")
        },
    );
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    assert_eq!(h.status().reason, Some(TerminalReason::AgentError));
    assert_eq!(h.last_event("agent.failed")["transient"], json!(false));
}
