//! The runs this replica has seen ended ([`EndedRuns`]), so a reconcile woken late by a watch
//! that still shows one going reads nothing.

use super::cluster::{RunKey, StoredRun};

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
    pub fn note(&self, run: &StoredRun) {
        if !crate::engine::observe_needed(run.snapshot.status["phase"].as_str()) {
            self.ended(
                &RunKey::new(run.snapshot.namespace.clone(), run.snapshot.name.clone()),
                &run.snapshot.uid,
            );
        }
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
