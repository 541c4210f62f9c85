//! How a watch recovers (issue 16): each watch is kube-runtime's `watcher` wrapped by
//! [`recovering`] so that
//! - any error makes it relist from scratch (as client-go's reflector does), so a watch that
//!   failed is synced again only once the API server has answered a list, and `/readyz`
//!   (see [`WatchHealth`]) reflects it;
//! - it backs off on its own, with [`WatchBackoff`]: bounded ([`BACKOFF_MAX`]), reset once
//!   the watch works again, and no wait at all after a 410 Gone (the API server answers; only
//!   the resourceVersion is too old, as after a restart or a compaction);
//! - its errors stop there: they never reach the kube-runtime Controller, whose own trigger
//!   backoff would otherwise pause every watch of the scope for up to 30 s per error.
//!
//! The run, Approval and Lease watches ([`super::watches`]) and the admin-policy reflectors
//! ([`super::admin_policy`]) all go through it.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;

use super::metrics::WatchHealth;

/// The first wait after a watch fails (200 ms), doubled after each failure in a row.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// The longest wait between a watch's attempts (4 s), so it recovers within this of the API
/// server answering again (issue 16: within a few seconds).
pub const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// The backoff of one watch (kube-runtime's [`Backoff`], applied with
/// [`WatchStreamExt::backoff`]): [`BACKOFF_INITIAL`] doubling up to [`BACKOFF_MAX`], each wait
/// drawn between half and all of that (jitter, so replicas do not retry in step); back to
/// the start once the watch has worked again; none after a 410 Gone unless the error before it
/// was a 410 answered at once too.
///
/// kube-runtime resets a backoff on any item the stream yields, but a relisting `watcher`
/// yields `Event::Init` before asking the API server anything; the reset here follows
/// [`WatchHealth::successes`] instead (a list completed, a change arrived), and
/// [`Backoff::reset`] does nothing (except in [`WatchBackoff::for_triggers`]).
pub struct WatchBackoff {
    health: Arc<WatchHealth>,
    seen_successes: u64,
    next: Duration,
    last_was_immediate: bool,
    /// Whether [`Backoff::reset`] (any item yielded) resets it, as kube-runtime's backoffs do:
    /// for the Controller's merged triggers, whose items are real objects.
    reset_on_items: bool,
}

impl WatchBackoff {
    /// The backoff of the watch whose health is `health`.
    pub fn new(health: Arc<WatchHealth>) -> WatchBackoff {
        WatchBackoff {
            seen_successes: health.successes(),
            health,
            next: BACKOFF_INITIAL,
            last_was_immediate: false,
            reset_on_items: false,
        }
    }

    /// The same bounded backoff for the Controller's merged trigger stream, reset by any item
    /// it yields.
    pub fn for_triggers() -> WatchBackoff {
        WatchBackoff {
            reset_on_items: true,
            ..WatchBackoff::new(Arc::new(WatchHealth::unreported("triggers")))
        }
    }

    /// The wait before the next attempt, without jitter.
    fn step(&mut self) -> Duration {
        let successes = self.health.successes();
        if successes != self.seen_successes {
            self.seen_successes = successes;
            self.next = BACKOFF_INITIAL;
        }
        if self.health.last_error_was_gone() && !self.last_was_immediate {
            self.last_was_immediate = true;
            return Duration::ZERO;
        }
        self.last_was_immediate = false;
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.step();
        Some(wait.mul_f64(rand::random_range(0.5..=1.0)))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        if self.reset_on_items {
            self.next = BACKOFF_INITIAL;
        }
    }
}

/// Whether a watch error is the API server's 410 Gone (the resourceVersion asked for is older
/// than its history), as a watch event or as the answer to the list or watch request.
fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// A watch as the Controller gets it: `start` (a kube-runtime `watcher`) begun afresh after
/// every error so it relists, its health kept in `health`, backed off with [`WatchBackoff`],
/// and its errors logged and dropped.
pub fn recovering<K, F, S>(
    health: Arc<WatchHealth>,
    start: F,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    F: Fn() -> S + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let start = Arc::new(start);
    let first: BoxStream<'static, Result<Event<K>, watcher::Error>> = start().boxed();
    let observed = health.clone();
    futures::stream::unfold((first, start), |(mut inner, start)| async move {
        let item = inner.next().await?;
        if item.is_err() {
            // Relist: a fresh watcher starts with a list.
            inner = start().boxed();
        }
        Some((item, (inner, start)))
    })
    .inspect(move |item| match item {
        Ok(Event::Init) => observed.relisting(),
        Ok(Event::InitApply(_)) => {}
        Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => observed.worked(),
        Err(err) => observed.failed(is_gone(err), err),
    })
    .backoff(WatchBackoff::new(health))
    .filter(|item| futures::future::ready(item.is_ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_is_bounded_resets_once_the_watch_works_and_skips_a_410() {
        let health = Arc::new(WatchHealth::unreported("agentruns"));
        let mut backoff = WatchBackoff::new(health.clone());
        let waits: Vec<Duration> = (0..10)
            .map(|_| {
                health.failed(false, &"connection refused");
                backoff.step()
            })
            .collect();
        assert_eq!(waits[0], BACKOFF_INITIAL);
        assert_eq!(waits[1], BACKOFF_INITIAL * 2);
        assert!(waits.iter().all(|w| *w <= BACKOFF_MAX), "{waits:?}");
        assert_eq!(waits[9], BACKOFF_MAX);
        // Jittered waits stay within half and all of the step.
        let jittered = backoff.next().unwrap_or_default();
        assert!(
            jittered >= BACKOFF_MAX / 2 && jittered <= BACKOFF_MAX,
            "{jittered:?}"
        );

        health.worked();
        health.failed(false, &"connection refused");
        assert_eq!(
            backoff.step(),
            BACKOFF_INITIAL,
            "reset once the watch worked"
        );
        health.failed(true, &"410 Gone");
        assert_eq!(backoff.step(), Duration::ZERO, "a 410 relists at once");
        health.failed(true, &"410 Gone");
        assert!(backoff.step() > Duration::ZERO, "but not twice in a row");
    }
}
