//! docs/design.md section 6, "MCP tasks": a task the server created for a call is recorded the
//! moment it is known and followed; after a takeover a recorded task settles the interrupted
//! call without a person, and one that is not recorded (or was found lost) is put to a person.

use serde_json::json;

use super::harness::*;
use super::mcp::{listing, mcp_run};
use crate::api::{RunPhase, SideEffect, StepIndex, StepStatus};
use crate::engine::{Input, McpTask, ToolOutcome, TASK_LOST};

/// A run whose holder `a` is executing the `search` tool (made `LocalMutation`, so that an
/// interruption would ask a person) on step 0.
fn executing() -> Harness {
    let mut h = mcp_run(vec![
        call("search", json!({"q": "crash"})),
        complete(json!("done")),
    ]);
    h.spec_mut().tools[0].side_effect = SideEffect::LocalMutation;
    h.reconcile("a");
    h.list_tools("a", |_| Ok(listing()));
    assert_eq!(h.steps()[0].status, StepStatus::Executing);
    h
}

fn task() -> McpTask {
    McpTask {
        id: "task-7".into(),
        poll_interval_millis: 500,
        session: Some("session-1".into()),
        protocol_version: "2025-11-25".into(),
    }
}

/// The pending call answers that the server created [`task`].
fn created(h: &mut Harness) -> Vec<Effect> {
    let call = h.tool_calls.last().expect("a call").clone();
    h.pending_tool = None;
    h.step(
        "a",
        Input::TaskCreated {
            step: call.step,
            attempt: call.attempt,
            task: task(),
        },
    )
}

#[test]
fn a_created_task_is_recorded_in_one_write_and_followed() {
    let mut h = executing();
    let effects = created(&mut h);
    assert_effects!(effects, ["WriteStatus", "CallTool(search#1)"]);
    let data = h.last_event("step.task_created");
    assert_eq!(
        data,
        json!({"taskId": "task-7", "pollIntervalMillis": 500, "session": "session-1",
               "protocolVersion": "2025-11-25", "attempt": 1})
    );
    let follow = h.tool_calls.last().expect("the follow").clone();
    assert_eq!(follow.task, Some(task()));
    assert_eq!(follow.attempt, 1, "the same attempt");
    assert!(follow.pin.is_some(), "the pin checks the task's result");
    // Applied twice (a 409 re-read): recorded once.
    created(&mut h);
    let recorded = h
        .events()
        .iter()
        .filter(|e| e.type_ == crate::api::EventType::StepTaskCreated)
        .count();
    assert_eq!(recorded, 1);
    h.result("a", json!({"issue": 12}));
    assert_eq!(h.steps()[0].status, StepStatus::Done);
}

#[test]
fn after_a_takeover_a_recorded_task_settles_the_call_without_a_person() {
    let mut h = executing();
    created(&mut h);
    let calls = h.tool_calls.len();
    h.expire_lease();
    let effects = h.reconcile("b");
    assert_effects!(effects, ["WriteStatus", "CallTool(search#1)"]);
    assert!(h.approvals.is_empty(), "nobody is asked");
    let follow = h.tool_calls.last().expect("the follow").clone();
    assert_eq!(
        follow.task,
        Some(task()),
        "the task is followed, not sent again"
    );
    assert_eq!(h.tool_calls.len(), calls + 1);
    assert_eq!(
        h.last_event("run.resumed"),
        json!({"after": "interruption", "reconciliation": "task", "step": 0, "taskId": "task-7"})
    );
    assert_words!(
        h.journal_tail(3),
        ["lease.taken_over", "step.interrupted@0", "run.resumed"]
    );
    h.result("b", json!({"issue": 12}));
    let status = h.status();
    assert_eq!(status.steps[0].status, StepStatus::Done);
    assert_eq!(
        status.steps[0].attempts, 1,
        "one attempt: nothing ran twice"
    );
}

#[test]
fn without_a_recorded_task_or_with_a_lost_one_a_person_is_asked() {
    // The process stopped between sending the call and recording the task.
    let mut h = executing();
    h.expire_lease();
    h.reconcile("b");
    assert_eq!(h.status().phase, RunPhase::WaitingForApproval);
    assert_eq!(h.approvals.len(), 1);

    // The task was recorded, but its server forgot it.
    let mut h = executing();
    created(&mut h);
    h.finish_tool(
        "a",
        ToolOutcome::Unknown {
            detail: format!("{TASK_LOST}: the server no longer knows the session"),
            duration_ms: 10,
        },
    );
    let status = h.status();
    assert_eq!(
        status.phase,
        RunPhase::WaitingForApproval,
        "{:?}",
        h.journal()
    );
    let approval = h.approvals.values().next().expect("an Approval").clone();
    let presentation = &approval["spec"]["presentation"];
    assert_eq!(presentation["task"]["taskId"], json!("task-7"));
    assert!(presentation["task"]["detail"]
        .as_str()
        .is_some_and(|d| d.starts_with(TASK_LOST)));
    assert_eq!(status.steps[0].index, StepIndex(0));
}
