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
    /// Which of issue 15's request savings are on (all, unless measuring them).
    pub savings: Savings,
    /// The admin policies (`AgentPolicy`, `ClusterAgentPolicy`) this replica watches, handed to
    /// the engine with each call ([`super::admin_policy`]; none in [`Settings::new`]).
    pub admin_policies: super::admin_policy::AdminPolicyView,
}

/// Issue 15's request savings, each of which can be switched off to measure it on its own
/// (docs/performance.md): `agentrt controller` reads [`SAVINGS_OFF_ENV`]. None changes what a
/// run does; each only saves API requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Savings {
    /// `lease-cache`: a reconcile reads the Lease as the Lease watch delivered it, not by GET.
    pub lease_cache: bool,
    /// `keep-terminal-lease`: the Lease of a run that ended is not released.
    pub keep_terminal_lease: bool,
    /// `observer-skip`: a run another replica holds live is not read ([`crate::engine::observer_wait`]).
    pub observer_skip: bool,
    /// `spread`: new runs are tried first by the replica their uid ranks first
    /// ([`super::spread`]).
    pub spread: bool,
    /// `event-limit`: Kubernetes Events go out at `--event-qps` at most (off: as fast as they
    /// come, `controller::projection::EventRate`).
    pub event_limit: bool,
    /// `pacing`: the executor slots follow the API server's pace ([`super::pacing`]; off:
    /// always `--max-concurrent-runs`).
    pub pacing: bool,
    /// `slow-start`: the paced slots begin at [`super::pacing::MIN_SLOTS`] and double while the
    /// server answers quickly ([`super::pacing`]; off: they begin at `--max-concurrent-runs`).
    pub slow_start: bool,
    /// `watched-spec`: a new run's reconcile takes the run from the watch event that delivered
    /// it ([`super::watched::FreshRun`]) instead of reading it.
    pub watched_spec: bool,
    /// `event-batch`: a run's `Started` Event is held `--event-batch-seconds`
    /// (`controller::projection::EventRate::batch`; off: not held).
    pub event_batch: bool,
    /// `presence`: each replica announces itself with a presence Lease before it takes runs
    /// ([`super::presence`]).
    pub presence: bool,
    /// `watch-lag`: a run held elsewhere is left alone for the run watch's lag too once its
    /// Lease could have expired ([`WatchLag`]).
    pub watch_lag: bool,
    /// `lease-watch-behind`: a run recorded as held by another replica whose Lease the Lease
    /// watch has not delivered yet is left alone until it does, for a while
    /// ([`crate::engine::lease_watch_behind`]).
    pub lease_watch_behind: bool,
}

/// The environment variable naming savings to switch off, comma-separated (`lease-cache`,
/// `keep-terminal-lease`, `observer-skip`, `spread`, `event-limit`, `pacing`, `slow-start`,
/// `watched-spec`,
/// `event-batch`, `presence`, `watch-lag`, `lease-watch-behind`, or `all`); for measuring
/// only.
pub const SAVINGS_OFF_ENV: &str = "AGENTRT_SAVINGS_OFF";

impl Savings {
    /// Every saving on.
    pub const ALL: Savings = Savings {
        lease_cache: true,
        keep_terminal_lease: true,
        observer_skip: true,
        spread: true,
        event_limit: true,
        pacing: true,
        slow_start: true,
        watched_spec: true,
        event_batch: true,
        presence: true,
        watch_lag: true,
        lease_watch_behind: true,
    };

    /// [`Savings::ALL`] less those `off` names (comma-separated; unknown names are ignored).
    pub fn without(off: &str) -> Savings {
        let off: Vec<&str> = off.split(',').map(str::trim).collect();
        let on = |name: &str| !off.contains(&name) && !off.contains(&"all");
        Savings {
            lease_cache: on("lease-cache"),
            keep_terminal_lease: on("keep-terminal-lease"),
            observer_skip: on("observer-skip"),
            spread: on("spread"),
            event_limit: on("event-limit"),
            pacing: on("pacing"),
            slow_start: on("slow-start"),
            watched_spec: on("watched-spec"),
            event_batch: on("event-batch"),
            presence: on("presence"),
            watch_lag: on("watch-lag"),
            lease_watch_behind: on("lease-watch-behind"),
        }
    }

    /// [`Savings::without`] what [`SAVINGS_OFF_ENV`] names.
    pub fn from_env() -> Savings {
        Savings::without(&std::env::var(SAVINGS_OFF_ENV).unwrap_or_default())
    }
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
            savings: Savings::ALL,
            admin_policies: super::admin_policy::AdminPolicyView::none(),
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
    pub leases: LeaseObservations,
    /// The new runs this replica leaves to another replica first ([`super::spread`]).
    pub spread: super::spread::Spread,
    /// The runs this replica leaves alone until its Lease watch delivers their Lease
    /// ([`crate::engine::lease_watch_behind`]).
    pub lease_watch_behind: super::spread::LeftAlone,
    /// The runs this replica executes, and what their executor tasks share.
    pub executors: Executors,
    /// Reconcile failures in a row, per run: [`super::failures::error_policy`]'s backoff.
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
                paced: settings.savings.pacing,
                slow_start: settings.savings.slow_start,
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
            leases: LeaseObservations::default(),
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
        if let Some(cached) = self
            .leases
            .cached(key)
            .filter(|_| self.settings.savings.lease_cache)
        {
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
    /// ([`super::spread::place`]; 0, first, when the spread is off): the order in which its
    /// runs waiting for a slot get one, and which new runs it keeps past a quarter of the
    /// [`super::watched::FreshRun`] budget ([`super::watches::keeps_fresh`]).
    pub fn place_for(&self, uid: &str) -> usize {
        if !self.settings.savings.spread {
            return 0;
        }
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
