//! What a replica that is not executing a run does with it (docs/design.md section 5, the resume
//! table), and cancel (docs/behaviours.md 30, 42, 43).
//!
//! An observer never starts a side effect. It may write what needs no lease (cancel, an expired
//! or rejected approval), recreate a recorded Approval that is missing, ask for the lease
//! ([`super::ObserveNext::AcquireLease`]) when the run needs a holder, or requeue for an expiry. Terminal
//! runs are left alone.

use super::lease::{lease_liveness, LeaseLiveness};
use super::record::{interrupted_observation, Txn};
use super::{LeaseView, PreviousHolder};
use crate::api::{RunPhase, StepStatus, TerminalReason, Time};

/// When the lease `lease` says it expires (renewTime + duration, by its holder's clock), for the
/// record only (`previousExpiry`); `None` when it names no holder or says nothing of time.
/// Whether it has expired is [`lease_liveness`]'s to say.
pub(crate) fn lease_expiry(lease: &LeaseView) -> Option<Time> {
    lease.holder.as_ref()?;
    let renewed = lease.renewed_at?;
    Some(renewed.plus_seconds(lease.duration_seconds?))
}

/// Milliseconds from `now` until `then` (0 when past).
pub(crate) fn millis_until(now: Time, then: Time) -> u64 {
    u64::try_from(then.as_millis().saturating_sub(now.as_millis())).unwrap_or(0)
}

/// Whether observing a run whose phase a watch last saw as `phase` can do anything: not when
/// it is terminal, as a terminal phase never changes again and [`super::observe`] leaves such a run
/// alone. A replica can then skip reading it. Any other phase, or none, may need work.
pub fn observe_needed(phase: Option<&str>) -> bool {
    let Some(phase) = phase else {
        return true;
    };
    match serde_json::from_value::<RunPhase>(serde_json::Value::String(phase.to_string())) {
        Ok(phase) => !phase.is_terminal(),
        Err(_) => true,
    }
}

/// [`super::observe`].
pub(crate) fn observe(txn: &mut Txn, lease: &LeaseView) {
    let phase = txn.status.phase;
    if phase.is_terminal() {
        return;
    }
    if txn.run.spec.cancel {
        cancel(txn);
        return;
    }
    match phase {
        RunPhase::Pending => txn.acquire_lease(None),
        RunPhase::WaitingForApproval => super::waiting::waiting(txn),
        _ => match lease_liveness(lease, txn.run.spec.lease_duration_seconds) {
            // docs/behaviours.md 30: someone (this replica included) holds it and it has not been
            // seen unchanged for its duration and the margin: wait that out.
            LeaseLiveness::Live { millis } => txn.requeue_after(millis),
            LeaseLiveness::Free | LeaseLiveness::Expired => {
                txn.acquire_lease(Some(PreviousHolder {
                    holder: lease.holder.clone(),
                    expired_at: lease_expiry(lease),
                }))
            }
        },
    }
}

/// Cancels a non-terminal run (docs/behaviours.md 42): every step deciding, awaiting approval or
/// executing fails with an `interrupted` observation naming its status, the run ends
/// `Cancelled` `operator_cancelled`. No lease is needed; pending Approvals stay as they are; a
/// running tool is not interrupted (its outcome is appended late, docs/behaviours.md 44).
pub(crate) fn cancel(txn: &mut Txn) {
    for index in 0..txn.status.steps.len() {
        let previous = txn.status.steps[index].status;
        if matches!(
            previous,
            StepStatus::Deciding | StepStatus::AwaitingApproval | StepStatus::Executing
        ) {
            if previous == StepStatus::Deciding {
                super::model_calls::close_open_attempt(txn, index, "cancelled before its answer");
            }
            txn.fail_step(index, interrupted_observation(previous, None));
        }
    }
    txn.end_run(TerminalReason::OperatorCancelled, None, None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_terminal_run_needs_no_observer() {
        for phase in ["Completed", "Failed", "Cancelled"] {
            assert!(!observe_needed(Some(phase)), "{phase}");
        }
        for phase in ["Pending", "Running", "WaitingForApproval", "Unheard"] {
            assert!(observe_needed(Some(phase)), "{phase}");
        }
        assert!(observe_needed(None));
    }
}
