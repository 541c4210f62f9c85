//! What this replica has seen of each run's Lease, and since when (docs/design.md section 4): the
//! holder, renewTime and resourceVersion last seen, and the instant on this replica's
//! monotonic clock when it first saw them so. The engine judges a Lease expired only once it
//! has been seen unchanged for `leaseDurationSeconds` plus the margin
//! ([`crate::engine::lease_liveness`]; client-go's leader election keeps the same
//! `observedTime`). Wall clocks are never read here.
//!
//! Fed by every Lease this replica reads (the reconcile's GET) and by the Lease watch, which
//! sees each renewal as it is written; so the age of a Lease whose holder died runs from about
//! its last renewal, and a takeover follows within the duration and the margin.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::runtime::watcher;

use crate::controller::context::RunKey;

/// The version of a Lease that, unchanged, lets its observation age.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    resource_version: Option<String>,
}

impl Seen {
    fn of(lease: &Lease) -> Seen {
        let spec = lease.spec.as_ref();
        Seen {
            holder: spec.and_then(|spec| spec.holder_identity.clone()),
            renew_time: spec.and_then(|spec| spec.renew_time.clone()),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }
}

/// The run a Lease belongs to: the Lease is named after its run, in its namespace.
fn key_of(lease: &Lease) -> RunKey {
    RunKey {
        namespace: lease.metadata.namespace.clone().unwrap_or_default(),
        name: lease.metadata.name.clone().unwrap_or_default(),
    }
}

/// Per run: the Lease version last seen and when it was first seen so.
#[derive(Debug, Default)]
pub struct LeaseObservations {
    seen: Mutex<HashMap<RunKey, (Seen, Instant)>>,
}

impl LeaseObservations {
    /// Records `lease` (the run `key`'s Lease, as read or watched at `at` on the monotonic
    /// clock; `None` when absent) and returns for how many milliseconds it has been seen
    /// unchanged: 0 when it is new or changed, and for an absent Lease (which is forgotten).
    pub fn observe(&self, key: &RunKey, lease: Option<&Lease>, at: Instant) -> u64 {
        let mut seen = match self.seen.lock() {
            Ok(seen) => seen,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(lease) = lease else {
            seen.remove(key);
            return 0;
        };
        let now_seen = Seen::of(lease);
        match seen.get(key) {
            Some((last, since)) if *last == now_seen => {
                u64::try_from(at.saturating_duration_since(*since).as_millis()).unwrap_or(u64::MAX)
            }
            _ => {
                seen.insert(key.clone(), (now_seen, at));
                0
            }
        }
    }

    /// Records what the Lease watch saw at `at` (monotonic): an applied Lease is observed as
    /// [`LeaseObservations::observe`] does, a deleted one forgotten.
    pub fn watched(&self, event: &watcher::Event<Lease>, at: Instant) {
        match event {
            watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                self.observe(&key_of(lease), Some(lease), at);
            }
            watcher::Event::Delete(lease) => self.forget(&key_of(lease)),
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// Forgets the run `key`'s Lease (it was deleted).
    pub fn forget(&self, key: &RunKey) {
        match self.seen.lock() {
            Ok(mut seen) => seen.remove(key),
            Err(poisoned) => poisoned.into_inner().remove(key),
        };
    }

    /// How many Leases are remembered.
    pub fn len(&self) -> usize {
        match self.seen.lock() {
            Ok(seen) => seen.len(),
            Err(poisoned) => poisoned.into_inner().len(),
        }
    }

    /// True when no Lease is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn key() -> RunKey {
        RunKey {
            namespace: "ns".into(),
            name: "r".into(),
        }
    }

    fn lease(holder: &str, renew_millis: i64, version: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(
                    jiff::Timestamp::from_millisecond(renew_millis).unwrap(),
                )),
                lease_duration_seconds: Some(2),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_first_seen_has_been_seen_unchanged_for_nothing() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        // Its renewTime is long past; that says nothing about how long it has been unchanged.
        assert_eq!(seen.observe(&key(), Some(&lease("a", 0, "1")), t0), 0);
        assert_eq!(
            seen.observe(
                &key(),
                Some(&lease("a", 0, "1")),
                t0 + Duration::from_millis(1500)
            ),
            1500
        );
    }

    #[test]
    fn a_renewal_or_a_new_holder_starts_the_observation_again() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        let at = |millis: u64| t0 + Duration::from_millis(millis);
        seen.observe(&key(), Some(&lease("a", 0, "1")), at(0));
        assert_eq!(
            seen.observe(&key(), Some(&lease("a", 700, "2")), at(700)),
            0
        );
        assert_eq!(
            seen.observe(&key(), Some(&lease("a", 700, "2")), at(1000)),
            300
        );
        assert_eq!(
            seen.observe(&key(), Some(&lease("b", 700, "3")), at(1100)),
            0
        );
        // A write that changed neither holder nor renewTime is still a new version.
        assert_eq!(
            seen.observe(&key(), Some(&lease("b", 700, "4")), at(1200)),
            0
        );
        assert_eq!(
            seen.observe(&key(), Some(&lease("b", 700, "4")), at(3200)),
            2000
        );
    }

    #[test]
    fn the_watch_feeds_the_same_observation_as_a_read() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        let mut watched = lease("a", 0, "1");
        watched.metadata.namespace = Some("ns".into());
        watched.metadata.name = Some("r".into());
        seen.watched(&watcher::Event::InitApply(watched.clone()), t0);
        assert_eq!(
            seen.observe(
                &key(),
                Some(&lease("a", 0, "1")),
                t0 + Duration::from_millis(800)
            ),
            800
        );
        seen.watched(&watcher::Event::Delete(watched), t0);
        assert!(seen.is_empty());
    }

    #[test]
    fn an_absent_lease_is_forgotten() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        seen.observe(&key(), Some(&lease("a", 0, "1")), t0);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen.observe(&key(), None, t0), 0);
        assert!(seen.is_empty());
        seen.observe(&key(), Some(&lease("a", 0, "1")), t0);
        seen.forget(&key());
        assert!(seen.is_empty());
        assert_eq!(
            seen.observe(
                &key(),
                Some(&lease("a", 0, "1")),
                t0 + Duration::from_secs(9)
            ),
            0,
            "seen again after being forgotten: first seen now"
        );
    }
}
