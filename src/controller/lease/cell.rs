//! The lease an executor holds ([`LeaseCell`]), shared with its renewal task: renewed every
//! third of its duration and before a call when half is spent, one write at a time; won back
//! after a call when nobody took it; released, or deleted when its run ended (docs/design.md
//! section 4).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{release, renew, HeldLease, Renewal};
use crate::controller::cluster::{ApiError, ClusterApi};
use crate::controller::identity::{Clock, HolderId};

/// The lease an executor holds, shared between the executor and its renewal task.
#[derive(Debug)]
pub struct LeaseCell {
    held: Mutex<HeldLease>,
    lost: AtomicBool,
    released: AtomicBool,
    /// Held across every write of the Lease (the renewal task's, the executor's before a call,
    /// a win-back, the release, the deletion): one write at a time, each from the Lease as the
    /// one before it left it, so the executor and its renewal task never send two writes on one
    /// resourceVersion (issue 35).
    writing: tokio::sync::Mutex<()>,
}

impl LeaseCell {
    /// Starts holding `held`.
    pub fn new(held: HeldLease) -> Arc<LeaseCell> {
        Arc::new(LeaseCell {
            held: Mutex::new(held),
            lost: AtomicBool::new(false),
            released: AtomicBool::new(false),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// The lease as last written.
    pub fn held(&self) -> HeldLease {
        match self.held.lock() {
            Ok(held) => held.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, held: HeldLease) {
        match self.held.lock() {
            Ok(mut slot) => *slot = held,
            Err(poisoned) => *poisoned.into_inner() = held,
        }
    }

    /// True once a renewal found another holder or the lease expired unrenewed.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks the lease lost.
    pub fn mark_lost(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    /// True once released.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    /// The holder's own check before a side effect (docs/behaviours.md 29): not lost, and the last
    /// acknowledged renewal's send instant + duration − skew margin ahead of now, on this
    /// replica's monotonic clock.
    pub fn may_start_side_effect(&self, skew_margin: Duration) -> bool {
        !self.is_lost()
            && !self.is_released()
            && self
                .held()
                .may_start_side_effect(Instant::now(), skew_margin)
    }

    /// Milliseconds of life the lease has left on this replica's monotonic clock, minus
    /// `skew_margin` (0 when lost, released or expired).
    pub fn remaining_millis(&self, skew_margin: Duration) -> u64 {
        if self.is_lost() || self.is_released() {
            return 0;
        }
        let left = self.held().remaining(Instant::now(), skew_margin);
        u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
    }

    /// Renews now (writing `clock`'s time as renewTime), unless more than half the lease's life
    /// is left; false when the lease is lost (another holder, or renewals failing past its
    /// expiry). Used before the write that precedes a side effect, so a start is not recorded
    /// under a lease about to lapse.
    pub async fn renew_if_half_spent(
        &self,
        api: &dyn ClusterApi,
        holder: &HolderId,
        clock: &Clock,
        skew_margin: Duration,
        on_renew_failed: impl Fn(),
    ) -> bool {
        let _one_write = self.writing.lock().await;
        let held = self.held();
        let half = held
            .duration_seconds
            .max(0)
            .unsigned_abs()
            .saturating_mul(500);
        if self.remaining_millis(skew_margin) > half {
            return true;
        }
        if self.is_lost() || self.is_released() {
            return false;
        }
        match renew(api, &held, holder, clock.now()).await {
            Ok(Renewal::Renewed(renewed)) => {
                self.set(*renewed);
                true
            }
            Ok(Renewal::Lost { holder: other }) => {
                tracing::warn!(lease = ?held.lease.metadata.name, holder = ?other, "lease lost: another holder renewed or took it");
                self.mark_lost();
                false
            }
            Err(err) => {
                tracing::info!(lease = ?held.lease.metadata.name, %err, "lease renewal failed");
                on_renew_failed();
                self.may_start_side_effect(skew_margin)
            }
        }
    }

    /// Wins back a lease this replica lost while a call was in flight (renewals that failed
    /// past its expiry), when nobody took it meanwhile (docs/design.md section 5, a lease won
    /// back): renews the Lease as last written by compare-and-set ([`renew`]), which lands only
    /// while the Lease still names this holder and this run; a Lease another replica took (or
    /// released after taking) is never won back. True when renewed: the lease is held again
    /// (its life counted from this renewal's send instant). False when released, another
    /// holder has it, or the API server fails (the lease stays lost).
    pub async fn regain(&self, api: &dyn ClusterApi, holder: &HolderId, clock: &Clock) -> bool {
        if self.is_released() {
            return false;
        }
        let _one_write = self.writing.lock().await;
        let held = self.held();
        match renew(api, &held, holder, clock.now()).await {
            Ok(Renewal::Renewed(renewed)) => {
                self.set(*renewed);
                self.lost.store(false, Ordering::SeqCst);
                true
            }
            Ok(Renewal::Lost { holder: other }) => {
                tracing::info!(lease = ?held.lease.metadata.name, holder = ?other, "the lease cannot be won back: another holder took it");
                false
            }
            Err(err) => {
                tracing::info!(lease = ?held.lease.metadata.name, %err, "the lease cannot be won back");
                false
            }
        }
    }

    /// Deletes the Lease of a run that ended ([`crate::engine::lease_release_needed`]: no
    /// replica waits for it, and a finished run keeps no Lease, docs/design.md section 4), on
    /// the uid and resourceVersion last written. On a conflict the Lease is read once more and
    /// deleted on its new resourceVersion while it still names `holder` and this run; a Lease
    /// another holder (or another run of the name) wrote since is left, and goes with its run
    /// (its ownerReference). Renewals and a later [`LeaseCell::release`] then write nothing. A
    /// lost lease is not touched. Errors are logged, never returned: the Lease then goes with
    /// the run.
    pub async fn delete_ended(&self, api: &dyn ClusterApi, holder: &HolderId) {
        if self.is_lost() || self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let _one_write = self.writing.lock().await;
        let mut lease = self.held().lease;
        let run_uid = super::owner_uid(&lease).map(str::to_string);
        // One re-read on a conflict: a write this replica made that the cell did not see
        // moved the resourceVersion; the Lease is deleted only while it still names this
        // holder and this run.
        for attempt in 0..2 {
            let meta = &lease.metadata;
            let namespace = meta.namespace.clone().unwrap_or_default();
            let name = meta.name.clone().unwrap_or_default();
            let result = api
                .delete_lease(
                    &namespace,
                    &name,
                    meta.uid.as_deref().unwrap_or_default(),
                    meta.resource_version.as_deref().unwrap_or_default(),
                )
                .await;
            match result {
                Ok(()) | Err(ApiError::NotFound(_)) => return,
                Err(ApiError::Conflict(_)) if attempt == 0 => {
                    match api.get_lease(&namespace, &name).await {
                        Ok(Some(fresh))
                            if fresh
                                .spec
                                .as_ref()
                                .and_then(|spec| spec.holder_identity.as_deref())
                                == Some(holder.as_str())
                                && super::owner_uid(&fresh).map(str::to_string) == run_uid =>
                        {
                            lease = fresh;
                        }
                        _ => {
                            tracing::debug!(lease = %name, "the ended run's Lease is another's now; it goes with its run");
                            return;
                        }
                    }
                }
                Err(ApiError::Conflict(_)) => {
                    tracing::debug!(lease = %name, "the ended run's Lease changed since; it goes with the run");
                    return;
                }
                Err(err) => {
                    tracing::info!(lease = %name, %err, "cannot delete the ended run's Lease; it goes with the run");
                    return;
                }
            }
        }
    }

    /// Releases the lease if it is still held (not lost, not released).
    pub async fn release(&self, api: &dyn ClusterApi, holder: &HolderId) {
        if self.is_lost() || self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        let _one_write = self.writing.lock().await;
        let held = self.held();
        if let Err(err) = release(api, &held, holder).await {
            tracing::warn!(lease = ?held.lease.metadata.name, %err, "cannot release the lease; it will expire");
        }
    }

    /// Renews the lease a third of its duration after its last acknowledged renewal, its own
    /// or the executor's before a call (writing `clock`'s time as renewTime), always on the
    /// resourceVersion held at that moment, until
    /// it is lost or released, or `stop` fires. A renewal that finds another holder, or that
    /// fails until the lease has expired on this replica's monotonic clock (the last
    /// acknowledged renewal's send instant + duration), marks it lost and calls `on_lost`; each
    /// renewal the API server does not answer calls `on_renew_failed`.
    pub async fn keep_renewed(
        self: Arc<LeaseCell>,
        api: Arc<dyn ClusterApi>,
        holder: HolderId,
        clock: Clock,
        stop: tokio_util::sync::CancellationToken,
        on_lost: impl Fn() + Send,
        on_renew_failed: impl Fn() + Send,
    ) {
        let mut failed = false;
        loop {
            let (period, since_renewed) = {
                let held = self.held();
                let period = Duration::from_millis(
                    u64::try_from(held.duration_seconds.max(1)).unwrap_or(1) * 1000 / 3,
                );
                (period, held.sent_at.elapsed())
            };
            // A third of the duration after the last acknowledged renewal, whoever made it (the
            // executor renews too, before a call when half is spent); after a failure, a third
            // of the duration after it.
            let wait = if failed {
                period
            } else {
                period.saturating_sub(since_renewed)
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            if self.is_lost() || self.is_released() {
                return;
            }
            // The lease as held now, not as it was before the wait: a renewal made meanwhile
            // moved its resourceVersion, and renewing the older one could only conflict. The
            // executor's own renewal waits for this one, and this one for it.
            let _one_write = self.writing.lock().await;
            if self.is_lost() || self.is_released() {
                return;
            }
            let held = self.held();
            if !failed && held.sent_at.elapsed() < period {
                continue;
            }
            let now = clock.now();
            match renew(api.as_ref(), &held, &holder, now).await {
                Ok(Renewal::Renewed(renewed)) => {
                    // Kept even when a release or deletion is waiting for this write: it is
                    // the resourceVersion they must write on.
                    self.set(*renewed);
                    if self.is_released() {
                        return;
                    }
                    failed = false;
                }
                Ok(Renewal::Lost { holder: other }) => {
                    tracing::warn!(lease = ?held.lease.metadata.name, holder = ?other, "lease lost: another holder renewed or took it");
                    self.mark_lost();
                    on_lost();
                    return;
                }
                Err(err) => {
                    failed = true;
                    on_renew_failed();
                    if !held.may_start_side_effect(Instant::now(), Duration::ZERO) {
                        tracing::warn!(lease = ?held.lease.metadata.name, %err, "lease lost: renewals failed past its expiry");
                        self.mark_lost();
                        on_lost();
                        return;
                    }
                    tracing::info!(lease = ?held.lease.metadata.name, %err, "lease renewal failed; retrying");
                }
            }
        }
    }
}
