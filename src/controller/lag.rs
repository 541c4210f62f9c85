//! How far this replica's run watch runs behind its own status writes ([`WatchLag`]): each
//! answered write is a probe, its delivery by the watch settles it (issue 15). The reconcile
//! leaves a run held elsewhere alone for this lag too once its Lease could have expired, and
//! the metrics export it (`agentrt_watch_lag_seconds`).

/// A lag sample older than this (seconds, monotonic) no longer counts ([`WatchLag::lag_millis`]).
pub const LAG_MEMORY_SECONDS: u64 = 60;

/// A probe in flight this long (seconds) is taken for lost: its event may never come, and
/// [`WatchLag::lag_millis`] reports no more than this. The ten minutes after which a killed
/// replica's presence Lease is deleted ([`super::lease::presence::STALE_AFTER`]).
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
