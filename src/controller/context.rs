//! What every reconcile and executor shares ([`Context`]): the API, this replica's
//! [`Settings`] (identity, clock, engine, tunables), its Events and metrics, what it has seen of
//! each Lease, the executor registry ([`super::executors`]), and the helpers that perform the
//! engine's bookkeeping effects (compare-and-set status writes, Approval creation and status).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::cluster::{ApiError, ClusterApi, RunKey, RunState};
use super::ended::EndedRuns;
use super::executors::Executors;
use super::failures::FailureBackoff;
use super::identity::{Clock, HolderId};
use super::lag::WatchLag;
use super::lease::{
    self,
    observation::{LeaseObservations, LeaseRead},
};
use super::metrics::Metrics;
use super::projection::EventSink;
use crate::engine::{Budgets, Caller, Engine, EngineError, Input, LeaseView, Observed, Transition};

/// Who this replica is and how it runs: its holder identity and clock, the engine it asks,
/// and the tunables of `agentrt controller` (docs/design.md section 7).
#[derive(Debug, Clone)]
pub struct Settings {
    /// This process's holder identity.
    pub holder: HolderId,
    /// This replica's clock.
    pub clock: Clock,
    /// The engine (tests may script one).
    pub engine: Engine,
    /// `--max-concurrent-runs`: most runs executed at once by this replica (at least 1; fewer
    /// while the API server answers slowly, [`super::pacing`]).
    pub max_concurrent_runs: usize,
    /// `--reconcile-concurrency`: most reconciles kube-runtime runs at once (0: unbounded).
    pub reconcile_concurrency: u16,
    /// `--lease-skew-margin-ms`: subtracted from the lease's life in the holder's own check
    /// before each side effect, and added to `leaseDurationSeconds` of unchanged observation
    /// before another holder's Lease is judged expired (docs/design.md section 4).
    pub skew_margin: Duration,
    /// Size limits handed to the engine.
    pub budgets: Budgets,
    /// The admin policies (`AgentPolicy`, `ClusterAgentPolicy`) this replica watches, handed to
    /// the engine with each call ([`super::admin_policy`]; none in [`Settings::new`]).
    pub admin_policies: super::admin_policy::AdminPolicyView,
    /// Whether the cluster runs Pods: `false` under `agentrt dev`, whose embedded API server
    /// has no nodes, so that a `job` tool's call fails at once saying so (docs/design.md
    /// section 6, "Job tools").
    pub runs_pods: bool,
    /// Where the Approval writes this replica wins are notified (`--notify-webhook`;
    /// [`super::notify`]); none in [`Settings::new`].
    pub notifier: super::notify::Notifier,
}

impl Settings {
    /// The defaults of `agentrt controller` for `holder`: the system clock, the real engine,
    /// 256 runs, 32 reconciles at once, a 500 ms skew margin, the default budgets.
    pub fn new(holder: HolderId) -> Settings {
        Settings {
            holder,
            clock: Clock::default(),
            engine: Engine::PURE,
            max_concurrent_runs: 256,
            reconcile_concurrency: 32,
            skew_margin: Duration::from_millis(500),
            budgets: Budgets::default(),
            admin_policies: super::admin_policy::AdminPolicyView::none(),
            runs_pods: true,
            notifier: super::notify::Notifier::none(),
        }
    }
}

/// What a [`Context`] is built from, by name.
pub struct ContextParts {
    /// The API server.
    pub api: Arc<dyn ClusterApi>,
    /// Identity, engine and tunables.
    pub settings: Settings,
    /// Kubernetes Events.
    pub events: EventSink,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The client for tool, agent and hook calls.
    pub http: reqwest::Client,
    /// Fires at shutdown.
    pub shutdown: CancellationToken,
    /// Where reconcile requests for runs go.
    pub kicks: mpsc::UnboundedSender<RunKey>,
}

/// What kube-runtime hands every reconcile and `error_policy` of this replica (as in kube-rs's
/// controller-rs: the client, the recorder, the metrics, the settings), plus the executor
/// registry the executor tasks share ([`Executors`]).
pub struct Context {
    /// The API server.
    pub api: Arc<dyn ClusterApi>,
    /// Identity, engine and tunables.
    pub settings: Settings,
    /// Kubernetes Events.
    pub events: EventSink,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// What this replica has seen of each run's Lease, and since when (its monotonic clock).
    pub leases: Arc<LeaseObservations>,
    /// The new runs this replica leaves to another replica first ([`super::spread`]).
    pub spread: super::spread::Spread,
    /// The runs this replica leaves alone until its Lease watch delivers their Lease
    /// ([`crate::engine::lease_watch_behind`]).
    pub lease_watch_behind: super::spread::LeftAlone,
    /// The runs this replica executes, and what their executor tasks share.
    pub executors: Executors,
    /// Reconcile failures in a row, per run: [`super::reconcile::entry::error_policy`]'s backoff.
    pub failures: FailureBackoff,
    /// The runs this replica has seen ended, in a read or a write ([`EndedRuns`]).
    pub ended: EndedRuns,
    /// How far this replica's run watch runs behind its own status writes ([`WatchLag`]),
    /// shared with the metrics (`agentrt_watch_lag_seconds`).
    pub watch_lag: Arc<WatchLag>,
}

impl Context {
    /// Builds a context from its parts.
    pub fn new(parts: ContextParts) -> Context {
        let ContextParts {
            api,
            settings,
            events,
            metrics,
            http,
            shutdown,
            kicks,
        } = parts;
        let executors = Executors::new(
            http,
            shutdown,
            super::executors::Slots {
                max: settings.max_concurrent_runs,
                paced: true,
                slow_start: true,
                executing: metrics.executors.clone(),
                limit: metrics.executor_slots.clone(),
                median: metrics.status_write_median.clone(),
            },
            kicks,
        );
        let watch_lag = Arc::new(WatchLag::default());
        metrics.watch_lag_from({
            let lag = watch_lag.clone();
            move || lag.lag_millis(std::time::Instant::now()) as f64 / 1000.0
        });
        Context {
            api,
            settings,
            events,
            metrics,
            leases: Arc::default(),
            spread: super::spread::Spread::default(),
            lease_watch_behind: super::spread::LeftAlone::default(),
            ended: EndedRuns::default(),
            watch_lag,
            executors,
            failures: FailureBackoff::default(),
        }
    }

    /// The replica calling the engine, now.
    pub fn caller(&self) -> Caller {
        Caller {
            holder: self.settings.holder.as_str().to_string(),
            now: self.settings.clock.now(),
            draining: self.executors.shutdown.is_cancelled(),
            admin: Default::default(),
        }
    }

    /// The run `key`'s Lease: as the Lease watch last delivered it once that watch has listed
    /// ([`LeaseObservations::cached`]; a stale version only makes the compare-and-set that
    /// follows fail, the CAS is the fence), else read live; with where it came from, for
    /// [`Context::observe_lease`].
    ///
    /// # Errors
    /// When the live read fails.
    pub async fn read_lease(
        &self,
        key: &RunKey,
    ) -> Result<(Option<Arc<Lease>>, LeaseRead), ApiError> {
        if let Some(cached) = self.leases.cached(key) {
            return Ok((cached, LeaseRead::Cached));
        }
        let began = LeaseRead::Live(std::time::Instant::now());
        Ok((
            self.api
                .get_lease(&key.namespace, &key.name)
                .await?
                .map(Arc::new),
            began,
        ))
    }

    /// The Lease named after run `key` as just read (`None`: absent), as the engine judges it
    /// for the run of uid `run_uid`: recorded as it is stored in this replica's observations
    /// (which the Lease watch also feeds, so they must hold what is stored, whoever owns it),
    /// and judged with how long it has been seen unchanged on the monotonic clock and the
    /// margin (docs/design.md section 4). A Lease another run of this name owns (a deleted
    /// run's, [`lease::own`]) is judged as absent (docs/behaviours.md 79). `source` says where
    /// the read came from: an absent Lease does not erase one the Lease watch delivered since
    /// ([`LeaseObservations::observe_read`]).
    pub fn observe_lease(
        &self,
        key: &RunKey,
        read: Option<&Lease>,
        run_uid: &str,
        source: LeaseRead,
    ) -> LeaseView {
        let unchanged_for_ms =
            self.leases
                .observe_read(key, read, std::time::Instant::now(), source);
        let margin_ms = self.takeover_margin_ms();
        match lease::own(read, run_uid) {
            Some(own) => lease::observed(Some(own), unchanged_for_ms, margin_ms),
            None => lease::observed(None, 0, margin_ms),
        }
    }

    /// `holder`'s presence Lease as the Lease watch last delivered it, judged as a run's Lease
    /// is ([`Context::observe_lease`]: how long it has been seen unchanged at `at`, and the
    /// margin); `None` when this replica has seen none (docs/design.md sections 2 and 7).
    pub fn holder_presence(&self, holder: &str, at: std::time::Instant) -> Option<LeaseView> {
        let (presence, unchanged_for_ms) = self.leases.presence_of(holder, at)?;
        Some(lease::observed(
            Some(&presence),
            unchanged_for_ms,
            self.takeover_margin_ms(),
        ))
    }

    /// This replica's place among the replicas it has seen lately for the run `uid`
    /// ([`super::spread::place`]): the order in which its
    /// runs waiting for a slot get one, and which new runs it keeps past a quarter of the
    /// [`super::watched::FreshRun`] budget ([`super::watches::keeps_fresh`]).
    pub fn place_for(&self, uid: &str) -> usize {
        let peers = self
            .leases
            .holders_seen(std::time::Instant::now(), super::spread::PEER_MEMORY);
        super::spread::place(uid, self.settings.holder.as_str(), &peers)
    }

    /// `--lease-skew-margin-ms`: the unchanged observation required beyond a Lease's duration
    /// before it is judged expired (milliseconds).
    fn takeover_margin_ms(&self) -> u64 {
        u64::try_from(self.settings.skew_margin.as_millis()).unwrap_or(u64::MAX)
    }

    /// [`Context::caller`] with the admin policies that select the run, read now
    /// ([`super::admin_policy::AdminPolicyView::for_run`]).
    pub fn caller_for(&self, state: &RunState) -> Caller {
        let admin = self
            .settings
            .admin_policies
            .for_run(&state.run.snapshot.namespace, &state.run.object["metadata"]);
        Caller {
            admin: Arc::new(admin),
            ..self.caller()
        }
    }

    /// Asks the engine what the executor does next.
    pub fn step(&self, state: &RunState, input: Input) -> Result<Transition, EngineError> {
        (self.settings.engine.step)(
            &state.run.snapshot,
            &state.approvals,
            &self.caller_for(state),
            &self.settings.budgets,
            input,
        )
    }

    /// [`Context::step`] with sealing off for this one transition (its segment could not be
    /// created; docs/design.md section 4a).
    pub fn step_unsealed(&self, state: &RunState, input: Input) -> Result<Transition, EngineError> {
        let budgets = Budgets {
            seal: crate::engine::archive::SealLimits::off(),
            ..self.settings.budgets.clone()
        };
        (self.settings.engine.step)(
            &state.run.snapshot,
            &state.approvals,
            &self.caller_for(state),
            &budgets,
            input,
        )
    }

    /// Asks the engine what this replica, not executing the run, does with it.
    pub fn observe(&self, state: &RunState, lease: &LeaseView) -> Observed {
        (self.settings.engine.observe)(
            &state.run.snapshot,
            &state.approvals,
            &self.caller_for(state),
            &self.settings.budgets,
            lease,
        )
    }
}
