//! Golden spellings of every closed set in `src/api/vocab.rs` (docs/design.md sections 1-2): what a
//! user writes in a spec and phases, conditions and verdicts are CamelCase; the record's step
//! statuses, decision and observation kinds, policy decisions, terminal reasons, event types and
//! tool and decider failures are the vocabulary's snake_case. Changing one of these is changing the contract.

use agentrt::api::{
    ApprovalPhase, DeciderFailure, DecisionKind, EventType, IdempotencyKeys, ObservationKind,
    PolicyDecisionKind, PolicyOutcome, RunPhase, SideEffect, StepStatus, TerminalReason,
    TextAnswer, ToolFailure, Verdict, INTERRUPTED_SIDE_EFFECT, POLICY_ERROR,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Each value serializes to exactly its spelling and the spelling reads back as the value.
fn pin<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(cases: &[(T, &str)]) {
    for (value, spelling) in cases {
        let written = serde_json::to_value(value).expect("serializes");
        assert_eq!(
            written,
            serde_json::Value::String(spelling.to_string()),
            "{value:?}"
        );
        let read: T = serde_json::from_value(written).expect("reads back");
        assert_eq!(&read, value);
    }
}

#[test]
fn side_effect_classes_are_camel_case() {
    pin(&[
        (SideEffect::ReadOnly, "ReadOnly"),
        (SideEffect::LocalMutation, "LocalMutation"),
        (SideEffect::RemoteMutation, "RemoteMutation"),
        (SideEffect::Destructive, "Destructive"),
    ]);
    for class in SideEffect::ALL {
        assert_eq!(serde_json::to_value(class).unwrap(), class.as_str());
    }
}

#[test]
fn policy_outcomes_in_a_spec_are_camel_case() {
    pin(&[
        (PolicyOutcome::Allow, "Allow"),
        (PolicyOutcome::Deny, "Deny"),
        (PolicyOutcome::Abort, "Abort"),
        (PolicyOutcome::RequireApproval, "RequireApproval"),
    ]);
}

#[test]
fn text_answer_settings_in_a_spec_are_camel_case() {
    pin(&[
        (TextAnswer::Complete, "Complete"),
        (TextAnswer::Invalid, "Invalid"),
    ]);
    assert_eq!(TextAnswer::default(), TextAnswer::Complete);
}

#[test]
fn idempotency_key_settings_in_a_spec_are_camel_case() {
    pin(&[
        (IdempotencyKeys::NotHonored, "NotHonored"),
        (IdempotencyKeys::Honored, "Honored"),
    ]);
    assert_eq!(IdempotencyKeys::default(), IdempotencyKeys::NotHonored);
}

#[test]
fn run_phases_are_camel_case() {
    pin(&[
        (RunPhase::Pending, "Pending"),
        (RunPhase::Running, "Running"),
        (RunPhase::WaitingForApproval, "WaitingForApproval"),
        (RunPhase::Completed, "Completed"),
        (RunPhase::Failed, "Failed"),
        (RunPhase::Cancelled, "Cancelled"),
    ]);
}

#[test]
fn step_statuses_are_snake_case() {
    pin(&[
        (StepStatus::Deciding, "deciding"),
        (StepStatus::AwaitingApproval, "awaiting_approval"),
        (StepStatus::Executing, "executing"),
        (StepStatus::Done, "done"),
        (StepStatus::Failed, "failed"),
        (StepStatus::Interrupted, "interrupted"),
    ]);
}

#[test]
fn decision_kinds_are_snake_case() {
    pin(&[
        (DecisionKind::ToolCall, "tool_call"),
        (DecisionKind::Complete, "complete"),
        (DecisionKind::Fail, "fail"),
    ]);
    assert_eq!(
        DecisionKind::parse("tool_call"),
        Some(DecisionKind::ToolCall)
    );
    assert_eq!(DecisionKind::parse("ToolCall"), None);
}

#[test]
fn observation_kinds_are_snake_case() {
    pin(&[
        (ObservationKind::ToolResult, "tool_result"),
        (ObservationKind::ToolError, "tool_error"),
        (ObservationKind::PolicyDenied, "policy_denied"),
        (ObservationKind::InvalidDecision, "invalid_decision"),
        (ObservationKind::Interrupted, "interrupted"),
    ]);
}

#[test]
fn policy_decisions_in_the_record_are_snake_case() {
    pin(&[
        (PolicyDecisionKind::Allow, "allow"),
        (PolicyDecisionKind::Deny, "deny"),
        (PolicyDecisionKind::Abort, "abort"),
        (PolicyDecisionKind::RequireApproval, "require_approval"),
    ]);
}

#[test]
fn terminal_reasons_are_snake_case_and_take_their_phase() {
    let cases = [
        (
            TerminalReason::GoalCompleted,
            "goal_completed",
            RunPhase::Completed,
        ),
        (TerminalReason::GoalFailed, "goal_failed", RunPhase::Failed),
        (TerminalReason::LimitSteps, "limit_steps", RunPhase::Failed),
        (
            TerminalReason::LimitModelCalls,
            "limit_model_calls",
            RunPhase::Failed,
        ),
        (
            TerminalReason::LimitTokens,
            "limit_tokens",
            RunPhase::Failed,
        ),
        (TerminalReason::LimitCost, "limit_cost", RunPhase::Failed),
        (
            TerminalReason::LimitActiveTime,
            "limit_active_time",
            RunPhase::Failed,
        ),
        (
            TerminalReason::LimitElapsedTime,
            "limit_elapsed_time",
            RunPhase::Failed,
        ),
        (
            TerminalReason::ApprovalExpired,
            "approval_expired",
            RunPhase::Cancelled,
        ),
        (
            TerminalReason::ModelUnavailable,
            "model_unavailable",
            RunPhase::Failed,
        ),
        (
            TerminalReason::RepeatedToolFailures,
            "repeated_tool_failures",
            RunPhase::Failed,
        ),
        (
            TerminalReason::LoopDetected,
            "loop_detected",
            RunPhase::Failed,
        ),
        (
            TerminalReason::PolicyAbort,
            "policy_abort",
            RunPhase::Failed,
        ),
        (TerminalReason::ToolAbort, "tool_abort", RunPhase::Failed),
        (
            TerminalReason::ApprovalRejected,
            "approval_rejected",
            RunPhase::Cancelled,
        ),
        (
            TerminalReason::OperatorCancelled,
            "operator_cancelled",
            RunPhase::Cancelled,
        ),
        (
            TerminalReason::ReconcileConflict,
            "reconcile_conflict",
            RunPhase::Failed,
        ),
        (TerminalReason::AgentError, "agent_error", RunPhase::Failed),
        (
            TerminalReason::InternalError,
            "internal_error",
            RunPhase::Failed,
        ),
        (
            TerminalReason::RecordTooLarge,
            "record_too_large",
            RunPhase::Failed,
        ),
        (
            TerminalReason::ToolUnavailable,
            "tool_unavailable",
            RunPhase::Failed,
        ),
        (
            TerminalReason::InvalidSpec,
            "invalid_spec",
            RunPhase::Failed,
        ),
    ];
    let spellings: Vec<(TerminalReason, &str)> = cases.iter().map(|(r, s, _)| (*r, *s)).collect();
    pin(&spellings);
    for (reason, spelling, phase) in cases {
        assert_eq!(reason.phase(), phase, "{reason:?}");
        // The Ready condition's reason is the same word in CamelCase (API conventions).
        let camel: String = spelling
            .split('_')
            .map(|word| word[..1].to_uppercase() + &word[1..])
            .collect();
        assert_eq!(reason.condition_reason(), camel, "{reason:?}");
        assert!(reason.phase().is_terminal());
    }
}

#[test]
fn event_types_are_the_journal_spellings() {
    pin(&[
        (EventType::RunCreated, "run.created"),
        (EventType::RunStarted, "run.started"),
        (EventType::StepStarted, "step.started"),
        (EventType::StepDecided, "step.decided"),
        (EventType::StepPolicy, "step.policy"),
        (EventType::StepToolStarted, "step.tool_started"),
        (EventType::StepToolFinished, "step.tool_finished"),
        (EventType::StepFailed, "step.failed"),
        (EventType::StepInterrupted, "step.interrupted"),
        (EventType::ApprovalRequested, "approval.requested"),
        (EventType::ApprovalDecided, "approval.decided"),
        (EventType::RunResumed, "run.resumed"),
        (EventType::LeaseTakenOver, "lease.taken_over"),
        (EventType::LimitExceeded, "limit.exceeded"),
        (EventType::LoopDetected, "loop.detected"),
        (EventType::ModelDispatched, "model.dispatched"),
        (EventType::ModelCompleted, "model.completed"),
        (EventType::ModelFailed, "model.failed"),
        (EventType::AgentFailed, "agent.failed"),
        (EventType::ToolPinned, "tool.pinned"),
        (EventType::SpecChanged, "spec.changed"),
        (EventType::RunFinished, "run.finished"),
    ]);
}

#[test]
fn approval_phases_and_verdicts_are_camel_case() {
    pin(&[
        (ApprovalPhase::Pending, "Pending"),
        (ApprovalPhase::Approved, "Approved"),
        (ApprovalPhase::Rejected, "Rejected"),
        (ApprovalPhase::Expired, "Expired"),
        (ApprovalPhase::Executed, "Executed"),
        (ApprovalPhase::Settled, "Settled"),
        (ApprovalPhase::Cancelled, "Cancelled"),
    ]);
    pin(&[
        (Verdict::Approved, "Approved"),
        (Verdict::Rejected, "Rejected"),
        (Verdict::TookEffect, "TookEffect"),
        (Verdict::DidNotTakeEffect, "DidNotTakeEffect"),
    ]);
    assert_eq!(INTERRUPTED_SIDE_EFFECT, "interrupted_side_effect");
    assert_eq!(POLICY_ERROR, "policy_error");
}

#[test]
fn misspellings_are_refused() {
    assert!(serde_json::from_str::<StepStatus>("\"Executing\"").is_err());
    assert!(serde_json::from_str::<RunPhase>("\"running\"").is_err());
    assert!(serde_json::from_str::<TerminalReason>("\"GoalCompleted\"").is_err());
    assert!(serde_json::from_str::<SideEffect>("\"read_only\"").is_err());
}

#[test]
fn tool_failures_in_the_record_are_snake_case() {
    let cases = [
        (ToolFailure::HttpStatus, "http_status"),
        (ToolFailure::InvalidContent, "invalid_content"),
        (ToolFailure::ConnectionRefused, "connection_refused"),
        (ToolFailure::InvalidArgs, "invalid_args"),
        (ToolFailure::InvalidRequest, "invalid_request"),
        (ToolFailure::ResponseTooLarge, "response_too_large"),
        (ToolFailure::ExecutorPanic, "executor_panic"),
        (ToolFailure::NoExecutor, "no_executor"),
        (ToolFailure::HeaderUnavailable, "header_unavailable"),
        (ToolFailure::DefinitionChanged, "definition_changed"),
        (ToolFailure::ToolReportedError, "tool_reported_error"),
        (ToolFailure::McpError, "mcp_error"),
        (ToolFailure::JobFailed, "job_failed"),
    ];
    pin(&cases);
    assert_eq!(cases.len(), ToolFailure::ALL.len());
    for (failure, spelling) in cases {
        assert_eq!(failure.as_str(), spelling);
        assert_eq!(ToolFailure::parse(spelling), Some(failure));
    }
}

#[test]
fn decider_failures_in_the_record_are_snake_case() {
    let cases = [
        (DeciderFailure::NoToolCall, "no_tool_call"),
        (DeciderFailure::Truncated, "truncated"),
        (DeciderFailure::Unparseable, "unparseable"),
        (DeciderFailure::Unstorable, "unstorable"),
    ];
    pin(&cases);
    assert_eq!(cases.len(), DeciderFailure::ALL.len());
    for (failure, spelling) in cases {
        assert_eq!(failure.as_str(), spelling);
        assert_eq!(DeciderFailure::parse(spelling), Some(failure));
    }
}
