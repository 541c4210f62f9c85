//! docs/design.md section 6, "MCP tasks": a task the server created for a call is recorded the
//! moment it is known and followed; after a takeover a recorded task settles the interrupted
//! call without a person, and one that is not recorded (or was found lost) is put to a person.

use serde_json::json;

use super::harness::*;
use super::mcp::{listing, mcp_run};
use crate::api::{RunPhase, SideEffect, StepIndex, StepStatus};
use crate::engine::{Input, McpTask, TaskInput, TaskReply, ToolOutcome, TASK_LOST};

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
        reply: None,
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

/// The followed task asks which interpretation is meant.
fn asks(h: &mut Harness) -> Vec<Effect> {
    let call = h.tool_calls.last().expect("a call").clone();
    h.pending_tool = None;
    h.step(
        "a",
        Input::TaskInputRequired {
            step: call.step,
            attempt: call.attempt,
            input: TaskInput {
                task_id: "task-7".into(),
                request_id: json!(0),
                message: "Which interpretation?".into(),
                requested_schema: json!({
                    "type": "object",
                    "required": ["interpretation"],
                    "properties": {"interpretation": {"type": "string", "enum": ["snake", "language"]}}
                }),
            },
        },
    )
}

fn decide_with_answer(h: &mut Harness, name: &str, answer: serde_json::Value) {
    h.approve(name);
    let object = h.approvals.get_mut(name).expect("the Approval");
    object["spec"]["decision"]["answer"] = answer;
}

#[test]
fn a_task_asking_for_input_pauses_on_an_input_required_approval_whose_answer_is_sent() {
    let mut h = executing();
    created(&mut h);
    let effects = asks(&mut h);
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(mcp-0-1)",
            "WriteApprovalStatus(mcp-0-1:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    assert_eq!(status.steps[0].status, StepStatus::AwaitingApproval);
    let spec = h.approval("mcp-0-1")["spec"].clone();
    assert_eq!(spec["kind"], json!("input_required"));
    assert_eq!(
        spec["presentation"]["message"],
        json!("Which interpretation?")
    );
    assert_eq!(
        spec["presentation"]["task"],
        json!({"taskId": "task-7", "requestId": 0})
    );
    assert_eq!(
        spec["presentation"]["requestedSchema"]["required"],
        json!(["interpretation"])
    );
    assert_eq!(
        h.last_event("approval.requested")["origin"],
        json!("task_input")
    );

    decide_with_answer(&mut h, "mcp-0-1", json!({"interpretation": "snake"}));
    let calls = h.tool_calls.len();
    let effects = h.reconcile("a");
    assert!(
        super::harness::kinds(&effects).contains(&"CallTool(search#1)".to_string()),
        "{:?}",
        super::harness::kinds(&effects)
    );
    assert_eq!(
        h.tool_calls.len(),
        calls + 1,
        "the task is followed, not called again"
    );
    let follow = h.tool_calls.last().expect("the follow").clone();
    let task = follow.task.expect("a task");
    assert_eq!(task.id, "task-7");
    assert_eq!(
        task.reply,
        Some(TaskReply {
            request_id: json!(0),
            result: json!({"action": "accept", "content": {"interpretation": "snake"}}),
        })
    );
    assert_eq!(follow.attempt, 1);
    assert_eq!(
        h.last_event("step.input_answered")["action"],
        json!("accept")
    );
    assert_eq!(h.status().steps[0].status, StepStatus::Executing);
    assert_eq!(h.status().steps[0].attempts, 1);
    h.result("a", json!({"report": "snakes"}));
    assert_eq!(h.steps()[0].status, StepStatus::Done);
}

#[test]
fn an_answer_that_does_not_match_the_requested_schema_is_sent_as_a_decline_saying_why() {
    let mut h = executing();
    created(&mut h);
    asks(&mut h);
    decide_with_answer(&mut h, "mcp-0-1", json!({"interpretation": "dragon"}));
    h.reconcile("a");
    let follow = h.tool_calls.last().expect("the follow").clone();
    let reply = follow.task.and_then(|t| t.reply).expect("a reply");
    assert_eq!(reply.result, json!({"action": "decline"}));
    let answered = h.last_event("step.input_answered");
    assert_eq!(answered["action"], json!("decline"));
    assert!(
        answered["violations"][0]
            .as_str()
            .is_some_and(|v| v.contains("interpretation")),
        "{answered}"
    );
}

#[test]
fn rejecting_an_input_required_approval_ends_the_run() {
    let mut h = executing();
    created(&mut h);
    asks(&mut h);
    h.reject("mcp-0-1", "not this one");
    h.reconcile("a");
    assert_eq!(h.status().phase, RunPhase::Cancelled);
}
