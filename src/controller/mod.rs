//! kube-runtime wiring, per-run executor tasks, leases, compare-and-set writes, Kubernetes
//! Events and metrics (DESIGN.md sections 4 and 7). The controller performs the effects the
//! engine asks for and feeds their outcomes back; it decides nothing about a run itself.
//!
//! The rooms:
//! - [`reconcile`]: the kube-runtime reconcile: `Input::Observe` for runs this replica is not
//!   executing, the effects that need no side effect, and winning the Lease.
//! - [`executor`]: one task per held run, performing the engine's effects in order.
//! - [`calls`]: the tool, agent and hook calls an executor makes.
//! - [`lease`]: the run's Lease: acquire, take over, renew, release, all compare-and-set.
//! - [`cluster`]: the API server behind a trait (compare-and-set status writes).
//! - [`context`]: what reconciles and executors share.
//! - [`projection`]: Kubernetes Events derived from what each write added to the record.
//! - [`metrics`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`fault`]: the named crash points of the `fault-injection` feature.
//! - [`identity`]: the holder identity and this replica's clock.

pub mod calls;
pub mod cluster;
pub mod context;
pub mod dev;
pub mod executor;
#[cfg(test)]
mod fake;
pub mod fault;
pub mod identity;
pub mod lease;
pub mod metrics;
pub mod projection;
pub mod reconcile;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, Controller, PredicateConfig, WatchStreamExt};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::api::{AgentRun, Approval};
use crate::engine::Budgets;
use context::{Context, RunKey, Settings, StepFn};
use identity::{Clock, HolderId};
use metrics::Metrics;
use projection::EventSink;

/// Arguments of `agentrt controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Path to a kubeconfig; without it, in-cluster config or $KUBECONFIG is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Watch AgentRuns in this namespace only (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub options: ControllerOptions,
}

/// The controller's settings, shared by `agentrt controller` and `agentrt dev`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerOptions {
    /// Prefix of this replica's holder identity; a random suffix is drawn per process
    /// (default: the hostname, else `agentrt`).
    #[arg(long)]
    pub holder_id: Option<String>,
    /// Serve Prometheus metrics on /metrics, and /healthz and /readyz, on this address.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Most runs this replica executes at once.
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_runs: usize,
    /// Milliseconds subtracted from a lease's expiry when checking, before each side effect,
    /// that it is still held.
    #[arg(long, default_value_t = 500)]
    pub lease_skew_margin_ms: u64,
    /// How long shutdown waits for tool calls in flight before releasing the leases.
    #[arg(long, default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// Test only: shift this replica's clock by this many milliseconds.
    #[arg(long, default_value_t = 0, hide = true, allow_negative_numbers = true)]
    pub clock_offset_ms: i64,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            holder_id: None,
            metrics_addr: None,
            max_concurrent_runs: 256,
            lease_skew_margin_ms: 500,
            shutdown_grace_seconds: 20,
            clock_offset_ms: 0,
        }
    }
}

/// Runs the controller until SIGINT or SIGTERM, then releases the leases it holds.
///
/// # Errors
/// When no Kubernetes configuration can be loaded or the API server refuses the watches.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("cannot use the kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, or run in a cluster",
        )?,
    };
    let client = Client::try_from(config).context("cannot build a Kubernetes client")?;
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));
    run_with_client(client, args.namespace, args.options, shutdown).await
}

/// Cancels `token` at SIGINT or SIGTERM.
pub async fn shutdown_on_signal(token: CancellationToken) {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(err) => {
                    tracing::warn!(%err, "cannot listen for SIGTERM");
                    let _ = interrupt.await;
                    token.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down: no new side effect starts; releasing leases");
    token.cancel();
}

/// Runs the controller against `client` until `shutdown` fires; then waits (at most
/// `--shutdown-grace-seconds`) for the executors to stop and releases their leases.
///
/// # Errors
/// When the metrics address cannot be bound or the HTTP client cannot be built.
pub async fn run_with_client(
    client: Client,
    namespace: Option<String>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_engine(client, namespace, options, shutdown, crate::engine::step).await
}

/// [`run_with_client`] with the engine given (tests may script one).
///
/// # Errors
/// As [`run_with_client`].
pub async fn run_with_engine(
    client: Client,
    namespace: Option<String>,
    options: ControllerOptions,
    shutdown: CancellationToken,
    step_fn: StepFn,
) -> anyhow::Result<()> {
    let prefix = options
        .holder_id
        .clone()
        .unwrap_or_else(identity::default_prefix);
    let holder = HolderId::with_random_suffix(&prefix);
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = options.metrics_addr {
        let bound = metrics::serve(addr, metrics.clone(), shutdown.clone()).await?;
        tracing::info!(addr = %bound, "serving metrics");
    }
    let (kicks_tx, kicks_rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
    let ctx = Arc::new(Context::new(
        Arc::new(cluster::KubeApi::new(client.clone())),
        holder.clone(),
        Clock::with_offset_ms(options.clock_offset_ms),
        Settings {
            max_concurrent_runs: options.max_concurrent_runs.max(1),
            skew_margin: Duration::from_millis(options.lease_skew_margin_ms),
            budgets: Budgets::default(),
        },
        step_fn,
        crate::tools::http::client()?,
        EventSink::start(client.clone(), holder.as_str().to_string()),
        metrics.clone(),
        shutdown.clone(),
        kicks_tx,
    ));
    tracing::info!(%holder, namespace = namespace.as_deref().unwrap_or("(all)"), "controller starting");

    let runs_type = ApiResource::erase::<AgentRun>(&());
    let approvals_type = ApiResource::erase::<Approval>(&());
    let (runs, approvals, leases): (Api<DynamicObject>, Api<DynamicObject>, Api<Lease>) =
        match &namespace {
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

    // Runs: wake on what matters to another replica (a new run, a spec change such as cancel,
    // a phase or holder change), not on every status write.
    let writer = reflector::store::Writer::new(runs_type.clone());
    let reader = writer.as_reader();
    let run_stream = reflector::reflector(writer, watcher(runs, watcher::Config::default()))
        .default_backoff()
        .applied_objects()
        .predicate_filter(run_predicate, PredicateConfig::default());
    // Leases: wake the run when its holder changes (a release, a takeover).
    let lease_stream = watcher(
        leases,
        watcher::Config::default().labels(&format!(
            "{}={}",
            lease::MANAGED_BY_LABEL,
            lease::MANAGED_BY
        )),
    )
    .default_backoff()
    .applied_objects()
    .predicate_filter(lease_predicate, PredicateConfig::default());
    let lease_runs_type = runs_type.clone();
    let kick_runs_type = runs_type.clone();
    let kicks =
        tokio_stream::wrappers::UnboundedReceiverStream::new(kicks_rx).map(move |key: RunKey| {
            ObjectRef::new_with(&key.name, kick_runs_type.clone()).within(&key.namespace)
        });

    metrics.set_ready();
    let controller = Controller::for_stream_with(run_stream, reader, runs_type.clone())
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
        .graceful_shutdown_on({
            let shutdown = shutdown.clone();
            async move { shutdown.cancelled().await }
        })
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "controller stream");
            }
        });
    controller.await;

    // Shutdown: executors stop before their next side effect (a tool call in flight finishes
    // and is recorded) and release their leases on the way out.
    let grace = Duration::from_secs(options.shutdown_grace_seconds);
    let deadline = tokio::time::Instant::now() + grace;
    while ctx.executing() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if ctx.executing() > 0 {
        tracing::warn!(
            runs = ctx.executing(),
            "shutdown grace elapsed with runs still executing; their leases will expire"
        );
    }
    tracing::info!(%holder, "controller stopped");
    Ok(())
}

fn hash_of(parts: &[Option<&str>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// What a replica must wake for on an AgentRun: its generation (spec changes: cancel, policy),
/// phase and recorded holder.
fn run_predicate(run: &DynamicObject) -> Option<u64> {
    let generation = run.metadata.generation.map(|g| g.to_string());
    let status = run.data.get("status");
    let phase = status.and_then(|s| s.get("phase")).and_then(|p| p.as_str());
    let holder = status
        .and_then(|s| s.get("lease"))
        .and_then(|l| l.get("holder"))
        .and_then(|h| h.as_str());
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
mod tests;
