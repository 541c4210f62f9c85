//! What this replica has seen of each run's Lease, and since when (docs/design.md section 4): the
//! Lease last seen (holder, renewTime and resourceVersion decide whether it changed), and the
//! instant on this replica's monotonic clock when it first saw it so. The engine judges a Lease
//! expired only once it has been seen unchanged for `leaseDurationSeconds` plus the margin
//! ([`crate::engine::lease_liveness`]; client-go's leader election keeps the same
//! `observedTime`). No run's Lease is judged by a wall clock here; the one wall-clock read is
//! whether a replica's presence Lease ([`crate::controller::lease::presence`]) was renewed lately
//! enough for its holder to count as a peer, which decides nothing about a run.
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

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::runtime::watcher;

use crate::controller::cluster::RunKey;

/// The run a Lease belongs to: the Lease is named after its run, in its namespace.
fn key_of(lease: &Lease) -> RunKey {
    RunKey {
        namespace: lease.metadata.namespace.clone().unwrap_or_default(),
        name: lease.metadata.name.clone().unwrap_or_default(),
    }
}

/// A Lease of exactly the shape agentrt writes ([`crate::controller::lease`]: agentrt's own
/// label, one controller owner that is the AgentRun of the Lease's own name, nothing else in
/// its metadata but what the API server sets), kept as only the fields that vary: about a
/// third of a whole [`Lease`] (issue 15: memory per waiting run, every run has a Lease).
#[derive(Debug, Clone, PartialEq)]
struct CompactLease {
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    creation_timestamp: Option<Time>,
    /// The owning run's uid.
    owner_uid: Box<str>,
    holder: Option<Box<str>>,
    lease_duration_seconds: Option<i32>,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    lease_transitions: Option<i32>,
}

impl CompactLease {
    /// `lease` compacted, when the compact form gives back exactly `lease`; `None` for any
    /// other Lease (kept whole).
    fn of(lease: &Lease) -> Option<CompactLease> {
        let spec = lease.spec.as_ref()?;
        let owner = lease.metadata.owner_references.as_deref()?.first()?;
        let compact = CompactLease {
            uid: lease.metadata.uid.as_deref().map(Box::from),
            resource_version: lease.metadata.resource_version.as_deref().map(Box::from),
            creation_timestamp: lease.metadata.creation_timestamp.clone(),
            owner_uid: owner.uid.as_str().into(),
            holder: spec.holder_identity.as_deref().map(Box::from),
            lease_duration_seconds: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time.clone(),
            renew_time: spec.renew_time.clone(),
            lease_transitions: spec.lease_transitions,
        };
        (compact.lease(&key_of(lease)) == *lease).then_some(compact)
    }

    /// The whole Lease of the run `key` this stands for.
    fn lease(&self, key: &RunKey) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(key.name.clone()),
                namespace: Some(key.namespace.clone()),
                uid: self.uid.as_deref().map(str::to_string),
                resource_version: self.resource_version.as_deref().map(str::to_string),
                creation_timestamp: self.creation_timestamp.clone(),
                labels: Some(crate::controller::lease::managed_by_labels()),
                owner_references: Some(vec![crate::controller::lease::run_owner(
                    &key.name,
                    &self.owner_uid,
                )]),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: self.holder.as_deref().map(str::to_string),
                lease_duration_seconds: self.lease_duration_seconds,
                acquire_time: self.acquire_time.clone(),
                renew_time: self.renew_time.clone(),
                lease_transitions: self.lease_transitions,
                ..LeaseSpec::default()
            }),
        }
    }
}

/// A Lease as kept: compactly when it has agentrt's shape, else whole. Both behind a pointer,
/// so the observations' table (whose slots stay allocated for the most runs it ever held)
/// costs little per slot.
#[derive(Debug)]
enum Kept {
    Compact(Box<CompactLease>),
    Whole(Arc<Lease>),
}

impl Kept {
    /// `lease` as kept, without its managedFields (as the Lease watch delivers it): a Lease
    /// written back without them keeps the stored ones.
    fn of(lease: &Lease) -> Kept {
        let mut lease = lease.clone();
        lease.metadata.managed_fields = None;
        match CompactLease::of(&lease) {
            Some(compact) => Kept::Compact(Box::new(compact)),
            None => Kept::Whole(Arc::new(lease)),
        }
    }

    /// The Lease of the run `key` as it was seen.
    fn lease(&self, key: &RunKey) -> Arc<Lease> {
        match self {
            Kept::Compact(compact) => Arc::new(compact.lease(key)),
            Kept::Whole(lease) => lease.clone(),
        }
    }

    /// `spec.holderIdentity` of the Lease kept.
    fn holder(&self) -> Option<&str> {
        match self {
            Kept::Compact(kept) => kept.holder.as_deref(),
            Kept::Whole(kept) => kept
                .spec
                .as_ref()
                .and_then(|spec| spec.holder_identity.as_deref()),
        }
    }

    /// `spec.renewTime` and `metadata.resourceVersion` of the Lease kept.
    fn renew_time_and_version(&self) -> (Option<&MicroTime>, Option<&str>) {
        match self {
            Kept::Compact(kept) => (kept.renew_time.as_ref(), kept.resource_version.as_deref()),
            Kept::Whole(kept) => (
                kept.spec.as_ref().and_then(|spec| spec.renew_time.as_ref()),
                kept.metadata.resource_version.as_deref(),
            ),
        }
    }

    /// Whether `lease` is the version of the Lease kept (holder, renewTime and
    /// resourceVersion the same), which, unchanged, lets its observation age.
    fn same_version(&self, lease: &Lease) -> bool {
        let spec = lease.spec.as_ref();
        self.holder() == spec.and_then(|spec| spec.holder_identity.as_deref())
            && self.renew_time_and_version()
                == (
                    spec.and_then(|spec| spec.renew_time.as_ref()),
                    lease.metadata.resource_version.as_deref(),
                )
    }
}

/// One run's Lease as last seen.
#[derive(Debug)]
struct Entry {
    kept: Kept,
    /// When it was first seen as it is (monotonic).
    since: Instant,
    /// The [`State::touches`] count when it was last seen: a relist drops what it did not touch.
    touched: u64,
}

/// Where a read of a run's Lease came from ([`LeaseObservations::observe_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseRead {
    /// This replica's Lease watch cache ([`LeaseObservations::cached`]).
    Cached,
    /// The API server, by a read that began at this instant (monotonic).
    Live(Instant),
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
    /// The keys of the replicas' presence Leases among `seen` (a key no longer in `seen` is
    /// dropped when next looked at).
    presence: std::collections::HashSet<RunKey>,
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
    /// clock; `None` when absent, which forgets it) and returns for how many milliseconds it
    /// has been seen unchanged: 0 when it is new or changed, and for an absent Lease.
    /// [`LeaseObservations::observe_read`] of a live read that began at `at`.
    pub fn observe(&self, key: &RunKey, lease: Option<&Lease>, at: Instant) -> u64 {
        self.observe_read(key, lease, at, LeaseRead::Live(at))
    }

    /// [`LeaseObservations::observe`] of what a read found, `read` saying where it came from.
    ///
    /// An absent Lease found in this cache ([`LeaseRead::Cached`]) forgets nothing: whatever
    /// the cache holds by now came later (a Lease the watch delivered since: another replica
    /// created it), and the watch's own Delete events forget deleted Leases. One found absent
    /// by a live read forgets only what was first seen as it is before that read began. So the
    /// replica that loses a create race does not go on taking the run's Lease for absent (and
    /// creating it again, and reading the run again) until the winner renews it.
    pub fn observe_read(
        &self,
        key: &RunKey,
        lease: Option<&Lease>,
        at: Instant,
        read: LeaseRead,
    ) -> u64 {
        let Some(lease) = lease else {
            if let LeaseRead::Live(began) = read {
                let mut state = self.lock();
                if state
                    .seen
                    .get(key)
                    .is_some_and(|entry| entry.since <= began)
                {
                    state.seen.remove(key);
                }
            }
            return 0;
        };
        self.record(key, lease, at, true).0
    }

    /// [`LeaseObservations::observe`] of a Lease that is there, and whether its holder is new
    /// to this replica: it had no Lease for the run, or one of another holder. The holder
    /// counts as seen at `at` when `counts_holder`.
    fn record(&self, key: &RunKey, lease: &Lease, at: Instant, counts_holder: bool) -> (u64, bool) {
        let mut state = self.lock();
        state.touches = state.touches.wrapping_add(1);
        let touched = state.touches;
        if crate::controller::lease::presence::is_presence(lease) && !state.presence.contains(key) {
            state.presence.insert(key.clone());
        }
        let holder = lease
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.as_deref());
        if let Some(holder) = holder.filter(|holder| counts_holder && !holder.is_empty()) {
            match state.holders.get_mut(holder) {
                Some(last) => *last = (*last).max(at),
                None => {
                    state.holders.insert(holder.to_string(), at);
                }
            }
        }
        match state.seen.get_mut(key) {
            Some(entry) if entry.kept.same_version(lease) => {
                entry.touched = touched;
                let millis = u64::try_from(at.saturating_duration_since(entry.since).as_millis())
                    .unwrap_or(u64::MAX);
                (millis, false)
            }
            seen => {
                let new_holder = seen.is_none_or(|entry| entry.kept.holder() != holder);
                state.seen.insert(
                    key.clone(),
                    Entry {
                        kept: Kept::of(lease),
                        since: at,
                        touched,
                    },
                );
                (0, new_holder)
            }
        }
    }

    /// Records what the Lease watch of `scope` (a namespace, `None` for all) saw at `at`
    /// (monotonic): an applied Lease is observed as [`LeaseObservations::observe`] does, a
    /// deleted one forgotten; a relist ([`watcher::Event::Init`]) makes the scope's Leases
    /// read live again until it is done, and then forgets what it did not list.
    ///
    /// Returns whether the event wakes the run's reconcile: an applied Lease whose holder is
    /// new to this replica (no Lease was seen for the run, or one of another holder, whether
    /// by this watch or by a live read); a renewal does not, nor a deletion (a run's Lease goes
    /// with the run). This is the Lease watch's predicate, kept in the observation itself so
    /// that a Lease costs no second cache entry (issue 15: memory per waiting run).
    pub fn watched(&self, scope: Option<&str>, event: &watcher::Event<Lease>, at: Instant) -> bool {
        match event {
            watcher::Event::Apply(lease) | watcher::Event::InitApply(lease) => {
                // A replica's presence wakes no run: it only makes its holder a peer, unless
                // its renewTime is long past by this replica's wall clock (a killed replica's
                // leftover; presence decides nothing, so a wall clock may judge it).
                use crate::controller::lease::presence;
                if presence::is_presence(lease) {
                    let counts = presence::renewed_lately(lease, jiff::Timestamp::now());
                    self.record(&key_of(lease), lease, at, counts);
                    return false;
                }
                self.record(&key_of(lease), lease, at, true).1
            }
            watcher::Event::Delete(lease) => {
                self.forget(&key_of(lease));
                // A replica that stopped withdrew its presence: it is no peer from now on.
                use crate::controller::lease::presence;
                if let Some(holder) =
                    presence::holder_of(lease).filter(|_| presence::is_presence(lease))
                {
                    self.lock().holders.remove(holder);
                }
                false
            }
            watcher::Event::Init => {
                let mut state = self.lock();
                let scope: Scope = scope.map(str::to_string);
                state.listed.remove(&scope);
                let touches = state.touches;
                state.relisting.insert(scope, touches);
                false
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
                false
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
        Some(state.seen.get(key).map(|entry| entry.kept.lease(key)))
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

    /// `holder`'s presence Lease ([`crate::controller::lease::presence`]) as the Lease watch last
    /// delivered it, and for how many milliseconds before `at` (monotonic) this replica has seen
    /// it unchanged: of its presence Leases in several namespaces, the one seen changed last.
    /// `None` when this replica has seen none.
    pub fn presence_of(&self, holder: &str, at: Instant) -> Option<(Arc<Lease>, u64)> {
        let state = self.lock();
        state
            .presence
            .iter()
            .filter_map(|key| {
                let entry = state.seen.get(key)?;
                let Kept::Whole(lease) = &entry.kept else {
                    return None;
                };
                let held = crate::controller::lease::presence::is_presence(lease)
                    && crate::controller::lease::presence::holder_of(lease) == Some(holder);
                held.then(|| (lease.clone(), entry.since))
            })
            .max_by_key(|(_, since)| *since)
            .map(|(lease, since)| {
                let unchanged = at.saturating_duration_since(since).as_millis();
                (lease, u64::try_from(unchanged).unwrap_or(u64::MAX))
            })
    }

    /// The replicas' presence Leases ([`crate::controller::lease::presence`]) seen unchanged for at
    /// least `older_than` before `at` (monotonic): what a replica killed without stopping left.
    pub fn stale_presence(&self, at: Instant, older_than: std::time::Duration) -> Vec<Arc<Lease>> {
        let mut state = self.lock();
        let State { seen, presence, .. } = &mut *state;
        let mut stale = Vec::new();
        presence.retain(|key| match seen.get(key) {
            Some(entry) => match &entry.kept {
                Kept::Whole(lease) if crate::controller::lease::presence::is_presence(lease) => {
                    if at.saturating_duration_since(entry.since) >= older_than {
                        stale.push(lease.clone());
                    }
                    true
                }
                _ => false,
            },
            None => false,
        });
        stale
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
mod tests;
