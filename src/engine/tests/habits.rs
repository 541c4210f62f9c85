//! docs/behaviours.md 70-74 (issue 14, Kubernetes users' habits): a finished run's Job-like
//! `Complete`/`Failed` condition, a plain-text final answer of the openai agent, and
//! `spec.changed` when policy or limits are edited on a live run.

use serde_json::{json, Value};

use super::approvals::{paused, NAME};
use super::harness::*;
use crate::api::{AgentRunStatus, RunPhase, StepStatus, TerminalReason, TextAnswer};
use crate::engine::model::ReportedUsage;
use crate::engine::{Input, ModelOutcome, ToolOutcome};

/// The condition of `type_` as (status, reason, message), if the run has it.
fn condition(status: &AgentRunStatus, type_: &str) -> Option<(String, String, String)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[test]
fn a_completed_run_has_the_condition_complete_true_and_no_failed() {
    let mut h = Harness::scripted(vec![complete(json!({"refunded": 250}))]);
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(
        condition(&status, "Complete"),
        Some((
            "True".into(),
            "GoalCompleted".into(),
            "the run completed its goal".into()
        ))
    );
    assert_eq!(condition(&status, "Failed"), None);
}

#[test]
fn a_rejected_run_has_the_condition_failed_true_with_its_reason_in_camel_case() {
    let mut h = paused();
    assert_eq!(condition(&h.status(), "Failed"), None, "absent while live");
    assert_eq!(
        condition(&h.status(), "Complete"),
        None,
        "absent while live"
    );
    h.reject(NAME, "refund is too large");
    h.reconcile("b");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Cancelled);
    assert_eq!(
        condition(&status, "Failed"),
        Some((
            "True".into(),
            "ApprovalRejected".into(),
            "refund is too large".into()
        )),
        "approval_rejected becomes ApprovalRejected, the note its message"
    );
    assert_eq!(condition(&status, "Complete"), None);
    assert_eq!(status.conditions[0].type_, "Ready", "Ready stays first");
}

#[test]
fn a_failed_run_has_the_condition_failed_true() {
    let mut h = Harness::scripted(vec![
        json!({"kind": "fail", "message": "the order does not exist"}),
    ]);
    h.reconcile("a");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(
        condition(&status, "Failed"),
        Some((
            "True".into(),
            "GoalFailed".into(),
            "the order does not exist".into()
        ))
    );
}

/// A model's reply with no tool call that stopped with `text`, as the openai agent records it.
fn text_answer(text: &str) -> ModelOutcome {
    ModelOutcome::Answered {
        decision: json!({"kind": "invalid", "failure": "no_tool_call", "finishReason": "stop",
                         "content": {"role": "assistant", "content": text}}),
        usage: Some(ReportedUsage {
            input_tokens: 100,
            cached_input_tokens: 0,
            output_tokens: 10,
        }),
        latency_ms: 900,
    }
}

/// Answers the pending model call with `outcome`.
fn answer(h: &mut Harness, outcome: ModelOutcome) -> Vec<Effect> {
    let (step, attempt) = h.pending_model.take().expect("a model call is pending");
    h.step(
        "a",
        Input::ModelAnswered {
            step,
            attempt,
            outcome,
        },
    )
}

#[test]
fn a_plain_text_answer_completes_the_run_with_its_text_as_the_result() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let effects = answer(&mut h, text_answer("Order 1042 was refunded."));
    assert_effects!(effects, ["WriteStatus", "ReleaseLease", "Stop"]);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Completed);
    assert_eq!(status.reason, Some(TerminalReason::GoalCompleted));
    assert_eq!(
        status.result,
        Some(json!({"text": "Order 1042 was refunded."}))
    );
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Done);
    let decision = step.decision.as_ref().expect("recorded");
    assert_eq!(
        decision.kind.as_deref(),
        Some("invalid"),
        "the reply is recorded as received"
    );
    assert_eq!(
        h.last_event("step.decided"),
        json!({"kind": "invalid", "textAnswer": true}),
        "the journal says the text was taken as the answer"
    );
}

#[test]
fn a_blank_reply_or_one_that_did_not_stop_is_no_final_answer() {
    let mut h = Harness::new(OPENAI);
    h.reconcile("a");
    let outcome = |content: Value, finish: Option<&str>| {
        let mut decision = json!({"kind": "invalid", "failure": "no_tool_call",
                                  "content": {"role": "assistant", "content": content}});
        if let Some(finish) = finish {
            decision["finishReason"] = json!(finish);
        }
        ModelOutcome::Answered {
            decision,
            usage: Some(ReportedUsage {
                input_tokens: 100,
                cached_input_tokens: 0,
                output_tokens: 10,
            }),
            latency_ms: 900,
        }
    };
    answer(&mut h, outcome(json!("  "), Some("stop")));
    answer(&mut h, outcome(json!("I am done."), None));
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Running);
    assert_eq!(status.steps[0].status, StepStatus::Failed);
    assert_eq!(status.steps[1].status, StepStatus::Failed);
}

#[test]
fn text_answer_invalid_keeps_a_plain_text_reply_a_no_tool_call_invalid_decision() {
    let mut h = Harness::new(OPENAI);
    h.spec_mut()
        .agent
        .openai
        .as_mut()
        .expect("an openai agent")
        .text_answer = TextAnswer::Invalid;
    h.reconcile("a");
    let effects = answer(&mut h, text_answer("Order 1042 was refunded."));
    let Some(Effect::CallModel { request, .. }) = effects.last() else {
        panic!("the model is asked again: {effects:?}");
    };
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Running, "the loop goes on");
    let step = &status.steps[0];
    assert_eq!(step.status, StepStatus::Failed);
    let observation = step.observation.as_ref().expect("observed");
    assert_eq!(
        serde_json::to_value(observation.kind).unwrap(),
        json!("invalid_decision")
    );
    let content = observation.content.as_ref().expect("content");
    assert_eq!(content["failure"], json!("no_tool_call"), "{content}");
    let messages = request["messages"].as_array().expect("messages");
    assert!(
        messages.iter().any(|m| m["role"] == "assistant"
            && m["content"] == "Order 1042 was refunded."
            && m.get("tool_calls").is_none()),
        "the model sees its own text, not a call it never made: {messages:?}"
    );
}

/// A scripted run executing its first call (`write_local`, then complete).
fn executing() -> Harness {
    let mut h = Harness::scripted(vec![
        call("write_local", json!({"n": 1})),
        complete(json!("ok")),
    ]);
    h.reconcile("a");
    h
}

fn tool_finished() -> Input {
    Input::ToolFinished {
        step: StepIndex(0),
        attempt: 1,
        outcome: ToolOutcome::Result {
            status: 200,
            content: json!({"ok": true}),
            duration_ms: 5,
        },
    }
}

#[test]
fn an_edit_of_policy_and_limits_on_a_live_run_is_journaled_spec_changed_naming_the_fields() {
    let mut h = executing();
    assert!(
        h.status().spec_hashes.contains_key("policy"),
        "the first write keeps the fields' hashes"
    );
    assert!(!h.status().spec_hashes.contains_key("cancel"));
    let before = h.events().len();
    h.spec_mut().limits.max_steps = 7;
    h.spec_mut().policy.rules.clear();
    h.spec_mut().policy.side_effects.destructive = crate::api::PolicyOutcome::Abort;
    h.run.generation = 2;
    h.step("a", tool_finished());
    let journal = h.journal_from(before);
    assert_eq!(
        journal.iter().filter(|w| *w == "spec.changed").count(),
        1,
        "{journal:?}"
    );
    // Before what the transition decided under the new spec, not after the run's end.
    assert_eq!(
        journal.first().map(String::as_str),
        Some("spec.changed"),
        "{journal:?}"
    );
    assert_eq!(
        h.last_event("spec.changed"),
        json!({"generation": 2, "fields": ["spec.limits", "spec.policy"]})
    );
    assert_eq!(h.status().observed_generation, Some(2));
    assert_eq!(h.status().phase, RunPhase::Completed);
}

#[test]
fn a_new_generation_that_changes_no_hashed_field_writes_no_spec_changed() {
    let mut h = executing();
    h.spec_mut().cancel = false;
    h.run.generation = 2;
    h.step("a", tool_finished());
    assert!(
        !h.journal().iter().any(|w| w == "spec.changed"),
        "{:?}",
        h.journal()
    );
}

#[test]
fn a_waiting_run_acknowledges_an_edit_of_its_spec_at_once() {
    let mut h = paused();
    assert_eq!(h.status().phase, RunPhase::WaitingForApproval);
    let before = h.events().len();
    // An edit of spec.limits (server-side apply): the next look at the run writes the new
    // generation, in the status and in every condition, and says what changed.
    h.spec_mut().limits.max_steps = 7;
    h.run.generation = 3;
    h.reconcile("b");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    assert_eq!(status.observed_generation, Some(3));
    assert!(!status.conditions.is_empty());
    assert!(
        status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(3)),
        "{:?}",
        status.conditions
    );
    assert_eq!(h.journal_from(before), ["spec.changed"]);
    assert_eq!(
        h.last_event("spec.changed"),
        json!({"generation": 3, "fields": ["spec.limits"]})
    );
    // Looking again writes nothing more.
    let after = h.events().len();
    h.reconcile("b");
    assert_eq!(h.events().len(), after);
}

/// The Kubernetes Event a lone `limit.exceeded` with `data` projects to: (type, reason, message).
fn limit_event(data: Value) -> (String, String, String) {
    let status = json!({"events": [{"seq": 1, "type": "limit.exceeded", "data": data}]});
    let events = crate::engine::kube_events(&Value::Null, &status);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    (e.type_.as_str().into(), e.reason.clone(), e.message.clone())
}

#[test]
fn a_projected_cost_limit_event_says_it_would_be_exceeded() {
    assert_eq!(
        limit_event(json!({"limit": "maxEstimatedCostMicros", "value": 227, "max": 100})),
        (
            "Warning".into(),
            "LimitExceeded".into(),
            "maxEstimatedCostMicros would be exceeded: 227 projected, limit 100".into()
        )
    );
    assert_eq!(
        limit_event(json!({"limit": "maxSteps", "value": 51, "max": 50})).2,
        "maxSteps reached: 51 of 50"
    );
}

#[test]
fn an_api_key_refused_over_plain_http_is_a_warning_insecure_model_endpoint() {
    let detail = format!(
        "model endpoint http://models.example:8080/v1/chat/completions: not sent: {}; use an \
         https:// baseURL",
        crate::engine::model::INSECURE_KEY_REFUSAL
    );
    let (kind, reason, message) = limit_event(json!({"limit": "modelEndpoint", "detail": detail}));
    assert_eq!(
        (kind.as_str(), reason.as_str()),
        ("Warning", "InsecureModelEndpoint")
    );
    assert_eq!(message, detail, "the detail once, no '- of -'");
    let (_, reason, _) = limit_event(json!({"limit": "modelEndpoint", "detail": "bad url"}));
    assert_eq!(reason, "ModelEndpointUnusable");
}
