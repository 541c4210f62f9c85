//! Job tools in the crash-point property test (docs/design.md section 5, "A Job tool's Job", and
//! section 6, "Job tools"; docs/behaviours.md 116-121).
//!
//! The test plays the executor of a `job` call as `controller::calls::job` performs it: a call
//! to create (or to resume without a recorded creation) creates the Job unless one of its name
//! exists, then reports `Input::JobCreated`; a call to resume a recorded creation reads the Job
//! and reports its outcome, or `JOB_GONE` when it is absent. The executor may die before the
//! creation, between the creation and its write, and while the Job runs; someone may remove a
//! Job by hand. The world of Jobs is `Harness::jobs` (each created once, with the result it will
//! report) and `Harness::jobs_gone`.
//!
//! What must hold ([`check`]): a Job is created only for a recorded start (every creation is
//! one performed call, so the common check counts it: at most once per attempt, a second
//! attempt only on a grant); a Job step's recorded result is the one its Job reported; and an
//! interrupted Job step asks a person only when its Job was removed.

use serde_json::json;

use super::super::harness::{Effect, Harness};
use super::MAX_CRASHES;
use crate::api::{RunEvent, StepIndex};
use crate::engine::{job_name, Input, JobStage, ToolOutcome, JOB_GONE};

/// The `job` executor of a tool in the property test: any image, the defaults otherwise.
pub(super) fn job_tool() -> Box<crate::api::JobTool> {
    Box::new(crate::api::JobTool {
        template: json!({"spec": {"containers": [{"name": "work", "image": "registry.local/work:1"}]}}),
        ..Default::default()
    })
}

/// Whether the awaited tool call is a Job tool's.
pub(super) fn pending(h: &Harness) -> bool {
    h.pending_tool
        .as_ref()
        .is_some_and(|call| call.job.is_some())
}

/// The executor dies: nothing it had not performed happens; its lease runs out.
fn die(h: &mut Harness, crashes: &mut usize) {
    *crashes += 1;
    h.crash_after = None;
    h.pending_tool = None;
    h.expire_lease();
}

/// Plays the awaited Job call for `holder`; `choice` picks where the executor dies, if it does
/// (at most [`MAX_CRASHES`] in all). `None` when it died; else the effects of what it reported.
pub(super) fn execute(
    h: &mut Harness,
    holder: &str,
    choice: u8,
    crashes: &mut usize,
) -> Option<Vec<Effect>> {
    let call = h.pending_tool.clone()?;
    let stage = call.job?;
    let name = job_name(&h.run.uid, call.step, call.attempt);
    let may_die = *crashes < MAX_CRASHES;
    match stage {
        JobStage::Create | JobStage::Resume { recorded: false } => {
            if may_die && choice % 7 == 1 {
                // Before the Job is created.
                die(h, crashes);
                return None;
            }
            if !h.jobs.contains_key(&name) {
                // The effect: a Job (and so a Pod) exists from now on.
                h.tool_calls.push(call.clone());
                h.tool_call_times.push(h.now);
                h.jobs
                    .insert(name.clone(), json!({"job": name, "v": choice % 3}));
            }
            if may_die && choice % 7 == 2 {
                // After the Job is created, before the write that records it.
                die(h, crashes);
                return None;
            }
            h.pending_tool = None;
            Some(h.step(
                holder,
                Input::JobCreated {
                    step: call.step,
                    attempt: call.attempt,
                    name: name.clone(),
                    job: Ok(format!("job-uid-{name}")),
                },
            ))
        }
        JobStage::Resume { recorded: true } => {
            if may_die && choice % 7 == 3 {
                // While the Job runs (or after it finished, before the write).
                die(h, crashes);
                return None;
            }
            let outcome = if h.jobs_gone.contains(&name) || !h.jobs.contains_key(&name) {
                ToolOutcome::Unknown {
                    detail: format!("{JOB_GONE}: the Job {name} is gone"),
                    duration_ms: 1,
                }
            } else {
                ToolOutcome::Result {
                    status: 200,
                    content: h.jobs[&name].clone(),
                    duration_ms: 5,
                }
            };
            Some(h.finish_tool(holder, outcome))
        }
    }
}

/// Someone removes a Job by hand (past its finalizer) while no replica holds the run: the
/// `pick`th of those not removed yet, if any.
pub(super) fn remove_one(h: &mut Harness, pick: u8) {
    let present: Vec<String> = h
        .jobs
        .keys()
        .filter(|name| !h.jobs_gone.contains(*name))
        .cloned()
        .collect();
    if present.is_empty() {
        return;
    }
    let name = present[usize::from(pick) % present.len()].clone();
    h.jobs_gone.insert(name);
}

/// The Job of a `step.tool_finished` event, when its step's tool was a Job tool that created
/// one (its attempt in the event's data).
fn job_of(h: &Harness, event: &RunEvent) -> Option<String> {
    let step: StepIndex = event.step?;
    let attempt = event.data.as_ref()?.get("attempt")?.as_i64()?;
    let name = job_name(&h.run.uid, step, attempt);
    h.jobs.contains_key(&name).then_some(name)
}

/// The Job-tool properties of a played case (see the module's doc).
pub(super) fn check(h: &Harness, events: &[RunEvent]) {
    for event in events {
        if serde_json::to_value(event.type_).ok() != Some(json!("step.tool_finished")) {
            continue;
        }
        let Some(name) = job_of(h, event) else {
            continue;
        };
        let observation = &event.data.as_ref().expect("data")["observation"];
        if observation["kind"] == json!("tool_result") {
            assert_eq!(
                observation["content"], h.jobs[&name],
                "the recorded result of {name} is the one its Job reported"
            );
        }
    }
    for approval in h.approvals.values() {
        let Some(job) = approval["spec"]["presentation"]["job"]["name"].as_str() else {
            continue;
        };
        assert!(
            h.jobs_gone.contains(job),
            "a person was asked about the Job {job}, which could still tell: {:?}",
            approval["spec"]["presentation"]
        );
    }
}
