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
mod tests;
