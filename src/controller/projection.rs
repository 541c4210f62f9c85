//! Kubernetes Events on the AgentRun (events.k8s.io/v1): a projection of what one status write
//! added to the record (docs/design.md section 4: Events are projections of the record). Which
//! journal entries become which Event is the engine's projection (`engine::kube_events`): the
//! run started and finished, approvals requested and decided, takeovers, interruptions,
//! resumptions, limits. Publishing is best effort: a failure never touches the run.
//!
//! Each Event is created as kube-runtime's `Recorder` would create a new one, but without its
//! series cache: a journal entry is projected once, so there is no repeat to count, and that
//! cache (every Event of the last six minutes, scanned on each publish) would cost memory and
//! time in proportion to the runs a replica works on.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::runtime::events::{Event, EventType};
use kube::Api;
use serde_json::Value;
use tokio::sync::mpsc;

use super::cluster::StoredRun;
use crate::engine::KubeEventType;

/// The Events one write deserves, from the status before and after it: the engine's projection
/// of the journal entries the write added (`engine::kube_events`), as kube-runtime Events.
pub fn events_for_write(old_status: &Value, new_status: &Value) -> Vec<Event> {
    crate::engine::kube_events(old_status, new_status)
        .into_iter()
        .map(|projection| Event {
            type_: match projection.type_ {
                KubeEventType::Normal => EventType::Normal,
                KubeEventType::Warning => EventType::Warning,
            },
            reason: projection.reason,
            note: Some(projection.message),
            action: "Reconcile".into(),
            secondary: None,
        })
        .collect()
}

/// The events.k8s.io/v1 Event for `event` about `reference`, as reported by `instance`.
pub fn k8s_event(event: &Event, reference: ObjectReference, instance: &str) -> K8sEvent {
    let now = jiff::Timestamp::now();
    K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        event_time: Some(MicroTime(now)),
        note: event.note.clone(),
        metadata: ObjectMeta {
            namespace: reference.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                reference.name.as_deref().unwrap_or(REPORTER),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        regarding: Some(reference),
        reporting_controller: Some(REPORTER.into()),
        reporting_instance: Some(instance.to_string()),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        related: event.secondary.clone(),
        ..K8sEvent::default()
    }
}

/// The reporting controller named on every Event.
const REPORTER: &str = "agentrt-controller";

/// The reference an Event about `run` names.
pub fn reference(run: &StoredRun) -> ObjectReference {
    snapshot_reference(&run.snapshot)
}

fn snapshot_reference(run: &crate::engine::RunSnapshot) -> ObjectReference {
    ObjectReference {
        api_version: Some("agentrt.dev/v1alpha1".into()),
        kind: Some("AgentRun".into()),
        name: Some(run.name.clone()),
        namespace: Some(run.namespace.clone()),
        uid: Some(run.uid.clone()),
        resource_version: None,
        field_path: None,
    }
}

/// How fast one replica publishes Kubernetes Events (`--event-qps`, `--event-burst`, named
/// and meant as the kubelet's flags of those names): a token bucket of `burst` Events refilled
/// at `per_second` Events per second. Events beyond it wait in a queue of [`EVENT_QUEUE`]
/// Events; one that finds the queue full is dropped and counted (`agentrt_kube_events_total`
/// `outcome="dropped"`). The record is never affected: Events are its projection, best effort
/// (docs/design.md section 4), and a limit keeps them from competing with the record's writes
/// for the API server (docs/performance.md, issue 15).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventRate {
    /// Events per second; 0 (or less): no limit.
    pub per_second: f64,
    /// Events published at once before the rate applies (at least 1).
    pub burst: u32,
    /// How long a run's `Started` Event is held before it is published
    /// (`--event-batch-seconds`; zero: not held), so that the run's next Normal Event within
    /// that time (most often its end) is folded into it: a run that ends within it costs one
    /// Event, not two (issue 15: Events batched). Any Event folded into it is due at once.
    ///
    /// A non-zero hold grows by [`HELD_WRITES`] times the API server's median status write time
    /// (`agentrt_status_write_median_seconds`, up to [`MAX_EXTRA_HOLD`]): on a server that
    /// answers a write in a second, a run of ten steps lives eleven seconds or more, and its
    /// `Started` would otherwise go apart from its end, one more request to a server already
    /// slow. On a quick server the extra is milliseconds. The hold is measured again when the
    /// Event falls due, so a run that started before the first write time was measured (the
    /// first runs of a replica) is held by the write time measured since.
    pub batch: std::time::Duration,
}

impl Default for EventRate {
    fn default() -> Self {
        EventRate {
            per_second: 10.0,
            burst: 25,
            batch: std::time::Duration::from_secs(5),
        }
    }
}

/// How many median status write times a held `Started` Event waits beyond
/// `--event-batch-seconds` ([`EventRate::batch`]): twice the eleven writes of a ten-step run,
/// for the writes slower than the median and the time between them (measured in
/// docs/performance.md).
pub const HELD_WRITES: u32 = 20;

/// The most a held `Started` Event waits beyond `--event-batch-seconds` for slow status writes.
pub const MAX_EXTRA_HOLD: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a `Started` Event is held: `batch` (zero: not held), and when held, [`HELD_WRITES`]
/// times `write_median_seconds` more, at most [`MAX_EXTRA_HOLD`] more.
pub fn started_hold(batch: std::time::Duration, write_median_seconds: f64) -> std::time::Duration {
    if batch.is_zero() {
        return batch;
    }
    let extra =
        (write_median_seconds.max(0.0) * f64::from(HELD_WRITES)).min(MAX_EXTRA_HOLD.as_secs_f64());
    batch + std::time::Duration::from_secs_f64(extra)
}

/// The reason of the Event held for [`EventRate::batch`] (the engine's projection of
/// `run.started`).
const HELD_REASON: &str = crate::engine::STARTED_REASON;

/// Events a replica keeps waiting for the rate before it drops new ones (the kubelet keeps
/// 1000 too).
pub const EVENT_QUEUE: usize = 1000;

/// A token bucket on the monotonic clock: [`TokenBucket::take`] says how long to wait before
/// the next Event may go. Tokens go negative while Events wait, so waiters are spaced by
/// `1 / per_second` seconds.
#[derive(Debug)]
struct TokenBucket {
    rate: EventRate,
    tokens: f64,
    at: std::time::Instant,
}

impl TokenBucket {
    fn new(rate: EventRate, now: std::time::Instant) -> TokenBucket {
        TokenBucket {
            rate,
            tokens: f64::from(rate.burst.max(1)),
            at: now,
        }
    }

    /// Takes a token at `now`: the time to wait before using it (zero: at once).
    fn take(&mut self, now: std::time::Instant) -> std::time::Duration {
        if self.rate.per_second <= 0.0 {
            return std::time::Duration::ZERO;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        let burst = f64::from(self.rate.burst.max(1));
        self.tokens = (self.tokens + elapsed * self.rate.per_second).min(burst);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            std::time::Duration::ZERO
        } else {
            std::time::Duration::from_secs_f64(-self.tokens / self.rate.per_second)
        }
    }
}

/// The most bytes an Event's note may hold (the events.k8s.io/v1 API refuses longer ones).
pub const NOTE_LIMIT: usize = 1024;

/// What [`WaitingEvents::push`] did with an Event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// It waits at the end of the queue.
    Added,
    /// It was folded into an Event of the same run already waiting.
    Folded,
    /// The queue holds [`EVENT_QUEUE`] Events: dropped.
    Full,
}

/// The Events waiting for the rate or for their batch, oldest first, each with the instant it
/// is due. A Normal Event about a run that already has a Normal Event waiting is folded into
/// it (the later reason, both notes: "Completed: … (earlier, Started: …)", due at the earlier
/// of the two instants), so a run that starts and ends while its Events wait costs one Event,
/// not two (issue 15: Events batched); Warnings are never folded. On a quiet cluster only a
/// run's `Started` waits ([`EventRate::batch`]).
#[derive(Default)]
pub struct WaitingEvents {
    queue: std::collections::VecDeque<Waiting>,
}

/// One Event waiting in [`WaitingEvents`].
struct Waiting {
    reference: ObjectReference,
    event: Event,
    due: std::time::Instant,
    /// When a held `Started` Event was queued (`None`: not held, or folded into since), so
    /// its hold can be measured again when it falls due ([`WaitingEvents::extend_held`]).
    held_since: Option<std::time::Instant>,
}

impl WaitingEvents {
    /// Queues `event` about `reference`, due at `due` (or at the earlier instant of the Event
    /// it folds into).
    pub fn push(
        &mut self,
        reference: ObjectReference,
        event: Event,
        due: std::time::Instant,
    ) -> Queued {
        self.push_from(reference, event, due, None)
    }

    /// Queues a `Started` Event about `reference` held since `since`, due at `due` at first;
    /// [`WaitingEvents::extend_held`] may hold it longer.
    pub fn push_held(
        &mut self,
        reference: ObjectReference,
        event: Event,
        since: std::time::Instant,
        due: std::time::Instant,
    ) -> Queued {
        self.push_from(reference, event, due, Some(since))
    }

    fn push_from(
        &mut self,
        reference: ObjectReference,
        event: Event,
        due: std::time::Instant,
        held_since: Option<std::time::Instant>,
    ) -> Queued {
        if matches!(event.type_, EventType::Warning) {
            // A Warning never overtakes what its run said before: a held Event of the run is
            // due with it (and goes first, being older).
            for waiting in self
                .queue
                .iter_mut()
                .filter(|waiting| same_run(&waiting.reference, &reference))
            {
                waiting.due = waiting.due.min(due);
            }
        }
        if matches!(event.type_, EventType::Normal) {
            if let Some(waiting) = self.queue.iter_mut().find(|waiting| {
                matches!(waiting.event.type_, EventType::Normal)
                    && same_run(&waiting.reference, &reference)
            }) {
                let earlier = format!(
                    "{}: {}",
                    waiting.event.reason,
                    waiting.event.note.as_deref().unwrap_or_default()
                );
                let mut note = match event.note.as_deref() {
                    Some(note) if !note.is_empty() => format!("{note} (earlier, {earlier})"),
                    _ => format!("(earlier, {earlier})"),
                };
                truncate_note(&mut note);
                waiting.event.reason = event.reason;
                waiting.event.note = Some(note);
                waiting.due = waiting.due.min(due);
                if held_since.is_none() {
                    // What it was held for came: it is due as it is, no longer held.
                    waiting.held_since = None;
                }
                return Queued::Folded;
            }
        }
        if self.queue.len() >= EVENT_QUEUE {
            return Queued::Full;
        }
        self.queue.push_back(Waiting {
            reference,
            event,
            due,
            held_since,
        });
        Queued::Added
    }

    /// Measures again the hold of each held `Started` Event due at `now`: it is due `hold`
    /// after it was queued, when that is later (the server's write time, and so the hold,
    /// grew while it waited: most of all for runs that started before the first write time was
    /// measured). `hold` is [`started_hold`] of the write time now.
    pub fn extend_held(&mut self, now: std::time::Instant, hold: std::time::Duration) {
        for waiting in &mut self.queue {
            let Some(since) = waiting.held_since else {
                continue;
            };
            if waiting.due <= now {
                let until = since + hold;
                if until > now {
                    waiting.due = until;
                } else {
                    waiting.held_since = None;
                }
            }
        }
    }

    /// Takes the oldest Event due at `now`.
    pub fn pop_due(&mut self, now: std::time::Instant) -> Option<(ObjectReference, Event)> {
        let index = self.queue.iter().position(|waiting| waiting.due <= now)?;
        let waiting = self.queue.remove(index)?;
        Some((waiting.reference, waiting.event))
    }

    /// Makes every Event waiting due at `now` at the latest (shutdown: nothing is held).
    pub fn all_due(&mut self, now: std::time::Instant) {
        for waiting in &mut self.queue {
            waiting.due = waiting.due.min(now);
            waiting.held_since = None;
        }
    }

    /// The soonest instant an Event waiting is due (`None`: none waits).
    pub fn next_due(&self) -> Option<std::time::Instant> {
        self.queue.iter().map(|waiting| waiting.due).min()
    }

    /// How many Events wait.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// Whether two Events are about the same run (by uid; an Event without one is about no run).
fn same_run(a: &ObjectReference, b: &ObjectReference) -> bool {
    a.uid.is_some() && a.uid == b.uid
}

/// When `event`, queued at `now`, is due: a Normal `Started` after `batch`, any other at once.
fn due_at(
    event: &Event,
    now: std::time::Instant,
    batch: std::time::Duration,
) -> std::time::Instant {
    if matches!(event.type_, EventType::Normal) && event.reason == HELD_REASON {
        now + batch
    } else {
        now
    }
}

/// Cuts `note` to [`NOTE_LIMIT`] bytes at a character boundary, ending it with "…".
fn truncate_note(note: &mut String) {
    if note.len() <= NOTE_LIMIT {
        return;
    }
    let mut end = NOTE_LIMIT - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push('…');
}

/// Where Events go: a bounded queue to one publishing task that posts them at most at the
/// replica's [`EventRate`], so neither a slow events endpoint nor a burst of Events slows a
/// run down.
#[derive(Clone)]
pub struct EventSink {
    tx: Option<mpsc::Sender<(ObjectReference, Event)>>,
    metrics: Option<std::sync::Arc<super::metrics::Metrics>>,
}

impl EventSink {
    /// A sink that drops everything (unit tests).
    pub fn disabled() -> EventSink {
        EventSink {
            tx: None,
            metrics: None,
        }
    }

    /// A sink publishing as `agentrt-controller` (instance: the holder) at most at `rate`,
    /// counting each Event's outcome in `metrics`; a `Started` Event is held by `rate.batch` and
    /// the status write time in `median` ([`started_hold`]), measured when it is queued and
    /// again when it falls due.
    ///
    /// Once `shutdown` is cancelled nothing is held any more: what waits goes at the rate
    /// while the process still runs (the shutdown grace).
    pub fn start(
        client: kube::Client,
        instance: String,
        rate: EventRate,
        median: super::pacing::WriteMedian,
        metrics: std::sync::Arc<super::metrics::Metrics>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> EventSink {
        let (tx, mut rx) = mpsc::channel::<(ObjectReference, Event)>(EVENT_QUEUE);
        let counted = metrics.clone();
        tokio::spawn(async move {
            let mut bucket = TokenBucket::new(rate, std::time::Instant::now());
            let mut waiting = WaitingEvents::default();
            // The sender is gone: nothing more comes.
            let mut closed = false;
            // Shutdown began, or the sender is gone: nothing is held any more.
            let mut flushing = false;
            // A `Started` Event's hold by the write time measured now.
            let hold_now = || started_hold(rate.batch, median.get());
            // Held Events due at `now` are held again by the write time now (not once flushing).
            let rehold = |waiting: &mut WaitingEvents, now, flushing: bool| {
                if !flushing {
                    waiting.extend_held(now, hold_now());
                }
            };
            let queue = |waiting: &mut WaitingEvents, reference, event: Event, flushing: bool| {
                let batch = if flushing {
                    std::time::Duration::ZERO
                } else {
                    hold_now()
                };
                let now = std::time::Instant::now();
                let due = due_at(&event, now, batch);
                let queued = if due > now {
                    waiting.push_held(reference, event, now, due)
                } else {
                    waiting.push(reference, event, due)
                };
                let outcome = match queued {
                    Queued::Added => return,
                    Queued::Folded => "folded",
                    Queued::Full => "dropped",
                };
                counted.kube_event(outcome);
                counted.kube_events_queued.dec();
            };
            // Everything sent so far joins the queue, folded where it can be.
            let drain = |waiting: &mut WaitingEvents, rx: &mut mpsc::Receiver<_>, flushing| {
                while let Ok((reference, event)) = rx.try_recv() {
                    queue(waiting, reference, event, flushing);
                }
            };
            loop {
                drain(&mut waiting, &mut rx, flushing);
                let now = std::time::Instant::now();
                rehold(&mut waiting, now, flushing);
                match waiting.next_due() {
                    None if closed => break,
                    Some(due) if due <= now => {}
                    soonest => {
                        // Nothing is due: wait for the next Event, the soonest due, or
                        // shutdown (after which what is held is due at once).
                        let until = soonest.map(tokio::time::Instant::from_std);
                        tokio::select! {
                            received = rx.recv(), if !closed => match received {
                                Some((reference, event)) => {
                                    queue(&mut waiting, reference, event, flushing);
                                }
                                None => {
                                    closed = true;
                                    flushing = true;
                                    waiting.all_due(std::time::Instant::now());
                                }
                            },
                            () = shutdown.cancelled(), if !flushing => {
                                flushing = true;
                                waiting.all_due(std::time::Instant::now());
                            }
                            () = async {
                                match until {
                                    Some(until) => tokio::time::sleep_until(until).await,
                                    None => std::future::pending().await,
                                }
                            } => {}
                        }
                        continue;
                    }
                }
                let wait = bucket.take(now);
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                    // What arrived while it waited can still fold into the Event at the head.
                    drain(&mut waiting, &mut rx, flushing);
                }
                let now = std::time::Instant::now();
                rehold(&mut waiting, now, flushing);
                let Some((reference, event)) = waiting.pop_due(now) else {
                    continue;
                };
                let namespace = reference.namespace.clone().unwrap_or_default();
                let api: Api<K8sEvent> = Api::namespaced(client.clone(), &namespace);
                let object = k8s_event(&event, reference, &instance);
                match api.create(&super::cluster::write_params(), &object).await {
                    Ok(_) => counted.kube_event("published"),
                    Err(err) => {
                        counted.kube_event("failed");
                        tracing::debug!(%err, reason = %event.reason, "cannot publish a Kubernetes Event");
                    }
                }
                counted.kube_events_queued.dec();
            }
        });
        EventSink {
            tx: Some(tx),
            metrics: Some(metrics),
        }
    }

    /// Queues one Event; counts it dropped when the queue is full.
    fn queue(&self, reference: ObjectReference, event: Event) {
        let Some(tx) = &self.tx else { return };
        // Counted before it is sent, so the publisher never takes it off below zero.
        if let Some(metrics) = &self.metrics {
            metrics.kube_events_queued.inc();
        }
        if tx.try_send((reference, event)).is_err() {
            if let Some(metrics) = &self.metrics {
                metrics.kube_events_queued.dec();
                metrics.kube_event("dropped");
            }
        }
    }

    /// Queues a Warning Event about `run` that no write projects (a sealed segment the
    /// executor could not read; dropped when the queue is full).
    pub fn warn(&self, run: &crate::engine::RunSnapshot, reason: &str, note: String) {
        self.warn_about(snapshot_reference(run), reason, note);
    }

    /// Queues a Warning Event about the object `reference` names (a run whose spec does not
    /// decode, issue 34; dropped when the queue is full).
    pub fn warn_about(&self, reference: ObjectReference, reason: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.queue(reference, event);
    }

    /// Queues the Events of one write (dropped when the queue is full).
    pub fn write_landed(&self, before: &Value, after: &StoredRun) {
        if self.tx.is_none() {
            return;
        }
        let events = events_for_write(before, &after.snapshot.status);
        if events.is_empty() {
            return;
        }
        let reference = reference(after);
        for event in events {
            self.queue(reference.clone(), event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::{Duration, Instant};

    #[test]
    fn the_bucket_lets_a_burst_through_then_spaces_events_by_the_rate() {
        let start = Instant::now();
        let rate = EventRate {
            per_second: 4.0,
            burst: 3,
            batch: Duration::ZERO,
        };
        let mut bucket = TokenBucket::new(rate, start);
        for _ in 0..3 {
            assert_eq!(bucket.take(start), Duration::ZERO, "the burst goes at once");
        }
        // The next ones wait a quarter of a second each, one after the other.
        assert_eq!(bucket.take(start), Duration::from_millis(250));
        assert_eq!(bucket.take(start), Duration::from_millis(500));
        // A second later four tokens came back, of which two paid the waiters above.
        let later = start + Duration::from_secs(1);
        assert_eq!(bucket.take(later), Duration::ZERO);
        assert_eq!(bucket.take(later), Duration::ZERO);
        assert_eq!(bucket.take(later), Duration::from_millis(250));
        // A long quiet refills no more than the burst.
        let quiet = later + Duration::from_secs(60);
        let mut at_once = 0;
        while bucket.take(quiet).is_zero() {
            at_once += 1;
        }
        assert_eq!(at_once, 3);
    }

    fn normal(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn about(uid: &str) -> ObjectReference {
        ObjectReference {
            name: Some(format!("run-{uid}")),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn a_runs_normal_events_that_wait_together_fold_into_one_and_warnings_never_do() {
        let now = Instant::now();
        let mut waiting = WaitingEvents::default();
        assert_eq!(
            waiting.push(about("a"), normal("RunStarted", "started by c0"), now),
            Queued::Added
        );
        assert_eq!(
            waiting.push(about("b"), normal("RunStarted", "started by c1"), now),
            Queued::Added
        );
        let mut warning = normal("TakenOver", "taken over");
        warning.type_ = EventType::Warning;
        assert_eq!(waiting.push(about("a"), warning, now), Queued::Added);
        assert_eq!(
            waiting.push(
                about("a"),
                normal("RunFinished", "completed after 10 steps"),
                now
            ),
            Queued::Folded
        );
        assert_eq!(waiting.len(), 3);
        let (reference, first) = waiting.pop_due(now).expect("a's folded Event");
        assert_eq!(reference.uid.as_deref(), Some("a"));
        assert_eq!(first.reason, "RunFinished");
        assert_eq!(
            first.note.as_deref(),
            Some("completed after 10 steps (earlier, RunStarted: started by c0)")
        );
        assert_eq!(
            waiting.pop_due(now).map(|(_, e)| e.reason),
            Some("RunStarted".to_string())
        );
        assert_eq!(
            waiting.pop_due(now).map(|(_, e)| e.reason),
            Some("TakenOver".to_string())
        );
        assert!(waiting.is_empty());
        // Once published, an Event is not folded into: the next one waits on its own.
        assert_eq!(
            waiting.push(about("a"), normal("RunFinished", "again"), now),
            Queued::Added
        );
    }

    #[test]
    fn a_started_event_is_held_for_the_batch_and_what_folds_into_it_goes_at_once() {
        let now = Instant::now();
        let batch = Duration::from_secs(5);
        let started = normal(HELD_REASON, "the run started (holder c0)");
        assert_eq!(due_at(&started, now, batch), now + batch);
        assert_eq!(
            due_at(&normal("ApprovalRequested", "step 1 waits"), now, batch),
            now,
            "only Started is held"
        );
        let mut warning = normal(HELD_REASON, "");
        warning.type_ = EventType::Warning;
        assert_eq!(due_at(&warning, now, batch), now, "a Warning is never held");

        let mut waiting = WaitingEvents::default();
        waiting.push(about("a"), started, now + batch);
        let started = normal(HELD_REASON, "the run started (holder c0)");
        waiting.push(about("b"), started, now + batch);
        let mut taken = normal("TakenOver", "b-2 took the run over");
        taken.type_ = EventType::Warning;
        waiting.push(about("c"), taken, now);
        // The Warning behind the held Events goes first; the held ones are not due yet.
        assert_eq!(
            waiting.pop_due(now).map(|(r, _)| r.uid),
            Some(Some("c".to_string()))
        );
        assert!(waiting.pop_due(now).is_none());
        assert_eq!(waiting.next_due(), Some(now + batch));
        // b's run ends within the batch: one Event, due at once, saying both.
        let later = now + Duration::from_secs(2);
        assert_eq!(
            waiting.push(
                about("b"),
                normal("Completed", "the run ended Completed"),
                later
            ),
            Queued::Folded
        );
        let (reference, folded) = waiting.pop_due(later).expect("b's folded Event is due");
        assert_eq!(reference.uid.as_deref(), Some("b"));
        assert_eq!(folded.reason, "Completed");
        assert_eq!(
            folded.note.as_deref(),
            Some("the run ended Completed (earlier, Started: the run started (holder c0))")
        );
        // A Warning about a run never overtakes its held Started: both are due, Started first.
        let mut waiting_d = WaitingEvents::default();
        waiting_d.push(about("d"), normal(HELD_REASON, "started"), now + batch);
        let mut failed = normal("Failed", "the run ended Failed");
        failed.type_ = EventType::Warning;
        waiting_d.push(about("d"), failed, now);
        let order: Vec<String> = std::iter::from_fn(|| waiting_d.pop_due(now))
            .map(|(_, e)| e.reason)
            .collect();
        assert_eq!(order, [HELD_REASON, "Failed"]);
        // Shutdown: nothing is held any more.
        waiting_d.push(about("e"), normal(HELD_REASON, "started"), now + batch);
        waiting_d.all_due(now);
        assert!(waiting_d.pop_due(now).is_some());
        // a's Started goes alone once the batch has passed.
        assert!(waiting.pop_due(later).is_none());
        assert_eq!(
            waiting.pop_due(now + batch).map(|(_, e)| e.reason),
            Some(HELD_REASON.to_string())
        );
    }

    #[test]
    fn a_started_event_is_held_longer_while_status_writes_are_slow() {
        let batch = Duration::from_secs(5);
        assert_eq!(started_hold(batch, 0.0), batch);
        assert_eq!(
            started_hold(batch, 0.0125),
            batch + Duration::from_millis(250)
        );
        assert_eq!(started_hold(batch, 1.5), Duration::from_secs(35));
        assert_eq!(started_hold(batch, 3_600.0), batch + MAX_EXTRA_HOLD);
        // Not held stays not held, however slow the server.
        assert_eq!(started_hold(Duration::ZERO, 2.0), Duration::ZERO);
    }

    #[test]
    fn a_started_event_queued_before_the_write_time_was_measured_is_held_by_it_when_due() {
        let now = Instant::now();
        let batch = Duration::from_secs(5);
        let mut waiting = WaitingEvents::default();
        // Queued when no write time was measured yet: due after the batch alone.
        waiting.push_held(about("a"), normal(HELD_REASON, "started"), now, now + batch);
        waiting.push(about("b"), normal("ApprovalRequested", "step 1 waits"), now);
        let due = now + batch;
        // By then writes take 650 ms: held 20 of them more, from when it was queued.
        let hold = started_hold(batch, 0.65);
        waiting.extend_held(due, hold);
        assert_eq!(
            waiting.pop_due(due).map(|(r, _)| r.uid),
            Some(Some("b".to_string())),
            "an Event never held goes as it was due"
        );
        assert!(waiting.pop_due(due).is_none(), "a's Started waits on");
        assert_eq!(waiting.next_due(), Some(now + hold));
        // The run ends within the longer hold: one Event, due at once, and held no more.
        let end = now + Duration::from_secs(12);
        assert_eq!(
            waiting.push(about("a"), normal("Completed", "ended"), end),
            Queued::Folded
        );
        waiting.extend_held(end, started_hold(batch, 2.0));
        let (_, folded) = waiting.pop_due(end).expect("a's folded Event is due");
        assert_eq!(folded.reason, "Completed");

        // A hold that has passed when measured again is not moved: the Event goes.
        waiting.push_held(about("c"), normal(HELD_REASON, "started"), now, now + batch);
        waiting.extend_held(now + hold, started_hold(batch, 0.1));
        assert!(waiting.pop_due(now + hold).is_some());
        // Shutdown: nothing is held any more, whatever the write time.
        waiting.push_held(about("d"), normal(HELD_REASON, "started"), now, now + batch);
        waiting.all_due(now);
        waiting.extend_held(now, hold);
        assert!(waiting.pop_due(now).is_some());
    }

    #[test]
    fn folded_notes_stay_within_the_api_limit_and_a_full_queue_drops() {
        let now = Instant::now();
        let mut waiting = WaitingEvents::default();
        waiting.push(about("a"), normal("RunStarted", &"é".repeat(600)), now);
        waiting.push(about("a"), normal("RunFinished", &"x".repeat(600)), now);
        let (_, folded) = waiting.pop_due(now).expect("folded");
        let note = folded.note.expect("a note");
        assert!(note.len() <= NOTE_LIMIT, "{}", note.len());
        assert!(note.ends_with('…'));
        for n in 0..EVENT_QUEUE {
            assert_eq!(
                waiting.push(about(&n.to_string()), normal("RunStarted", ""), now),
                Queued::Added
            );
        }
        assert_eq!(
            waiting.push(about("late"), normal("RunStarted", ""), now),
            Queued::Full
        );
        // A run already waiting still folds into its Event when the queue is full.
        assert_eq!(
            waiting.push(about("7"), normal("RunFinished", ""), now),
            Queued::Folded
        );
    }

    #[test]
    fn a_rate_of_zero_is_no_limit() {
        let now = Instant::now();
        let mut bucket = TokenBucket::new(
            EventRate {
                per_second: 0.0,
                burst: 1,
                batch: Duration::ZERO,
            },
            now,
        );
        assert!((0..10_000).all(|_| bucket.take(now).is_zero()));
    }

    #[test]
    fn a_write_projects_its_takeover_interruption_and_approval() {
        let old = json!({"phase": "Running", "events": [{"seq": 1, "type": "run.created"}]});
        let new = json!({"phase": "WaitingForApproval", "events": [
            {"seq": 1, "type": "run.created"},
            {"seq": 2, "type": "step.interrupted", "step": 1, "data": {"previousStatus": "executing"}},
            {"seq": 3, "type": "lease.taken_over", "data": {"previousHolder": "a-1", "holder": "b-2"}},
            {"seq": 4, "type": "approval.requested", "step": 1, "data": {"approval": "r-1-1", "kind": "interrupted_side_effect"}}
        ]});
        let events = events_for_write(&old, &new);
        let reasons: Vec<_> = events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            ["StepInterrupted", "TakenOver", "ApprovalRequested"]
        );
        assert!(matches!(events[1].type_, EventType::Warning));
    }

    #[test]
    fn a_write_that_changes_nothing_visible_projects_nothing() {
        let old = json!({"phase": "Running", "events": [{"seq": 1, "type": "run.created"}]});
        let new = json!({"phase": "Running", "events": [
            {"seq": 1, "type": "run.created"}, {"seq": 2, "type": "step.tool_finished", "step": 0}
        ]});
        assert!(events_for_write(&old, &new).is_empty());
    }

    #[test]
    fn an_event_names_the_run_and_the_reporting_replica() {
        let event = Event {
            type_: EventType::Warning,
            reason: "TakenOver".into(),
            note: Some("taken over".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            name: Some("r".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        let object = k8s_event(&event, reference, "holder-1");
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        assert!(object.metadata.name.as_deref().unwrap().starts_with("r."));
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reporting_controller.as_deref(), Some(REPORTER));
        assert_eq!(object.reporting_instance.as_deref(), Some("holder-1"));
        assert_eq!(object.regarding.and_then(|r| r.name).as_deref(), Some("r"));
    }
}
