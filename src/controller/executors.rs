//! The executor registry ([`Executors`]): which runs this replica executes (one task each, see
//! [`super::executor`]), the runs waiting for a free slot (`--max-concurrent-runs`), the
//! channel on which executors and slots ask for a reconcile, and what the executor tasks share
//! (the HTTP client for tool, agent and hook calls; the shutdown token).
//!
//! It decides nothing about a run: it only answers "is this run executed here, at which
//! generation" and hands out slots (docs/design.md section 7), as many as the API server's pace
//! allows ([`super::pacing`]), the runs this replica ranks first for before the others
//! ([`super::spread`]). A run is one object, one uid:
//! a run deleted and created again under its name is another run, so an executor still
//! finishing the deleted one's call is told to stop and never holds the new one back
//! (docs/behaviours.md 79).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::cluster::RunKey;
use super::pacing::{Pace, WriteMedian};

/// One executor in the registry.
struct Running {
    /// The uid of the run it executes.
    uid: String,
    /// Fires to tell it to stop.
    stop: CancellationToken,
    /// The run's generation when it started.
    generation: i64,
}

/// The runs this replica executes, and what their executor tasks share.
pub struct Executors {
    /// The client for tool, agent and hook calls.
    pub http: reqwest::Client,
    /// Fires at shutdown: no new side effect starts, executors wind down.
    pub shutdown: CancellationToken,
    /// OAuth access tokens of MCP servers, by server and client (docs/design.md section 6,
    /// "MCP OAuth").
    pub oauth: crate::tools::mcp::oauth::TokenCache,
    /// Most runs executed at once (`--max-concurrent-runs`, at least 1).
    slots: usize,
    /// The slots the API server's pace allows now (`None`: pacing is off, all of `slots`).
    pace: Option<Mutex<Pace>>,
    /// The runs this replica executes and the slots reserved for reconciles acquiring a Lease.
    registry: Mutex<Registry>,
    /// Runs that found every executor slot taken; kicked as slots free up, those this replica
    /// ranks first for before the others, oldest first within a rank.
    slot_waiters: Mutex<SlotWaiters>,
    /// Reconcile requests (routed to the Controller watching the run's namespace).
    kicks: mpsc::UnboundedSender<RunKey>,
    /// `agentrt_executors`: how many runs execute now.
    gauge: Gauge,
    /// `agentrt_executor_slots`: the slots runs may take now.
    slots_gauge: Gauge,
    /// The pace's last window's median (`agentrt_status_write_median_seconds`).
    median: WriteMedian,
}

/// The runs this replica executes and the slots reserved for those about to, under one lock.
#[derive(Default)]
struct Registry {
    /// The runs this replica executes, by name: the run's uid, its executor's stop token and
    /// the run's generation when it started.
    runs: HashMap<RunKey, Running>,
    /// Slots held by reconciles acquiring a run's Lease ([`Executors::reserve_slot`]): taken
    /// before the acquire's request, given back when the executor registers or the acquire
    /// ends without one.
    reserved: usize,
}

impl Registry {
    /// The slots taken: executing runs and reservations.
    fn taken(&self) -> usize {
        self.runs.len() + self.reserved
    }
}

/// The runs waiting for a slot, by (this replica's rank for the run, arrival), and those kicked
/// for a free slot whose reconcile has not ended yet.
#[derive(Default)]
struct SlotWaiters {
    order: BTreeMap<(usize, u64), RunKey>,
    places: HashMap<RunKey, (usize, u64)>,
    arrivals: u64,
    kicked: HashMap<RunKey, Instant>,
}

/// How long a run kicked for a free slot counts against the free slots before its reconcile
/// ends (after that, the slot is offered again: a kicked run may be gone and never reconciled).
pub const KICK_PATIENCE: Duration = Duration::from_secs(10);

/// What builds an [`Executors`] besides its HTTP client and shutdown token.
pub struct Slots {
    /// `--max-concurrent-runs` (at least 1).
    pub max: usize,
    /// Whether the slots follow the API server's pace ([`super::pacing`]); else always `max`.
    pub paced: bool,
    /// Whether the paced slots begin in slow start ([`Pace::new`]) or at `max`
    /// ([`Pace::at_max`]).
    pub slow_start: bool,
    /// `agentrt_executors`.
    pub executing: Gauge,
    /// `agentrt_executor_slots`.
    pub limit: Gauge,
    /// Where the pace's last window's median goes (the Event sink reads it).
    pub median: WriteMedian,
}

impl Executors {
    /// An empty registry with the executor slots of `slots`; reconcile requests go to `kicks`.
    pub fn new(
        http: reqwest::Client,
        shutdown: CancellationToken,
        slots: Slots,
        kicks: mpsc::UnboundedSender<RunKey>,
    ) -> Executors {
        let max = slots.max.max(1);
        let pace = slots.paced.then(|| {
            if slots.slow_start {
                Pace::new(max)
            } else {
                Pace::at_max(max)
            }
        });
        let first = pace.as_ref().map_or(max, Pace::limit);
        slots.limit.set(i64::try_from(first).unwrap_or(i64::MAX));
        Executors {
            http,
            shutdown,
            oauth: crate::tools::mcp::oauth::TokenCache::default(),
            slots: max,
            pace: pace.map(Mutex::new),
            registry: Mutex::new(Registry::default()),
            slot_waiters: Mutex::new(SlotWaiters::default()),
            kicks,
            gauge: slots.executing,
            slots_gauge: slots.limit,
            median: slots.median,
        }
    }

    /// The slots runs may take now: `--max-concurrent-runs`, or less while the API server
    /// answers slowly ([`super::pacing`]).
    pub fn limit(&self) -> usize {
        match &self.pace {
            Some(pace) => lock(pace).limit(),
            None => self.slots,
        }
    }

    /// Records a status write that took `latency` (`ok` false: it failed; a conflict is an
    /// answer) for the pace of the slots; a window that lets more runs in kicks the waiters.
    pub fn record_write(&self, latency: Duration, ok: bool) {
        let Some(pace) = &self.pace else {
            return;
        };
        let executing = self.executing();
        let (before, after, verdict, median_ms, rate) = {
            let mut pace = lock(pace);
            let before = pace.limit();
            let verdict = pace.sample(latency, ok, executing, Instant::now());
            let median_ms = pace.last().map_or(0.0, |(_, median_ms)| median_ms);
            if verdict.is_some() {
                self.median.set(median_ms / 1000.0);
            }
            (before, pace.limit(), verdict, median_ms, pace.last_rate())
        };
        if before != after {
            self.slots_gauge
                .set(i64::try_from(after).unwrap_or(i64::MAX));
        }
        if let Some(verdict) = verdict {
            // Every window, so a log shows where the slots settle and why (docs/performance.md).
            tracing::debug!(
                before,
                after,
                ?verdict,
                median_ms,
                writes_per_second = rate,
                executing,
                "executor slots follow the API server's pace"
            );
        }
        if after > before {
            self.kick_slot_waiters();
        }
    }

    /// Asks for a reconcile of `key` now.
    pub fn kick(&self, key: &RunKey) {
        let _ = self.kicks.send(key.clone());
    }

    /// Asks for a reconcile of `key` after `millis` (dropped at shutdown).
    pub fn kick_after(&self, key: &RunKey, millis: u64) {
        let kicks = self.kicks.clone();
        let key = key.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(millis)) => { let _ = kicks.send(key); }
            }
        });
    }

    /// True while this replica executes the run `key` whose uid is `uid`.
    pub fn is_executing(&self, key: &RunKey, uid: &str) -> bool {
        lock(&self.registry)
            .runs
            .get(key)
            .is_some_and(|running| running.uid == uid)
    }

    /// How many runs this replica executes.
    pub fn executing(&self) -> usize {
        lock(&self.registry).runs.len()
    }

    /// Whether every executor slot is taken ([`Executors::limit`]), by executing runs or by
    /// reconciles acquiring a Lease ([`Executors::reserve_slot`]).
    pub fn is_full(&self) -> bool {
        let limit = self.limit();
        lock(&self.registry).taken() >= limit
    }

    /// Takes a free slot for the reconcile of `key`, about to acquire the run's Lease, or
    /// `None` when every slot is taken ([`Executors::is_full`]) or offered to other runs kicked
    /// for it ([`Executors::kick_slot_waiters`], for [`KICK_PATIENCE`] at most). The slot stays
    /// taken while the returned [`SlotReservation`] lives: drop it once the executor is
    /// registered ([`super::executor::spawn`]) or the acquire ended without one. Without it,
    /// every reconcile that checked for a free slot before the first acquire's request came
    /// back found one: a replica starting on many new runs executed three times its limit at
    /// once (47 on 16 slots, on kube-apiserver; issue 15, session 15). And a slot offered to
    /// the best-ranked waiting run went to whichever reconcile asked first: with 10,000 runs on
    /// 3 replicas, about a quarter of each replica's runs were started by another one, which
    /// had not kept them and read them first (issue 15, session 18).
    pub fn reserve_slot(&self, key: &RunKey) -> Option<SlotReservation<'_>> {
        let limit = self.limit();
        let offered = {
            let mut waiters = lock(&self.slot_waiters);
            waiters.kicked.remove(key);
            if waiters.kicked.is_empty() {
                0
            } else {
                let now = Instant::now();
                waiters
                    .kicked
                    .retain(|_, at| now.saturating_duration_since(*at) < KICK_PATIENCE);
                waiters.kicked.len()
            }
        };
        let mut registry = lock(&self.registry);
        if registry.taken().saturating_add(offered) >= limit {
            return None;
        }
        registry.reserved += 1;
        Some(SlotReservation { executors: self })
    }

    /// The generation the executor of the run `key` with uid `uid` started with, while this
    /// replica executes it.
    pub fn executing_generation(&self, key: &RunKey, uid: &str) -> Option<i64> {
        lock(&self.registry)
            .runs
            .get(key)
            .filter(|running| running.uid == uid)
            .map(|running| running.generation)
    }

    /// Registers an executor for the run `key` with uid `uid` (at its `generation`); false
    /// when one is registered for that run already. An executor registered under the name for
    /// another uid (a deleted run of the same name, still finishing a call) is told to stop
    /// (its `stop` fires) and replaced: it no longer counts, and its
    /// [`Executors::unregister`] leaves the new one in place.
    pub fn register(
        &self,
        key: &RunKey,
        uid: &str,
        stop: CancellationToken,
        generation: i64,
    ) -> bool {
        let mut registry = lock(&self.registry);
        let running = &mut registry.runs;
        if let Some(current) = running.get(key) {
            if current.uid == uid {
                return false;
            }
            tracing::info!(run = %key, deleted_uid = %current.uid, "the run was created again under its name; the deleted run's executor is told to stop");
            current.stop.cancel();
        }
        running.insert(
            key.clone(),
            Running {
                uid: uid.to_string(),
                stop,
                generation,
            },
        );
        self.gauge
            .set(i64::try_from(running.len()).unwrap_or(i64::MAX));
        true
    }

    /// Forgets the executor of the run `key` with uid `uid` (one registered since for another
    /// uid stays); its slot goes to a run waiting for one.
    pub fn unregister(&self, key: &RunKey, uid: &str) {
        {
            let mut registry = lock(&self.registry);
            let running = &mut registry.runs;
            if running.get(key).is_some_and(|running| running.uid == uid) {
                running.remove(key);
            }
            self.gauge
                .set(i64::try_from(running.len()).unwrap_or(i64::MAX));
        }
        self.kick_slot_waiters();
    }

    /// Remembers that `key` needs an executor slot and found none free ([`Executors::limit`]):
    /// it is reconciled again when one frees, instead of polling for one. `rank` is this
    /// replica's place among the replicas for the run (0: first, [`super::spread::place`]):
    /// a freed slot goes to the waiters this replica ranks first for (oldest first) before the
    /// others (newest first), so the replicas, which all see every new run, do not all kick the
    /// same one.
    pub fn wait_for_slot(&self, key: &RunKey, rank: usize) {
        let mut waiters = lock(&self.slot_waiters);
        match waiters.places.get(key).copied() {
            // Waiting already at this rank: it keeps its place.
            Some((waiting_rank, _)) if waiting_rank == rank => return,
            // Ranked anew (a peer it was left to is gone, or a new one came): it moves.
            Some(place) => {
                waiters.order.remove(&place);
                waiters.places.remove(key);
            }
            None => {}
        }
        waiters.arrivals += 1;
        // The runs another replica ranks before this one are taken newest first: that replica
        // serves them oldest first, so the two meet, and race for one run's Lease, only when
        // they have taken all the others (work stealing from the far end).
        let arrival = if rank == 0 {
            waiters.arrivals
        } else {
            u64::MAX - waiters.arrivals
        };
        let place = (rank, arrival);
        waiters.order.insert(place, key.clone());
        waiters.places.insert(key.clone(), place);
    }

    /// How many runs wait for a slot here.
    pub fn slot_waiting(&self) -> usize {
        lock(&self.slot_waiters).order.len()
    }

    /// Kicks as many runs waiting for a slot as there are free slots, best ranked first. A
    /// kicked run holds its slot until its reconcile ends ([`Executors::reconciled`]) or for
    /// [`KICK_PATIENCE`], so one freed slot is offered to one run at a time; one that no longer
    /// needs it passes it on when its reconcile ends.
    pub fn kick_slot_waiters(&self) {
        let limit = self.limit();
        let executing = lock(&self.registry).taken();
        let now = Instant::now();
        let kicked: Vec<RunKey> = {
            let mut waiters = lock(&self.slot_waiters);
            if waiters.order.is_empty() {
                return;
            }
            waiters
                .kicked
                .retain(|_, at| now.saturating_duration_since(*at) < KICK_PATIENCE);
            let free = limit.saturating_sub(executing + waiters.kicked.len());
            let mut kicked = Vec::new();
            while kicked.len() < free {
                let Some((_, key)) = waiters.order.pop_first() else {
                    break;
                };
                waiters.places.remove(&key);
                waiters.kicked.insert(key.clone(), now);
                kicked.push(key);
            }
            kicked
        };
        for key in kicked {
            self.kick(&key);
        }
    }

    /// A reconcile of `key` ended (whatever it did): a slot it was kicked for and did not take
    /// goes to the next run waiting for one.
    pub fn reconciled(&self, key: &RunKey) {
        {
            let mut waiters = lock(&self.slot_waiters);
            if waiters.kicked.is_empty() && waiters.order.is_empty() {
                return;
            }
            waiters.kicked.remove(key);
        }
        self.kick_slot_waiters();
    }
}

/// A slot held for a reconcile acquiring a run's Lease ([`Executors::reserve_slot`]); dropped,
/// it gives the slot back, and a run waiting for one is kicked.
pub struct SlotReservation<'a> {
    executors: &'a Executors,
}

impl SlotReservation<'_> {
    /// Gives the slot back once the executor it was taken for is registered
    /// ([`Executors::register`] returned true): the executor holds it now, so no slot frees up
    /// and no waiting run is kicked.
    pub fn registered(self) {
        lock(&self.executors.registry).reserved -= 1;
        std::mem::forget(self);
    }
}

impl Drop for SlotReservation<'_> {
    fn drop(&mut self) {
        lock(&self.executors.registry).reserved -= 1;
        self.executors.kick_slot_waiters();
    }
}

/// `mutex` locked; a poisoned one (a panic while it was held) is taken as it is: what it guards
/// is bookkeeping that stays usable.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executors(max: usize, paced: bool) -> (Executors, mpsc::UnboundedReceiver<RunKey>) {
        let (kicks, rx) = mpsc::unbounded_channel();
        let executors = Executors::new(
            reqwest::Client::new(),
            CancellationToken::new(),
            Slots {
                max,
                paced,
                slow_start: true,
                executing: Gauge::default(),
                limit: Gauge::default(),
                median: WriteMedian::default(),
            },
            kicks,
        );
        (executors, rx)
    }

    fn kicked(rx: &mut mpsc::UnboundedReceiver<RunKey>) -> Vec<String> {
        let mut names = Vec::new();
        while let Ok(key) = rx.try_recv() {
            names.push(key.name);
        }
        names
    }

    #[test]
    fn freed_slots_go_to_the_runs_this_replica_ranks_first_oldest_first_then_to_the_newest() {
        let (executors, mut rx) = executors(2, false);
        let key = |name: &str| RunKey::new("ns", name);
        assert!(executors.register(&key("a"), "ua", CancellationToken::new(), 1));
        assert!(executors.register(&key("b"), "ub", CancellationToken::new(), 1));
        assert!(executors.is_full());
        executors.wait_for_slot(&key("second-old"), 1);
        executors.wait_for_slot(&key("first-old"), 0);
        executors.wait_for_slot(&key("second-new"), 1);
        executors.wait_for_slot(&key("first-new"), 0);
        executors.wait_for_slot(&key("first-old"), 0);
        assert_eq!(executors.slot_waiting(), 4);
        executors.unregister(&key("a"), "ua");
        assert_eq!(kicked(&mut rx), ["first-old"]);
        // The kicked run holds the freed slot until its reconcile ends: nothing more is kicked.
        executors.kick_slot_waiters();
        assert!(kicked(&mut rx).is_empty());
        // It did not take the slot (another replica held it): the next one gets it.
        executors.reconciled(&key("first-old"));
        assert_eq!(kicked(&mut rx), ["first-new"]);
        // Of the runs another replica ranks first (and serves oldest first), the newest.
        executors.unregister(&key("b"), "ub");
        assert_eq!(kicked(&mut rx), ["second-new"]);
        assert_eq!(executors.slot_waiting(), 1);
        // Ranked anew (the replica it was left to is gone): it moves to its new rank.
        executors.wait_for_slot(&key("second-old"), 0);
        executors.wait_for_slot(&key("other"), 1);
        assert_eq!(executors.slot_waiting(), 2);
        executors.reconciled(&key("first-new"));
        executors.reconciled(&key("second-new"));
        assert!(executors.register(&key("c"), "uc", CancellationToken::new(), 1));
        executors.unregister(&key("c"), "uc");
        assert_eq!(
            kicked(&mut rx).first().map(String::as_str),
            Some("second-old")
        );
    }

    #[test]
    fn reconciles_acquiring_at_once_never_take_more_slots_than_the_limit() {
        let (executors, mut rx) = executors(2, false);
        let key = |name: &str| RunKey::new("ns", name);
        // Two reconciles reserve before either acquire answers; the third finds none.
        let first = executors.reserve_slot(&key("r1")).expect("a free slot");
        let second = executors
            .reserve_slot(&key("r2"))
            .expect("a second free slot");
        assert!(executors.is_full());
        assert!(executors.reserve_slot(&key("r3")).is_none());
        executors.wait_for_slot(&key("waiting"), 0);
        // The first won its Lease: its executor registers, then the reservation goes.
        assert!(executors.register(&key("a"), "ua", CancellationToken::new(), 1));
        drop(first);
        assert!(executors.is_full());
        assert!(kicked(&mut rx).is_empty(), "no slot freed");
        // The second lost its Lease: its slot goes back, to the run waiting for one.
        drop(second);
        assert!(!executors.is_full());
        assert_eq!(kicked(&mut rx), ["waiting"]);
        assert_eq!(executors.executing(), 1);
    }

    #[test]
    fn a_slot_offered_to_a_kicked_run_is_not_taken_by_another_reconcile() {
        let (executors, mut rx) = executors(2, false);
        let key = |name: &str| RunKey::new("ns", name);
        assert!(executors.register(&key("a"), "ua", CancellationToken::new(), 1));
        assert!(executors.register(&key("b"), "ub", CancellationToken::new(), 1));
        executors.wait_for_slot(&key("own"), 0);
        executors.unregister(&key("a"), "ua");
        assert_eq!(kicked(&mut rx), ["own"]);
        // Another replica's run, whose spread wait ended, asks before the kicked run's
        // reconcile does: the slot is not free for it.
        assert!(executors.reserve_slot(&key("stolen")).is_none());
        // The kicked run takes it; then every slot is taken.
        let own = executors.reserve_slot(&key("own")).expect("offered to it");
        assert!(executors.register(&key("own"), "uown", CancellationToken::new(), 1));
        own.registered();
        executors.reconciled(&key("own"));
        assert!(executors.is_full());
        assert!(executors.reserve_slot(&key("stolen")).is_none());
        // With no run waiting, a freed slot is anyone's.
        executors.unregister(&key("b"), "ub");
        assert!(kicked(&mut rx).is_empty());
        assert!(executors.reserve_slot(&key("stolen")).is_some());
    }

    #[test]
    fn slow_status_writes_lower_the_slots_and_pacing_off_keeps_them() {
        for paced in [true, false] {
            let (executors, _rx) = executors(64, paced);
            for n in 0..64 {
                let key = RunKey::new("ns", format!("r{n}"));
                executors.register(&key, &format!("u{n}"), CancellationToken::new(), 1);
            }
            let deadline = Instant::now() + Duration::from_millis(1_300);
            while Instant::now() < deadline {
                executors.record_write(Duration::from_millis(20), true);
                std::thread::sleep(Duration::from_millis(20));
            }
            let deadline = Instant::now() + Duration::from_millis(2_300);
            while Instant::now() < deadline {
                executors.record_write(Duration::from_secs(2), true);
                std::thread::sleep(Duration::from_millis(20));
            }
            if paced {
                assert!(executors.limit() < 64, "{}", executors.limit());
                assert!(executors.is_full());
            } else {
                assert_eq!(executors.limit(), 64);
            }
        }
    }
}
