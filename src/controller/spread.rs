//! Which replica tries a new run's Lease first (issue 15): without it every replica races to
//! create the Lease of each new run, and all but one lose with a 409 after reading the run.
//! Each replica ranks the replicas it knows (the holders the Lease watch saw lately, and
//! itself) by a hash of the run's uid and each holder (rendezvous hashing, so replicas that
//! know the same holders agree); a replica that is not first leaves a new run alone for
//! [`SPREAD_MILLIS`] once, then tries as before. It only delays a first try: the Lease's
//! compare-and-set still decides who holds the run (docs/design.md section 4), and a run whose
//! first-ranked replica died or is busy is tried by the others after the delay.
//!
//! [`LeftAlone`] is the once-per-run wait it uses, also for a run whose Lease the Lease watch
//! has not delivered yet (`controller::reconcile`, [`crate::engine::lease_watch_behind`]).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::cluster::RunKey;

/// How long a replica that is not first for a new run leaves it alone (milliseconds).
pub const SPREAD_MILLIS: u64 = 2_000;

/// A holder the Lease watch has not seen for this long is no longer counted as a replica.
pub const PEER_MEMORY: Duration = Duration::from_secs(30);

/// The new runs this replica left to another one, and since when ([`LeftAlone`]).
#[derive(Debug, Default)]
pub struct Spread {
    deferred: LeftAlone,
}

/// Runs this replica leaves alone once, each for a bounded time, and since when (monotonic):
/// a reconcile that would only lose a race now (another replica is about to take the run, or
/// a watch is about to deliver what makes the read needless) requeues instead, and reads as
/// before once the time is up. An entry lives until the time is up or the caller says the
/// reason is gone ([`LeftAlone::settled`]).
#[derive(Debug, Default)]
pub struct LeftAlone {
    since: Mutex<HashMap<RunKey, Instant>>,
}

impl LeftAlone {
    fn lock(&self) -> MutexGuard<'_, HashMap<RunKey, Instant>> {
        match self.since.lock() {
            Ok(since) => since,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The milliseconds still to leave the run `key` alone, counted from the first call for it
    /// (at `at`, monotonic) over `millis` in all; `None` once that time is up, which also
    /// forgets the run, so a later reason leaves it alone afresh.
    pub fn once(&self, key: &RunKey, at: Instant, millis: u64) -> Option<u64> {
        let mut left = self.lock();
        let since = *left.entry(key.clone()).or_insert(at);
        let waited = u64::try_from(at.saturating_duration_since(since).as_millis()).unwrap_or(0);
        if waited >= millis {
            left.remove(key);
            return None;
        }
        Some(millis - waited)
    }

    /// The reason to leave the run `key` alone is gone (or so is the run): forget it.
    pub fn settled(&self, key: &RunKey) {
        let mut left = self.lock();
        if !left.is_empty() {
            left.remove(key);
        }
    }
}

fn rank(uid: &str, holder: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (uid, holder).hash(&mut hasher);
    hasher.finish()
}

/// Whether `me` ranks first for the run `uid` among `me` and `peers` (its [`place`] is 0).
pub fn first_for(uid: &str, me: &str, peers: &[String]) -> bool {
    place(uid, me, peers) == 0
}

/// `me`'s place for the run `uid` among `me` and `peers`: how many of the others rank before it
/// (0: first).
pub fn place(uid: &str, me: &str, peers: &[String]) -> usize {
    let mine = (rank(uid, me), me);
    peers
        .iter()
        .filter(|peer| peer.as_str() != me)
        .filter(|peer| (rank(uid, peer), peer.as_str()) > mine)
        .count()
}

impl Spread {
    /// For a new run `key` (no status, no Lease yet) with `uid`: the milliseconds to leave it
    /// alone when `me` is not first among `peers` and has not left it alone for
    /// [`SPREAD_MILLIS`] yet; `None` to try it now.
    pub fn defer(
        &self,
        key: &RunKey,
        uid: &str,
        me: &str,
        peers: &[String],
        at: Instant,
    ) -> Option<u64> {
        if first_for(uid, me, peers) {
            self.settled(key);
            return None;
        }
        self.deferred.once(key, at, SPREAD_MILLIS)
    }

    /// The run `key` is no longer new (or is gone): forget that it was left alone.
    pub fn settled(&self, key: &RunKey) {
        self.deferred.settled(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RunKey {
        RunKey::new("ns", name)
    }

    #[test]
    fn exactly_one_replica_is_first_for_each_run_and_runs_spread_over_them() {
        let replicas: Vec<String> = ["a-1", "b-2", "c-3"].map(String::from).to_vec();
        let mut firsts = HashMap::new();
        for n in 0..300 {
            let uid = format!("uid-{n}");
            let first: Vec<&String> = replicas
                .iter()
                .filter(|me| first_for(&uid, me, &replicas))
                .collect();
            assert_eq!(first.len(), 1, "{uid}");
            *firsts.entry(first[0].clone()).or_insert(0) += 1;
        }
        for replica in &replicas {
            assert!(firsts[replica] > 50, "{firsts:?}");
        }
        // Alone, a replica is first for every run.
        assert!(first_for("uid-0", "a-1", &[]));
        // The places of the replicas for a run are 0, 1 and 2, the first's being 0.
        for n in 0..50 {
            let uid = format!("uid-{n}");
            let mut places: Vec<usize> = replicas
                .iter()
                .map(|me| place(&uid, me, &replicas))
                .collect();
            let first = replicas
                .iter()
                .position(|me| first_for(&uid, me, &replicas));
            assert_eq!(first.map(|i| places[i]), Some(0), "{uid}");
            places.sort();
            assert_eq!(places, vec![0, 1, 2], "{uid}");
        }
        assert_eq!(place("uid-0", "a-1", &[]), 0);
    }

    #[test]
    fn a_run_is_left_alone_once_for_the_time_given_then_afresh_after_it_settled() {
        let left = LeftAlone::default();
        let t0 = Instant::now();
        let at = |millis: u64| t0 + Duration::from_millis(millis);
        assert_eq!(left.once(&key("r"), at(0), 2_000), Some(2_000));
        assert_eq!(left.once(&key("r"), at(1_500), 2_000), Some(500));
        // Another run is counted on its own.
        assert_eq!(left.once(&key("s"), at(1_500), 2_000), Some(2_000));
        assert_eq!(left.once(&key("r"), at(2_000), 2_000), None);
        // Time up forgot it: a new reason leaves it alone afresh.
        assert_eq!(left.once(&key("r"), at(2_100), 2_000), Some(2_000));
        left.settled(&key("r"));
        assert_eq!(left.once(&key("r"), at(2_200), 2_000), Some(2_000));
    }

    #[test]
    fn a_replica_that_is_not_first_waits_once_then_tries() {
        let spread = Spread::default();
        let peers: Vec<String> = vec!["a-1".into(), "b-2".into()];
        let uid = (0..)
            .map(|n| format!("uid-{n}"))
            .find(|uid| !first_for(uid, "b-2", &peers))
            .expect("a run b-2 is not first for");
        let t0 = Instant::now();
        let b_at = |millis: u64| {
            spread.defer(
                &key("r"),
                &uid,
                "b-2",
                &peers,
                t0 + Duration::from_millis(millis),
            )
        };
        assert_eq!(b_at(0), Some(SPREAD_MILLIS));
        assert_eq!(b_at(500), Some(SPREAD_MILLIS - 500));
        assert_eq!(b_at(SPREAD_MILLIS), None);
        assert_eq!(spread.defer(&key("r"), &uid, "a-1", &peers, t0), None);
    }
}
