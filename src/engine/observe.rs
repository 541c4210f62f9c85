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

/// Whether an executor that stops after writing a status whose phase is `phase` releases the
/// run's Lease: only when the run goes on without it (waiting for a person, or a phase it
/// cannot read). The Lease of a run that ended is deleted instead (docs/design.md section 7:
/// finished runs keep no Lease): no replica acts on a terminal run ([`observe_needed`]), so
/// nobody waits for it.
pub fn lease_release_needed(phase: Option<&str>) -> bool {
    observe_needed(phase)
}

/// Whether a run whose status says `phase` and `observed_generation` is new: no controller has
/// written its status yet. Its status is absent, or only what the CRD defaults put there
/// (`phase: Pending`, docs/design.md section 2); the first write of a controller records
/// `observedGeneration`.
pub fn is_new_run(phase: Option<&str>, observed_generation: Option<i64>) -> bool {
    matches!(phase, None | Some("Pending")) && observed_generation.is_none()
}

/// Whether a new run's first transition writes its status before it calls anything, so that a
/// replica may start it from the run as a watch event showed it, the compare-and-set of that
/// write on the event's resourceVersion being the fence (issue 15; docs/design.md section 7).
/// False for a run with MCP tools: its servers are listed (`initialize`, `tools/list`, with the
/// spec's header Secrets) before its first write, so that run is read live first.
pub fn first_write_precedes_any_call(spec: &crate::api::AgentRunSpec) -> bool {
    !super::pins::needs_pins(spec)
}

/// Whether `status` (the run's status as stored; `Null` when absent) is one no controller
/// wrote: absent, or the CRD's default (phase `Pending`, no `observedGeneration`:
/// [`is_new_run`]).
pub fn is_unwritten_status(status: &serde_json::Value) -> bool {
    status.is_null()
        || is_new_run(
            status["phase"].as_str(),
            status["observedGeneration"].as_i64(),
        )
}

/// Whether a replica whose executor slots are all taken may leave the run it watched unread
/// until a slot frees: the run is new ([`is_new_run`]) and unchanged since it was created
/// (`generation` 1: no cancel or policy change a reconcile must act on without a slot). Reading
/// it could only end in waiting for a slot (issue 15).
pub fn slot_wait_unread(watched: &WatchedView) -> bool {
    is_new_run(watched.phase, watched.observed_generation) && watched.generation == Some(1)
}

/// Whether a replica that is not `caller_holder`, whose Lease watch has listed and holds no
/// Lease of this run, may leave the run it watched unread for a while: the run is `Running`
/// under another recorded holder, on its current spec (`generation` = `observedGeneration`: no
/// cancel or policy change a reconcile must act on). A holder wins the run's Lease before the
/// status write that records it (docs/design.md section 4), so that Lease exists unless someone
/// deleted it: the Lease watch is behind the run watch, and delivering the Lease wakes the run.
/// Reading the run now could only end in acquiring a Lease that exists, a create that loses
/// (409) after a read (issue 15). It only delays a read: the caller leaves the run alone once,
/// for a bounded time, then reads and decides as before.
pub fn lease_watch_behind(watched: &WatchedView, caller_holder: &str) -> bool {
    running_on_current_spec(watched)
        && watched
            .holder
            .is_some_and(|holder| !holder.is_empty() && holder != caller_holder)
}

/// Whether the watched run is `Running` and its last status write was decided on its current
/// spec (`generation` = `observedGeneration`: no cancel or policy change since), the state in
/// which an observer only waits on its holder ([`observer_wait`], [`lease_watch_behind`]).
fn running_on_current_spec(watched: &WatchedView) -> bool {
    watched.phase == Some("Running")
        && watched.generation.is_some()
        && watched.generation == watched.observed_generation
}

/// What a replica's watch last saw of a run, for [`observer_wait`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchedView<'a> {
    /// `status.phase`.
    pub phase: Option<&'a str>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `status.observedGeneration`: the generation the last status write was decided on.
    pub observed_generation: Option<i64>,
    /// `status.lease.holder`.
    pub holder: Option<&'a str>,
}

/// The most of the caller's run watch lag (milliseconds) [`observer_wait`] waits out past a
/// Lease's possible expiry while its holder's presence Lease is not seen live: near the default
/// Lease duration, since a lag past it costs one read of a run, which is cheaper than holding
/// back the takeover of a run whose holder may be gone.
pub const LAG_CAP_MILLIS: u64 = 60_000;

/// The most of the caller's run watch lag (milliseconds) [`observer_wait`] waits out while the
/// holder's presence Lease is seen live: its holder is renewing that, so it is up, and a run
/// Lease it stopped renewing is most likely a run it ended that the watch has not delivered
/// yet (10 minutes, the age at which a killed replica's presence Lease is deleted).
pub const LAG_CAP_PRESENT_MILLIS: u64 = 600_000;

/// How far behind the caller's run watch runs, for [`observer_wait`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WatchBehind<'a> {
    /// The lag (milliseconds, measured on the caller's own status writes).
    pub lag_ms: u64,
    /// The Lease holder's presence Lease as the caller has observed it (`None` when it has seen
    /// none, or did not look because the lag is within [`LAG_CAP_MILLIS`]).
    pub holder_presence: Option<&'a LeaseView>,
}

/// For a replica that is not `caller_holder`: the milliseconds it may leave a run alone
/// without reading it, or `None` when it must read it and ask [`super::observe`]. Left alone
/// is a run whose Lease another replica holds, live as this replica has observed it (`lease`),
/// and that is either `Running` under that recorded holder with its last status write decided
/// on its current spec (`generation` = `observedGeneration`: no cancel or policy change since),
/// or new ([`is_new_run`]: its holder is starting it and sees its spec as it is). For both,
/// [`super::observe`] would only wait for that Lease's expiry (docs/behaviours.md 30), so the
/// wait is the same and the reads are saved (issue 15).
///
/// `behind.lag_ms` is how far behind the caller's run watch runs: `watched` is that old, so the
/// run is left alone that much past the Lease's possible expiry as well, for the watch to
/// deliver what was written before it (a run that ended, its kept Lease unrenewed, needs no
/// read then). The lag counts up to [`LAG_CAP_MILLIS`]; up to [`LAG_CAP_PRESENT_MILLIS`] while
/// the holder's presence Lease (`behind.holder_presence`) is live as this replica has observed
/// it, the wait then ending no later than that presence could have expired, so that a holder
/// killed with its runs is judged without the longer cap. It only delays a read: the takeover
/// itself is decided by [`super::observe`] from the run read live (docs/design.md sections 4
/// and 7).
pub fn observer_wait(
    watched: &WatchedView,
    lease: &LeaseView,
    caller_holder: &str,
    behind: &WatchBehind,
) -> Option<u64> {
    let holder = lease.holder.as_deref()?;
    let running = running_on_current_spec(watched) && watched.holder == Some(holder);
    let new = is_new_run(watched.phase, watched.observed_generation);
    if holder == caller_holder || !(running || new) {
        return None;
    }
    let duration = lease.duration_seconds?;
    // While the holder's presence is live: for how much longer, at the least.
    let present_for = behind
        .holder_presence
        .filter(|presence| presence.holder.as_deref() == Some(holder))
        .and_then(|presence| {
            let duration = presence.duration_seconds?;
            match lease_liveness(presence, duration) {
                LeaseLiveness::Live { millis } => Some(millis),
                LeaseLiveness::Free | LeaseLiveness::Expired => None,
            }
        });
    let cap = if present_for.is_some() {
        LAG_CAP_PRESENT_MILLIS
    } else {
        LAG_CAP_MILLIS
    };
    let lag_ms = behind.lag_ms.min(cap);
    let judged = LeaseView {
        takeover_margin_ms: lease.takeover_margin_ms.saturating_add(lag_ms),
        ..lease.clone()
    };
    match lease_liveness(&judged, duration) {
        LeaseLiveness::Live { millis } => Some(match present_for {
            // Judged again once the presence could have expired (no sooner than in a second).
            Some(present) if lag_ms > LAG_CAP_MILLIS => millis.min(present.max(1_000)),
            _ => millis,
        }),
        LeaseLiveness::Free | LeaseLiveness::Expired => None,
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
        RunPhase::WaitingForApproval => {
            super::waiting::waiting(txn);
            txn.acknowledge_spec_edit();
        }
        _ => match lease_liveness(lease, txn.run.spec.lease_duration_seconds) {
            // docs/behaviours.md 30: someone (this replica included) holds it and it has not been
            // seen unchanged for its duration and the margin: wait that out.
            LeaseLiveness::Live { millis } => txn.requeue_after(millis),
            LeaseLiveness::Free | LeaseLiveness::Expired => {
                txn.acquire_lease(Some(PreviousHolder {
                    holder: lease.holder.clone(),
                    expired_at: lease_expiry(lease),
                    stopped_by: Some(stopped_by(
                        txn.now(),
                        lease,
                        txn.run.spec.lease_duration_seconds,
                    )),
                }))
            }
        },
    }
}

/// [`PreviousHolder::stopped_by`]: when this replica first saw `lease` as it is (`now` minus
/// how long it has seen it unchanged) plus the Lease's duration (the run's when the Lease names
/// none). Both terms are this replica's own measurements, so no other clock enters it.
fn stopped_by(now: Time, lease: &LeaseView, run_duration_seconds: i64) -> Time {
    let seen = i64::try_from(lease.unchanged_for_ms).unwrap_or(i64::MAX);
    let duration = lease
        .duration_seconds
        .unwrap_or(run_duration_seconds)
        .max(run_duration_seconds);
    Time::from_millis(now.as_millis().saturating_sub(seen)).plus_seconds(duration)
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

    /// A run watch `lag_ms` behind, the holder's presence not looked at.
    fn lagging(lag_ms: u64) -> WatchBehind<'static> {
        WatchBehind {
            lag_ms,
            holder_presence: None,
        }
    }

    /// A run the watch shows `Running` under `a-1` on its current spec (generation 1).
    fn running_under_a() -> WatchedView<'static> {
        WatchedView {
            phase: Some("Running"),
            generation: Some(1),
            observed_generation: Some(1),
            holder: Some("a-1"),
        }
    }

    /// A Lease (or a presence Lease) held by `a-1` for 30 s, seen unchanged for
    /// `unchanged_for_ms`, judged with a 500 ms margin.
    fn held_by_a(unchanged_for_ms: u64) -> LeaseView {
        LeaseView {
            holder: Some("a-1".into()),
            duration_seconds: Some(30),
            unchanged_for_ms,
            takeover_margin_ms: 500,
            ..LeaseView::default()
        }
    }

    #[test]
    fn a_new_run_or_one_held_live_by_another_on_its_current_spec_is_left_to_its_holder() {
        let watched = running_under_a();
        let lease = held_by_a(10_000);
        assert_eq!(
            observer_wait(&watched, &lease, "b-2", &WatchBehind::default()),
            Some(20_500)
        );
        let new = WatchedView {
            generation: Some(1),
            ..WatchedView::default()
        };
        assert_eq!(
            observer_wait(&new, &lease, "b-2", &WatchBehind::default()),
            Some(20_500)
        );
        // New also when the API server defaulted its status (`phase: Pending`, no
        // observedGeneration), as kube-apiserver and the embedded server do.
        let defaulted = WatchedView {
            phase: Some("Pending"),
            ..new
        };
        assert_eq!(
            observer_wait(&defaulted, &lease, "b-2", &WatchBehind::default()),
            Some(20_500)
        );
        // Its holder, a spec the holder has not decided on (a cancel), another phase, a Lease
        // held by someone else than the record says, or one seen unchanged too long: read it.
        assert_eq!(
            observer_wait(&watched, &lease, "a-1", &WatchBehind::default()),
            None
        );
        let cancelled = WatchedView {
            generation: Some(2),
            ..watched
        };
        assert_eq!(
            observer_wait(&cancelled, &lease, "b-2", &WatchBehind::default()),
            None
        );
        let waiting = WatchedView {
            phase: Some("WaitingForApproval"),
            ..watched
        };
        assert_eq!(
            observer_wait(&waiting, &lease, "b-2", &WatchBehind::default()),
            None
        );
        let moved = LeaseView {
            holder: Some("c-3".into()),
            ..lease.clone()
        };
        assert_eq!(
            observer_wait(&watched, &moved, "b-2", &WatchBehind::default()),
            None
        );
        let stale = LeaseView {
            unchanged_for_ms: 31_000,
            ..lease
        };
        assert_eq!(
            observer_wait(&watched, &stale, "b-2", &WatchBehind::default()),
            None
        );
        // A run watch 5 s behind: the run is left alone 5 s past the Lease's possible expiry,
        // then read.
        assert_eq!(
            observer_wait(&watched, &stale, "b-2", &lagging(5_000)),
            Some(4_500)
        );
        let staler = LeaseView {
            unchanged_for_ms: 36_000,
            ..stale
        };
        assert_eq!(
            observer_wait(&watched, &staler, "b-2", &lagging(5_000)),
            None
        );
    }

    #[test]
    fn a_watch_lag_past_a_minute_is_waited_out_while_the_holder_is_present() {
        let watched = running_under_a();
        // The run's Lease could have expired 70 s ago; the run watch is 90 s behind.
        let lease = held_by_a(100_500);
        assert_eq!(
            observer_wait(&watched, &lease, "b-2", &lagging(90_000)),
            None,
            "past the minute's cap: read"
        );
        // The holder renews its presence Lease (seen changed 4 s ago): the whole lag is waited
        // out, judged again when the presence could have expired.
        let presence = held_by_a(4_000);
        let behind = WatchBehind {
            lag_ms: 90_000,
            holder_presence: Some(&presence),
        };
        assert_eq!(
            observer_wait(&watched, &lease, "b-2", &behind),
            Some(20_000)
        );
        let renewed = LeaseView {
            unchanged_for_ms: 25_000,
            ..presence.clone()
        };
        let behind = WatchBehind {
            holder_presence: Some(&renewed),
            ..behind
        };
        assert_eq!(
            observer_wait(&watched, &lease, "b-2", &behind),
            Some(5_500),
            "until the presence could have expired"
        );
        // A presence seen unchanged past its duration (the holder was killed), or another
        // replica's: the minute's cap, so the run is read.
        for presence in [
            LeaseView {
                unchanged_for_ms: 31_000,
                ..presence.clone()
            },
            LeaseView {
                holder: Some("c-3".into()),
                ..presence.clone()
            },
        ] {
            let behind = WatchBehind {
                lag_ms: 90_000,
                holder_presence: Some(&presence),
            };
            assert_eq!(observer_wait(&watched, &lease, "b-2", &behind), None);
        }
        // Within the minute the presence changes nothing.
        let behind = WatchBehind {
            lag_ms: 5_000,
            holder_presence: Some(&presence),
        };
        let fresh = LeaseView {
            unchanged_for_ms: 31_000,
            ..lease.clone()
        };
        assert_eq!(observer_wait(&watched, &fresh, "b-2", &behind), Some(4_500));
        // And the lag counts no further than the longer cap.
        let long = WatchBehind {
            lag_ms: 3_600_000,
            holder_presence: Some(&presence),
        };
        let ancient = LeaseView {
            unchanged_for_ms: 700_000,
            ..lease
        };
        assert_eq!(observer_wait(&watched, &ancient, "b-2", &long), None);
    }

    #[test]
    fn a_run_is_new_until_a_controller_wrote_its_status() {
        assert!(is_new_run(None, None));
        assert!(is_new_run(Some("Pending"), None));
        assert!(!is_new_run(Some("Pending"), Some(1)));
        assert!(!is_new_run(Some("Running"), None));
    }

    #[test]
    fn only_a_new_run_as_created_waits_for_a_slot_unread() {
        let created = WatchedView {
            phase: Some("Pending"),
            generation: Some(1),
            ..WatchedView::default()
        };
        assert!(slot_wait_unread(&created));
        let cancelled = WatchedView {
            generation: Some(2),
            ..created
        };
        assert!(!slot_wait_unread(&cancelled));
        let started = WatchedView {
            observed_generation: Some(1),
            ..created
        };
        assert!(!slot_wait_unread(&started));
    }

    #[test]
    fn a_run_recorded_as_held_elsewhere_on_its_current_spec_waits_for_the_lease_watch() {
        let held = WatchedView {
            phase: Some("Running"),
            generation: Some(1),
            observed_generation: Some(1),
            holder: Some("a-1"),
        };
        assert!(lease_watch_behind(&held, "b-2"));
        // Its own recorded holding: this replica knows its Lease; read.
        assert!(!lease_watch_behind(&held, "a-1"));
        // A cancel or a policy change since the last write: read and act on it now.
        let edited = WatchedView {
            generation: Some(2),
            ..held
        };
        assert!(!lease_watch_behind(&edited, "b-2"));
        // Waiting for a person (its holder released the Lease), new, or ended: read.
        for phase in [
            None,
            Some("Pending"),
            Some("WaitingForApproval"),
            Some("Completed"),
        ] {
            let other = WatchedView { phase, ..held };
            assert!(!lease_watch_behind(&other, "b-2"), "{phase:?}");
        }
        // No holder recorded, or an empty one.
        for holder in [None, Some("")] {
            let unheld = WatchedView { holder, ..held };
            assert!(!lease_watch_behind(&unheld, "b-2"), "{holder:?}");
        }
    }

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
