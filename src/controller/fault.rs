//! Named crash points for the crash tests (docs/design.md section 9): with the cargo feature
//! `fault-injection`, `AGENTRT_FAULT=<point>[:<step>]` makes the process kill itself with
//! SIGKILL at the named point (for that step only, when a step is given). Without the feature
//! every check compiles to nothing.
//!
//! The points sit in the executor right after the status write that recorded the thing
//! succeeded (derived from the events that write added), `during-tool` while a tool call is in
//! flight, `during-model` while a model attempt is in flight (after `model.dispatched` landed),
//! `after-hook-answered` between the reconcile hook's answer and the write that applies it,
//! `after-status-answered` between a tool's status URL's answer and the write that applies it,
//! `after-task-created` between an MCP server's creating a task and the write recording it,
//! and
//! `after-segment-created` between a sealed segment's create and the status write that drops
//! its steps (`:<n>` names the segment's index there).

use serde_json::Value;

/// A crash point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// After the write recording `step.started`.
    AfterStepStarted,
    /// After the write recording `step.decided`.
    AfterDecided,
    /// After the write recording `step.tool_started`, before the call.
    AfterToolStarted,
    /// While the tool call is in flight (after sending).
    DuringTool,
    /// After the write recording `step.tool_finished`.
    AfterToolReturned,
    /// After the write recording `step.interrupted`.
    AfterInterrupted,
    /// After the write recording `run.resumed`.
    AfterResumed,
    /// While a model attempt is in flight (after sending).
    DuringModel,
    /// After the reconcile hook answered, before the write applying its answer.
    AfterHookAnswered,
    /// After an http tool's status URL answered about an interrupted call, before the write
    /// applying its answer (docs/design.md section 5).
    AfterStatusAnswered,
    /// After a sealed segment was created (or found already there), before the status write
    /// that drops its steps (docs/design.md section 4a); its number is the segment's index.
    AfterSegmentCreated,
    /// After a `job` tool's Job was created, before the write recording `step.job_created`.
    AfterJobCreated,
    /// After a `job` tool's Job ended and its outcome was read, before the write recording it.
    AfterJobFinished,
    /// After an MCP server created a task for a `tools/call`, before the write recording
    /// `step.task_created` (docs/design.md section 6, "MCP tasks").
    AfterTaskCreated,
    /// After the write recording `step.task_created`, before the task is followed.
    AfterTaskRecorded,
}

impl FaultPoint {
    /// Every point, as `AGENTRT_FAULT` names them.
    pub const ALL: [FaultPoint; 15] = [
        FaultPoint::AfterStepStarted,
        FaultPoint::AfterDecided,
        FaultPoint::AfterToolStarted,
        FaultPoint::DuringTool,
        FaultPoint::AfterToolReturned,
        FaultPoint::AfterInterrupted,
        FaultPoint::AfterResumed,
        FaultPoint::DuringModel,
        FaultPoint::AfterHookAnswered,
        FaultPoint::AfterStatusAnswered,
        FaultPoint::AfterSegmentCreated,
        FaultPoint::AfterJobCreated,
        FaultPoint::AfterJobFinished,
        FaultPoint::AfterTaskCreated,
        FaultPoint::AfterTaskRecorded,
    ];

    /// The name `AGENTRT_FAULT` uses.
    pub fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterStepStarted => "after-step-started",
            FaultPoint::AfterDecided => "after-decided",
            FaultPoint::AfterToolStarted => "after-tool-started",
            FaultPoint::DuringTool => "during-tool",
            FaultPoint::AfterToolReturned => "after-tool-returned",
            FaultPoint::AfterInterrupted => "after-interrupted",
            FaultPoint::AfterResumed => "after-resumed",
            FaultPoint::DuringModel => "during-model",
            FaultPoint::AfterHookAnswered => "after-hook-answered",
            FaultPoint::AfterStatusAnswered => "after-status-answered",
            FaultPoint::AfterSegmentCreated => "after-segment-created",
            FaultPoint::AfterJobCreated => "after-job-created",
            FaultPoint::AfterJobFinished => "after-job-finished",
            FaultPoint::AfterTaskCreated => "after-task-created",
            FaultPoint::AfterTaskRecorded => "after-task-recorded",
        }
    }

    /// The point a record event type marks, when it marks one.
    pub fn after_event(event_type: &str) -> Option<FaultPoint> {
        Some(match event_type {
            "step.started" => FaultPoint::AfterStepStarted,
            "step.decided" => FaultPoint::AfterDecided,
            "step.tool_started" => FaultPoint::AfterToolStarted,
            "step.tool_finished" => FaultPoint::AfterToolReturned,
            "step.interrupted" => FaultPoint::AfterInterrupted,
            "run.resumed" => FaultPoint::AfterResumed,
            "step.task_created" => FaultPoint::AfterTaskRecorded,
            _ => return None,
        })
    }
}

/// Parses `<point>[:<step>]`.
pub fn parse(spec: &str) -> Option<(FaultPoint, Option<i64>)> {
    let (name, step) = match spec.split_once(':') {
        Some((name, step)) => (name, Some(step.trim().parse().ok()?)),
        None => (spec, None),
    };
    let point = FaultPoint::ALL
        .into_iter()
        .find(|point| point.name() == name.trim())?;
    Some((point, step))
}

/// The `(type, step)` of each event in `new_status.events` with a seq above the highest seq in
/// `old_status.events`: what one write added.
pub fn added_events(old_status: &Value, new_status: &Value) -> Vec<(String, Option<i64>)> {
    let old_max = old_status
        .get("events")
        .and_then(Value::as_array)
        .map(|events| {
            events
                .iter()
                .filter_map(|event| event.get("seq").and_then(Value::as_i64))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0);
    new_status
        .get("events")
        .and_then(Value::as_array)
        .map(|events| {
            events
                .iter()
                .filter(|event| event.get("seq").and_then(Value::as_i64).unwrap_or(0) > old_max)
                .filter_map(|event| {
                    let kind = event.get("type")?.as_str()?.to_string();
                    Some((kind, event.get("step").and_then(Value::as_i64)))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(feature = "fault-injection")]
fn configured() -> Option<(FaultPoint, Option<i64>)> {
    static CONFIGURED: std::sync::OnceLock<Option<(FaultPoint, Option<i64>)>> =
        std::sync::OnceLock::new();
    *CONFIGURED.get_or_init(|| {
        let spec = std::env::var("AGENTRT_FAULT").ok()?;
        let parsed = parse(&spec);
        if parsed.is_none() {
            tracing::warn!(%spec, "AGENTRT_FAULT names no known crash point; ignored");
        }
        parsed
    })
}

/// Kills this process with SIGKILL when `AGENTRT_FAULT` names `point` (and `step`, if it names
/// one). A no-op without the `fault-injection` feature.
#[cfg(feature = "fault-injection")]
pub fn check(point: FaultPoint, step: Option<i64>) {
    if let Some((configured, configured_step)) = configured() {
        if configured == point && (configured_step.is_none() || configured_step == step) {
            eprintln!(
                "agentrt: AGENTRT_FAULT: killing this process at {} (step {step:?})",
                point.name()
            );
            // SAFETY: kill(2) on our own pid with a valid signal number has no memory effects.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }
}

/// A no-op without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn check(_point: FaultPoint, _step: Option<i64>) {}

/// Checks the crash points the events a successful write added mark.
#[cfg(feature = "fault-injection")]
pub fn after_write(old_status: &Value, new_status: &Value) {
    if configured().is_none() {
        return;
    }
    for (kind, step) in added_events(old_status, new_status) {
        if let Some(point) = FaultPoint::after_event(&kind) {
            check(point, step);
        }
    }
}

/// A no-op without the `fault-injection` feature.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn after_write(_old_status: &Value, _new_status: &Value) {}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fault_specs_name_a_point_and_optionally_a_step() {
        assert_eq!(parse("during-tool"), Some((FaultPoint::DuringTool, None)));
        assert_eq!(
            parse("after-tool-started:2"),
            Some((FaultPoint::AfterToolStarted, Some(2)))
        );
        assert_eq!(
            parse("during-model:1"),
            Some((FaultPoint::DuringModel, Some(1)))
        );
        assert_eq!(
            parse("after-hook-answered"),
            Some((FaultPoint::AfterHookAnswered, None))
        );
        assert_eq!(
            parse("after-segment-created:1"),
            Some((FaultPoint::AfterSegmentCreated, Some(1)))
        );
        assert_eq!(parse("nowhere"), None);
        assert_eq!(parse("after-decided:x"), None);
    }

    #[test]
    fn the_events_a_write_added_are_those_past_the_old_highest_seq() {
        let old = json!({"events": [{"seq": 1, "type": "run.created"}, {"seq": 2, "type": "run.started"}]});
        let new = json!({"events": [
            {"seq": 1, "type": "run.created"}, {"seq": 2, "type": "run.started"},
            {"seq": 3, "type": "step.started", "step": 0}, {"seq": 4, "type": "step.tool_started", "step": 0}
        ]});
        assert_eq!(
            added_events(&old, &new),
            vec![
                ("step.started".to_string(), Some(0)),
                ("step.tool_started".to_string(), Some(0))
            ]
        );
        assert_eq!(added_events(&Value::Null, &old).len(), 2);
    }
}
