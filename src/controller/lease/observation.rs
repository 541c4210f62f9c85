//! What this replica has seen of each run's Lease, and since when (docs/design.md section 4): the
//! Lease last seen (holder, renewTime and resourceVersion decide whether it changed), and the
//! instant on this replica's monotonic clock when it first saw it so. The engine judges a Lease
//! expired only once it has been seen unchanged for `leaseDurationSeconds` plus the margin
//! ([`crate::engine::lease_liveness`]; client-go's leader election keeps the same
//! `observedTime`). Wall clocks are never read here.
//!
//! Fed by the Lease watch, which sees each renewal as it is written (so the age of a Lease whose
//! holder died runs from about its last renewal, and a takeover follows within the duration
//! and the margin), and by every Lease this replica reads live. Once the watch of a scope has
//! listed, the Lease it last delivered is what a reconcile reads ([`LeaseObservations::cached`]):
//! the Lease only decides whether to try a compare-and-set, which is the fence (a stale
//! version makes that write fail with 409), so no GET per reconcile is needed (issue 15). A
//! relist forgets what it no longer lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
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

/// One run's Lease as last seen.
#[derive(Debug)]
struct Entry {
    seen: Seen,
    since: Instant,
    /// The Lease as stored, less its labels when they are only agentrt's own
    /// ([`stored_compactly`]; [`LeaseObservations::cached`] puts them back).
    lease: Arc<Lease>,
    /// Whether its labels were taken off.
    unlabelled: bool,
    /// The [`State::touches`] count when it was last seen: a relist drops what it did not touch.
    touched: u64,
}

/// Whether `lease`'s labels are exactly the one every agentrt Lease carries
/// (`app.kubernetes.io/managed-by: agentrt`).
fn only_managed_by(lease: &Lease) -> bool {
    lease.metadata.labels.as_ref() == Some(&crate::controller::lease::managed_by_labels())
}

/// `lease` as kept, and whether its labels were taken off: they go when they are only
/// agentrt's own, since a label map costs about half a KiB per Lease and every run has one
/// (issue 15: memory per waiting run).
fn stored_compactly(lease: &Lease) -> (Lease, bool) {
    let mut kept = lease.clone();
    let unlabelled = only_managed_by(lease);
    if unlabelled {
        kept.metadata.labels = None;
    }
    (kept, unlabelled)
}

/// The Lease of `entry` as it is stored: agentrt's own label back on one kept without it.
fn as_stored(entry: &Entry) -> Arc<Lease> {
    let kept = &entry.lease;
    if !entry.unlabelled {
        return kept.clone();
    }
    let mut lease = Lease::clone(kept);
    lease.metadata.labels = Some(crate::controller::lease::managed_by_labels());
    Arc::new(lease)
}

/// A watch scope: a namespace, or `None` for all.
type Scope = Option<String>;

#[derive(Debug, Default)]
struct State {
    seen: HashMap<RunKey, Entry>,
    /// Scopes whose watch has listed and not started relisting since: the count of touches
    /// when it last started listing.
    listed: HashMap<Scope, u64>,
    /// Scopes relisting now: the count of touches when the relist began.
    relisting: HashMap<Scope, u64>,
    touches: u64,
    /// Every holder seen, and when it was last seen holding a Lease (monotonic).
    holders: HashMap<String, Instant>,
}

fn in_scope(scope: &Scope, key: &RunKey) -> bool {
    scope.as_deref().is_none_or(|ns| ns == key.namespace)
}

/// Per run: the Lease last seen and when it was first seen so; per watch scope: whether its
/// watch has listed.
#[derive(Debug, Default)]
pub struct LeaseObservations {
    state: Mutex<State>,
}

impl LeaseObservations {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(state) => state,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records `lease` (the run `key`'s Lease, as read or watched at `at` on the monotonic
    /// clock; `None` when absent) and returns for how many milliseconds it has been seen
    /// unchanged: 0 when it is new or changed, and for an absent Lease (which is forgotten).
    pub fn observe(&self, key: &RunKey, lease: Option<&Lease>, at: Instant) -> u64 {
        let mut state = self.lock();
        let Some(lease) = lease else {
            state.seen.remove(key);
            return 0;
        };
        state.touches = state.touches.wrapping_add(1);
        let touched = state.touches;
        if let Some(holder) = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref())
            .filter(|holder| !holder.is_empty())
        {
            match state.holders.get_mut(holder) {
                Some(last) => *last = (*last).max(at),
                None => {
                    state.holders.insert(holder.to_string(), at);
                }
            }
        }
        let now_seen = Seen::of(lease);
        match state.seen.get_mut(key) {
            Some(entry) if entry.seen == now_seen => {
                entry.touched = touched;
                u64::try_from(at.saturating_duration_since(entry.since).as_millis())
                    .unwrap_or(u64::MAX)
            }
            _ => {
                let (kept, unlabelled) = stored_compactly(lease);
                state.seen.insert(
                    key.clone(),
                    Entry {
                        seen: now_seen,
                        since: at,
                        lease: Arc::new(kept),
                        unlabelled,
                        touched,
                    },
                );
                0
            }
        }
    }

    /// Records what the Lease watch of `scope` (a namespace, `None` for all) saw at `at`
    /// (monotonic): an applied Lease is observed as [`LeaseObservations::observe`] does, a
    /// deleted one forgotten; a relist ([`watcher::Event::Init`]) makes the scope's Leases
    /// read live again until it is done, and then forgets what it did not list.
    pub fn watched(&self, scope: Option<&str>, event: &watcher::Event<Lease>, at: Instant) {
        match event {
            watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                self.observe(&key_of(lease), Some(lease), at);
            }
            watcher::Event::Delete(lease) => self.forget(&key_of(lease)),
            watcher::Event::Init => {
                let mut state = self.lock();
                let scope: Scope = scope.map(str::to_string);
                state.listed.remove(&scope);
                let touches = state.touches;
                state.relisting.insert(scope, touches);
            }
            watcher::Event::InitDone => {
                let mut state = self.lock();
                let scope: Scope = scope.map(str::to_string);
                if let Some(began) = state.relisting.remove(&scope) {
                    state
                        .seen
                        .retain(|key, entry| !in_scope(&scope, key) || entry.touched > began);
                }
                let touches = state.touches;
                state.listed.insert(scope, touches);
            }
        }
    }

    /// The run `key`'s Lease as its watch last delivered it: `Some(None)` when the watch of
    /// its scope has listed and holds no Lease for it, `None` when no such watch has listed
    /// (the caller reads it live).
    pub fn cached(&self, key: &RunKey) -> Option<Option<Arc<Lease>>> {
        let state = self.lock();
        if !state.listed.keys().any(|scope| in_scope(scope, key)) {
            return None;
        }
        Some(state.seen.get(key).map(as_stored))
    }

    /// The holders seen holding a Lease within `within` before `at` (monotonic): the replicas
    /// this one knows of ([`crate::controller::spread`]). Older ones are forgotten.
    pub fn holders_seen(&self, at: Instant, within: std::time::Duration) -> Vec<String> {
        let mut state = self.lock();
        state
            .holders
            .retain(|_, last| at.saturating_duration_since(*last) <= within);
        state.holders.keys().cloned().collect()
    }

    /// Forgets the run `key`'s Lease (it was deleted).
    pub fn forget(&self, key: &RunKey) {
        self.lock().seen.remove(key);
    }

    /// How many Leases are remembered.
    pub fn len(&self) -> usize {
        self.lock().seen.len()
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
    fn a_lease_is_kept_without_agentrts_own_label_and_handed_out_with_it() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        let mut ours = lease("a", 0, "1");
        ours.metadata.namespace = Some("ns".into());
        ours.metadata.name = Some("r".into());
        ours.metadata.labels = Some(crate::controller::lease::managed_by_labels());
        seen.watched(None, &watcher::Event::Init, t0);
        seen.watched(None, &watcher::Event::InitApply(ours.clone()), t0);
        seen.watched(None, &watcher::Event::InitDone, t0);
        assert!(seen.lock().seen[&key()].lease.metadata.labels.is_none());
        assert_eq!(
            *seen.cached(&key()).expect("listed").expect("a lease"),
            ours
        );
        // A Lease with other labels (or none) is handed out exactly as it was seen.
        for (version, labels) in [
            ("2", None),
            ("3", Some([("team".to_string(), "a".to_string())].into())),
        ] {
            let mut theirs = ours.clone();
            theirs.metadata.labels = labels;
            theirs.metadata.resource_version = Some(version.into());
            seen.observe(&key(), Some(&theirs), t0);
            assert_eq!(
                *seen.cached(&key()).expect("listed").expect("a lease"),
                theirs
            );
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
        seen.watched(None, &watcher::Event::InitApply(watched.clone()), t0);
        assert_eq!(
            seen.observe(
                &key(),
                Some(&lease("a", 0, "1")),
                t0 + Duration::from_millis(800)
            ),
            800
        );
        seen.watched(None, &watcher::Event::Delete(watched), t0);
        assert!(seen.is_empty());
    }

    #[test]
    fn a_listed_watch_answers_reads_and_a_relist_forgets_what_it_did_not_list() {
        let seen = LeaseObservations::default();
        let t0 = Instant::now();
        let named = |name: &str| {
            let mut lease = lease("a", 0, "1");
            lease.metadata.namespace = Some("ns".into());
            lease.metadata.name = Some(name.into());
            lease
        };
        let other = RunKey {
            namespace: "ns".into(),
            name: "gone".into(),
        };
        // Not listed yet: read live.
        assert!(seen.cached(&key()).is_none());
        seen.watched(Some("ns"), &watcher::Event::Init, t0);
        seen.watched(Some("ns"), &watcher::Event::InitApply(named("r")), t0);
        seen.watched(Some("ns"), &watcher::Event::InitApply(named("gone")), t0);
        seen.watched(Some("ns"), &watcher::Event::InitDone, t0);
        let cached = seen.cached(&key()).expect("listed").expect("a lease");
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("1"));
        assert!(
            seen.cached(&RunKey {
                namespace: "elsewhere".into(),
                name: "r".into()
            })
            .is_none(),
            "another namespace's watch has not listed"
        );
        // A relist reads live until done, then forgets the Lease it did not list again.
        seen.watched(Some("ns"), &watcher::Event::Init, t0);
        assert!(seen.cached(&key()).is_none());
        seen.watched(Some("ns"), &watcher::Event::InitApply(named("r")), t0);
        seen.watched(Some("ns"), &watcher::Event::InitDone, t0);
        assert!(seen.cached(&key()).expect("listed").is_some());
        assert_eq!(seen.cached(&other), Some(None), "gone while unwatched");
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
