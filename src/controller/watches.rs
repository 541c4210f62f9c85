//! The kube-runtime Controller over AgentRuns in one scope (a namespace, or all): what wakes a
//! run's reconcile. Watches are filtered so a replica does not wake on every status write
//! (STYLE.md): a run wakes on a new generation (a spec change such as cancel), a phase change
//! or a new recorded holder; on any change to its Approvals (a person's decision); on a change
//! of its Lease's holder (a release, a takeover); and on its executors' requests. Every Lease
//! change (each renewal) also updates this replica's observation of that Lease
//! ([`super::lease::observation`]) without waking a reconcile.
//!
//! Every replica receives every write of every run it watches, so what it keeps of one is
//! small ([`WatchedRun`]: metadata, phase, holder); the spec and the record are skipped while
//! the event is parsed. Nothing is decided from this cache: a reconcile reads the run live.

use std::sync::Arc;

use std::borrow::Cow;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::core::DynamicResourceScope;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, Controller, PredicateConfig, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;

use super::context::{Context, RunKey};
use super::{lease, reconcile};
use crate::api::{AgentRun, Approval};

/// What a replica keeps of a watched AgentRun: its metadata and the status fields that wake it
/// or that the metrics count. Unknown fields (the spec, the steps, the journal) are skipped
/// while parsing, without being built.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WatchedRun {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `status.phase` and `status.lease.holder`.
    #[serde(default)]
    pub status: WatchedStatus,
}

/// The part of a run's status a watch keeps.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WatchedStatus {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
    /// `status.lease`.
    #[serde(default)]
    pub lease: Option<WatchedLease>,
}

/// The part of `status.lease` a watch keeps.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WatchedLease {
    /// `status.lease.holder`.
    #[serde(default)]
    pub holder: Option<String>,
}

impl Resource for WatchedRun {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Runs the Controller for `scope` (a namespace; `None` for all) until shutdown.
pub async fn controller(
    client: Client,
    scope: Option<String>,
    ctx: Arc<Context>,
    kicks: UnboundedReceiver<RunKey>,
) {
    let runs_type = ApiResource::erase::<AgentRun>(&());
    let approvals_type = ApiResource::erase::<Approval>(&());
    let (runs, approvals, leases): (Api<WatchedRun>, Api<DynamicObject>, Api<Lease>) = match &scope
    {
        Some(ns) => (
            Api::namespaced_with(client.clone(), ns, &runs_type),
            Api::namespaced_with(client.clone(), ns, &approvals_type),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all_with(client.clone(), &runs_type),
            Api::all_with(client.clone(), &approvals_type),
            Api::all(client.clone()),
        ),
    };
    let writer = reflector::store::Writer::new(runs_type.clone());
    let reader = writer.as_reader();
    ctx.metrics.watch_runs(reader.clone());
    let run_stream = reflector::reflector(writer, watcher(runs, watcher::Config::default()))
        .default_backoff()
        .applied_objects()
        .predicate_filter(run_predicate, PredicateConfig::default());
    let lease_stream = watcher(
        leases,
        watcher::Config::default().labels(&format!(
            "{}={}",
            lease::MANAGED_BY_LABEL,
            lease::MANAGED_BY
        )),
    )
    .default_backoff()
    .inspect({
        // Every renewal is seen here, before the predicate drops it: the observation of each
        // Lease (what it is and since when) stays current without a reconcile per renewal.
        let ctx = ctx.clone();
        move |event| {
            if let Ok(event) = event {
                ctx.leases.watched(event, std::time::Instant::now());
            }
        }
    })
    .applied_objects()
    .predicate_filter(lease_predicate, PredicateConfig::default());
    let lease_runs_type = runs_type.clone();
    let kick_runs_type = runs_type.clone();
    let kicks =
        tokio_stream::wrappers::UnboundedReceiverStream::new(kicks).map(move |key: RunKey| {
            ObjectRef::new_with(&key.name, kick_runs_type.clone()).within(&key.namespace)
        });
    let shutdown = ctx.shutdown.clone();
    let deadline = ctx.shutdown.clone();
    let controller = Controller::for_stream_with(run_stream, reader, runs_type)
        .owns_with(approvals, approvals_type, watcher::Config::default())
        .watches_stream_with(
            lease_stream,
            move |lease: Lease| {
                let owned_by_run = lease
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|owner| owner.kind == "AgentRun");
                let name = lease.metadata.name.clone().unwrap_or_default();
                let namespace = lease.metadata.namespace.clone().unwrap_or_default();
                owned_by_run
                    .then(|| ObjectRef::new_with(&name, lease_runs_type.clone()).within(&namespace))
            },
            (),
        )
        .reconcile_on(kicks)
        .with_config(kube::runtime::Config::default().concurrency(32))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
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

/// How long the watches may take to stop after shutdown begins.
const WATCH_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn hash_of(parts: &[Option<&str>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// What a replica must wake for on an AgentRun: its generation (spec changes: cancel, policy),
/// phase and recorded holder.
fn run_predicate(run: &WatchedRun) -> Option<u64> {
    let generation = run.metadata.generation.map(|g| g.to_string());
    let phase = run.status.phase.as_deref();
    let holder = run
        .status
        .lease
        .as_ref()
        .and_then(|lease| lease.holder.as_deref());
    Some(hash_of(&[generation.as_deref(), phase, holder]))
}

/// A Lease matters when its holder changes.
fn lease_predicate(lease: &Lease) -> Option<u64> {
    let holder = lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref());
    Some(hash_of(&[holder]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_run_keeps_metadata_phase_and_holder_only() {
        let run: WatchedRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u", "generation": 2},
            "spec": {"goal": "g", "agent": {"scripted": {"decisions": []}}},
            "status": {"phase": "Running", "lease": {"holder": "a-1", "epoch": 3},
                       "steps": [{"index": 0}], "events": [{"seq": 1}]},
        }))
        .expect("a run decodes");
        assert_eq!(run.metadata.uid.as_deref(), Some("u"));
        assert_eq!(run.status.phase.as_deref(), Some("Running"));
        let moved = WatchedRun {
            status: WatchedStatus {
                phase: Some("Running".into()),
                lease: Some(WatchedLease {
                    holder: Some("b-2".into()),
                }),
            },
            ..run.clone()
        };
        assert_ne!(run_predicate(&run), run_predicate(&moved));
        // A new run without a status yet decodes too.
        let fresh: WatchedRun =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": {}}))
                .expect("a new run decodes");
        assert!(fresh.status.phase.is_none());
    }
}
