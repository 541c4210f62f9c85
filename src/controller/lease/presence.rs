//! Each replica's presence Lease (issue 15): a `coordination.k8s.io/v1` Lease per replica and
//! watched namespace, so that the other replicas know it before it takes any run.
//!
//! Without it a replica learns of its peers only from the run Leases they hold. Replicas that
//! start together therefore know none for their first runs: each ranks itself first for every
//! new run ([`crate::controller::spread`]) and all of them race to create its Lease, all but one losing
//! with a 409. A presence Lease is created before the replica is ready, renewed every third of
//! [`PRESENCE_SECONDS`], and deleted when the replica stops. The Lease watch already selects
//! it (it carries agentrt's label), so its holder counts among the replicas
//! ([`super::observation::LeaseObservations::holders_seen`]) from the first event;
//! its deletion ends that at once.
//!
//! A presence Lease decides nothing about a run: the spread only delays a replica's first try
//! of a new run, a live one lets an observer whose run watch runs more than a minute behind
//! wait that lag out before it reads a run whose Lease its holder stopped renewing
//! ([`crate::engine::observer_wait`]), and the run's own Lease stays the compare-and-set that
//! decides who holds it (docs/design.md section 4). Losing one (an API server error, a run that takes its name and
//! deletes it as another run's Lease) costs only races for new runs again.
//!
//! Shape: named [`PRESENCE_PREFIX`] + the holder identity ([`lease_name`]), labelled
//! [`super::MANAGED_BY_LABEL`] and [`PRESENCE_LABEL`], no owner, `holderIdentity` the
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

use super::observation::LeaseObservations;
use super::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::controller::cluster::{ApiError, ClusterApi};
use crate::controller::identity::{Clock, HolderId};

/// The label that marks a replica's presence Lease (value [`PRESENCE_VALUE`]).
pub const PRESENCE_LABEL: &str = "agentrt.dev/presence";

/// The value of [`PRESENCE_LABEL`].
pub const PRESENCE_VALUE: &str = "replica";

/// What every presence Lease's name starts with.
pub const PRESENCE_PREFIX: &str = "agentrt-replica-";

/// `leaseDurationSeconds` of a presence Lease; it is renewed every third of it (10 s). The
/// same as [`crate::controller::spread::PEER_MEMORY`], so a replica renewing it stays a peer.
pub const PRESENCE_SECONDS: u64 = 30;

/// A presence Lease seen unchanged this long (monotonic, by the replica that sees it) is
/// deleted as one a killed replica left: 20 of its durations (10 minutes).
pub const STALE_AFTER: Duration = Duration::from_secs(PRESENCE_SECONDS * 20);

/// The namespace a replica watching all namespaces announces itself in when neither
/// `--presence-namespace` (env `POD_NAMESPACE`) nor [`SERVICE_ACCOUNT_NAMESPACE`] names one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The file naming the Pod's namespace in a cluster (the service account's mount).
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The name of `holder`'s presence Lease: [`PRESENCE_PREFIX`] + the holder identity,
/// lowercased, when that is a valid Lease name (a DNS subdomain of at most 253 characters);
/// else [`PRESENCE_PREFIX`] + the first 16 hex digits of the identity's SHA-256, so that
/// two holders never share a name.
pub fn lease_name(holder: &HolderId) -> String {
    let name = format!("{PRESENCE_PREFIX}{}", holder.as_str().to_ascii_lowercase());
    if is_dns_subdomain(&name) {
        return name;
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(holder.as_str().as_bytes());
    format!("{PRESENCE_PREFIX}{}", &hex::encode(digest)[..16])
}

/// A DNS subdomain (RFC 1123) of at most 253 characters: dot-separated labels of lowercase
/// letters, digits and `-`, each starting and ending with a letter or digit.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            !bytes.is_empty()
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
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

/// How long stopping waits for the presence Lease's deletion before it gives up (the Lease
/// then goes once seen unchanged for [`STALE_AFTER`]).
pub const WITHDRAW_SECONDS: u64 = 5;

/// A presence Lease whose `renewTime` is older than this by the observing replica's wall
/// clock is not counted as a peer: a leftover of a replica killed without stopping (90 s,
/// three of its durations). Presence decides nothing about a run, so a wall clock may judge
/// it; a skewed clock only makes a replica count a peer too long or too briefly.
pub const PEER_RENEWED_WITHIN: Duration = Duration::from_secs(PRESENCE_SECONDS * 3);

/// Whether `lease` (a presence Lease) was renewed within [`PEER_RENEWED_WITHIN`] of `now`
/// (this replica's wall clock): only then does its holder count as a peer.
pub fn renewed_lately(lease: &Lease, now: jiff::Timestamp) -> bool {
    let Some(renewed) = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.renew_time.as_ref())
    else {
        return false;
    };
    let age = now.duration_since(renewed.0);
    age.is_negative() || age.unsigned_abs() <= PEER_RENEWED_WITHIN
}

/// One replica's presence Lease in one namespace.
pub struct Presence {
    api: Arc<dyn ClusterApi>,
    holder: HolderId,
    clock: Clock,
    namespace: String,
    /// The Lease as last written (`None`: none written yet, or it was refused).
    written: Option<Lease>,
    /// Whether the name was found taken by a Lease that is not a presence Lease (warned once).
    taken: bool,
}

impl Presence {
    /// The presence of `holder` in `namespace` (not written yet).
    pub fn new(
        api: Arc<dyn ClusterApi>,
        holder: HolderId,
        clock: Clock,
        namespace: String,
    ) -> Presence {
        Presence {
            api,
            holder,
            clock,
            namespace,
            written: None,
            taken: false,
        }
    }

    /// Writes the presence Lease: created when this replica has written none yet, else
    /// replaced on the version last written (its acquireTime kept). A 409 reads the stored one
    /// and replaces that (a presence Lease has one writer, so the stored one is a leftover of
    /// this name or a write whose answer was lost); a 404 creates it again. A Lease of this
    /// name that is not a presence Lease (a run's) is left alone. Failures are logged and tried
    /// again at the next call: presence is never worth stopping for.
    pub async fn announce(&mut self) {
        let namespace = self.namespace.as_str();
        let fresh = presence_lease(&self.holder, namespace, MicroTime(self.clock.now().0));
        let result = match &self.written {
            None => match self.api.create_lease(namespace, &fresh).await {
                Err(ApiError::Conflict(_)) => {
                    replace_stored(self.api.as_ref(), namespace, fresh).await
                }
                other => other.map(Some),
            },
            Some(last) => {
                let mut lease = last.clone();
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
                        match self.api.create_lease(namespace, &fresh).await {
                            Err(ApiError::Conflict(_)) => {
                                replace_stored(self.api.as_ref(), namespace, fresh).await
                            }
                            other => other.map(Some),
                        }
                    }
                    other => other.map(Some),
                }
            }
        };
        match result {
            Ok(Some(lease)) => {
                self.written = Some(lease);
                self.taken = false;
            }
            Ok(None) => {
                self.written = None;
                if !self.taken {
                    self.taken = true;
                    tracing::warn!(%namespace, lease = %lease_name(&self.holder), "a Lease that is not a presence Lease (a run's) has this replica's presence name; not announcing until it is gone");
                }
            }
            // The version last written is kept: the next renewal meets a 409 and reads the
            // stored one, and stopping still deletes it.
            Err(err) => {
                tracing::info!(%namespace, %err, "cannot write this replica's presence Lease; other replicas may race it for new runs");
            }
        }
    }

    /// Deletes the presence Lease this replica wrote (preconditions: its uid, and the version
    /// last written when that is still the stored one), so the other replicas stop counting
    /// it at once. Gives up on an error: the Lease then goes once seen unchanged for
    /// [`STALE_AFTER`].
    pub async fn withdraw(&mut self) {
        let Some(mut lease) = self.written.take() else {
            return;
        };
        let namespace = self.namespace.as_str();
        let name = lease.metadata.name.clone().unwrap_or_default();
        for _ in 0..2 {
            match delete_exactly(self.api.as_ref(), &lease).await {
                Ok(()) | Err(ApiError::NotFound(_)) => return,
                // A renewal whose answer was lost moved it: delete the stored one if ours.
                Err(ApiError::Conflict(_)) => match self.api.get_lease(namespace, &name).await {
                    Ok(Some(stored))
                        if is_presence(&stored)
                            && holder_of(&stored) == Some(self.holder.as_str()) =>
                    {
                        lease = stored;
                    }
                    _ => return,
                },
                Err(err) => {
                    tracing::info!(%namespace, %err, "cannot delete this replica's presence Lease; it goes once seen unchanged for 10 minutes");
                    return;
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
            if holder_of(&lease) == Some(self.holder.as_str()) {
                continue;
            }
            let namespace = lease.metadata.namespace.as_deref().unwrap_or_default();
            let name = lease.metadata.name.as_deref().unwrap_or_default();
            match delete_exactly(self.api.as_ref(), &lease).await {
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
    /// `stop` fires (which also cuts short a renewal or sweep the API server does not answer),
    /// then withdraws, waiting at most [`WITHDRAW_SECONDS`]. The first
    /// [`Presence::announce`] is the caller's, before it takes runs.
    pub async fn keep(mut self, leases: Arc<LeaseObservations>, stop: CancellationToken) {
        let period = Duration::from_secs(PRESENCE_SECONDS / 3);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
            let round = async {
                self.announce().await;
                self.sweep(&leases).await;
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = round => {}
            }
        }
        let withdraw = self.withdraw();
        if tokio::time::timeout(Duration::from_secs(WITHDRAW_SECONDS), withdraw)
            .await
            .is_err()
        {
            tracing::info!("the presence Lease's deletion did not answer in time; it goes once seen unchanged for 10 minutes");
        }
    }
}

/// `spec.holderIdentity` of `lease`.
pub fn holder_of(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// Deletes `lease` only as it is: preconditions on its uid and resourceVersion (409 when it
/// changed or was replaced since).
async fn delete_exactly(api: &dyn ClusterApi, lease: &Lease) -> Result<(), ApiError> {
    let metadata = &lease.metadata;
    api.delete_lease(
        metadata.namespace.as_deref().unwrap_or_default(),
        metadata.name.as_deref().unwrap_or_default(),
        metadata.uid.as_deref().unwrap_or_default(),
        metadata.resource_version.as_deref().unwrap_or_default(),
    )
    .await
}

/// After a 409 on this replica's own presence Lease: replace the stored one with `fresh`'s
/// spec when it is a presence Lease; `Ok(None)` when a Lease of another kind has the name.
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
        let plain = holder("pod-7");
        assert_eq!(
            lease_name(&plain),
            format!("agentrt-replica-{}", plain.as_str())
        );
        for odd in ["Pod_Name.X", "a..b", "x.-y", &"a".repeat(300)] {
            let one = lease_name(&holder(odd));
            let two = lease_name(&holder(odd));
            assert!(one.starts_with(PRESENCE_PREFIX), "{one}");
            assert!(is_dns_subdomain(&one), "{one}");
            assert_ne!(one, two, "each holder its own name");
        }
        assert!(!is_dns_subdomain("a..b") && !is_dns_subdomain("a.-b") && !is_dns_subdomain("A"));
    }

    #[tokio::test]
    async fn announcing_creates_then_renews_and_withdrawing_deletes() {
        let api = Arc::new(FakeApi::default());
        let me = holder("a");
        let mut presence = Presence::new(api.clone(), me.clone(), Clock::default(), "ns".into());
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
        let mut presence = Presence::new(api.clone(), me.clone(), Clock::default(), "ns".into());
        presence.announce().await;
        assert!(presence.written.is_some(), "the leftover is replaced");

        // A run's Lease under the presence name is never written over.
        let other = holder("b");
        let mut run_lease = presence_lease(&other, "ns", MicroTime(Clock::default().now().0));
        run_lease.metadata.labels = Some(crate::controller::lease::managed_by_labels());
        api.create_lease("ns", &run_lease).await.unwrap();
        let mut presence = Presence::new(api.clone(), other.clone(), Clock::default(), "ns".into());
        presence.announce().await;
        assert!(presence.written.is_none());
        assert!(presence.taken);
        let stored = api.lease("ns", &lease_name(&other)).unwrap();
        assert!(!is_presence(&stored));
    }

    #[tokio::test]
    async fn a_sweep_deletes_only_others_presence_seen_unchanged_long_enough() {
        use std::time::{Duration, Instant};
        let api = Arc::new(FakeApi::default());
        let me = holder("a");
        let gone = holder("gone");
        let mut mine = Presence::new(api.clone(), me.clone(), Clock::default(), "ns".into());
        mine.announce().await;
        let mut theirs = Presence::new(api.clone(), gone.clone(), Clock::default(), "ns".into());
        theirs.announce().await;
        let seen = LeaseObservations::default();
        let long_ago = Instant::now()
            .checked_sub(STALE_AFTER + Duration::from_secs(1))
            .expect("a monotonic clock this far back");
        for lease in [&mine.written, &theirs.written] {
            let lease = lease.clone().expect("written");
            let key = crate::controller::cluster::RunKey::new(
                "ns",
                lease.metadata.name.as_deref().unwrap_or_default(),
            );
            seen.observe(&key, Some(&lease), long_ago);
        }
        assert_eq!(mine.sweep(&seen).await, 1);
        assert!(api.lease("ns", &lease_name(&gone)).is_none());
        assert!(
            api.lease("ns", &lease_name(&me)).is_some(),
            "its own is kept"
        );
    }
}
