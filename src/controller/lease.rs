//! The run's Lease (docs/design.md sections 2 and 4; docs/behaviours.md 27-33): one
//! `coordination.k8s.io/v1` Lease per run, named after it and owned by it. Acquire, take over,
//! renew and release are compare-and-set writes (create when absent, replace on the
//! `resourceVersion` read); none of them writes a run event.
//!
//! The Lease is the liveness signal, the run record is the fence: winning the Lease only lets
//! this replica try the record's compare-and-set. Two checks, each on one replica's own
//! monotonic clock, never one replica's wall clock against another's:
//! - Another holder's Lease is taken only once this replica has seen it unchanged (same holder,
//!   renewTime and resourceVersion) for `leaseDurationSeconds` plus the margin: the engine's
//!   rule ([`crate::engine::lease_liveness`]) over the observation this replica keeps
//!   ([`observation::LeaseObservations`]), as client-go's leader election does. A replica whose
//!   clock is skewed, ahead or behind, so never takes a Lease that is being renewed.
//! - The holder's own check before each side effect ([`HeldLease::may_start_side_effect`],
//!   docs/behaviours.md 29): the instant its last acknowledged renewal was sent + duration − skew
//!   margin must lie ahead of now, on its own monotonic clock. The renewal was sent before any
//!   other replica could see it, so the holder stops at least two margins before a replica
//!   watching the Lease may take it.
//!
//! The renewTime and acquireTime written are this replica's wall-clock time (`--clock-offset-ms`
//! shifts it in tests): for people and `kubectl`, and recorded as `previousExpiry`; no decision
//! reads them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};

use kube::Resource;

use super::cluster::{ApiError, ClusterApi, StoredRun};
use super::identity::HolderId;
use crate::api::{AgentRun, Time};
use crate::engine::{lease_liveness, LeaseLiveness, LeaseView};

mod cell;
pub mod observation;
pub mod presence;

pub use cell::LeaseCell;

/// The label selecting the Leases this controller manages.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "agentrt";

/// The uid of the AgentRun a Lease belongs to: its controller ownerReference's (the first
/// ownerReference when none is marked controller); `None` when it names no owner.
pub fn owner_uid(lease: &Lease) -> Option<&str> {
    let owners = lease
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    owners
        .iter()
        .find(|owner| owner.controller == Some(true))
        .or_else(|| owners.first())
        .map(|owner| owner.uid.as_str())
}

/// Whether `lease` is the Lease of the run whose uid is `run_uid` (docs/design.md section 2,
/// Lease): owned by it. A Lease of that name owned by another uid was left by a deleted run of
/// the same name; it is never adopted, renewed or judged as this run's.
pub fn owned_by(lease: &Lease, run_uid: &str) -> bool {
    owner_uid(lease) == Some(run_uid)
}

/// The run's own Lease among what was read: `read` when it is owned by `run_uid`, `None` when
/// it is absent or another run's ([`owned_by`]).
pub fn own<'a>(read: Option<&'a Lease>, run_uid: &str) -> Option<&'a Lease> {
    read.filter(|lease| owned_by(lease, run_uid))
}

/// What a Lease as read says (holder, renewTime, duration), with no observation: as first seen
/// now, judged with no margin. [`observed`] adds what this replica has seen of it.
pub fn view(lease: Option<&Lease>) -> LeaseView {
    observed(lease, 0, 0)
}

/// What the engine sees of a Lease as read: what it says, seen unchanged by this replica for
/// `unchanged_for_ms` milliseconds (its monotonic clock), judged with `takeover_margin_ms`
/// milliseconds of margin beyond `leaseDurationSeconds`.
pub fn observed(
    lease: Option<&Lease>,
    unchanged_for_ms: u64,
    takeover_margin_ms: u64,
) -> LeaseView {
    let Some(spec) = lease.and_then(|lease| lease.spec.as_ref()) else {
        return LeaseView {
            unchanged_for_ms,
            takeover_margin_ms,
            ..LeaseView::default()
        };
    };
    LeaseView {
        holder: spec
            .holder_identity
            .clone()
            .filter(|holder| !holder.is_empty()),
        renewed_at: spec
            .renew_time
            .as_ref()
            .or(spec.acquire_time.as_ref())
            .map(|time| Time(time.0)),
        duration_seconds: spec.lease_duration_seconds.map(i64::from),
        unchanged_for_ms,
        takeover_margin_ms,
    }
}

/// The Lease this replica holds on one run, as last written.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldLease {
    /// The Lease object as the API server returned it after our last write.
    pub lease: Lease,
    /// The renewTime we wrote, by our wall clock (shown, never decided on).
    pub renewed_at: Time,
    /// When the write the API server acknowledged (the acquisition or the last renewal) was
    /// sent, on this replica's monotonic clock: the start of the lease's life for the holder's
    /// own check.
    pub sent_at: Instant,
    /// `leaseDurationSeconds`.
    pub duration_seconds: i64,
}

impl HeldLease {
    /// How much of the lease's life is left at `at` (this replica's monotonic clock), minus
    /// `skew_margin`: `sent_at` + `leaseDurationSeconds` − `skew_margin` − `at`, zero when past.
    pub fn remaining(&self, at: Instant, skew_margin: Duration) -> Duration {
        let duration = Duration::from_secs(self.duration_seconds.max(0).unsigned_abs());
        duration
            .saturating_sub(skew_margin)
            .saturating_sub(at.saturating_duration_since(self.sent_at))
    }

    /// The holder's own check before a side effect (docs/behaviours.md 29): true while the last
    /// acknowledged renewal's send instant + duration − `skew_margin` lies ahead of `at`, on
    /// this replica's monotonic clock.
    pub fn may_start_side_effect(&self, at: Instant, skew_margin: Duration) -> bool {
        !self.remaining(at, skew_margin).is_zero()
    }
}

fn micro(time: Time) -> MicroTime {
    MicroTime(time.0)
}

/// The labels every agentrt Lease carries: [`MANAGED_BY_LABEL`] = [`MANAGED_BY`] (what the
/// Lease watch selects on).
pub fn managed_by_labels() -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())])
}

/// The ownerReference of a run's Lease: the AgentRun `name` with `uid`, as its controller (so
/// the Lease is deleted with the run; docs/design.md section 2, Lease).
pub fn run_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: AgentRun::api_version(&()).into_owned(),
        kind: AgentRun::kind(&()).into_owned(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn fresh_lease(run: &StoredRun, holder: &HolderId, now: Time, duration_seconds: i64) -> Lease {
    let snapshot = &run.snapshot;
    Lease {
        metadata: ObjectMeta {
            name: Some(snapshot.name.clone()),
            namespace: Some(snapshot.namespace.clone()),
            labels: Some(managed_by_labels()),
            owner_references: Some(vec![run_owner(&snapshot.name, &snapshot.uid)]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.as_str().to_string()),
            acquire_time: Some(micro(now)),
            renew_time: Some(micro(now)),
            lease_duration_seconds: Some(i32::try_from(duration_seconds).unwrap_or(i32::MAX)),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
    }
}

/// When a Lease, as this replica has observed it (`seen`, from [`observed`]), is held by
/// another holder and not expired by the engine's rule ([`lease_liveness`]: seen unchanged for
/// `leaseDurationSeconds` plus the margin): the milliseconds until it would be, if nothing
/// changes. `None` when it is absent, released, ours, or expired. `fallback_duration_seconds`
/// (the run's `spec.leaseDurationSeconds`) stands in for a Lease that names no duration.
pub fn held_by_another(
    seen: &LeaseView,
    holder: &HolderId,
    fallback_duration_seconds: i64,
) -> Option<u64> {
    if seen.holder.as_deref() == Some(holder.as_str()) {
        return None;
    }
    match lease_liveness(seen, fallback_duration_seconds) {
        LeaseLiveness::Live { millis } => Some(millis),
        LeaseLiveness::Free | LeaseLiveness::Expired => None,
    }
}

/// Wins the run's Lease by compare-and-set over `read` (the Lease as read when the engine
/// decided to acquire it, live or as the Lease watch delivered it; `None` when it was absent),
/// which this replica has observed as `seen` ([`observed`]). `Ok(None)` when another replica
/// won (a 409, also for a `read` that was not the latest), when `read` is gone (a 404), or when
/// `read` is still held by another
/// holder ([`held_by_another`]): a live Lease is never taken, whatever asked for it; only an
/// expired, released or absent one is (docs/design.md section 4). `now` (this replica's wall clock)
/// is written as renewTime, for people; the holder's own check runs from the instant the write
/// was sent.
///
/// A `read` owned by another uid ([`owned_by`]: a deleted run of the same name left it, its
/// executor perhaps still finishing a call) is never adopted: it is deleted with preconditions
/// on its uid and resourceVersion, then a fresh Lease owned by this run is created. `seen`
/// then describes no Lease (the caller judges only the run's own, [`own`]). A precondition
/// that fails means someone else replaced or changed it: `Ok(None)`, look again.
///
/// # Errors
/// When the API server fails otherwise.
pub async fn acquire(
    api: &dyn ClusterApi,
    run: &StoredRun,
    read: Option<&Lease>,
    seen: &LeaseView,
    holder: &HolderId,
    now: Time,
) -> Result<Option<HeldLease>, ApiError> {
    let duration_seconds = run.snapshot.spec.lease_duration_seconds;
    if held_by_another(seen, holder, duration_seconds).is_some() {
        return Ok(None);
    }
    let namespace = &run.snapshot.namespace;
    let read = match read {
        Some(foreign) if !owned_by(foreign, &run.snapshot.uid) => {
            let name = foreign.metadata.name.as_deref().unwrap_or_default();
            let uid = foreign.metadata.uid.as_deref().unwrap_or_default();
            let version = foreign
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default();
            tracing::info!(
                lease = name,
                owner = ?owner_uid(foreign),
                "the Lease belongs to another run of this name (deleted); replacing it"
            );
            match api.delete_lease(namespace, name, uid, version).await {
                Ok(()) | Err(ApiError::NotFound(_)) => None,
                Err(ApiError::Conflict(_)) => return Ok(None),
                Err(err) => return Err(err),
            }
        }
        read => read,
    };
    let sent_at = Instant::now();
    let written = match read {
        None => {
            api.create_lease(namespace, &fresh_lease(run, holder, now, duration_seconds))
                .await
        }
        Some(read) => {
            let mut lease = read.clone();
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            let changed = spec.holder_identity.as_deref() != Some(holder.as_str());
            if changed {
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                spec.acquire_time = Some(micro(now));
            }
            spec.holder_identity = Some(holder.as_str().to_string());
            spec.renew_time = Some(micro(now));
            spec.lease_duration_seconds = Some(i32::try_from(duration_seconds).unwrap_or(i32::MAX));
            api.replace_lease(namespace, &lease).await
        }
    };
    match written {
        Ok(lease) => Ok(Some(HeldLease {
            lease,
            renewed_at: now,
            sent_at,
            duration_seconds,
        })),
        // Another replica won, or the version read (possibly the watch's, a past one) is gone:
        // look again.
        Err(ApiError::Conflict(_) | ApiError::NotFound(_)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// How a renewal ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Renewal {
    /// Renewed; the new state.
    Renewed(Box<HeldLease>),
    /// Another holder (or nobody) holds the Lease now.
    Lost {
        /// Who holds it.
        holder: Option<String>,
    },
}

/// How one compare-and-set on a Lease this replica holds ended ([`while_ours`]).
enum Swap {
    /// The write landed; the Lease as stored now, and when the write was sent.
    Written(Box<Lease>, Instant),
    /// The Lease is no longer ours: another holder (`Some`), released, or gone (`None`).
    NotOurs(Option<String>),
}

/// The compare-and-set renew and release share: while `base` (the Lease as last written or
/// read) is still held by `holder` and owned by the same run, write `edit(base)` on its
/// resourceVersion. A 409 re-reads the Lease and tries again on the fresh version while it is
/// still ours (someone touched it without taking it, e.g. this replica's other renewal), at
/// most [`SWAP_ATTEMPTS`] times; a 404, or a re-read finding it gone, is
/// [`Swap::NotOurs`]`(None)`.
///
/// # Errors
/// When the API server fails otherwise, and [`ApiError::Conflict`] when every attempt met a
/// 409 while the Lease was still ours: that is a renewal that did not happen, not a lost lease
/// (the caller decides by its monotonic clock; docs/design.md section 4). Reporting it as lost
/// made a busy replica give up runs it still held, and another take them over.
async fn while_ours(
    api: &dyn ClusterApi,
    base: &Lease,
    holder: &HolderId,
    edit: impl Fn(&mut LeaseSpec),
) -> Result<Swap, ApiError> {
    let namespace = base.metadata.namespace.clone().unwrap_or_default();
    let name = base.metadata.name.clone().unwrap_or_default();
    let run_uid = owner_uid(base).map(str::to_string);
    let mut base = base.clone();
    for _ in 0..SWAP_ATTEMPTS {
        let current = base
            .spec
            .as_ref()
            .and_then(|spec| spec.holder_identity.clone());
        // Same holder, another run's Lease (the run was deleted and created again under its
        // name, and this replica holds the new one's): not ours.
        if current.as_deref() != Some(holder.as_str())
            || owner_uid(&base).map(str::to_string) != run_uid
        {
            return Ok(Swap::NotOurs(current));
        }
        let mut lease = base.clone();
        if let Some(spec) = lease.spec.as_mut() {
            edit(spec);
        }
        let sent_at = Instant::now();
        match api.replace_lease(&namespace, &lease).await {
            Ok(lease) => return Ok(Swap::Written(Box::new(lease), sent_at)),
            Err(ApiError::Conflict(_)) => match api.get_lease(&namespace, &name).await? {
                Some(fresh) => base = fresh,
                None => return Ok(Swap::NotOurs(None)),
            },
            Err(ApiError::NotFound(_)) => return Ok(Swap::NotOurs(None)),
            Err(err) => return Err(err),
        }
    }
    let same_run = owner_uid(&base).map(str::to_string) == run_uid;
    let current = base.spec.and_then(|spec| spec.holder_identity);
    if current.as_deref() == Some(holder.as_str()) && same_run {
        return Err(ApiError::Conflict(format!(
            "Lease {namespace}/{name} changed under each of {SWAP_ATTEMPTS} writes while still held by {holder}"
        )));
    }
    Ok(Swap::NotOurs(current))
}

/// How many compare-and-set writes [`while_ours`] tries while the Lease stays ours.
pub const SWAP_ATTEMPTS: usize = 3;

/// Renews `held` by compare-and-set ([`while_ours`]), writing `now` (this replica's wall clock)
/// as renewTime. A 409 re-reads the Lease: still ours (someone touched it without taking it) →
/// renew on the fresh version; another holder → [`Renewal::Lost`].
///
/// # Errors
/// When the API server fails otherwise (the caller decides, by its monotonic clock, whether the
/// lease is lost).
pub async fn renew(
    api: &dyn ClusterApi,
    held: &HeldLease,
    holder: &HolderId,
    now: Time,
) -> Result<Renewal, ApiError> {
    let renewed = while_ours(api, &held.lease, holder, |spec| {
        spec.renew_time = Some(micro(now));
    })
    .await?;
    Ok(match renewed {
        Swap::Written(lease, sent_at) => Renewal::Renewed(Box::new(HeldLease {
            lease: *lease,
            renewed_at: now,
            sent_at,
            duration_seconds: held.duration_seconds,
        })),
        Swap::NotOurs(holder) => Renewal::Lost { holder },
    })
}

/// Releases `held`: clears the holder by compare-and-set ([`while_ours`]), only if it is still
/// ours.
///
/// # Errors
/// When the API server fails (the Lease then simply expires).
pub async fn release(
    api: &dyn ClusterApi,
    held: &HeldLease,
    holder: &HolderId,
) -> Result<(), ApiError> {
    while_ours(api, &held.lease, holder, |spec| spec.holder_identity = None).await?;
    Ok(())
}

#[cfg(test)]
mod tests;
