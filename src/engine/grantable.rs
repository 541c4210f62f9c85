//! Whether an Approval can still grant, as a person deciding it sees it (docs/design.md
//! section 2 "Approval", docs/behaviours.md 42, 67): only an undecided, `Pending`, unexpired
//! Approval that is the latest of its step, while that step awaits approval in a run that has
//! not ended, is not being cancelled or deleted, and is the very run (uid) it was made for.
//! The engine's own decisions ([`super::waiting`]) apply the same rule to the record; `agentrt
//! approve`, `reject` and `settle` ask [`approval_cannot_grant`] and [`run_cannot_use`] before
//! they patch, and word the answer themselves.

use crate::api::{AgentRun, Approval, ApprovalPhase, RunPhase, StepIndex, StepStatus, Time};

/// Why an Approval cannot grant, read from the Approval alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRefusal {
    /// `spec.decision` is set: a decision is written once.
    Decided,
    /// `status.phase` is not `Pending` (with `status.reason`, as written).
    NotPending {
        /// The phase.
        phase: ApprovalPhase,
        /// `status.reason`.
        reason: Option<String>,
    },
    /// `status.expiresAt` is at or before the time asked about.
    Expired {
        /// `status.expiresAt`.
        at: Time,
    },
}

/// Why an Approval's run cannot use a decision on it, read from the run as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunRefusal {
    /// No run of `spec.runName` exists (deleted; with `--cascade=orphan` the Approval outlives
    /// it): nothing will ever act on a decision.
    Gone,
    /// The run has a `deletionTimestamp`.
    BeingDeleted,
    /// The run of that name has another uid than `spec.runUID` or the Approval's AgentRun
    /// ownerReference: it belongs to an earlier run of the same name.
    EarlierRun,
    /// The run ended (`status.phase` terminal, with `status.reason` as its wire spelling).
    Ended {
        /// The phase.
        phase: RunPhase,
        /// `status.reason`, spelled as on the wire.
        reason: Option<String>,
    },
    /// `spec.cancel: true` on a run that has not ended yet.
    BeingCancelled,
    /// The step's latest Approval is another one.
    Superseded {
        /// The step.
        step: StepIndex,
        /// The name of its latest Approval.
        latest: String,
    },
    /// The step no longer awaits approval.
    NotAwaiting {
        /// The step.
        step: StepIndex,
    },
}

/// Why `approval` cannot grant at `now`, from the Approval alone; `None` when it may, as far as
/// the Approval says ([`run_cannot_use`] says the rest).
pub fn approval_cannot_grant(approval: &Approval, now: Time) -> Option<ApprovalRefusal> {
    if approval.spec.decision.is_some() {
        return Some(ApprovalRefusal::Decided);
    }
    let status = approval.status.as_ref()?;
    if status.phase != ApprovalPhase::Pending {
        return Some(ApprovalRefusal::NotPending {
            phase: status.phase,
            reason: status.reason.clone(),
        });
    }
    status
        .expires_at
        .filter(|at| *at <= now)
        .map(|at| ApprovalRefusal::Expired { at })
}

/// Why `run` (the AgentRun named by `spec.runName`, as stored; `None` when absent) cannot use a
/// decision on `approval`; `None` when it can.
pub fn run_cannot_use(approval: &Approval, run: Option<&AgentRun>) -> Option<RunRefusal> {
    let Some(run) = run else {
        return Some(RunRefusal::Gone);
    };
    if run.metadata.deletion_timestamp.is_some() {
        return Some(RunRefusal::BeingDeleted);
    }
    let owner_uid = approval
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "AgentRun" && o.name == approval.spec.run_name)
        .map(|o| o.uid.as_str());
    let uid_matches = |uid: &str| run.metadata.uid.as_deref() == Some(uid);
    if !uid_matches(&approval.spec.run_uid) || owner_uid.is_some_and(|u| !uid_matches(u)) {
        return Some(RunRefusal::EarlierRun);
    }
    let cancelled = run.spec.cancel.then_some(RunRefusal::BeingCancelled);
    let Some(status) = run.status.as_ref() else {
        return cancelled;
    };
    if status.phase.is_terminal() {
        return Some(RunRefusal::Ended {
            phase: status.phase,
            reason: status
                .reason
                .and_then(|r| serde_json::to_value(r).ok())
                .and_then(|r| r.as_str().map(str::to_string)),
        });
    }
    if cancelled.is_some() {
        return cancelled;
    }
    let name = approval.metadata.name.as_deref().unwrap_or_default();
    let step = status
        .steps
        .iter()
        .find(|s| s.index == approval.spec.step_index)?;
    match step.approvals.last() {
        Some(latest) if latest.name != name => Some(RunRefusal::Superseded {
            step: step.index,
            latest: latest.name.clone(),
        }),
        _ if step.status != StepStatus::AwaitingApproval => {
            Some(RunRefusal::NotAwaiting { step: step.index })
        }
        _ => None,
    }
}
