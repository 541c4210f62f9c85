//! Each replica's presence Lease (issue 15): a `coordination.k8s.io/v1` Lease per replica and
//! watched namespace, so that the other replicas know it before it takes any run.
//!
//! Without it a replica learns of its peers only from the run Leases they hold. Replicas that
//! start together therefore know none for their first runs: each ranks itself first for every
//! new run ([`super::spread`]) and all of them race to create its Lease, all but one losing
//! with a 409. A presence Lease is created before the replica is ready, renewed every third of
//! [`PRESENCE_SECONDS`], and deleted when the replica stops. The Lease watch already selects
//! it (it carries agentrt's label), so its holder counts among the replicas
//! ([`super::lease::observation::LeaseObservations::holders_seen`]) from the first event;
//! its deletion ends that at once.
//!
//! A presence Lease decides nothing about a run: the spread only delays a replica's first try
//! of a new run, and the run's own Lease stays the compare-and-set that decides who holds it
//! (docs/design.md section 4). Losing one (an API server error, a run that takes its name and
//! deletes it as another run's Lease) costs only races for new runs again.
//!
//! Shape: named [`PRESENCE_PREFIX`] + the holder identity ([`lease_name`]), labelled
//! [`super::lease::MANAGED_BY_LABEL`] and [`PRESENCE_LABEL`], no owner, `holderIdentity` the
//! replica, `leaseDurationSeconds` [`PRESENCE_SECONDS`]. A replica killed without stopping
//! leaves its presence Lease; any replica that has seen it unchanged for [`STALE_AFTER`] on its
//! own monotonic clock (the rule a run's Lease is judged by) deletes it, with preconditions on
//! its uid and resourceVersion.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use tokio_util::sync::CancellationToken;

use super::cluster::{ApiError, ClusterApi};
use super::identity::{Clock, HolderId};
use super::lease::observation::LeaseObservations;
use super::lease::{MANAGED_BY, MANAGED_BY_LABEL};

/// The label that marks a replica's presence Lease (value [`PRESENCE_VALUE`]).
pub const PRESENCE_LABEL: &str = "agentrt.dev/presence";

/// The value of [`PRESENCE_LABEL`].
pub const PRESENCE_VALUE: &str = "replica";

/// What every presence Lease's name starts with.
pub const PRESENCE_PREFIX: &str = "agentrt-replica-";

/// `leaseDurationSeconds` of a presence Lease; it is renewed every third of it (10 s). The
/// same as [`super::spread::PEER_MEMORY`], so a replica renewing it stays a peer.
pub const PRESENCE_SECONDS: u64 = 30;

/// A presence Lease seen unchanged this long (monotonic, by the replica that sees it) is
/// deleted as one a killed replica left: 20 of its durations (10 minutes).
pub const STALE_AFTER: Duration = Duration::from_secs(PRESENCE_SECONDS * 20);

/// The namespace a replica watching all namespaces announces itself in when
/// `--presence-namespace` (env `POD_NAMESPACE`) is not given.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The name of `holder`'s presence Lease: [`PRESENCE_PREFIX`] + the holder identity,
/// lowercased, every character a Lease name may not hold replaced by `-`, cut to 253 bytes
/// (a DNS subdomain, as Lease names must be).
pub fn lease_name(holder: &HolderId) -> String {
    let mut name = String::from(PRESENCE_PREFIX);
    name.extend(holder.as_str().chars().map(|c| {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
            c
        } else {
            '-'
        }
    }));
    name.truncate(253);
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    name
}

/// Whether `lease` is a replica's presence Lease (it carries [`PRESENCE_LABEL`]).
pub fn is_presence(lease: &Lease) -> bool {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(PRESENCE_LABEL))
        .is_some_and(|value| value == PRESENCE_VALUE)
}

/// `holder`'s presence Lease in `namespace`, renewed at `now` (this replica's wall clock, for
/// people: no replica judges it by its times).
pub fn presence_lease(holder: &HolderId, namespace: &str, now: MicroTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(holder)),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
                (PRESENCE_LABEL.to_string(), PRESENCE_VALUE.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.as_str().to_string()),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_duration_seconds: Some(PRESENCE_SECONDS as i32),
            ..LeaseSpec::default()
        }),
    }
}

/// One replica's presence Leases: one per namespace it announces itself in.
pub struct Presence {
    api: Arc<dyn ClusterApi>,
    holder: HolderId,
    clock: Clock,
    /// Per namespace, the Lease as last written (`None`: not written yet, or lost).
    written: Vec<(String, Option<Lease>)>,
}

impl Presence {
    /// The presence of `holder` in each of `namespaces` (not written yet).
    pub fn new(
        api: Arc<dyn ClusterApi>,
        holder: HolderId,
        clock: Clock,
        namespaces: &[String],
    ) -> Presence {
        let mut namespaces = namespaces.to_vec();
        namespaces.sort();
        namespaces.dedup();
        Presence {
            api,
            holder,
            clock,
            written: namespaces.into_iter().map(|ns| (ns, None)).collect(),
        }
    }

    /// Writes each presence Lease: created when this replica has written none yet, else
    /// replaced on the version last written; a 409 reads the stored one and replaces that
    /// (a presence Lease has one writer, so the stored one is a leftover of this holder's
    /// name or a write whose answer was lost), a 404 creates it again. Failures are logged
    /// and tried again at the next call: presence is never worth stopping for.
    pub async fn announce(&mut self) {
        let now = MicroTime(self.clock.now().0);
        for (namespace, written) in &mut self.written {
            let fresh = presence_lease(&self.holder, namespace, now.clone());
            let result = match written.take() {
                None => match self.api.create_lease(namespace, &fresh).await {
                    Err(ApiError::Conflict(_)) => {
                        replace_stored(self.api.as_ref(), namespace, fresh).await
                    }
                    other => other.map(Some),
                },
                Some(last) => {
                    // Renewed: the same acquireTime, a new renewTime.
                    let mut lease = last;
                    let acquired = lease.spec.as_ref().and_then(|s| s.acquire_time.clone());
                    lease.spec = fresh.spec.clone();
                    if let Some(spec) = lease.spec.as_mut().filter(|_| acquired.is_some()) {
                        spec.acquire_time = acquired;
                    }
                    match self.api.replace_lease(namespace, &lease).await {
                        Err(ApiError::Conflict(_)) => {
                            replace_stored(self.api.as_ref(), namespace, fresh).await
                        }
                        Err(ApiError::NotFound(_)) => {
                            self.api.create_lease(namespace, &fresh).await.map(Some)
                        }
                        other => other.map(Some),
                    }
                }
            };
            match result {
                Ok(lease) => *written = lease,
                Err(err) => {
                    tracing::info!(%namespace, %err, "cannot write this replica's presence Lease; other replicas may race it for new runs");
                }
            }
        }
    }

    /// Deletes each presence Lease this replica wrote (preconditions: its uid and the version
    /// last written), so the other replicas stop counting it at once.
    pub async fn withdraw(&mut self) {
        for (namespace, written) in &mut self.written {
            let Some(lease) = written.take() else {
                continue;
            };
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            let uid = lease.metadata.uid.as_deref().unwrap_or_default();
            let version = lease
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default();
            match self.api.delete_lease(namespace, name, uid, version).await {
                Ok(()) | Err(ApiError::NotFound(_)) => {}
                Err(err) => {
                    tracing::info!(%namespace, %err, "cannot delete this replica's presence Lease; it goes once seen unchanged for 10 minutes");
                }
            }
        }
    }

    /// Deletes the presence Leases of other replicas that `observations` has seen unchanged
    /// for [`STALE_AFTER`] (left by a replica killed without stopping), with preconditions on
    /// their uid and resourceVersion: a renewal meanwhile makes the delete fail, and the
    /// Lease stays. Returns how many were deleted.
    pub async fn sweep(&self, observations: &LeaseObservations) -> usize {
        let mut deleted = 0;
        for lease in observations.stale_presence(std::time::Instant::now(), STALE_AFTER) {
            if lease
                .spec
                .as_ref()
                .and_then(|spec| spec.holder_identity.as_deref())
                == Some(self.holder.as_str())
            {
                continue;
            }
            let namespace = lease.metadata.namespace.as_deref().unwrap_or_default();
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            let uid = lease.metadata.uid.as_deref().unwrap_or_default();
            let version = lease
                .metadata
                .resource_version
                .as_deref()
                .unwrap_or_default();
            match self.api.delete_lease(namespace, name, uid, version).await {
                Ok(()) => {
                    tracing::info!(%namespace, lease = name, "deleted the presence Lease of a replica gone for 10 minutes");
                    deleted += 1;
                }
                Err(ApiError::NotFound(_) | ApiError::Conflict(_)) => {}
                Err(err) => {
                    tracing::debug!(%namespace, lease = name, %err, "cannot delete a stale presence Lease");
                }
            }
        }
        deleted
    }

    /// Renews every third of [`PRESENCE_SECONDS`] and sweeps stale presence Leases until
    /// `stop` fires, then withdraws. The first [`Presence::announce`] is the caller's, before
    /// it takes runs.
    pub async fn keep(mut self, ctx: Arc<super::context::Context>, stop: CancellationToken) {
        let period = Duration::from_secs(PRESENCE_SECONDS / 3);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
            self.announce().await;
            self.sweep(&ctx.leases).await;
        }
        self.withdraw().await;
    }
}

/// After a 409 on `holder`'s own presence Lease: replace the stored one with `fresh`'s spec.
async fn replace_stored(
    api: &dyn ClusterApi,
    namespace: &str,
    fresh: Lease,
) -> Result<Option<Lease>, ApiError> {
    let name = fresh.metadata.name.clone().unwrap_or_default();
    let Some(mut stored) = api.get_lease(namespace, &name).await? else {
        return api.create_lease(namespace, &fresh).await.map(Some);
    };
    if !is_presence(&stored) {
        tracing::warn!(%namespace, lease = %name, "a Lease that is not a presence Lease has this replica's presence name; not announcing in this namespace");
        return Ok(None);
    }
    stored.spec = fresh.spec;
    api.replace_lease(namespace, &stored).await.map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fake::FakeApi;

    fn holder(name: &str) -> HolderId {
        HolderId::with_random_suffix(name)
    }

    #[test]
    fn a_presence_lease_name_is_a_dns_subdomain_that_starts_with_the_prefix() {
        let name = lease_name(&holder("Pod_Name.X"));
        assert!(name.starts_with("agentrt-replica-pod-name.x-"), "{name}");
        assert!(name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'));
        let long = lease_name(&holder(&"a".repeat(300)));
        assert!(long.len() <= 253, "{}", long.len());
        assert!(!long.ends_with('-'));
    }

    #[tokio::test]
    async fn announcing_creates_then_renews_and_withdrawing_deletes() {
        let api = Arc::new(FakeApi::default());
        let me = holder("a");
        let mut presence = Presence::new(
            api.clone(),
            me.clone(),
            Clock::default(),
            &["ns".to_string(), "ns".to_string()],
        );
        presence.announce().await;
        let first = api.lease("ns", &lease_name(&me)).expect("created");
        assert!(is_presence(&first));
        assert_eq!(
            first.spec.as_ref().and_then(|s| s.holder_identity.clone()),
            Some(me.as_str().to_string())
        );
        presence.announce().await;
        let second = api.lease("ns", &lease_name(&me)).expect("renewed");
        assert_ne!(
            first.metadata.resource_version,
            second.metadata.resource_version
        );
        // Deleted behind its back (a run of that name took it): created again.
        api.delete_lease(
            "ns",
            &lease_name(&me),
            "",
            second.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap();
        presence.announce().await;
        assert!(api.lease("ns", &lease_name(&me)).is_some());
        presence.withdraw().await;
        assert!(api.lease("ns", &lease_name(&me)).is_none());
    }

    #[tokio::test]
    async fn a_leftover_of_the_same_name_is_replaced_and_a_run_lease_is_left_alone() {
        let api = Arc::new(FakeApi::default());
        let me = holder("a");
        let leftover = presence_lease(&me, "ns", MicroTime(Clock::default().now().0));
        api.create_lease("ns", &leftover).await.unwrap();
        let mut presence = Presence::new(api.clone(), me.clone(), Clock::default(), &["ns".into()]);
        presence.announce().await;
        assert!(presence.written[0].1.is_some(), "the leftover is replaced");

        // A run's Lease under the presence name is never written over.
        let other = holder("b");
        let mut run_lease = presence_lease(&other, "ns", MicroTime(Clock::default().now().0));
        run_lease.metadata.labels = Some(crate::controller::lease::managed_by_labels());
        api.create_lease("ns", &run_lease).await.unwrap();
        let mut presence =
            Presence::new(api.clone(), other.clone(), Clock::default(), &["ns".into()]);
        presence.announce().await;
        assert!(presence.written[0].1.is_none());
        let stored = api.lease("ns", &lease_name(&other)).unwrap();
        assert!(!is_presence(&stored));
    }
}
