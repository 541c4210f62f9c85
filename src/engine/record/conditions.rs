//! The run's conditions (`Ready`, `WaitingForApproval`, `ApprovalConflict`,
//! `ToolHintsDisagree`, and a finished run's `Complete` or `Failed` as a Job has them),
//! derived from the record on every write (docs/design.md section 2): type, status, CamelCase
//! reason and message.

use serde_json::Value;

use crate::api::{AgentRunStatus, EventType, RunPhase, TerminalReason, ToolSpec};
use crate::engine::pins::hint_disagreements;

pub(super) type ConditionParts = (&'static str, &'static str, String, String);

pub(super) fn ready_condition(status: &AgentRunStatus) -> ConditionParts {
    match (status.phase, status.reason) {
        (RunPhase::Completed, _) => (
            "Ready",
            "True",
            TerminalReason::GoalCompleted.condition_reason().into(),
            "the run completed its goal".into(),
        ),
        (_, Some(reason)) => (
            "Ready",
            "False",
            reason.condition_reason().to_string(),
            status
                .reason_detail
                .clone()
                .unwrap_or_else(|| format!("the run ended {}", phase_word(status.phase))),
        ),
        (phase, None) => (
            "Ready",
            "False",
            phase_word(phase).to_string(),
            format!("the run is {}", phase_word(phase)),
        ),
    }
}

/// `ApprovalConflict` (issue 16): True while the awaited Approval is one the run had to
/// re-home because its name was taken by an object that is not its own; False once a run that
/// had the condition moves on; absent for a run that never had a conflict.
pub(super) fn approval_conflict_condition(
    status: &AgentRunStatus,
    had: bool,
) -> Option<ConditionParts> {
    let awaited = (status.phase == RunPhase::WaitingForApproval)
        .then(|| {
            status
                .steps
                .iter()
                .rev()
                .find(|s| s.status == crate::api::StepStatus::AwaitingApproval)
                .and_then(|s| s.approvals.last())
        })
        .flatten();
    let rehomed = awaited.and_then(|a| {
        status.events.iter().rev().find_map(|e| {
            let data = e.data.as_ref()?;
            (e.type_ == EventType::ApprovalRequested
                && data.get("approval").and_then(Value::as_str) == Some(a.name.as_str()))
            .then(|| data.clone())
        })
    });
    match rehomed.filter(|d| d.get("replaces").is_some()) {
        Some(data) => {
            let text = |k: &str| {
                data.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_string()
            };
            Some((
                "ApprovalConflict",
                "True",
                "NameTaken".into(),
                format!(
                    "Approval {} {}; it was left as it is and the run waits on Approval {}",
                    text("replaces"),
                    text("conflict"),
                    text("approval")
                ),
            ))
        }
        None if had => Some((
            "ApprovalConflict",
            "False",
            "NoConflict".into(),
            "the run waits on no Approval whose name was taken".into(),
        )),
        None => None,
    }
}

/// `ToolHintsDisagree` (docs/design.md section 6, docs/behaviours.md 64): True while a pin's
/// annotations claim more danger than the manifest's class of its tool (`tools`, the run's
/// effective tools); absent otherwise. The class stays the manifest's either way.
pub(super) fn hints_condition(
    status: &AgentRunStatus,
    tools: &[ToolSpec],
) -> Option<ConditionParts> {
    let claims: Vec<String> = status
        .tool_pins
        .iter()
        .filter_map(|pin| {
            let tool = tools.iter().find(|t| t.name == pin.tool)?;
            let found = hint_disagreements(pin.definition.annotations.as_ref(), tool.side_effect);
            (!found.is_empty()).then(|| {
                let said: Vec<&str> = found.iter().map(|d| d.claim).collect();
                format!(
                    "{}: {} (the manifest says {})",
                    pin.tool,
                    said.join("; "),
                    tool.side_effect.as_str()
                )
            })
        })
        .collect();
    (!claims.is_empty()).then(|| {
        (
            "ToolHintsDisagree",
            "True",
            "AnnotationsClaimMoreDanger".into(),
            format!(
                "the policy follows the manifest's side-effect classes; {}",
                claims.join(" | ")
            ),
        )
    })
}

/// A finished run's Job-like condition (docs/design.md section 2, docs/behaviours.md 70), so
/// `kubectl wait --for=condition=Complete` (or `=Failed`) works: `Complete` True on
/// `Completed`; `Failed` True on `Failed` or `Cancelled`, with the terminal reason in
/// CamelCase and the record's `reasonDetail` as its message. Absent while the run is live, as
/// a Job's are.
pub(super) fn terminal_condition(status: &AgentRunStatus) -> Option<ConditionParts> {
    match status.phase {
        RunPhase::Completed => Some((
            "Complete",
            "True",
            TerminalReason::GoalCompleted.condition_reason().into(),
            "the run completed its goal".into(),
        )),
        RunPhase::Failed | RunPhase::Cancelled => {
            let reason = status.reason.unwrap_or(TerminalReason::InternalError);
            Some((
                "Failed",
                "True",
                reason.condition_reason().into(),
                status
                    .reason_detail
                    .clone()
                    .unwrap_or_else(|| format!("the run ended {}", phase_word(status.phase))),
            ))
        }
        RunPhase::Pending | RunPhase::Running | RunPhase::WaitingForApproval => None,
    }
}

pub(super) fn waiting_condition(status: &AgentRunStatus) -> ConditionParts {
    if status.phase == RunPhase::WaitingForApproval {
        let name = status
            .steps
            .iter()
            .rev()
            .find_map(|s| s.approvals.last())
            .map(|a| a.name.clone())
            .unwrap_or_default();
        // docs/design.md section 5: a re-run of an interrupted call waits out its first
        // attempt; the condition says until when.
        let until = status
            .events
            .iter()
            .rev()
            .filter(|e| e.type_ == EventType::ApprovalRequested)
            .filter_map(|e| e.data.as_ref())
            .find(|d| d.get("approval").and_then(Value::as_str) == Some(name.as_str()))
            .and_then(|d| d.pointer("/presentation/firstAttempt/mayRunUntil"))
            .and_then(Value::as_str)
            .map(|until| {
                format!(
                    "; the interrupted first attempt may run until {until}, and nothing runs again \
                     before then"
                )
            })
            .unwrap_or_default();
        (
            "WaitingForApproval",
            "True",
            "ApprovalPending".into(),
            format!("waiting for a decision on Approval {name}{until}"),
        )
    } else {
        (
            "WaitingForApproval",
            "False",
            phase_word(status.phase).to_string(),
            "no approval is pending".into(),
        )
    }
}

fn phase_word(phase: RunPhase) -> &'static str {
    match phase {
        RunPhase::Pending => "Pending",
        RunPhase::Running => "Running",
        RunPhase::WaitingForApproval => "WaitingForApproval",
        RunPhase::Completed => "Completed",
        RunPhase::Failed => "Failed",
        RunPhase::Cancelled => "Cancelled",
    }
}
