//! The kube-runtime Controller over AgentRuns in one scope (a namespace, or all): what wakes a
//! run's reconcile. Watches are filtered so a replica does not wake on every status write
//! (ARCHITECTURE.md): a run wakes on a new generation (a spec change such as cancel), a phase change
//! or a new recorded holder; on any change to its Approvals (a person's decision); on a change
//! of its Lease's holder (a release, a takeover); and on its executors' requests. Every Lease
//! change (each renewal) also updates this replica's observation of that Lease
//! ([`super::lease::observation`]) without waking a reconcile.
//!
//! What a replica keeps of each watched run is [`super::watched`]'s; how each watch recovers
//! from errors is [`super::relist`]'s. Approvals are decoded one by one in [`approvals`].

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::Event;
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource};
use tokio::sync::mpsc::UnboundedReceiver;

use super::cluster::RunKey;
use super::context::Context;
use super::relist::{recovering, WatchBackoff};
use super::watched::{FreshRun, WatchedRun, FRESH_OTHERS_BYTES};
use super::{lease, reconcile};
use crate::api::AgentRun;

pub mod approvals;

use self::approvals::{SetAside, WatchedApproval};

/// Whether this replica keeps the new run `uid` as a [`FreshRun`], with `alive` bytes of them
/// alive (its own counted): below [`FRESH_OTHERS_BYTES`], or when its uid ranks this replica
/// first among the replicas seen lately ([`Context::place_for`]).
pub(super) fn keeps_fresh(ctx: &Context, uid: &str, alive: usize) -> bool {
    alive <= FRESH_OTHERS_BYTES || ctx.place_for(uid) == 0
}

/// Runs the Controller for `scope` (a namespace; `None` for all) until shutdown.
pub async fn controller(
    client: Client,
    scope: Option<String>,
    ctx: Arc<Context>,
    kicks: UnboundedReceiver<RunKey>,
) {
    let (runs, approvals, leases): (Api<WatchedRun>, Api<WatchedApproval>, Api<Lease>) =
        match &scope {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (
                Api::all(client.clone()),
                Api::all(client.clone()),
                Api::all(client.clone()),
            ),
        };
    let writer = reflector::store::Writer::new(());
    let reader = writer.as_reader();
    ctx.metrics.watch_runs(reader.clone());
    let scope_name = scope.as_deref();
    let run_watch = recovering(ctx.metrics.watch("agentruns", scope_name), move || {
        watcher(runs.clone(), watcher::Config::default())
    })
    .map({
        // The watch's predicate, judged against the run as the store holds it before this
        // event is applied, so that a run costs no second cache entry (issue 15: memory per
        // waiting run).
        let store = reader.clone();
        let ctx = ctx.clone();
        move |mut event| {
            if let Ok(Event::Init) = &event {
                ctx.watch_lag.relisting();
            }
            if let Ok(Event::Apply(run) | Event::InitApply(run)) = &mut event {
                run.wakes = wakes(store.get(&key_of_run(run)).as_deref(), run);
                if run.fresh.is_some() && !keeps_fresh(&ctx, run.uid(), FreshRun::bytes_alive()) {
                    run.fresh = None;
                }
                // How far behind this watch runs, timed on this replica's own writes.
                if let Some(version) = run.metadata.resource_version.as_deref() {
                    ctx.watch_lag.delivered(version, std::time::Instant::now());
                }
                // The watcher took the resourceVersion to resume from when it made this
                // event; nothing reads it from the store, which would keep it twice (in the
                // run and in its key).
                run.metadata.resource_version = None;
            }
            event
        }
    });
    let run_stream = reflector::reflector(writer, run_watch)
        .applied_objects()
        .try_filter(|run| std::future::ready(run.wakes));
    let lease_config = watcher::Config::default().labels(&format!(
        "{}={}",
        lease::MANAGED_BY_LABEL,
        lease::MANAGED_BY
    ));
    let lease_stream = recovering(ctx.metrics.watch("leases", scope_name), move || {
        // A Lease kept in the observations is written back on acquiring it (its
        // resourceVersion is the CAS), so only managedFields go: an update without them keeps
        // the stored ones.
        watcher(leases.clone(), lease_config.clone())
            .modify(|lease: &mut Lease| lease.metadata.managed_fields = None)
    })
    .filter_map({
        // Every renewal is seen here: the observation of each Lease (what it is and since
        // when) stays current without a reconcile per renewal; only a Lease whose holder is new
        // to this replica goes on to wake its run (the observation is the predicate).
        let ctx = ctx.clone();
        let scope = scope.clone();
        move |event| {
            let woken = match event {
                Ok(event) => {
                    let wakes =
                        ctx.leases
                            .watched(scope.as_deref(), &event, std::time::Instant::now());
                    match event {
                        Event::Apply(lease) | Event::InitApply(lease) if wakes => Some(Ok(lease)),
                        _ => None,
                    }
                }
                Err(err) => Some(Err(err)),
            };
            std::future::ready(woken)
        }
    });
    // An Approval wakes the run that owns it (what `Controller::owns` does, here with the
    // recovering watch); one that does not decode is set aside and wakes nothing (issue 34).
    // Kept in a store for `agentrt_approvals_pending{kind,namespace}` (only names, kind, phase).
    let approval_writer = reflector::store::Writer::<WatchedApproval>::new(());
    let approval_store = approval_writer.as_reader();
    ctx.metrics
        .approvals
        .pending_from(Box::new(move || pending_approvals(&approval_store)));
    let approval_watch = recovering(ctx.metrics.watch("approvals", scope_name), move || {
        watcher(approvals.clone(), watcher::Config::default())
    });
    let approval_stream = reflector::reflector(approval_writer, approval_watch)
        .touched_objects()
        .try_filter({
            let ctx = ctx.clone();
            let set_aside = Arc::new(SetAside::default());
            move |approval| std::future::ready(set_aside.serves(&ctx, approval))
        });
    let kicks = tokio_stream::wrappers::UnboundedReceiverStream::new(kicks)
        .map(move |key: RunKey| ObjectRef::new(&key.name).within(&key.namespace));
    let kicks = futures::stream::select(kicks, resync_sweep(reader.clone(), RESYNC, RESYNC_TICK));
    let shutdown = ctx.executors.shutdown.clone();
    let deadline = ctx.executors.shutdown.clone();
    let controller = Controller::for_stream_with(run_stream, reader, ())
        .watches_stream_with(
            approval_stream,
            move |approval: WatchedApproval| {
                let namespace = approval.metadata.namespace.clone().unwrap_or_default();
                let owners: Vec<ObjectRef<WatchedRun>> = approval
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|owner| {
                        owner.kind == AgentRun::kind(&())
                            && owner.api_version == AgentRun::api_version(&())
                    })
                    .map(|owner| ObjectRef::new(&owner.name).within(&namespace))
                    .collect();
                owners
            },
            (),
        )
        .watches_stream_with(
            lease_stream,
            move |lease: Lease| {
                let owned_by_run = lease
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|owner| owner.kind == AgentRun::kind(&()));
                let name = lease.metadata.name.clone().unwrap_or_default();
                let namespace = lease.metadata.namespace.clone().unwrap_or_default();
                owned_by_run.then(|| ObjectRef::new(&name).within(&namespace))
            },
            (),
        )
        .reconcile_on(kicks)
        // The watches above back off on their own and pass no errors on; this only guards
        // the Controller's other triggers, with the same bounded backoff.
        .trigger_backoff(WatchBackoff::for_triggers())
        .with_config(
            kube::runtime::Config::default().concurrency(ctx.settings.reconcile_concurrency),
        )
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(
            reconcile::entry::reconcile,
            reconcile::entry::error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "controller stream");
            }
        });
    // A watch stuck in its backoff (e.g. the CRDs are not installed) never lets the
    // Controller's graceful shutdown finish; after shutdown it gets a few seconds, then it is
    // dropped. Executors are not part of it: they stop and release their leases on their own.
    tokio::select! {
        () = controller => {}
        () = async move {
            deadline.cancelled().await;
            tokio::time::sleep(WATCH_SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("the watches did not stop within {WATCH_SHUTDOWN_GRACE:?} of shutdown; dropping them");
        }
    }
}

/// How long a run the engine has nothing to do for (waiting for a person without an expiry) is
/// left before it is looked at again; its own changes, its Approvals' and its Lease's wake it
/// sooner. Only a safety net against a missed watch event, kept by one sweep over the watched
/// runs rather than a timer per run ([`resync_sweep`]).
pub const RESYNC: Duration = Duration::from_secs(3600);

/// How often the resync sweep ([`resync_sweep`]) looks at its next share of the runs.
const RESYNC_TICK: Duration = Duration::from_secs(10);

/// The safety net against a missed watch event (docs/design.md section 7): every run that is not
/// terminal is reconciled once per `period` ([`RESYNC`]), whatever woke it meanwhile. One sweep
/// over the watch's store does it, a share of the runs each `tick` (the runs whose uid hashes
/// into that tick's bucket of `period / tick`), so the reconciles spread evenly over the
/// period and no run carries a timer of its own: a scheduled requeue per waiting run kept
/// about 1.2 KiB in the Controller's scheduler (issue 15: memory per waiting run, measured with
/// heaptrack). A terminal run is left out (its reconcile has nothing to do).
fn resync_sweep(
    store: reflector::Store<WatchedRun>,
    period: Duration,
    tick: Duration,
) -> impl Stream<Item = ObjectRef<WatchedRun>> + Send {
    let buckets = u64::try_from(period.as_millis() / tick.as_millis().max(1))
        .unwrap_or(u64::MAX)
        .max(1);
    futures::stream::unfold(0_u64, move |bucket| {
        let store = store.clone();
        async move {
            tokio::time::sleep(tick).await;
            let due = resync_due(&store.state(), bucket % buckets, buckets);
            Some((futures::stream::iter(due), bucket.wrapping_add(1)))
        }
    })
    .flatten()
}

/// The runs of `runs` that are not terminal and whose uid hashes into `bucket` of `buckets`:
/// what the resync sweep reconciles at that tick ([`resync_sweep`]).
fn resync_due(runs: &[Arc<WatchedRun>], bucket: u64, buckets: u64) -> Vec<ObjectRef<WatchedRun>> {
    runs.iter()
        .filter(|run| crate::engine::observe_needed(run.status.phase.as_deref()))
        .filter(|run| hash_of(&[run.metadata.uid.as_deref()]) % buckets.max(1) == bucket)
        .filter_map(|run| {
            let name = run.metadata.name.as_deref()?;
            let namespace = run.metadata.namespace.as_deref().unwrap_or_default();
            Some(ObjectRef::new(name).within(namespace))
        })
        .collect()
}

/// How long the watches may take to stop after shutdown begins.
const WATCH_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn hash_of(parts: &[Option<&str>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The store's key of `run`.
fn key_of_run(run: &WatchedRun) -> ObjectRef<WatchedRun> {
    ObjectRef::new(run.metadata.name.as_deref().unwrap_or_default())
        .within(run.metadata.namespace.as_deref().unwrap_or_default())
}

/// Whether a watch event that shows `run` must wake its reconcile, given the run as the watch
/// last showed it (`before`, `None` when it had not): a new run (or a new one of the same name),
/// a new generation (a spec change: cancel, policy), phase or recorded holder. Nothing else a
/// status write changes wakes it.
pub(super) fn wakes(before: Option<&WatchedRun>, run: &WatchedRun) -> bool {
    let Some(before) = before else {
        return true;
    };
    fn holder(run: &WatchedRun) -> Option<&str> {
        run.status
            .lease
            .as_ref()
            .and_then(|lease| lease.holder.as_deref())
    }
    before.metadata.uid != run.metadata.uid
        || before.metadata.generation != run.metadata.generation
        || before.status.phase != run.status.phase
        || holder(before) != holder(run)
}

#[cfg(test)]
mod intake_tests;

/// The pending Approvals `store` holds, by (kind, namespace).
fn pending_approvals(store: &reflector::Store<WatchedApproval>) -> Vec<((String, String), i64)> {
    let mut counts = std::collections::BTreeMap::<(String, String), i64>::new();
    for approval in store.state() {
        if let Some(kind) = &approval.pending_kind {
            let namespace = approval.metadata.namespace.clone().unwrap_or_default();
            *counts.entry((kind.to_string(), namespace)).or_default() += 1;
        }
    }
    counts.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_resync_sweep_visits_every_waiting_run_once_per_period_and_no_ended_one() {
        let mut writer = reflector::store::Writer::<WatchedRun>::new(());
        let phases = ["WaitingForApproval", "Running", "Completed", "Failed"];
        for i in 0..200 {
            let run: WatchedRun = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("run-{i}"), "namespace": "ns",
                             "uid": format!("uid-{i}")},
                "status": {"phase": phases[i % phases.len()]},
            }))
            .expect("a run decodes");
            writer.apply_watcher_event(&Event::Apply(run));
        }
        let runs = writer.as_reader().state();
        let buckets = 6;
        let mut seen: Vec<String> = (0..buckets)
            .flat_map(|bucket| resync_due(&runs, bucket, buckets))
            .map(|run| run.name)
            .collect();
        let mut expected: Vec<String> = (0..200)
            .filter(|i| i % phases.len() < 2)
            .map(|i| format!("run-{i}"))
            .collect();
        seen.sort();
        expected.sort();
        assert_eq!(
            seen, expected,
            "each waiting or running run once, no ended one"
        );
        assert!(
            (0..buckets).all(|bucket| resync_due(&runs, bucket, buckets).len() < 50),
            "the runs spread over the buckets"
        );
        // The stream: the first tick's share after one tick.
        let tick = Duration::from_millis(20);
        let mut sweep = Box::pin(resync_sweep(writer.as_reader(), tick * 6, tick));
        let first = tokio::time::timeout(Duration::from_secs(30), sweep.next())
            .await
            .expect("the sweep yields within a tick or so")
            .expect("the sweep never ends");
        assert!(expected.contains(&first.name));
    }
}
