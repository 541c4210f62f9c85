//! Takeover and interrupted steps (docs/design.md sections 3-5; docs/behaviours.md 31-32, 34-40).
//!
//! A takeover (after the Lease was won) records the new holder under a new epoch, writes
//! `lease.taken_over` {previousHolder, previousExpiry, previousStoppedBy, holder, epoch} and
//! marks every `deciding` or `executing` step `interrupted` (observation {previousStatus}, `step.interrupted`) in one
//! write. Then the interrupted step (the last one, still `interrupted`: a takeover that died
//! before resolving it leaves it recognisable) is resolved ([`resume_interrupted`]):
//! - with `spec.reconcile.webhook`: the hook is asked ([`ExternalCall::ReconcileHook`]) and its
//!   Reconciliation applied ([`reconciled`]);
//! - without: a non-`ReadOnly` tool that was executing pauses on an `interrupted_side_effect`
//!   Approval (args that fail the schema or were never JSON: `reconcile_conflict`); a
//!   `ReadOnly` tool, a deciding agent or nothing in flight → `run.resumed` {after:
//!   interruption} and the loop goes on, the agent seeing the interrupted observation.
//!
//! A tool whose outcome is unknown ([`super::ToolOutcome::Unknown`]) is handled the same way.
//! Before anyone is asked, a tool that can tell is asked: a `job` tool's Job
//! ([`super::by_job`]), an `http` tool with `reconcile` ([`super::by_key`]).

use serde_json::{json, Value};

use super::approvals::{self, Origin, Requirement};
use super::loop_::{check_call, drive, start_step, CallProblem, Flow};
use super::record::{interrupted_observation, previous_status, to_value, Txn};
use super::validate::{check_storable, json_kind};
use super::{ExternalCall, PreviousHolder};
use crate::api::{EventType, SideEffect, StepStatus, TerminalReason, INTERRUPTED_SIDE_EFFECT};

/// The notice an `interrupted_side_effect` Approval shows (docs/design.md section 5).
pub const INTERRUPTED_NOTICE: &str = "The tool call started, but the process running it stopped \
before its outcome was recorded, so whether it took effect is unknown, and it may still be \
running until firstAttempt.mayRunUntil. Approving runs it again with these arguments and the \
same idempotency key (firstAttempt.idempotencyKey), no earlier than firstAttempt.mayRunUntil; \
TookEffect records the result you give as its outcome and goes on without running it; \
DidNotTakeEffect records it as not executed and the agent decides again; rejecting ends the run.";

/// What the record says of a step's last attempt that was interrupted (docs/design.md section
/// 5): when it started, by its holder's wall clock, and until when it may still be running.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FirstAttempt {
    /// The attempt number (`step.tool_started`'s `attempt`).
    pub attempt: i64,
    /// When it started (the `step.tool_started` event's time, the starting holder's clock).
    pub started_at: crate::api::Time,
    /// No re-run of the step starts before this: the latest of `started_at`, the attempt's
    /// `notBefore` (a call sent again by its key after a wait) and the interrupting takeover's
    /// `previousStoppedBy`, plus the tool's `timeoutSeconds`.
    pub may_run_until: crate::api::Time,
}

/// docs/design.md section 5: until when the last attempt of step `index` may still be running,
/// when that attempt was interrupted. An attempt starts only under a live lease and runs at most
/// the tool's `timeoutSeconds`, so it ends by its start plus that timeout. The start is the
/// first holder's wall clock, which may be behind; the takeover that interrupted it records
/// `previousStoppedBy`, by when on the taker's own clock that holder had stopped starting side
/// effects (docs/leases.md), so the later of the two plus the timeout holds when either clock is
/// right. An interruption with no takeover (an unknown outcome the holder recorded itself)
/// has only the start, on the same clock as the holder's own timeout. `None` when no attempt
/// of the step is in the window.
pub(crate) fn first_attempt(txn: &Txn, index: usize) -> Option<FirstAttempt> {
    let step = txn.index_at(index);
    let events = &txn.status.events;
    let started = events
        .iter()
        .rposition(|e| e.type_ == EventType::StepToolStarted && e.step == Some(step))?;
    let start = &events[started];
    let attempt = start
        .data
        .as_ref()
        .and_then(|d| d.get("attempt"))
        .and_then(Value::as_i64)
        .unwrap_or(txn.status.steps[index].attempts);
    let tool = start
        .data
        .as_ref()
        .and_then(|d| d.get("tool"))
        .and_then(Value::as_str)
        .or_else(|| txn.status.steps[index].decision.as_ref()?.tool.as_deref());
    let timeout = tool
        .and_then(|name| txn.run.spec.tools.iter().find(|t| t.name == name))
        .map_or(0, |t| t.timeout_seconds);
    // The takeover that interrupted it: the first `lease.taken_over` after the start. A record
    // written before `previousStoppedBy` existed has the takeover's own time, which is later.
    let stopped_by = events[started..]
        .iter()
        .find(|e| e.type_ == EventType::LeaseTakenOver)
        .map(|e| {
            e.data
                .as_ref()
                .and_then(|d| d.get("previousStoppedBy"))
                .and_then(|v| serde_json::from_value::<crate::api::Time>(v.clone()).ok())
                .unwrap_or(e.time)
        });
    // A call sent again by its key waits before it is sent (`notBefore`): it runs from then.
    let not_before = start
        .data
        .as_ref()
        .and_then(|d| d.get("notBefore"))
        .and_then(|v| serde_json::from_value::<crate::api::Time>(v.clone()).ok())
        .unwrap_or(start.time)
        .max(start.time);
    let from = stopped_by.map_or(not_before, |t| t.max(not_before));
    Some(FirstAttempt {
        attempt,
        started_at: start.time,
        may_run_until: from.plus_seconds(timeout),
    })
}

/// Step `index`'s index and attempt when it was interrupted while executing (a call the tool
/// itself may settle: a Job, an MCP task), unless its last interruption's detail starts with
/// `given_up` (the tool's own word already failed: someone is asked).
pub(crate) fn interrupted_attempt(
    txn: &Txn,
    index: usize,
    given_up: &str,
) -> Option<(crate::api::StepIndex, i64)> {
    let step = &txn.status.steps[index];
    if step.status != StepStatus::Interrupted
        || previous_status(step) != Some(StepStatus::Executing)
        || step.attempts < 1
    {
        return None;
    }
    let failed = last_interruption_detail(txn, index)
        .is_some_and(|detail| detail.as_str().is_some_and(|d| d.starts_with(given_up)));
    (!failed).then_some((txn.index_at(index), step.attempts))
}

/// The `detail` of step `index`'s last `step.interrupted` (why a tool could not say what became
/// of its call), if it has one.
pub(crate) fn last_interruption_detail(txn: &Txn, index: usize) -> Option<Value> {
    let step = txn.index_at(index);
    txn.status
        .events
        .iter()
        .rev()
        .find(|e| e.type_ == EventType::StepInterrupted && e.step == Some(step))
        .and_then(|e| e.data.as_ref()?.get("detail").cloned())
}

/// The idempotency key every attempt of step `index` sends (docs/design.md section 6).
pub(crate) fn idempotency_key(txn: &Txn, index: usize) -> String {
    format!("{}/{}", txn.run.uid, txn.index_at(index))
}

/// [`super::Input::LeaseAcquired`] for a `Running` run.
pub(crate) fn take_over(txn: &mut Txn, takeover: Option<PreviousHolder>) {
    if takeover.is_none() && txn.holder() == Some(txn.caller.holder.as_str()) {
        // The start (or a grant) this replica just wrote, applied again: go on from the record.
        drive(txn);
        return;
    }
    let previous = takeover.unwrap_or_else(|| PreviousHolder {
        holder: txn.holder().map(str::to_string),
        expired_at: None,
        stopped_by: None,
    });
    if already_taken_over(txn, &previous) {
        drive(txn);
        return;
    }
    // A released Lease names no holder; the record still says who held the run last.
    let previous_holder = previous
        .holder
        .clone()
        .or_else(|| txn.holder().map(str::to_string));
    txn.take_lease();
    let epoch = txn.status.lease.as_ref().map_or(0, |l| l.epoch);
    txn.event(
        EventType::LeaseTakenOver,
        None,
        json!({
            "previousHolder": previous_holder,
            "previousExpiry": previous.expired_at,
            "previousStoppedBy": previous.stopped_by,
            "holder": txn.caller.holder,
            "epoch": epoch,
        }),
    );
    for index in 0..txn.status.steps.len() {
        let status = txn.status.steps[index].status;
        if matches!(status, StepStatus::Deciding | StepStatus::Executing) {
            interrupt(txn, index, None);
        }
    }
    let in_flight = txn
        .status
        .steps
        .last()
        .is_some_and(|s| s.status == StepStatus::Interrupted);
    if !in_flight {
        // Nothing in flight: the loop simply goes on.
        txn.event(
            EventType::RunResumed,
            None,
            json!({"after": "interruption"}),
        );
    }
    drive(txn);
}

/// Whether this very takeover is already in the record (the input applied again after a
/// write whose answer was lost).
fn already_taken_over(txn: &Txn, previous: &PreviousHolder) -> bool {
    if txn.holder() != Some(txn.caller.holder.as_str()) {
        return false;
    }
    let last = txn
        .status
        .events
        .iter()
        .rev()
        .find(|e| e.type_ == EventType::LeaseTakenOver)
        .and_then(|e| e.data.clone());
    let field = |d: &Value, name: &str| d.get(name).cloned().unwrap_or(Value::Null);
    last.is_some_and(|d| {
        field(&d, "previousHolder") == json!(previous.holder)
            && field(&d, "previousExpiry") == json!(previous.expired_at)
            && field(&d, "holder") == json!(txn.caller.holder)
    })
}

/// Marks step `index` interrupted (guarantee 3).
pub(crate) fn interrupt(txn: &mut Txn, index: usize, detail: Option<&str>) {
    let previous = txn.status.steps[index].status;
    if previous == StepStatus::Deciding {
        super::model_calls::close_open_attempt(
            txn,
            index,
            "interrupted before its answer was recorded",
        );
    }
    let mut data = json!({"previousStatus": previous});
    if let Some(detail) = detail {
        data["detail"] = json!(detail);
    }
    txn.step_mut(index).status = StepStatus::Interrupted;
    txn.step_mut(index).observation = Some(interrupted_observation(previous, detail));
    txn.event(EventType::StepInterrupted, Some(txn.index_at(index)), data);
}

/// Resolves the last step, which is `interrupted` (see the module doc).
pub(crate) fn resume_interrupted(txn: &mut Txn) -> Flow {
    let Some(index) = txn.last_position() else {
        return Flow::Continue;
    };
    // A Job tool's Job says it (docs/design.md section 6, "Job tools").
    if let Some(flow) = super::by_job::resume(txn, index) {
        return flow;
    }
    // An MCP task recorded for the attempt says it (docs/design.md section 6, "MCP tasks").
    if let Some(flow) = super::by_task::resume(txn, index) {
        return flow;
    }
    // The tool's own word first: an http tool with `reconcile` (docs/design.md section 5).
    if let Some(flow) = super::by_key::resume(txn, index) {
        return flow;
    }
    let step = &txn.status.steps[index];
    let unknown_side_effect = previous_status(step) == Some(StepStatus::Executing)
        && step
            .decision
            .as_ref()
            .and_then(|d| d.tool.as_deref())
            .and_then(|name| txn.run.spec.tools.iter().find(|t| t.name == name))
            .is_none_or(|t| t.side_effect != SideEffect::ReadOnly);
    if unknown_side_effect || has_hook(txn) {
        return ask_someone(txn, index, None);
    }
    txn.event(
        EventType::RunResumed,
        None,
        json!({"after": "interruption"}),
    );
    start_step(txn)
}

fn has_hook(txn: &Txn) -> bool {
    txn.run
        .spec
        .reconcile
        .as_ref()
        .is_some_and(|r| r.webhook.is_some())
}

/// The interrupted step `index` needs someone who knows: the reconcile hook when the run has
/// one, else an `interrupted_side_effect` Approval, whose presentation carries `status_url`
/// (what a tool's status URL said, `{url, said}`) when there is one.
pub(crate) fn ask_someone(txn: &mut Txn, index: usize, status_url: Option<Value>) -> Flow {
    if has_hook(txn) {
        let mut view = run_view(txn, index);
        if let Some(said) = status_url {
            view["statusURL"] = said;
        }
        txn.call(ExternalCall::ReconcileHook { view });
        return Flow::Halt;
    }
    pause_unknown_outcome(txn, index, status_url)
}

/// docs/behaviours.md 34, 36: an interrupted non-ReadOnly call pauses on an
/// `interrupted_side_effect` Approval, unless its call no longer checks.
fn pause_unknown_outcome(txn: &mut Txn, index: usize, status_url: Option<Value>) -> Flow {
    let Some(decision) = txn.status.steps[index].decision.clone() else {
        let detail = format!(
            "step {} was executing with no recorded decision",
            txn.index_at(index)
        );
        txn.end_run(TerminalReason::ReconcileConflict, Some(detail), None);
        return Flow::Continue;
    };
    let (tool, args) = match check_call(txn, &decision) {
        Ok(call) => call,
        Err(CallProblem::Invalid(invalid)) => {
            let detail = format!(
                "step {} was interrupted executing a call that no longer checks: {}",
                txn.index_at(index),
                invalid.error
            );
            txn.end_run(TerminalReason::ReconcileConflict, Some(detail), None);
            return Flow::Continue;
        }
        Err(CallProblem::Internal(detail)) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            return Flow::Continue;
        }
    };
    let spec_tool = &txn.run.spec.tools[tool];
    let mut presentation = json!({
        "tool": spec_tool.name,
        "args": args,
        "sideEffect": spec_tool.side_effect,
        "notice": INTERRUPTED_NOTICE,
    });
    let key = idempotency_key(txn, index);
    if let Some(first) = first_attempt(txn, index) {
        presentation["firstAttempt"] = json!({
            "attempt": first.attempt,
            "startedAt": first.started_at,
            "mayRunUntil": first.may_run_until,
            "idempotencyKey": key,
        });
    } else {
        presentation["firstAttempt"] = json!({"idempotencyKey": key});
    }
    if let Some(mcp) = super::calls::mcp_presentation(txn, spec_tool) {
        presentation["mcp"] = mcp;
    }
    if let Some(said) = status_url {
        presentation["statusURL"] = said;
    }
    // Why the tool's own word could not settle it (docs/design.md section 6, "MCP tasks" and
    // "Job tools").
    if let Some(task) = super::by_task::last_task(txn, index) {
        let detail = last_interruption_detail(txn, index);
        presentation["task"] = json!({"taskId": task.id, "detail": detail});
    }
    if let Some(job) = super::by_job::last_job(txn, index) {
        let detail = last_interruption_detail(txn, index);
        presentation["job"] = json!({"name": job, "detail": detail});
    }
    let requirement = Requirement {
        kind: INTERRUPTED_SIDE_EFFECT.to_string(),
        reason: Some(format!(
            "the outcome of {} (step {}) is unknown after an interruption",
            spec_tool.name,
            txn.index_at(index)
        )),
        capability: None,
        presentation: Some(presentation),
        origin: Origin::Interruption,
    };
    approvals::pause(txn, index, tool, args, requirement)
}

/// The run's approvals as the reconcile hook and the webhook agent see them: per approval of
/// each step, its name, step, kind, hash, verdict, whether it was executed, and the Approval
/// object's phase.
pub(crate) fn approvals_view(txn: &Txn) -> Vec<Value> {
    txn.status
        .steps
        .iter()
        .flat_map(|s| s.approvals.iter().map(move |a| (s.index, a)))
        .map(|(step, a)| {
            let object = txn.approvals.iter().find(|o| o.name == a.name);
            json!({
                "name": a.name,
                "step": step,
                "kind": a.kind,
                "hash": a.hash,
                "verdict": a.verdict,
                "executed": a.executed,
                "phase": object.and_then(|o| o.object.pointer("/status/phase")).cloned(),
            })
        })
        .collect()
}

/// What the reconcile hook receives: the run, a summary of its spec, the window's steps,
/// `archive` (`status.archive` as stored, `null` when nothing is sealed: bounded, the newest 8
/// index entries, `count` and `head`; a hook that needs older steps reads the segments, walking
/// back through each one's `previous`: docs/design.md section 4a) and the approvals.
fn run_view(txn: &Txn, index: usize) -> Value {
    let run = txn.run;
    let approvals = approvals_view(txn);
    json!({
        "run": {"namespace": run.namespace, "name": run.name, "uid": run.uid},
        "spec": {
            "goal": run.spec.goal,
            "tools": run.spec.tools.iter().map(|t| json!({
                "name": t.name,
                "sideEffect": t.side_effect,
                "terminal": t.terminal,
            })).collect::<Vec<_>>(),
        },
        "phase": txn.status.phase,
        "interruptedStep": txn.index_at(index),
        "steps": to_value(&txn.status.steps),
        "archive": to_value(&txn.status.archive),
        "approvals": approvals,
    })
}

/// [`super::Input::Reconciled`] (docs/behaviours.md 39-40).
pub(crate) fn reconciled(txn: &mut Txn, answer: Result<Value, String>) {
    let pending = txn
        .last_position()
        .filter(|i| txn.status.steps[*i].status == StepStatus::Interrupted);
    let Some(index) = pending else {
        // Already applied: go on from the record.
        drive(txn);
        return;
    };
    let flow = apply_reconciliation(txn, index, answer);
    if flow == Flow::Continue {
        drive(txn);
    }
}

fn apply_reconciliation(txn: &mut Txn, index: usize, answer: Result<Value, String>) -> Flow {
    let internal = |txn: &mut Txn, detail: String| {
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        Flow::Continue
    };
    let answer = match answer {
        Ok(answer) => answer,
        Err(err) => return internal(txn, format!("the reconcile hook failed: {err}")),
    };
    let outcome = answer.get("outcome").and_then(Value::as_str).unwrap_or("");
    let detail = answer
        .get("detail")
        .and_then(Value::as_str)
        .map(str::to_string);
    match outcome {
        "continue" => {
            txn.event(
                EventType::RunResumed,
                None,
                json!({"after": "interruption", "reconciliation": "continue"}),
            );
            start_step(txn)
        }
        "completed" => match answer.get("result") {
            Some(result) if check_storable(result).is_ok() => {
                txn.end_run(TerminalReason::GoalCompleted, detail, Some(result.clone()));
                Flow::Continue
            }
            _ => internal(
                txn,
                "the reconcile hook answered completed without a JSON result".into(),
            ),
        },
        "conflict" => {
            txn.end_run(TerminalReason::ReconcileConflict, detail, None);
            Flow::Continue
        }
        "waiting" => waiting(txn, index, answer.get("pause")),
        other => internal(
            txn,
            format!(
                "the reconcile hook answered outcome {other:?} (expected continue, completed, \
                 waiting or conflict)"
            ),
        ),
    }
}

/// `waiting`: the interrupted call pauses on the hook's require_approval decision.
fn waiting(txn: &mut Txn, index: usize, pause: Option<&Value>) -> Flow {
    let conflict = |txn: &mut Txn, detail: String| {
        txn.end_run(TerminalReason::ReconcileConflict, Some(detail), None);
        Flow::Continue
    };
    let Some(pause) = pause.filter(|p| !p.is_null()) else {
        return conflict(
            txn,
            "the reconcile hook answered waiting without a pause".into(),
        );
    };
    let decision = pause
        .get("decision")
        .or_else(|| pause.get("outcome"))
        .and_then(Value::as_str);
    if !matches!(decision, Some("require_approval" | "RequireApproval")) {
        let detail = format!(
            "the reconcile hook's pause must be a require_approval decision (got {decision:?})"
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return Flow::Continue;
    }
    let step = &txn.status.steps[index];
    let record = step.decision.clone();
    let (Some(record), Some(StepStatus::Executing)) = (record, previous_status(step)) else {
        return conflict(
            txn,
            format!(
                "waiting: step {} was not executing a tool call",
                txn.index_at(index)
            ),
        );
    };
    let (tool, args) = match check_call(txn, &record) {
        Ok(call) => call,
        Err(CallProblem::Internal(detail)) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            return Flow::Continue;
        }
        Err(CallProblem::Invalid(invalid)) => {
            let detail = format!(
                "waiting: step {}'s call no longer checks: {}",
                txn.index_at(index),
                invalid.error
            );
            let registered = txn
                .run
                .spec
                .tools
                .iter()
                .any(|t| record.tool.as_deref() == Some(t.name.as_str()));
            if registered && record.invalid_args.is_none() {
                // Args that now fail the schema end the step invalid_decision first.
                txn.fail_step(index, invalid.observation());
            }
            return conflict(txn, detail);
        }
    };
    let field = |name: &str| pause.get(name).filter(|v| !v.is_null()).cloned();
    for name in ["capability", "presentation"] {
        if let Some(value) = field(name) {
            // The Approval's schema types both as objects (docs/design.md section 2), so anything
            // else could never be created.
            let checked = if value.is_object() {
                check_storable(&value)
            } else {
                Err(format!(
                    "it must be a JSON object, got {}",
                    json_kind(&value)
                ))
            };
            if let Err(err) = checked {
                let detail = format!("the reconcile hook's pause.{name} is not storable: {err}");
                txn.end_run(TerminalReason::InternalError, Some(detail), None);
                return Flow::Continue;
            }
        }
    }
    let requirement = Requirement {
        kind: field("kind")
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| "reconcile".into()),
        reason: field("reason").and_then(|v| v.as_str().map(str::to_string)),
        capability: field("capability"),
        presentation: field("presentation"),
        origin: Origin::Reconcile,
    };
    approvals::pause(txn, index, tool, args, requirement)
}
