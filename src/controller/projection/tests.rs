//! Tests of [`super`].
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
