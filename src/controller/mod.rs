//! kube-runtime wiring, per-run executor tasks, leases, compare-and-set writes, Kubernetes
//! Events and metrics (docs/design.md sections 4 and 7). The controller performs the effects the
//! engine asks for and feeds their outcomes back; it decides nothing about a run itself.
//!
//! Its files form layers: each names only files of its own layer or the layers below, never in
//! a circle (`tests/architecture.rs` fails naming the circle), bottom first:
//!
//! 1. Primitives, naming no other file here:
//!    - `identity`: the holder identity and this replica's clock.
//!    - `fault`: the named crash points of the `fault-injection` feature.
//!    - `pacing`: how many executor slots the API server's pace allows.
//!    - `cluster`: the API server behind a trait ([`cluster::ClusterApi`]), its errors, the
//!      keys of a run ([`cluster::RunKey`]); `cluster/stored`: a run as read, decoded one field
//!      at a time; `cluster/kube_api`: the trait over a kube client.
//! 2. On the API:
//!    - `watched`: what a replica keeps of each watched run; `watched/fresh`: a new run kept
//!      whole until its first status write.
//!    - `lease`: the run's Lease by compare-and-set (acquire, take over, renew, release,
//!      delete, the holder's own check); `lease/cell`: the lease an executor holds, shared
//!      with its renewal task, one write at a time; `lease/observation`: what this replica has
//!      seen of each Lease and since when; `lease/presence`: this replica's presence Lease.
//!    - `spread`: which replica tries a new run's Lease first (rendezvous hashing).
//!    - `trace`: the `run` and `step` spans (and, with `otel`, the run's trace).
//!    - `failures`: why a reconcile failed, by kind, and each run's backoff.
//!    - `executors`: the executor registry: which runs execute here, slots, reconcile requests.
//! 3. Observations and output:
//!    - `ended`: the runs seen ended; `lag`: how far the run watch runs behind this replica's
//!      own writes.
//!    - `metrics`: `/metrics`, `/healthz`, `/readyz`; `metrics/health`: each watch's health.
//!    - `relist`: how a watch recovers (relist after any error, its own bounded backoff).
//!    - `projection`: Kubernetes Events derived from each write, rate-limited and folded.
//!    - `notify`: the Approval notifications (webhook queues, retries); `notify/message`:
//!      their Slack and CloudEvents bodies.
//!    - `admin_policy`: the admin policies by reflector, handed to the engine with each call;
//!      fail closed while unreadable.
//!    - `admission`: the validating webhook for AgentRuns; `admission/access`: a
//!      SubjectAccessReview per Secret a new run names.
//! 4. `context`: what every reconcile and executor shares ([`context::Context`]: the API, the
//!    [`context::Settings`], Events, metrics, Lease observations, the executor registry).
//! 5. On the context:
//!    - `writes`: the engine's bookkeeping performed: reading a run with its Approvals, the
//!      compare-and-set status write, Approval creation and status writes.
//!    - `segments`: the sealed steps an openai agent's conversation needs, read once and cached.
//!    - `calls`: the tool, agent, model and hook calls; `calls/mcp`: MCP listing and calls;
//!      `calls/job`: a Job tool's call as a Job (create, read, wait, release its finalizer).
//! 6. `executor`: one task per held run, performing each `engine::Transition` in order;
//!    `executor/gate`: whether a call may still start (the Lease, a stop, a drain).
//! 7. `reconcile`: the Observe reconcile (`engine::observe` for runs this replica is not
//!    executing, winning the Lease); `reconcile/entry`: kube-runtime's entry points and a run
//!    that does not decode set aside.
//! 8. `watches`: the kube-runtime Controller: what wakes a run; `watches/approvals`: Approvals
//!    decoded one by one. `dev`: `agentrt dev`'s wiring of the embedded server. This file: the
//!    settings of `agentrt controller` and starting it all.

pub mod admin_policy;
pub mod admission;
pub mod calls;
pub mod cluster;
pub mod context;
pub mod dev;
pub mod ended;
pub mod executor;
pub mod executors;
pub mod failures;
#[cfg(test)]
mod fake;
pub mod fault;
pub mod identity;
pub mod lag;
pub mod lease;
pub mod metrics;
pub mod notify;
pub mod pacing;
pub mod projection;
pub mod reconcile;
pub mod relist;
pub mod segments;
pub mod spread;
pub mod trace;
pub mod watched;
pub mod watches;
pub mod writes;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use tokio_util::sync::CancellationToken;

use cluster::RunKey;
use context::{Context, ContextParts, Settings};
use identity::{Clock, HolderId};
use lease::presence;
use metrics::Metrics;
use projection::EventSink;

/// Arguments of `agentrt controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Path to a kubeconfig; without it, in-cluster config or $KUBECONFIG is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Watch AgentRuns in this namespace; repeat for several (default: all namespaces).
    #[arg(long = "namespace")]
    pub namespaces: Vec<String>,
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
    /// The namespace this replica's presence Lease goes in when it watches all namespaces
    /// (with --namespace, the first of them): the other replicas learn of it before it takes
    /// any run, so that they do not all race for the same new runs. Default: the Pod's
    /// namespace (env POD_NAMESPACE, which the chart sets, else the service account's
    /// namespace file), else `default`.
    #[arg(long, env = "POD_NAMESPACE")]
    pub presence_namespace: Option<String>,
    /// Serve Prometheus metrics on /metrics, and /healthz and /readyz, on this address.
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// Serve the validating admission webhook for AgentRuns (HTTPS, path
    /// `/validate-agentrun`) on this address, for a real API server to call; not served when
    /// not given (docs/behaviours.md 1). `agentrt dev` validates AgentRuns in its own process
    /// whether or not this is given.
    #[arg(long)]
    pub webhook_addr: Option<SocketAddr>,
    /// The directory holding the webhook's `tls.crt` and `tls.key` (PEM).
    #[arg(long, default_value = "/etc/agentrt/webhook")]
    pub webhook_cert_dir: std::path::PathBuf,
    /// Most runs this replica executes at once. A replica starts with 16 slots and doubles them
    /// each second the API server answers status writes quickly, up to this number; while the
    /// server answers slowly (a median over 4 times the quickest seen; always over 1 s, never
    /// under 100 ms), fewer (down to 16): the slots follow the server's pace and grow back when
    /// it answers quickly again; the gauge agentrt_executor_slots shows the number now
    /// (docs/design.md section 7).
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_runs: usize,
    /// Most reconciles (reads of a run and its Lease, and the writes that need no side
    /// effect) run at once per watched scope (each --namespace, or all namespaces); 0: no
    /// limit.
    #[arg(long, default_value_t = 32)]
    pub reconcile_concurrency: u16,
    /// Kubernetes Events this replica publishes per second at most (0: no limit); more wait in
    /// a queue of 1000, and what finds it full is dropped and counted in
    /// `agentrt_kube_events_total{outcome="dropped"}`. The record is never affected.
    #[arg(long, default_value_t = 10.0)]
    pub event_qps: f64,
    /// Kubernetes Events published at once before `--event-qps` applies.
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..))]
    pub event_burst: u32,
    /// Seconds a run's Started Event is held before it is published (0: not held); a run
    /// that ends, or asks for an Approval, within them gets one Event saying both
    /// ("Completed: ... (earlier, Started: ...)") instead of two. Any Normal Events of one run
    /// that wait together (for this or for --event-qps) fold into one; Warnings are never held
    /// or folded.
    #[arg(long, default_value_t = 5)]
    pub event_batch_seconds: u64,
    /// Milliseconds subtracted from a held lease's life when checking, before each side effect,
    /// that it is still held; and added to leaseDurationSeconds of unchanged observation before
    /// another replica's Lease is taken over.
    #[arg(long, default_value_t = 500)]
    pub lease_skew_margin_ms: u64,
    /// Set by `agentrt dev` (whose embedded API server has no nodes): a `job` tool's call fails
    /// at once saying the cluster runs no Pods.
    #[arg(skip)]
    pub no_pods: bool,
    /// How long shutdown waits for tool calls in flight before releasing the leases.
    #[arg(long, default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// Seal a run's oldest settled steps into an AgentRunSegment when its window holds more
    /// than this many settled steps (docs/design.md section 4a).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub seal_steps: u32,
    /// Seal when a run's window (its steps and events) passes this many bytes of JSON.
    #[arg(long, default_value_t = 131072, value_parser = clap::value_parser!(u32).range(1024..))]
    pub seal_bytes: u32,
    /// The most recent settled steps a seal by step count leaves in the window (at least 1; 0
    /// is refused), and the trailing identical calls and failures the run's loop detection and
    /// failure count look back on. A seal by bytes leaves fewer when they pass a third of
    /// `--seal-bytes` (docs/design.md section 4a).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub keep_steps: u32,
    /// Notifications about Approvals (`--notify-*`; docs/design.md section 7).
    #[command(flatten)]
    pub notify: notify::NotifyArgs,
    /// Test only, compiled with the `fault-injection` feature: shift this replica's wall clock
    /// by this many milliseconds (negative: behind), so the clock-skew scenarios can skew one
    /// replica. The monotonic clock, which decides every lease expiry, is not shifted.
    #[cfg(feature = "fault-injection")]
    #[arg(long, default_value_t = 0, hide = true, allow_negative_numbers = true)]
    pub clock_offset_ms: i64,
}

impl ControllerOptions {
    /// The sealing limits of `--seal-steps`, `--seal-bytes` and `--keep-steps`.
    pub fn seal_limits(&self) -> crate::engine::archive::SealLimits {
        let size = |n: u32| usize::try_from(n).unwrap_or(usize::MAX);
        crate::engine::archive::SealLimits {
            seal_steps: size(self.seal_steps),
            seal_bytes: size(self.seal_bytes),
            keep_steps: size(self.keep_steps),
            ..crate::engine::archive::SealLimits::default()
        }
    }

    /// The namespace of this replica's presence Lease when it watches all namespaces:
    /// `--presence-namespace`, else the in-cluster service account's namespace
    /// ([`presence::SERVICE_ACCOUNT_NAMESPACE`]), else [`presence::DEFAULT_NAMESPACE`].
    pub fn presence_namespace(&self) -> String {
        self.presence_namespace
            .clone()
            .filter(|ns| !ns.is_empty())
            .or_else(|| {
                std::fs::read_to_string(presence::SERVICE_ACCOUNT_NAMESPACE)
                    .ok()
                    .map(|ns| ns.trim().to_string())
                    .filter(|ns| !ns.is_empty())
            })
            .unwrap_or_else(|| presence::DEFAULT_NAMESPACE.to_string())
    }

    /// This replica's wall clock: the system's, shifted by `--clock-offset-ms` in
    /// `fault-injection` builds.
    pub fn clock(&self) -> Clock {
        #[cfg(feature = "fault-injection")]
        return Clock::with_offset_ms(self.clock_offset_ms);
        #[cfg(not(feature = "fault-injection"))]
        return Clock::default();
    }
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            holder_id: None,
            no_pods: false,
            metrics_addr: None,
            webhook_addr: None,
            webhook_cert_dir: std::path::PathBuf::from("/etc/agentrt/webhook"),
            max_concurrent_runs: 256,
            reconcile_concurrency: 32,
            event_qps: 10.0,
            event_burst: 25,
            event_batch_seconds: 5,
            lease_skew_margin_ms: 500,
            presence_namespace: None,
            shutdown_grace_seconds: 20,
            seal_steps: 64,
            seal_bytes: 128 * 1024,
            keep_steps: 8,
            notify: notify::NotifyArgs::default(),
            #[cfg(feature = "fault-injection")]
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
            // A KUBECONFIG-style list (`a:b`) is read and merged in order, as kubectl does.
            let mut kubeconfig: Option<kube::config::Kubeconfig> = None;
            for part in std::env::split_paths(path).filter(|p| !p.as_os_str().is_empty()) {
                let next = kube::config::Kubeconfig::read_from(&part)
                    .with_context(|| format!("cannot read the kubeconfig {}", part.display()))?;
                kubeconfig = Some(match kubeconfig {
                    None => next,
                    Some(merged) => merged.merge(next).with_context(|| {
                        format!("cannot merge the kubeconfig {}", part.display())
                    })?,
                });
            }
            let kubeconfig = kubeconfig
                .with_context(|| format!("--kubeconfig {:?} names no file", path.display()))?;
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
    run_with_client(client, args.namespaces, args.options, shutdown).await
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
    namespaces: Vec<String>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_engine(
        client,
        namespaces,
        options,
        shutdown,
        crate::engine::Engine::PURE,
    )
    .await
}

/// [`run_with_client`] with the engine given (tests may script one).
///
/// # Errors
/// As [`run_with_client`].
pub async fn run_with_engine(
    client: Client,
    namespaces: Vec<String>,
    options: ControllerOptions,
    shutdown: CancellationToken,
    engine: crate::engine::Engine,
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
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        let mut unique = namespaces.clone();
        unique.sort();
        unique.dedup();
        unique.into_iter().map(Some).collect()
    };
    // docs/design.md section 6, admin policies: watched from the start, read at each decision.
    let admin_policies = admin_policy::AdminPolicyView::watch(&client, &scopes, &shutdown);
    if let Some(addr) = options.webhook_addr {
        let bound = admission::serve(
            addr,
            &options.webhook_cert_dir,
            admin_policies.clone(),
            Arc::new(admission::access::SubjectAccessReviews::new(client.clone())),
            shutdown.clone(),
        )
        .await?;
        tracing::info!(addr = %bound, path = admission::PATH, "serving the admission webhook");
    }
    let (kicks_tx, mut kicks_rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
    let events = EventSink::start(
        client.clone(),
        holder.as_str().to_string(),
        projection::EventRate {
            per_second: options.event_qps,
            burst: options.event_burst,
            batch: Duration::from_secs(options.event_batch_seconds),
        },
        metrics.status_write_median.clone(),
        metrics.clone(),
        shutdown.clone(),
    );
    let notifier = notify::Notifier::start(
        &options.notify,
        crate::tools::http::client()?,
        metrics.clone(),
        events.clone(),
        shutdown.clone(),
    );
    let ctx = Arc::new(Context::new(ContextParts {
        api: Arc::new(cluster::KubeApi::new(client.clone())),
        settings: Settings {
            clock: options.clock(),
            engine,
            max_concurrent_runs: options.max_concurrent_runs.max(1),
            reconcile_concurrency: options.reconcile_concurrency,
            skew_margin: Duration::from_millis(options.lease_skew_margin_ms),
            budgets: crate::engine::Budgets {
                model_wire: crate::agents::openai::WIRE,
                seal: options.seal_limits(),
                ..crate::engine::Budgets::default()
            },
            admin_policies,
            runs_pods: !options.no_pods,
            notifier,
            ..Settings::new(holder.clone())
        },
        events,
        metrics: metrics.clone(),
        http: crate::tools::http::client()?,
        shutdown: shutdown.clone(),
        kicks: kicks_tx,
    }));
    tracing::info!(%holder, namespaces = ?namespaces, "controller starting (no namespaces: all)");

    // One kube-runtime Controller per watched namespace (or one over all namespaces), all
    // sharing this replica's executors; executors' reconcile requests are routed to the
    // Controller watching their namespace.
    let mut routes = std::collections::HashMap::new();
    let mut controllers = Vec::new();
    let swept = scopes.clone();
    for scope in scopes {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
        routes.insert(scope.clone(), tx);
        controllers.push(watches::controller(client.clone(), scope, ctx.clone(), rx));
    }
    tokio::spawn(async move {
        while let Some(key) = kicks_rx.recv().await {
            let route = routes
                .get(&Some(key.namespace.clone()))
                .or_else(|| routes.get(&None));
            if let Some(tx) = route {
                let _ = tx.send(key);
            }
        }
    });
    // This replica's presence, written before it is ready, so that replicas started together
    // know each other before the first new run (issue 15).
    let presence = {
        // One Lease is enough: every scope's Lease watch feeds the same holders. With
        // --namespace, the first of them (sorted), which every replica of one installation
        // shares.
        let namespace = match namespaces.iter().min() {
            Some(first) => first.clone(),
            None => options.presence_namespace(),
        };
        let mut presence =
            presence::Presence::new(ctx.api.clone(), holder.clone(), options.clock(), namespace);
        presence.announce().await;
        tokio::spawn(presence.keep(ctx.leases.clone(), shutdown.clone()))
    };
    metrics.set_ready();
    if ctx.settings.runs_pods {
        // Jobs of ended or deleted runs whose finalizer nobody else will remove (docs/design.md
        // section 6, "Job tools"): at start, then every SWEEP_SECONDS.
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                calls::job::sweep(&ctx, &swept).await;
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(calls::job::SWEEP_SECONDS)) => {}
                }
            }
        });
    }
    futures::future::join_all(controllers).await;

    // Shutdown: executors stop before their next side effect (a tool call in flight finishes
    // and is recorded) and release their leases on the way out.
    let grace = Duration::from_secs(options.shutdown_grace_seconds);
    let deadline = tokio::time::Instant::now() + grace;
    while ctx.executors.executing() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if ctx.executors.executing() > 0 {
        tracing::warn!(
            runs = ctx.executors.executing(),
            "shutdown grace elapsed with runs still executing; their leases will expire"
        );
    }
    let _ = presence.await;
    tracing::info!(%holder, "controller stopped");
    Ok(())
}

#[cfg(test)]
mod tests;
