//! What every reconcile and executor shares ([`Context`]): the API, this replica's
//! [`Settings`] (identity, clock, engine, tunables), its Events and metrics, what it has seen of
//! each Lease, the executor registry ([`super::executors`]), and the helpers that perform the
//! engine's bookkeeping effects (compare-and-set status writes, Approval creation and status).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::cluster::{ApiError, ClusterApi, RunError, StoredRun};
use super::executors::Executors;
use super::failures::FailureBackoff;
use super::fault;
use super::identity::{Clock, HolderId};
use super::lease::{
    self,
    observation::{LeaseObservations, LeaseRead},
};
use super::metrics::Metrics;
use super::projection::EventSink;
use crate::engine::{
    ApprovalSnapshot, Budgets, Caller, Engine, EngineError, Input, LeaseView, Observed, Transition,
};

/// Names one run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl RunKey {
    /// The run `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> RunKey {
        RunKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A run as the engine needs it: the run and its Approvals, read together.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// The run.
    pub run: StoredRun,
    /// Its Approvals (label `agentrt.dev/run-uid`).
    pub approvals: Vec<ApprovalSnapshot>,
}

/// How a status write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// It landed; the run as stored now.
    Landed(Box<StoredRun>),
    /// Someone else wrote first (or it did not land): re-read and decide again.
    Conflict,
    /// The run is gone.
    Gone,
}

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
    /// it ([`super::watches::FreshRun`]) instead of reading it.
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

/// A lag sample older than this (seconds, monotonic) no longer counts ([`WatchLag::lag_millis`]).
pub const LAG_MEMORY_SECONDS: u64 = 60;

/// A probe in flight this long (seconds) is taken for lost: its event may never come, and
/// [`WatchLag::lag_millis`] reports no more than this. The ten minutes after which a killed
/// replica's presence Lease is deleted ([`super::presence::STALE_AFTER`]).
pub const LAG_LOST_SECONDS: u64 = 600;

/// The least time (milliseconds) between two probes of [`WatchLag`]: at most one status write a
/// second is timed, whatever the write rate.
pub const LAG_PROBE_SPACING_MILLIS: u64 = 1_000;

/// How many of the versions the run watch delivered last [`WatchLag`] remembers, so that a
/// write whose event came before its answer is seen as delivered (no lag).
pub const LAG_DELIVERED_MEMORY: usize = 64;

/// How far this replica's run watch runs behind (issue 15), measured on its own monotonic clock
/// and its own writes only: a status write at most every [`LAG_PROBE_SPACING_MILLIS`] is a
/// probe, the instant it was answered (with the resourceVersion it returned) against the
/// instant the run watch delivered that version. No clock of another replica or of the API
/// server is read. The probes in flight are kept oldest first; the watch delivers a resource's
/// events in the order they were written, so delivering one settles the probes answered before
/// it too, and a probe whose event came before its answer costs no more than the spacing. The
/// oldest probe in flight counts as at least its age, so a watch falling further behind is seen
/// before its probe comes back; one in flight [`LAG_LOST_SECONDS`] is taken for lost. A write
/// whose version the watch delivered before the answer came (the last
/// [`LAG_DELIVERED_MEMORY`] versions) is a sample of 0.
///
/// On a loaded kube-apiserver a watch can deliver events tens of seconds late, more than a
/// minute with 10,000 runs. A replica that left a run another one held alone until that run's
/// Lease could have expired then found the run still `Running` (or `Pending`) in its watch,
/// though it had ended long before (its kept Lease unrenewed), and read it: about two reads per
/// run at scale, all after the run's last write. With the lag known, such a run is left alone
/// for the lag as well ([`crate::engine::observer_wait`], which caps it), so that the watch can
/// deliver what was written before the Lease could have expired. One `WatchLag` serves all of
/// a replica's watched scopes.
#[derive(Debug, Default)]
pub struct WatchLag {
    state: std::sync::Mutex<Lag>,
}

#[derive(Debug, Default)]
struct Lag {
    /// The writes in flight as probes, oldest first: each one's resourceVersion and when it
    /// was answered.
    probes: std::collections::VecDeque<(String, std::time::Instant)>,
    /// The last sample (milliseconds) and when it was taken.
    last: Option<(u64, std::time::Instant)>,
    /// The versions the run watch delivered last, newest last.
    delivered: std::collections::VecDeque<String>,
}

impl Lag {
    /// Drops the probes taken for lost at `at` ([`LAG_LOST_SECONDS`]).
    fn drop_lost(&mut self, at: std::time::Instant) {
        while self.probes.front().is_some_and(|(_, answered)| {
            at.saturating_duration_since(*answered).as_secs() >= LAG_LOST_SECONDS
        }) {
            self.probes.pop_front();
        }
    }

    /// The oldest probe's age at `at` (milliseconds), or `None` without one in flight.
    fn probe_age(&self, at: std::time::Instant) -> Option<u64> {
        let (_, answered) = self.probes.front()?;
        let age = at.saturating_duration_since(*answered);
        (age.as_secs() < LAG_LOST_SECONDS)
            .then(|| u64::try_from(age.as_millis()).unwrap_or(u64::MAX))
    }
}

impl WatchLag {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lag> {
        super::executors::lock(&self.state)
    }

    /// This replica's status write returning `resource_version` was answered at `at`: a sample
    /// of 0 when the watch delivered that version already; else a probe when the newest one in
    /// flight was answered [`LAG_PROBE_SPACING_MILLIS`] or more before.
    pub fn wrote(&self, resource_version: &str, at: std::time::Instant) {
        let mut lag = self.lock();
        if lag
            .delivered
            .iter()
            .any(|version| version == resource_version)
        {
            lag.last = Some((0, at));
            return;
        }
        lag.drop_lost(at);
        let spaced = lag.probes.back().is_none_or(|(_, answered)| {
            at.saturating_duration_since(*answered).as_millis()
                >= u128::from(LAG_PROBE_SPACING_MILLIS)
        });
        if spaced {
            lag.probes.push_back((resource_version.to_string(), at));
        }
    }

    /// The run watch delivered `resource_version` at `at`: when it is a probe, the time since
    /// its answer is the new sample, and it and every older probe are settled.
    pub fn delivered(&self, resource_version: &str, at: std::time::Instant) {
        let mut lag = self.lock();
        if lag.delivered.len() >= LAG_DELIVERED_MEMORY {
            lag.delivered.pop_front();
        }
        lag.delivered.push_back(resource_version.to_string());
        let Some(index) = lag
            .probes
            .iter()
            .position(|(probe, _)| probe == resource_version)
        else {
            return;
        };
        let answered = lag.probes[index].1;
        let millis =
            u64::try_from(at.saturating_duration_since(answered).as_millis()).unwrap_or(u64::MAX);
        lag.last = Some((millis, at));
        lag.probes.drain(..=index);
    }

    /// The run watch relists: the probes' own events may never come (the list holds later
    /// versions), so they are dropped.
    pub fn relisting(&self) {
        self.lock().probes.clear();
    }

    /// How far behind the run watch runs at `at` (milliseconds): the last sample if taken
    /// within [`LAG_MEMORY_SECONDS`], or the age of the oldest probe in flight, whichever is
    /// more, below [`LAG_LOST_SECONDS`]; 0 when neither says anything.
    pub fn lag_millis(&self, at: std::time::Instant) -> u64 {
        let lag = self.lock();
        let sampled = match lag.last {
            Some((millis, taken))
                if at.saturating_duration_since(taken).as_secs() < LAG_MEMORY_SECONDS =>
            {
                millis
            }
            _ => 0,
        };
        sampled
            .max(lag.probe_age(at).unwrap_or(0))
            .min(LAG_LOST_SECONDS.saturating_mul(1000))
    }
}

/// How many ended runs [`EndedRuns`] remembers (the oldest are forgotten first; about 150 bytes
/// each).
pub const ENDED_MEMORY: usize = 16_384;

/// The runs (name and uid) this replica has read or written in a terminal phase, newest last,
/// at most [`ENDED_MEMORY`]. A terminal phase never changes (`engine::observe_needed`), so a
/// reconcile woken by a watch that still shows such a run going (a watch minutes behind on a
/// loaded API server, delivering the run's earlier writes one by one) has nothing to read: at
/// scale on kube-apiserver, 3.5 reads per run came after the run had ended (issue 15). A run
/// created again under the name has another uid and is not skipped.
#[derive(Debug, Default)]
pub struct EndedRuns {
    state: std::sync::Mutex<Ended>,
}

/// [`EndedRuns`]' state: each run's uid by name, and the names oldest first.
#[derive(Debug, Default)]
struct Ended {
    uids: std::collections::HashMap<RunKey, String>,
    order: std::collections::VecDeque<RunKey>,
}

impl EndedRuns {
    fn lock(&self) -> std::sync::MutexGuard<'_, Ended> {
        super::executors::lock(&self.state)
    }

    /// Remembers that the run `key` with `uid` ended.
    pub fn ended(&self, key: &RunKey, uid: &str) {
        let mut ended = self.lock();
        if ended.uids.insert(key.clone(), uid.to_string()).is_none() {
            ended.order.push_back(key.clone());
        }
        while ended.order.len() > ENDED_MEMORY {
            if let Some(oldest) = ended.order.pop_front() {
                ended.uids.remove(&oldest);
            }
        }
    }

    /// Whether the run `key` with `uid` is known to have ended.
    pub fn has_ended(&self, key: &RunKey, uid: &str) -> bool {
        self.lock().uids.get(key).is_some_and(|ended| ended == uid)
    }

    /// How many ended runs are remembered.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remembers `run` if its status is in a terminal phase.
    fn note(&self, run: &StoredRun) {
        if !crate::engine::observe_needed(run.snapshot.status["phase"].as_str()) {
            self.ended(
                &RunKey::new(run.snapshot.namespace.clone(), run.snapshot.name.clone()),
                &run.snapshot.uid,
            );
        }
    }
}

/// Up to this many Approvals named by a record are read one by one; more, by label.
const MAX_APPROVAL_GETS: usize = 8;

/// Most compare-and-set conflicts in a row before a reconcile or executor gives up and looks
/// again later.
pub const MAX_CONFLICTS: u32 = 16;

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
    /// [`super::watches::FreshRun`] budget ([`super::watches::keeps_fresh`]).
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

    /// Reads the run and its Approvals live; `None` when the run is gone.
    ///
    /// The Approvals read are those the record names (the only ones the engine looks at): none
    /// for most runs, each by name for a few (a GET is O(1) on the API server, where a label
    /// LIST scans every Approval of the namespace), by label when it names many.
    ///
    /// # Errors
    /// When the API server fails, or the run's spec does not decode.
    pub async fn read_state(&self, key: &RunKey) -> Result<Option<RunState>, RunError> {
        let Some(run) = self.api.get_run(&key.namespace, &key.name).await? else {
            return Ok(None);
        };
        self.ended.note(&run);
        let names = crate::engine::recorded_approvals(&run.snapshot.status);
        let approvals = if names.len() > MAX_APPROVAL_GETS {
            let mut listed = self
                .api
                .list_approvals(&key.namespace, &run.snapshot.uid)
                .await?;
            // A recorded name the label LIST does not return may be held by another run's
            // object: read it by name so the engine sees it (issue 16).
            for name in &names {
                if !listed.iter().any(|a| &a.name == name) {
                    if let Some(approval) = self.api.get_approval(&key.namespace, name).await? {
                        listed.push(approval);
                    }
                }
            }
            listed
        } else {
            let mut approvals = Vec::with_capacity(names.len());
            for name in &names {
                // Every object under a recorded name, also one an earlier run of the same name
                // left behind: the engine tells whose it is and never adopts another run's
                // (issue 16).
                if let Some(approval) = self.api.get_approval(&key.namespace, name).await? {
                    approvals.push(approval);
                }
            }
            approvals.sort_by(|a, b| a.name.cmp(&b.name));
            approvals.dedup_by(|a, b| a.name == b.name);
            approvals
        };
        Ok(Some(RunState { run, approvals }))
    }

    /// Replaces the run's status by compare-and-set on the version in `state`. A failure that
    /// leaves it unknown whether the write landed is settled by reading the run back: the same
    /// status → landed; otherwise → [`Written::Conflict`] (decide again from what is stored).
    /// Never retries the write itself. `record` is `status` decoded when the caller holds it
    /// (an executor's [`crate::engine::Transition::record`]); the run that landed keeps it
    /// ([`super::cluster::Landed::into_run`]).
    ///
    /// # Errors
    /// When the API server cannot be reached to settle an unknown write.
    pub async fn write_status(
        &self,
        state: &RunState,
        status: Value,
        record: Option<Arc<crate::api::AgentRunStatus>>,
    ) -> Result<Written, RunError> {
        let before = &state.run.snapshot.status;
        let sent = std::time::Instant::now();
        let written = self.api.replace_run_status(&state.run, &status).await;
        // A conflict, a gone run or a refusal is an answer; any other error is a failed write.
        let failed = matches!(&written, Err(err)
            if !matches!(err, RunError::Api(ApiError::Conflict(_) | ApiError::NotFound(_) | ApiError::Refused { .. })));
        let took = sent.elapsed();
        self.executors.record_write(took, !failed);
        self.metrics.status_write_took(took.as_secs_f64());
        match written {
            Ok(landed) => {
                let run = landed.into_run(status, record);
                // A write that changed nothing keeps its version and makes no event.
                if self.settings.savings.watch_lag
                    && run.resource_version != state.run.resource_version
                {
                    self.watch_lag
                        .wrote(&run.resource_version, std::time::Instant::now());
                }
                self.metrics.status_write("ok");
                self.failures
                    .write_landed(&run.snapshot.namespace, &run.snapshot.name);
                self.landed(before, &run);
                Ok(Written::Landed(Box::new(run)))
            }
            Err(RunError::Api(ApiError::Conflict(detail))) => {
                self.metrics.status_write("conflict");
                tracing::debug!(run = %state.run.key(), %detail, "status write conflicted");
                Ok(Written::Conflict)
            }
            Err(RunError::Api(ApiError::NotFound(_))) => Ok(Written::Gone),
            Err(RunError::Api(ApiError::Refused { reason, message })) => {
                // Issue 34 item 6: RBAC or an admission policy refused the write. It did not
                // land, and is not a conflict: said once per attempt (a Warning Event on the
                // run, one log line, a metric), and the next attempt waits for the run's own
                // bounded backoff instead of reading and writing again at once.
                self.metrics.status_write("refused");
                self.metrics.status_write_refused(&reason);
                let key = RunKey {
                    namespace: state.run.snapshot.namespace.clone(),
                    name: state.run.snapshot.name.clone(),
                };
                let (row, wait) = self.failures.refused(&key);
                tracing::warn!(run = %key, %reason, %message, refused_in_a_row = row, retry_in = ?wait, "status write refused by the API server");
                self.events.warn(
                    &state.run.snapshot,
                    "StatusWriteRefused",
                    format!(
                        "the API server refused the status write ({reason}): {message}; next attempt in {}s",
                        wait.as_secs()
                    ),
                );
                tokio::time::sleep(wait).await;
                Err(RunError::Api(ApiError::Refused { reason, message }))
            }
            Err(err) => {
                self.metrics.status_write("error");
                tracing::warn!(run = %state.run.key(), %err, "status write failed; reading the run back to see whether it landed");
                let key = RunKey {
                    namespace: state.run.snapshot.namespace.clone(),
                    name: state.run.snapshot.name.clone(),
                };
                let mut last = err;
                for attempt in 0..5u32 {
                    tokio::time::sleep(Duration::from_millis(100 * (1 << attempt))).await;
                    match self.api.get_run(&key.namespace, &key.name).await {
                        Ok(Some(fresh)) => {
                            if same_json(&fresh.snapshot.status, &status) {
                                self.landed(before, &fresh);
                                return Ok(Written::Landed(Box::new(fresh)));
                            }
                            return Ok(Written::Conflict);
                        }
                        Ok(None) => return Ok(Written::Gone),
                        Err(err) => last = err,
                    }
                }
                Err(last)
            }
        }
    }

    fn landed(&self, before: &Value, after: &StoredRun) {
        self.ended.note(after);
        self.events.write_landed(before, after);
        self.metrics.observe_write(before, &after.snapshot.status);
        fault::after_write(before, &after.snapshot.status);
    }

    /// Creates an Approval the record names. One that exists already is this run's own (a
    /// create that landed before) or an object left by someone else; the run is reconciled
    /// again at once so that the engine reads it and tells which (issue 16: another run's
    /// Approval is never adopted).
    pub async fn create_approval(&self, key: &RunKey, approval: &Value) {
        match self.api.create_approval(&key.namespace, approval).await {
            Ok(()) => {}
            Err(ApiError::Conflict(_)) => self.executors.kick(key),
            Err(err) => {
                // The record names it; the next reconcile finds it missing and creates it.
                tracing::warn!(approval = ?approval["metadata"]["name"], %err, "cannot create the Approval; a later reconcile will");
            }
        }
    }

    /// Writes an Approval's status (a projection of the record), conditional on
    /// `resource_version` (the Approval as the engine read it). Without one (an Approval created
    /// in this transition) the Approval is read first and the status written only when its
    /// phase may follow the one stored (`ApprovalPhase::may_become`, docs/design.md section 2).
    /// A 409 means the Approval changed since it was read (a person's decision landing as the
    /// run ends, another replica's write): it is read again and the same check decides whether
    /// the status still applies, up to [`APPROVAL_STATUS_TRIES`] times. A run that ended is
    /// never reconciled again, so its Approvals' `Cancelled` must land here (docs/behaviours.md
    /// 67).
    pub async fn write_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: Option<String>,
        hash: &str,
    ) {
        let mut resource_version = resource_version;
        for _ in 0..APPROVAL_STATUS_TRIES {
            let rv = match resource_version.take() {
                Some(rv) => rv,
                None => match self.api.get_approval(namespace, name).await {
                    Ok(Some(current)) => {
                        match crate::engine::status_write_version(&current.object, status, hash) {
                            Some(rv) => rv,
                            None => {
                                // Another request's object, or a phase already past this one.
                                tracing::debug!(approval = %name, "the Approval is not this write's to change; left as it is");
                                return;
                            }
                        }
                    }
                    Ok(None) => return,
                    Err(err) => {
                        tracing::warn!(approval = %name, %err, "cannot read the Approval to write its status");
                        return;
                    }
                },
            };
            match self
                .api
                .patch_approval_status(namespace, name, status, &rv)
                .await
            {
                Ok(()) => return,
                Err(ApiError::Conflict(_)) => {
                    tracing::debug!(approval = %name, "the Approval changed since it was read; reading it again");
                }
                Err(err) => {
                    tracing::warn!(approval = %name, %err, "cannot write the Approval's status");
                    return;
                }
            }
        }
        tracing::warn!(approval = %name, "the Approval kept changing; its status is left to the next reconcile");
    }
}

/// How often an Approval's status write is tried when the Approval keeps changing under it.
pub const APPROVAL_STATUS_TRIES: usize = 3;

/// JSON equality where numbers compare by value (`1` equals `1.0`), as an API server may
/// re-encode them.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod ended_tests {
    use super::*;

    #[test]
    fn an_ended_run_is_known_by_name_and_uid_and_the_oldest_are_forgotten_first() {
        let ended = EndedRuns::default();
        let key = |n: usize| RunKey::new("ns", format!("r{n}"));
        ended.ended(&key(0), "u0");
        assert!(ended.has_ended(&key(0), "u0"));
        // The same name created again is another run.
        assert!(!ended.has_ended(&key(0), "u0-again"));
        assert!(!ended.has_ended(&key(1), "u1"));
        for n in 1..=ENDED_MEMORY {
            ended.ended(&key(n), &format!("u{n}"));
        }
        assert_eq!(ended.len(), ENDED_MEMORY);
        assert!(!ended.has_ended(&key(0), "u0"), "the oldest is forgotten");
        assert!(ended.has_ended(&key(1), "u1"));
        assert!(ended.has_ended(&key(ENDED_MEMORY), &format!("u{ENDED_MEMORY}")));
        // Noting it again does not count twice.
        ended.ended(&key(1), "u1");
        assert_eq!(ended.len(), ENDED_MEMORY);
    }
}

#[cfg(test)]
mod watch_lag_tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn the_lag_is_the_time_from_an_answered_write_to_its_delivery_and_goes_stale() {
        let lag = WatchLag::default();
        let t0 = Instant::now();
        assert_eq!(lag.lag_millis(t0), 0);
        lag.wrote("10", t0);
        // One probe a second at most: a write 100 ms later is not one.
        lag.wrote("11", t0 + Duration::from_millis(100));
        // Someone else's write: no sample, but the probe in flight says at least its age.
        lag.delivered("9", t0 + Duration::from_secs(1));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(1)), 1_000);
        lag.delivered("11", t0 + Duration::from_secs(2));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(3)), 3_000);
        lag.delivered("10", t0 + Duration::from_millis(2_500));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(3)), 2_500);
        // The next write is the next probe; a relist drops it.
        lag.wrote("12", t0 + Duration::from_secs(3));
        lag.relisting();
        lag.delivered("12", t0 + Duration::from_secs(4));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(4)), 2_500);
        assert_eq!(
            lag.lag_millis(t0 + Duration::from_secs(3 + LAG_MEMORY_SECONDS)),
            0,
            "an old sample no longer counts"
        );
    }

    #[test]
    fn a_write_delivered_before_its_answer_is_no_lag_and_a_lost_probe_stops_counting() {
        let lag = WatchLag::default();
        let t0 = Instant::now();
        // The watch delivered "20" before the write's answer was handled: lag 0, no probe.
        lag.delivered("20", t0);
        lag.wrote("20", t0 + Duration::from_millis(5));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(30)), 0);
        // A probe whose event never comes counts while it could still come, past a minute
        // (a watch that far behind at 10,000 runs), then not at all.
        lag.wrote("21", t0);
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(10)), 10_000);
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(90)), 90_000);
        assert_eq!(
            lag.lag_millis(t0 + Duration::from_secs(LAG_LOST_SECONDS)),
            0,
            "taken for lost"
        );
        // And the next write is the next probe.
        let later = t0 + Duration::from_secs(LAG_LOST_SECONDS);
        lag.wrote("22", later);
        lag.delivered("22", later + Duration::from_secs(1));
        assert_eq!(lag.lag_millis(later + Duration::from_secs(1)), 1_000);
    }

    #[test]
    fn a_later_probe_delivered_settles_the_older_ones() {
        let lag = WatchLag::default();
        let t0 = Instant::now();
        // "30"'s event came before its answer, after the last 64 versions had moved on: it
        // stays a probe until a later one is delivered.
        lag.wrote("30", t0);
        lag.wrote("31", t0 + Duration::from_secs(1));
        lag.wrote("32", t0 + Duration::from_secs(2));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(3)), 3_000);
        lag.delivered("31", t0 + Duration::from_millis(3_200));
        assert_eq!(
            lag.lag_millis(t0 + Duration::from_millis(3_200)),
            2_200,
            "the sample of \"31\"; \"30\" settled with it"
        );
        // "32" is in flight still, and counts once it is older than the sample.
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(5)), 3_000);
        lag.delivered("32", t0 + Duration::from_millis(5_100));
        assert_eq!(lag.lag_millis(t0 + Duration::from_secs(6)), 3_100);
    }
}
