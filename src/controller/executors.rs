//! The executor registry ([`Executors`]): which runs this replica executes (one task each, see
//! [`super::executor`]), the runs waiting for a free slot (`--max-concurrent-runs`), the
//! channel on which executors and slots ask for a reconcile, and what the executor tasks share
//! (the HTTP client for tool, agent and hook calls; the shutdown token).
//!
//! It decides nothing about a run: it only answers "is this run executed here, at which
//! generation" and hands out slots (docs/design.md section 7). A run is one object, one uid:
//! a run deleted and created again under its name is another run, so an executor still
//! finishing the deleted one's call is told to stop and never holds the new one back
//! (docs/behaviours.md 79).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::context::RunKey;

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
    /// Most runs executed at once (`--max-concurrent-runs`, at least 1).
    slots: usize,
    /// The runs this replica executes, by name: the run's uid, its executor's stop token and
    /// the run's generation when it started.
    running: Mutex<HashMap<RunKey, Running>>,
    /// Runs that found every executor slot taken, oldest first; kicked as slots free up.
    slot_waiters: Mutex<VecDeque<RunKey>>,
    /// Reconcile requests (routed to the Controller watching the run's namespace).
    kicks: mpsc::UnboundedSender<RunKey>,
    /// `agentrt_executors`: how many runs execute now.
    gauge: Gauge,
}

impl Executors {
    /// An empty registry with `slots` executor slots; reconcile requests go to `kicks`, the
    /// number executing is reported on `gauge`.
    pub fn new(
        http: reqwest::Client,
        shutdown: CancellationToken,
        slots: usize,
        kicks: mpsc::UnboundedSender<RunKey>,
        gauge: Gauge,
    ) -> Executors {
        Executors {
            http,
            shutdown,
            slots: slots.max(1),
            running: Mutex::new(HashMap::new()),
            slot_waiters: Mutex::new(VecDeque::new()),
            kicks,
            gauge,
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
        lock(&self.running)
            .get(key)
            .is_some_and(|running| running.uid == uid)
    }

    /// How many runs this replica executes.
    pub fn executing(&self) -> usize {
        lock(&self.running).len()
    }

    /// Whether every executor slot is taken.
    pub fn is_full(&self) -> bool {
        self.executing() >= self.slots
    }

    /// The generation the executor of the run `key` with uid `uid` started with, while this
    /// replica executes it.
    pub fn executing_generation(&self, key: &RunKey, uid: &str) -> Option<i64> {
        lock(&self.running)
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
        let mut running = lock(&self.running);
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
            let mut running = lock(&self.running);
            if running.get(key).is_some_and(|running| running.uid == uid) {
                running.remove(key);
            }
            self.gauge
                .set(i64::try_from(running.len()).unwrap_or(i64::MAX));
        }
        self.kick_slot_waiters();
    }

    /// Remembers that `key` needs an executor slot and found none free (`--max-concurrent-runs`):
    /// it is reconciled again when one frees, instead of polling for one.
    pub fn wait_for_slot(&self, key: &RunKey) {
        let mut waiters = lock(&self.slot_waiters);
        if !waiters.contains(key) {
            waiters.push_back(key.clone());
        }
    }

    /// Kicks as many runs waiting for a slot as there are free slots (a kicked run that no
    /// longer needs one leaves it to the next, at the end of its reconcile).
    pub fn kick_slot_waiters(&self) {
        let free = self.slots.saturating_sub(self.executing());
        if free == 0 {
            return;
        }
        let kicked: Vec<RunKey> = {
            let mut waiters = lock(&self.slot_waiters);
            let n = free.min(waiters.len());
            waiters.drain(..n).collect()
        };
        for key in kicked {
            self.kick(&key);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
