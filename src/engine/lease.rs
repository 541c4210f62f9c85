//! When a replica may take another holder's Lease (docs/design.md section 4; docs/behaviours.md 30-31).
//!
//! A Lease is judged by observation, never by comparing clocks: the replica asking has seen it
//! unchanged (same holder, same renewTime, same resourceVersion) for `leaseDurationSeconds`
//! plus its margin, measured on its own monotonic clock from the first time it saw that
//! version. A Lease first seen now starts that timer now, so it waits a full duration. This is
//! client-go's leader election rule (`observedTime` in `tools/leaderelection`): a holder that
//! renews changes the Lease every third of its duration, so a replica whose wall clock is
//! skewed, ahead or behind, never takes a Lease that is being renewed. The renewTime a holder
//! writes is its own wall-clock time; it is recorded (`previousExpiry`) and shown, never
//! compared with the asking replica's clock.
//!
//! The controller keeps the observation (holder, renewTime, resourceVersion, first-seen
//! instant) per Lease and passes its age in as [`LeaseView::unchanged_for_ms`]; this room owns
//! only the rule. The holder's own check before each side effect is another rule, on its own
//! clock (`controller::lease`).

use super::LeaseView;

/// How a replica that is not executing a run judges the run's Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseLiveness {
    /// Absent, or released (it names no holder): it may be acquired now.
    Free,
    /// It names a holder and has not been seen unchanged for the duration plus the margin yet:
    /// leave it, and look again in `millis` milliseconds (when it would be, if nothing changes).
    Live {
        /// Milliseconds until `leaseDurationSeconds` × 1000 + margin of unchanged observation.
        millis: u64,
    },
    /// It names a holder and has been seen unchanged for `leaseDurationSeconds` plus the
    /// margin: its holder stopped renewing, and it may be taken over.
    Expired,
}

/// Judges `lease` by how long the asking replica has seen it unchanged (see the module doc).
/// `fallback_duration_seconds` (the run's `spec.leaseDurationSeconds`) stands in for a Lease
/// that names no duration. Which holder it names does not matter: a replica's own Lease that
/// nobody renews expires the same way (docs/behaviours.md 32).
pub fn lease_liveness(lease: &LeaseView, fallback_duration_seconds: i64) -> LeaseLiveness {
    if lease.holder.is_none() {
        return LeaseLiveness::Free;
    }
    let duration_ms = lease
        .duration_seconds
        .unwrap_or(fallback_duration_seconds)
        .max(0)
        .unsigned_abs()
        .saturating_mul(1000);
    let needed = duration_ms.saturating_add(lease.takeover_margin_ms);
    if lease.unchanged_for_ms >= needed {
        LeaseLiveness::Expired
    } else {
        LeaseLiveness::Live {
            millis: needed - lease.unchanged_for_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Time;

    /// A Lease held by `a` for 30 s, renewed (by `a`'s clock) at `renewed_at`, seen unchanged
    /// for `unchanged_for_ms`, judged with a 500 ms margin.
    fn held(renewed_at: Time, unchanged_for_ms: u64) -> LeaseView {
        LeaseView {
            holder: Some("a".into()),
            renewed_at: Some(renewed_at),
            duration_seconds: Some(30),
            unchanged_for_ms,
            takeover_margin_ms: 500,
        }
    }

    fn long_ago() -> Time {
        Time::from_millis(0)
    }

    #[test]
    fn a_lease_first_seen_is_live_for_a_full_duration() {
        // Its renewTime says it expired decades ago; first seen now, it is live for 30.5 s.
        assert_eq!(
            lease_liveness(&held(long_ago(), 0), 3),
            LeaseLiveness::Live { millis: 30_500 }
        );
        assert_eq!(
            lease_liveness(&held(long_ago(), 30_499), 3),
            LeaseLiveness::Live { millis: 1 }
        );
    }

    #[test]
    fn a_lease_seen_unchanged_for_its_duration_and_the_margin_is_expired() {
        assert_eq!(
            lease_liveness(&held(long_ago(), 30_500), 3),
            LeaseLiveness::Expired
        );
        assert_eq!(
            lease_liveness(&held(long_ago(), 90_000), 3),
            LeaseLiveness::Expired
        );
    }

    #[test]
    fn a_lease_seen_changing_stays_live_whatever_its_renew_time() {
        // Each renewal is a new version, so its observation starts again: however far apart
        // the holder's clock and the asker's are, a lease renewed every third of its duration
        // is never seen unchanged for longer than that third.
        for renewed_at in [
            long_ago(),
            Time::from_millis(i64::MAX / 4),
            Time::from_millis(1_800_000_000_000),
        ] {
            for unchanged_for_ms in [0, 10_000, 20_000, 30_000] {
                assert!(
                    matches!(
                        lease_liveness(&held(renewed_at, unchanged_for_ms), 3),
                        LeaseLiveness::Live { .. }
                    ),
                    "{renewed_at:?} seen unchanged for {unchanged_for_ms} ms"
                );
            }
        }
    }

    #[test]
    fn the_renew_time_a_holder_writes_never_decides_expiry() {
        // The same observation with renewTimes far in the past and far in the future: the
        // same judgement (no wall clocks compared).
        let past = lease_liveness(&held(long_ago(), 12_000), 3);
        let future = lease_liveness(&held(Time::from_millis(4_000_000_000_000), 12_000), 3);
        let none = lease_liveness(
            &LeaseView {
                renewed_at: None,
                ..held(long_ago(), 12_000)
            },
            3,
        );
        assert_eq!(past, LeaseLiveness::Live { millis: 18_500 });
        assert_eq!(past, future);
        assert_eq!(past, none);
    }

    #[test]
    fn a_released_or_absent_lease_is_free() {
        assert_eq!(
            lease_liveness(&LeaseView::default(), 30),
            LeaseLiveness::Free
        );
        let released = LeaseView {
            holder: None,
            ..held(long_ago(), 0)
        };
        assert_eq!(lease_liveness(&released, 30), LeaseLiveness::Free);
    }

    #[test]
    fn a_lease_without_a_duration_is_judged_on_the_runs() {
        let lease = LeaseView {
            duration_seconds: None,
            ..held(long_ago(), 1_000)
        };
        assert_eq!(
            lease_liveness(&lease, 3),
            LeaseLiveness::Live { millis: 2_500 }
        );
        assert_eq!(
            lease_liveness(
                &LeaseView {
                    unchanged_for_ms: 3_500,
                    ..lease
                },
                3
            ),
            LeaseLiveness::Expired
        );
    }
}
