//! How many runs this replica executes at once when the API server is its bottleneck (issue 15;
//! docs/design.md section 7): the executor slots follow the server's pace, between
//! [`MIN_SLOTS`] and `--max-concurrent-runs`.
//!
//! On a server that answers slowly, every run in flight waits in the same queue. By Little's
//! law the runs finished per second stay what the server can take whatever the number in
//! flight, so more in flight only makes each run live longer, and a run that lives longer costs
//! more: its Lease is renewed every third of its duration, and new runs wait for a slot while
//! the server's queue grows. So the limit is cut when the status writes answer slowly and grown
//! back when they answer quickly again (additive increase, multiplicative decrease, as TCP
//! congestion control does with delay as its signal, as in TCP Vegas):
//!
//! - Each status write's latency is a sample; the median of each window of [`WINDOW`] (with at
//!   least [`MIN_SAMPLES`] samples) is compared to the quickest median seen (the baseline, which
//!   drifts up by [`BASELINE_DRIFT`] per window so a server that became slower for good is
//!   followed).
//! - Congested when the median exceeds [`CONGESTED_FACTOR`] × the baseline, held between
//!   [`CONGESTED_FLOOR_MS`] and [`CONGESTED_CEILING_MS`] (a replica that starts on a server
//!   already overloaded never sees a quick baseline; a write slower than the ceiling, the
//!   Kubernetes API's latency objective for a mutating call, is congestion whatever the
//!   baseline): the limit is multiplied by [`DECREASE`], but not below half the
//!   runs executing (those finish on their own: cutting below them only stops new ones) nor
//!   [`MIN_SLOTS`]. A failed write (the server errored or timed out) counts as congestion.
//! - Quick when the median is under [`QUICK_FACTOR`] × the baseline, held between
//!   [`QUICK_FLOOR_MS`] and half the ceiling: the limit grows by its square root (at least 1), when
//!   the slots are in use (at least [`UTILISED`] of them). A window of fewer than
//!   [`MIN_SAMPLES`] writes, each of them quick, counts as quick too: runs whose tools take
//!   seconds write seldom, and the slots they fill must still grow.
//! - Slow start: a replica begins at [`MIN_SLOTS`] and doubles the limit at each quick window
//!   until the first window that is not quick, as TCP's slow start probes a path before it
//!   fills it. All runs created at once would otherwise all start at once and all wait in the
//!   same queue on a slow server, each living as long as the whole batch takes (their Leases
//!   renewed, their `Started` Events sent apart from their ends), and the slots come down only
//!   as those finish. On a quick server the doubling reaches `--max-concurrent-runs` within a
//!   few seconds.
//!
//! A server answering within [`CONGESTED_FLOOR_MS`] is never judged congested, so a quick
//! cluster reaches `--max-concurrent-runs` by slow start and keeps it. Nothing here decides
//! what a run does: a run in flight is never stopped, only new runs wait (the slot wait of
//! [`super::executors`]).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

/// The median status write time of the pace's last window, in seconds (0 before the first
/// window closes): written by the executors that measure it ([`Pace::last`]), read by the
/// Event sink, which holds a run's `Started` Event longer on a slow server
/// (`controller::projection::started_hold`), and exported as
/// `agentrt_status_write_median_seconds`. Clones share one value.
#[derive(Clone, Debug, Default)]
pub struct WriteMedian(Gauge<f64, AtomicU64>);

impl WriteMedian {
    /// Sets the median to `seconds`.
    pub fn set(&self, seconds: f64) {
        self.0.set(seconds);
    }

    /// The median, in seconds (0 before the first window).
    pub fn get(&self) -> f64 {
        self.0.get()
    }

    /// The gauge that exports it (`agentrt_status_write_median_seconds`).
    pub fn gauge(&self) -> Gauge<f64, AtomicU64> {
        self.0.clone()
    }
}

/// The fewest slots the pace may leave, and where its slow start begins (or
/// `--max-concurrent-runs`, when that is lower). Not fewer: a server can be slow for reasons
/// other than this replica's runs (other clients, a starved machine), and then fewer runs in
/// flight only make fewer runs finish. kube-apiserver shares its capacity between clients
/// itself (API Priority and Fairness queues what is over a client's share), so more writes in
/// flight than the minimum win a replica little but a longer queue.
pub const MIN_SLOTS: usize = 16;
/// How long one window of samples lasts.
pub const WINDOW: Duration = Duration::from_secs(1);
/// The fewest samples a window needs to count.
pub const MIN_SAMPLES: usize = 5;
/// The baseline rises by this factor per window, so it follows a server that slowed for good.
pub const BASELINE_DRIFT: f64 = 1.01;
/// A window's median above this many baselines (and above [`CONGESTED_FLOOR_MS`]) is congestion.
pub const CONGESTED_FACTOR: f64 = 4.0;
/// A window's median at or under this many milliseconds is never congestion.
pub const CONGESTED_FLOOR_MS: f64 = 100.0;
/// A window's median over this many milliseconds is congestion whatever the baseline (the
/// Kubernetes API's latency objective for a mutating call of one object: 1 s).
pub const CONGESTED_CEILING_MS: f64 = 1_000.0;
/// A window's median under this many baselines, or under [`QUICK_FLOOR_MS`], is quick.
pub const QUICK_FACTOR: f64 = 2.0;
/// A window's median under this many milliseconds is quick.
pub const QUICK_FLOOR_MS: f64 = 50.0;
/// What a congested window multiplies the limit by.
pub const DECREASE: f64 = 0.8;
/// The share of the slots that must be in use for a quick window to grow them.
pub const UTILISED: f64 = 0.8;

/// What a window concluded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// The server answered slowly (or failed): the limit was cut.
    Congested,
    /// The server answered quickly: the limit grew (if the slots were in use).
    Quick,
    /// Between the two, or too few samples: the limit stays.
    Steady,
}

/// The pace of one replica: the current slot limit and the window being filled.
#[derive(Debug)]
pub struct Pace {
    max: usize,
    min: usize,
    limit: f64,
    baseline_ms: Option<f64>,
    window_start: Option<Instant>,
    window: Vec<f64>,
    failed: bool,
    /// True until the first window that is not quick: quick windows double the limit.
    slow_start: bool,
    /// The last windows' verdicts and medians (milliseconds), newest last, for the metrics and
    /// tests.
    history: VecDeque<(Verdict, f64)>,
    /// The status writes per second of the last window of at least [`MIN_SAMPLES`], for the log.
    last_rate: f64,
}

impl Pace {
    /// A pace with `max` slots at most (`--max-concurrent-runs`, at least 1) in slow start: it
    /// begins at [`MIN_SLOTS`] (or `max`, when lower).
    pub fn new(max: usize) -> Pace {
        let mut pace = Pace::at_max(max);
        pace.limit = pace.min as f64;
        pace.slow_start = true;
        pace
    }

    /// A pace with `max` slots at most (at least 1) that begins at `max`, without slow start (the
    /// `slow-start` saving off, for measuring).
    pub fn at_max(max: usize) -> Pace {
        let max = max.max(1);
        Pace {
            max,
            min: MIN_SLOTS.min(max),
            limit: max as f64,
            slow_start: false,
            baseline_ms: None,
            window_start: None,
            window: Vec::new(),
            failed: false,
            history: VecDeque::new(),
            last_rate: 0.0,
        }
    }

    /// The slots runs may take now (between the minimum and the maximum).
    pub fn limit(&self) -> usize {
        (self.limit.floor() as usize).clamp(self.min, self.max)
    }

    /// The quickest window median seen, drifted (milliseconds); `None` before the first window.
    pub fn baseline_ms(&self) -> Option<f64> {
        self.baseline_ms
    }

    /// The last window's verdict and median (milliseconds).
    pub fn last(&self) -> Option<(Verdict, f64)> {
        self.history.back().copied()
    }

    /// The status writes per second of the last window of at least [`MIN_SAMPLES`] (0 before
    /// one closed): for the log, which shows whether more slots still landed more writes.
    pub fn last_rate(&self) -> f64 {
        self.last_rate
    }

    /// Records one status write that took `latency` (`ok` false: it failed, not a conflict) at
    /// `at`, with `executing` runs in flight here. Returns the verdict when it closed a window.
    pub fn sample(
        &mut self,
        latency: Duration,
        ok: bool,
        executing: usize,
        at: Instant,
    ) -> Option<Verdict> {
        let start = *self.window_start.get_or_insert(at);
        self.window.push(latency.as_secs_f64() * 1000.0);
        self.failed |= !ok;
        let elapsed = at.saturating_duration_since(start);
        if elapsed < WINDOW {
            return None;
        }
        if self.window.len() >= MIN_SAMPLES {
            self.last_rate = self.window.len() as f64 / elapsed.as_secs_f64();
        }
        let verdict = self.close(executing);
        self.window_start = Some(at);
        Some(verdict)
    }

    fn close(&mut self, executing: usize) -> Verdict {
        let mut window = std::mem::take(&mut self.window);
        let failed = std::mem::take(&mut self.failed);
        window.sort_by(f64::total_cmp);
        if window.len() < MIN_SAMPLES && !failed {
            // Too few writes to judge the server by, unless each of them was quick.
            let quick = self
                .baseline_ms
                .map_or(QUICK_FLOOR_MS, |baseline| self.quick_ms(baseline));
            return match window.last() {
                Some(&slowest) if slowest < quick => {
                    self.grow(executing);
                    self.closed(Verdict::Quick, window[window.len() / 2])
                }
                _ => Verdict::Steady,
            };
        }
        let median = window[window.len() / 2];
        let baseline = match self.baseline_ms {
            Some(baseline) => (baseline * BASELINE_DRIFT).min(median),
            None => median,
        };
        self.baseline_ms = Some(baseline);
        let congested =
            (baseline * CONGESTED_FACTOR).clamp(CONGESTED_FLOOR_MS, CONGESTED_CEILING_MS);
        let verdict = if failed || median > congested {
            let floor = (executing as f64 / 2.0).max(self.min as f64);
            self.limit = (self.limit * DECREASE).max(floor.min(self.limit));
            self.slow_start = false;
            Verdict::Congested
        } else if median < self.quick_ms(baseline) {
            self.grow(executing);
            Verdict::Quick
        } else {
            self.slow_start = false;
            Verdict::Steady
        };
        self.closed(verdict, median)
    }

    /// Under this many milliseconds a window's median is quick, on a baseline of `baseline_ms`.
    fn quick_ms(&self, baseline_ms: f64) -> f64 {
        (baseline_ms * QUICK_FACTOR).clamp(QUICK_FLOOR_MS, CONGESTED_CEILING_MS / 2.0)
    }

    /// After a quick window: the limit doubles in slow start, else grows by its square root (at
    /// least 1); only while the slots are in use (at least [`UTILISED`] of them).
    fn grow(&mut self, executing: usize) {
        if (executing as f64) < self.limit() as f64 * UTILISED {
            return;
        }
        let step = if self.slow_start {
            self.limit
        } else {
            self.limit.sqrt().max(1.0)
        };
        self.limit = (self.limit + step).min(self.max as f64);
    }

    /// Ends a window with `verdict` on its `median` (milliseconds): the limit clamped, the
    /// history kept.
    fn closed(&mut self, verdict: Verdict, median: f64) -> Verdict {
        self.limit = self.limit.clamp(self.min as f64, self.max as f64);
        if self.history.len() == 16 {
            self.history.pop_front();
        }
        self.history.push_back((verdict, median));
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `windows` windows of `per` samples of `ms` milliseconds each, `executing` in flight.
    fn feed(pace: &mut Pace, t: &mut Instant, windows: usize, ms: u64, executing: usize) {
        for _ in 0..windows {
            for _ in 0..10 {
                pace.sample(Duration::from_millis(ms), true, executing, *t);
                *t += WINDOW / 10;
            }
        }
    }

    #[test]
    fn a_quick_server_keeps_every_slot() {
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        feed(&mut pace, &mut t, 30, 6, 256);
        assert_eq!(pace.limit(), 256);
        // Even a median many baselines above the quickest stays under the floor of congestion.
        feed(&mut pace, &mut t, 30, 60, 256);
        assert_eq!(pace.limit(), 256);
        assert_ne!(
            pace.last().map(|(verdict, _)| verdict),
            Some(Verdict::Congested)
        );
    }

    #[test]
    fn a_slow_server_cuts_the_slots_down_to_the_minimum_and_a_quick_one_grows_them_back() {
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        feed(&mut pace, &mut t, 5, 20, 256);
        assert_eq!(pace.limit(), 256);
        // Seconds per write: cut, but never below half of what is executing.
        feed(&mut pace, &mut t, 3, 3_000, 256);
        assert_eq!(
            pace.last().map(|(verdict, _)| verdict),
            Some(Verdict::Congested)
        );
        assert!(
            pace.limit() >= 128 && pace.limit() < 256,
            "{}",
            pace.limit()
        );
        // The runs in flight drain as no new one starts; the cut follows them to the minimum.
        feed(&mut pace, &mut t, 40, 3_000, 4);
        assert_eq!(pace.limit(), MIN_SLOTS);
        // The server recovers: the slots grow back while they are in use, and only then.
        feed(&mut pace, &mut t, 5, 20, 1);
        assert_eq!(pace.limit(), MIN_SLOTS, "unused slots do not grow");
        let mut last = pace.limit();
        for _ in 0..40 {
            let executing = pace.limit();
            feed(&mut pace, &mut t, 1, 20, executing);
            assert!(pace.limit() >= last);
            last = pace.limit();
        }
        assert_eq!(pace.limit(), 256);
    }

    #[test]
    fn a_server_slow_from_the_start_is_congested_past_the_ceiling() {
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        // Never a quick window: the baseline is slow too, yet over a second is congestion.
        feed(&mut pace, &mut t, 30, 2_500, 8);
        assert_eq!(pace.limit(), MIN_SLOTS);
        // Under half the ceiling, on that baseline, counts as quick again.
        let executing = pace.limit();
        feed(&mut pace, &mut t, 2, 400, executing);
        assert_eq!(
            pace.last().map(|(verdict, _)| verdict),
            Some(Verdict::Quick)
        );
        assert!(pace.limit() > MIN_SLOTS);
    }

    #[test]
    fn failed_writes_count_as_congestion_and_few_slow_samples_as_nothing() {
        let mut pace = Pace::at_max(100);
        let mut t = Instant::now();
        pace.sample(Duration::from_millis(5), false, 100, t);
        t += WINDOW;
        assert_eq!(
            pace.sample(Duration::from_millis(5), true, 100, t),
            Some(Verdict::Congested)
        );
        assert_eq!(pace.limit(), 80);
        // Two samples in a window decide nothing.
        t += WINDOW;
        pace.sample(Duration::from_secs(5), true, 100, t);
        t += WINDOW;
        assert_eq!(
            pace.sample(Duration::from_secs(5), true, 100, t),
            Some(Verdict::Steady)
        );
        assert_eq!(pace.limit(), 80);
    }

    #[test]
    fn slow_start_doubles_the_slots_while_the_server_is_quick_and_ends_at_the_first_window_that_is_not(
    ) {
        // Writes of `ms` every tenth of a window until one window closes; its verdict.
        fn window(pace: &mut Pace, t: &mut Instant, ms: u64, executing: usize) -> Verdict {
            loop {
                let verdict = pace.sample(Duration::from_millis(ms), true, executing, *t);
                *t += WINDOW / 10;
                if let Some(verdict) = verdict {
                    return verdict;
                }
            }
        }
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        assert_eq!(pace.limit(), MIN_SLOTS);
        // Slots not in use do not grow, quick or not.
        for _ in 0..3 {
            assert_eq!(window(&mut pace, &mut t, 6, 4), Verdict::Quick);
        }
        assert_eq!(pace.limit(), MIN_SLOTS);
        let executing = pace.limit();
        window(&mut pace, &mut t, 6, executing);
        assert_eq!(pace.limit(), 2 * MIN_SLOTS);
        let executing = pace.limit();
        window(&mut pace, &mut t, 6, executing);
        assert_eq!(pace.limit(), 4 * MIN_SLOTS);
        // Between quick and congested (baseline 6 ms: quick under 50, congested over 100): the
        // limit stays and slow start is over.
        let executing = pace.limit();
        assert_eq!(window(&mut pace, &mut t, 70, executing), Verdict::Steady);
        assert_eq!(pace.limit(), 4 * MIN_SLOTS);
        // From now on a quick window adds the square root, not the limit.
        assert_eq!(window(&mut pace, &mut t, 6, executing), Verdict::Quick);
        let grown = 4 * MIN_SLOTS + (4.0 * MIN_SLOTS as f64).sqrt() as usize;
        assert_eq!(pace.limit(), grown);
    }

    #[test]
    fn a_server_slow_from_the_start_keeps_the_slots_at_the_minimum_they_start_at() {
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        feed(&mut pace, &mut t, 10, 1_500, MIN_SLOTS);
        assert_eq!(pace.limit(), MIN_SLOTS);
        assert_eq!(
            pace.last().map(|(verdict, _)| verdict),
            Some(Verdict::Congested)
        );
        // Without slow start the same server finds 256 slots and cuts them as runs finish.
        let mut at_max = Pace::at_max(256);
        feed(&mut at_max, &mut t, 3, 1_500, 256);
        assert!(at_max.limit() >= 128, "{}", at_max.limit());
    }

    #[test]
    fn runs_that_write_seldom_still_grow_their_slots_when_each_write_is_quick() {
        let mut pace = Pace::new(256);
        let mut t = Instant::now();
        // Two writes a second (tools that take seconds): every window is sparse.
        let sparse = |pace: &mut Pace, t: &mut Instant, ms: u64| {
            let executing = pace.limit();
            for _ in 0..3 {
                pace.sample(Duration::from_millis(ms), true, executing, *t);
                *t += WINDOW / 2;
            }
        };
        sparse(&mut pace, &mut t, 8);
        assert_eq!(pace.limit(), 2 * MIN_SLOTS);
        sparse(&mut pace, &mut t, 8);
        assert!(pace.limit() > 2 * MIN_SLOTS, "{}", pace.limit());
        // A sparse window with a slow write decides nothing, either way.
        let before = pace.limit();
        sparse(&mut pace, &mut t, 2_000);
        assert_eq!(pace.limit(), before);
    }

    #[test]
    fn a_low_maximum_is_also_the_minimum() {
        let mut pace = Pace::new(2);
        let mut t = Instant::now();
        feed(&mut pace, &mut t, 10, 5_000, 2);
        assert_eq!(pace.limit(), 2);
    }
}
