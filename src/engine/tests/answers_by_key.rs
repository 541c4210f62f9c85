//! docs/behaviours.md 111-114: interrupted http calls a tool settles itself, by its status URL
//! or by honouring idempotency keys; nobody is asked unless the tool cannot tell.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{IdempotencyKeys, ObservationKind, RunPhase, StepStatus};
use crate::engine::{kube_events, Input, StatusAnswer};

/// A run of the `tools` fixture whose `write_local` tool (LocalMutation) has `reconcile` as given, holder `a` executing
/// it on step 0, then the Lease expired and replica `b` taking over.
fn taken_over(reconcile: Value) -> (Harness, Vec<String>) {
    let mut h = Harness::scripted(vec![
        call("write_local", json!({"n": 1})),
        complete(json!("ok")),
    ]);
    let tool = h
        .spec_mut()
        .tools
        .iter_mut()
        .find(|t| t.name == "write_local")
        .expect("write_local");
    tool.http.as_mut().expect("http").reconcile =
        Some(serde_json::from_value(reconcile).expect("reconcile"));
    h.reconcile("a");
    assert_eq!(h.steps()[0].status, StepStatus::Executing);
    h.expire_lease();
    let effects = kinds(&h.reconcile("b"));
    (h, effects)
}

fn status_url() -> Value {
    json!({"statusURL": "https://tool.example/calls/{key}?v=1"})
}

fn answer(h: &mut Harness, answer: StatusAnswer) -> Vec<String> {
    let query = h
        .pending_status
        .take()
        .expect("a status question is pending");
    kinds(&h.step(
        "b",
        Input::ToolStatusAnswered {
            step: query.step,
            answer,
        },
    ))
}

#[test]
fn a_takeover_asks_the_status_url_with_the_key_encoded_and_asks_no_person() {
    let (h, effects) = taken_over(status_url());
    assert_eq!(effects, ["WriteStatus", "AskToolStatus(write_local)"]);
    let query = h.pending_status.clone().expect("asked");
    assert_eq!(query.url, "https://tool.example/calls/uid-1%2F0?v=1");
    assert_eq!(query.idempotency_key, "uid-1/0");
    assert_eq!(query.timeout_millis, 10_000);
    assert_eq!(h.steps()[0].status, StepStatus::Interrupted);
    assert!(h.approvals.is_empty(), "nobody is asked");
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn succeeded_records_the_result_as_the_steps_without_running_it_again() {
    let (mut h, _) = taken_over(status_url());
    let before = h.run.status.clone();
    let effects = answer(
        &mut h,
        StatusAnswer::Succeeded {
            result: json!({"ticket": 7}),
        },
    );
    let settled = kube_events(&before, &h.run.status);
    assert_eq!(settled[0].reason, "SettledByTool");
    assert_eq!(
        settled[0].message,
        "step 0's interrupted call of write_local was settled by the tool's status URL: succeeded"
    );
    assert_eq!(effects[0], "WriteStatus");
    assert_eq!(h.tool_calls.len(), 1, "nothing runs again");
    let step = &h.steps()[0];
    assert_eq!(step.status, StepStatus::Done);
    let observation = step.observation.clone().expect("observation");
    assert_eq!(observation.kind, ObservationKind::ToolResult);
    assert_eq!(observation.content, Some(json!({"ticket": 7})));
    let finished = h.last_event("step.tool_finished");
    assert_eq!(
        finished["settledBy"],
        json!({"statusURL": "https://tool.example/calls/{key}?v=1", "state": "succeeded"})
    );
    assert_eq!(finished["attempt"], json!(1));
    // The loop goes on: the agent's next decision completes the run.
    assert_eq!(h.status().phase, RunPhase::Completed);
}

#[test]
fn failed_records_a_tool_error_and_the_agent_decides_again() {
    let (mut h, _) = taken_over(status_url());
    answer(
        &mut h,
        StatusAnswer::Failed {
            error: json!({"message": "card declined"}),
        },
    );
    let step = &h.steps()[0];
    assert_eq!(step.status, StepStatus::Failed);
    let observation = step.observation.clone().expect("observation");
    assert_eq!(observation.kind, ObservationKind::ToolError);
    assert_eq!(
        h.last_event("step.tool_finished")["error"]["failure"],
        json!("tool_reported_error")
    );
    assert_eq!(h.tool_calls.len(), 1);
    assert_eq!(h.steps().len(), 2, "the agent was asked again");
}

#[test]
fn not_found_before_the_first_attempt_ended_is_asked_again_then_sent_once_saying_why() {
    let (mut h, _) = taken_over(status_url());
    // Taken over at T0 + 30 s; the first attempt may run until T0 + 40 s: a 404 now may be a
    // call still on its way, so the URL is asked again then, and nothing is written.
    let effects = answer(&mut h, StatusAnswer::NotFound);
    assert_eq!(effects, ["AskToolStatus(write_local)"]);
    assert_eq!(
        h.pending_status.as_ref().map(|q| q.delay_millis),
        Some(10_000)
    );
    assert_eq!(h.tool_calls.len(), 1);
    h.advance(10);
    let before = h.run.status.clone();
    let effects = answer(&mut h, StatusAnswer::NotFound);
    assert_eq!(effects, ["WriteStatus", "CallTool(write_local#2)"]);
    let resumed = kube_events(&before, &h.run.status);
    assert_eq!(resumed[0].reason, "Resumed");
    assert_eq!(
        resumed[0].message,
        "the run resumed after interruption: step 0 is sent again with the same \
         Idempotency-Key, as its tool allows"
    );
    let (first, again) = (&h.tool_calls[0], &h.tool_calls[1]);
    assert_eq!(again.idempotency_key, first.idempotency_key);
    assert_eq!(again.args, first.args);
    assert_eq!(
        again.delay_millis, 0,
        "the first attempt has ended: nothing to wait out"
    );
    assert_eq!(
        h.last_event("step.tool_started")["resent"],
        json!({"by": "statusURL", "status": 404})
    );
    assert_eq!(
        h.last_event("run.resumed")["reconciliation"],
        json!("resend")
    );
    h.result("b", json!({"ok": true}));
    assert_eq!(h.steps()[0].status, StepStatus::Done);
}

#[test]
fn a_second_404_after_a_re_send_is_not_trusted() {
    let (mut h, _) = taken_over(status_url());
    h.advance(10);
    answer(&mut h, StatusAnswer::NotFound);
    assert_eq!(h.tool_calls.len(), 2, "sent again once");
    // The holder dies with the re-sent call in flight; the next taker hears 404 again.
    h.pending_tool = None;
    h.expire_lease();
    h.reconcile("c");
    h.advance(10);
    let query = h.pending_status.take().expect("asked again");
    let effects = kinds(&h.step(
        "c",
        Input::ToolStatusAnswered {
            step: query.step,
            answer: StatusAnswer::NotFound,
        },
    ));
    assert_eq!(effects[..2], ["WriteStatus", "CreateApproval(tools-0-1)"]);
    assert_eq!(h.tool_calls.len(), 2, "not sent a third time");
    let said = &h.approval("tools-0-1")["spec"]["presentation"]["statusURL"]["said"];
    assert_eq!(said["status"], json!(404), "{said}");
}

#[test]
fn a_status_url_that_cannot_tell_leaves_it_to_honored_keys_when_the_tool_has_them() {
    let (mut h, _) = taken_over(json!({
        "statusURL": "https://tool.example/{key}",
        "idempotencyKeys": "Honored",
    }));
    let effects = answer(
        &mut h,
        StatusAnswer::Unsettled {
            said: json!({"status": 503}),
        },
    );
    assert_eq!(effects, ["WriteStatus", "CallTool(write_local#2)"]);
    assert!(h.approvals.is_empty());
    let resent = h.last_event("step.tool_started")["resent"].clone();
    assert_eq!(resent["by"], json!("idempotencyKeys"));
    assert_eq!(resent["statusURL"]["said"]["status"], json!(503));
    assert_eq!(
        h.tool_calls[1].delay_millis, 10_000,
        "after the first attempt"
    );
}

#[test]
fn anything_else_pauses_on_the_approval_showing_what_the_status_url_said() {
    let (mut h, _) = taken_over(status_url());
    let said = json!({"status": 500, "body": "oops"});
    let effects = answer(&mut h, StatusAnswer::Unsettled { said: said.clone() });
    assert_eq!(effects[..2], ["WriteStatus", "CreateApproval(tools-0-1)"]);
    assert_eq!(h.status().phase, RunPhase::WaitingForApproval);
    let presentation = &h.approval("tools-0-1")["spec"]["presentation"];
    assert_eq!(
        presentation["statusURL"],
        json!({"url": "https://tool.example/calls/{key}?v=1", "said": said})
    );
    assert_eq!(
        presentation["firstAttempt"]["idempotencyKey"],
        json!("uid-1/0")
    );
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn an_answer_applied_twice_changes_nothing_the_second_time() {
    let (mut h, _) = taken_over(status_url());
    h.advance(10);
    let query = h.pending_status.clone().expect("asked");
    answer(&mut h, StatusAnswer::NotFound);
    let calls = h.tool_calls.len();
    h.step(
        "b",
        Input::ToolStatusAnswered {
            step: query.step,
            answer: StatusAnswer::NotFound,
        },
    );
    assert_eq!(h.tool_calls.len(), calls, "a second 404 sends nothing more");
}

#[test]
fn honored_keys_send_the_call_again_after_the_first_attempt_may_have_ended() {
    let (mut h, effects) = taken_over(json!({"idempotencyKeys": "Honored"}));
    assert_eq!(effects, ["WriteStatus", "CallTool(write_local#2)"]);
    assert!(h.approvals.is_empty(), "nobody is asked");
    let (first, again) = (&h.tool_calls[0], &h.tool_calls[1]);
    assert_eq!(again.idempotency_key, first.idempotency_key);
    // Taken over at T0 + 30 s; the tool's timeout is 10 s: the first attempt may run until
    // T0 + 40 s, so the re-sent one waits 10 s before it is sent.
    assert_eq!(again.delay_millis, 10_000);
    assert_eq!(
        h.last_event("step.tool_started")["notBefore"],
        json!("2026-01-01T00:00:40.000Z")
    );
    assert_eq!(
        h.last_event("step.tool_started")["resent"],
        json!({"by": "idempotencyKeys", "idempotencyKeys": "Honored"})
    );
    h.result("b", json!({"ok": true}));
    assert_eq!(h.steps()[0].status, StepStatus::Done);
}

#[test]
fn not_honored_keys_ask_a_person_as_before() {
    let (h, effects) = taken_over(json!({"idempotencyKeys": IdempotencyKeys::NotHonored}));
    assert_eq!(effects[..2], ["WriteStatus", "CreateApproval(tools-0-1)"]);
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn a_status_url_comes_before_honored_keys() {
    let (_, effects) = taken_over(json!({
        "idempotencyKeys": "Honored",
        "statusURL": "https://tool.example/{key}",
    }));
    assert_eq!(effects, ["WriteStatus", "AskToolStatus(write_local)"]);
}

#[test]
fn a_run_with_a_reconcile_hook_asks_the_tool_first_and_the_hook_only_when_it_cannot_tell() {
    let mut h = Harness::scripted(vec![
        call("write_local", json!({"n": 1})),
        complete(json!("ok")),
    ]);
    {
        let spec = h.spec_mut();
        spec.reconcile = Some(
            serde_json::from_value(json!({"webhook": {"url": "http://127.0.0.1:8090/hook"}}))
                .expect("hook"),
        );
        let tool = spec
            .tools
            .iter_mut()
            .find(|t| t.name == "write_local")
            .expect("tool");
        tool.http.as_mut().expect("http").reconcile =
            Some(serde_json::from_value(status_url()).expect("reconcile"));
    }
    h.reconcile("a");
    h.expire_lease();
    let effects = kinds(&h.reconcile("b"));
    assert_eq!(effects, ["WriteStatus", "AskToolStatus(write_local)"]);
    assert!(
        h.pending_hook.is_none(),
        "the tool is asked before the hook"
    );
    let said = json!({"status": 503});
    let effects = answer(&mut h, StatusAnswer::Unsettled { said: said.clone() });
    assert_eq!(effects, ["CallReconcileHook"]);
    let view = h.pending_hook.clone().expect("the hook is asked");
    assert_eq!(
        view["statusURL"]["said"], said,
        "the hook sees what the tool said"
    );
    assert!(h.approvals.is_empty());
}
