//! The sealing rule, the segment's hash and name, chain verification and stitching
//! (docs/design.md section 4a, docs/behaviours.md 55-58).

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::api::{
    AgentRunStatus, DecisionRecord, EventType, Observation, ObservationKind, RunEvent, RunPhase,
    Step, StepStatus, Time,
};

const OWNER: SegmentOwner<'static> = SegmentOwner {
    name: "refund-1042",
    uid: "6f1c2a1e-0000-4000-8000-000000001042",
};

fn small(seal_steps: usize, keep_steps: usize) -> SealLimits {
    SealLimits {
        seal_steps,
        seal_bytes: usize::MAX,
        keep_steps,
        min_keep_steps: 1,
        segment_bytes: usize::MAX,
    }
}

/// A record being written as the engine would: steps and their events, seq without gaps.
#[derive(Default, Clone)]
struct Record {
    status: AgentRunStatus,
    next_seq: i64,
}

impl Record {
    fn new() -> Record {
        let mut r = Record {
            status: AgentRunStatus {
                phase: RunPhase::Running,
                ..AgentRunStatus::default()
            },
            next_seq: 1,
        };
        r.event(EventType::RunCreated, None);
        r.event(EventType::RunStarted, None);
        r
    }

    fn event(&mut self, type_: EventType, step: Option<i64>) {
        self.status.events.push(RunEvent {
            seq: self.next_seq,
            time: Time::from_millis(1_767_225_600_000 + self.next_seq),
            type_,
            step: step.map(StepIndex),
            data: Some(json!({"n": self.next_seq})),
        });
        self.next_seq += 1;
    }

    /// Starts step `index` (status `executing`) with `payload` bytes in its observation.
    fn start(&mut self, payload: usize) -> i64 {
        let index = self.status.steps.last().map_or(0, |s| s.index.get() + 1);
        self.status.steps.push(Step {
            index: StepIndex(index),
            status: StepStatus::Executing,
            decision: Some(DecisionRecord {
                kind: Some("tool_call".into()),
                tool: Some("lookup_order".into()),
                args: Some(json!({"order": index})),
                ..DecisionRecord::default()
            }),
            policy: None,
            observation: None,
            approvals: Vec::new(),
            attempts: 1,
            started_at: Some(Time::from_millis(1_767_225_600_000)),
            finished_at: None,
        });
        self.event(EventType::StepStarted, Some(index));
        self.event(EventType::StepToolStarted, Some(index));
        self.status.steps.last_mut().expect("step").observation = Some(Observation {
            kind: ObservationKind::ToolResult,
            content: Some(Value::String("x".repeat(payload))),
            summary: "ok".into(),
            content_hash: String::new(),
            truncated: None,
        });
        index
    }

    fn settle(&mut self, index: i64) {
        let step = self
            .status
            .steps
            .iter_mut()
            .find(|s| s.index == StepIndex(index))
            .expect("step in window");
        step.status = StepStatus::Done;
        self.event(EventType::StepToolFinished, Some(index));
    }

    fn settled_steps(n: usize) -> Record {
        let mut r = Record::new();
        for _ in 0..n {
            let i = r.start(10);
            r.settle(i);
        }
        r
    }
}

fn fetched_of(segments: &[Seal]) -> BTreeMap<String, Value> {
    segments
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                serde_json::to_value(&s.segment).expect("segment JSON"),
            )
        })
        .collect()
}

#[test]
fn a_window_under_both_limits_seals_nothing() {
    let r = Record::settled_steps(4);
    assert_eq!(seal(OWNER, &r.status, &small(4, 1)).expect("seal"), None);
    assert_eq!(
        seal(OWNER, &r.status, &SealLimits::default()).expect("seal"),
        None
    );
}

#[test]
fn past_seal_steps_the_oldest_settled_steps_but_the_last_keep_steps_are_sealed() {
    let r = Record::settled_steps(5);
    let sealed = seal(OWNER, &r.status, &small(4, 1))
        .expect("seal")
        .expect("a seal");
    let seg = &sealed.segment;
    assert_eq!((seg.index, seg.first_step, seg.last_step), (0, 0, 3));
    assert_eq!(seg.step_count, 4);
    assert_eq!(seg.previous, "");
    // run.created, run.started (run-level, with the first steps), then 3 events per step.
    assert_eq!((seg.first_seq, seg.last_seq), (1, 14));
    assert_eq!(seg.events.len(), 14);
    assert_eq!(sealed.status.steps.len(), 1);
    assert_eq!(sealed.status.steps[0].index, StepIndex(4));
    assert_eq!(sealed.status.events[0].seq, 15);
    let archive = sealed.status.archive.as_ref().expect("archive");
    assert_eq!(archive.head, sealed.sha256);
    assert_eq!(archive.segments.len(), 1);
    assert_eq!(archive.segments[0].name, sealed.name);
    assert_eq!(archive.segments[0].bytes, seg.bytes);
    assert_eq!(
        seg.bytes,
        content_bytes(&seg.steps, &seg.events).expect("bytes")
    );
}

#[test]
fn default_limits_seal_at_65_settled_steps_keeping_8() {
    let r = Record::settled_steps(65);
    let sealed = seal(OWNER, &r.status, &SealLimits::default())
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.step_count, 57);
    assert_eq!(sealed.status.steps.len(), 8);
    assert_eq!(
        seal(
            OWNER,
            &Record::settled_steps(64).status,
            &SealLimits::default()
        )
        .expect("seal"),
        None
    );
}

#[test]
fn past_seal_bytes_a_few_large_steps_are_sealed() {
    let mut r = Record::new();
    for _ in 0..3 {
        let i = r.start(20_000);
        r.settle(i);
    }
    let limits = SealLimits {
        seal_bytes: 50_000,
        keep_steps: 1,
        ..SealLimits::default()
    };
    let sealed = seal(OWNER, &r.status, &limits)
        .expect("seal")
        .expect("over 50,000 bytes");
    assert_eq!(sealed.segment.step_count, 2);
    // Under the byte limit, 3 settled steps seal nothing.
    let under = SealLimits {
        seal_bytes: 1_000_000,
        ..limits
    };
    assert_eq!(seal(OWNER, &r.status, &under).expect("seal"), None);
}

#[test]
fn an_unsettled_step_is_never_sealed_nor_anything_after_it() {
    let mut r = Record::settled_steps(2);
    let waiting = r.start(10);
    r.status.steps[waiting as usize].status = StepStatus::AwaitingApproval;
    let sealed = seal(OWNER, &r.status, &small(1, 0))
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.last_step, 1);
    assert_eq!(sealed.status.steps.len(), 1);
    assert_eq!(sealed.status.steps[0].status, StepStatus::AwaitingApproval);
    for status in [
        StepStatus::Deciding,
        StepStatus::AwaitingApproval,
        StepStatus::Executing,
    ] {
        let mut r = Record::settled_steps(3);
        r.status.steps[0].status = status;
        assert_eq!(
            seal(OWNER, &r.status, &small(1, 0)).expect("seal"),
            None,
            "{status:?} first in the window"
        );
    }
    // An interrupted step still to be resolved (the last one) is never sealed.
    let mut r = Record::settled_steps(3);
    r.status.steps[2].status = StepStatus::Interrupted;
    let sealed = seal(OWNER, &r.status, &small(1, 0))
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.last_step, 1);
    assert_eq!(sealed.status.steps[0].status, StepStatus::Interrupted);
}

#[test]
fn an_interrupted_step_the_run_went_on_past_is_sealed_like_a_settled_one() {
    // A takeover resolved it (run.resumed, the next step started): it is history.
    let mut r = Record::settled_steps(3);
    r.status.steps[0].status = StepStatus::Interrupted;
    let sealed = seal(OWNER, &r.status, &small(1, 0))
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.steps[0].status, StepStatus::Interrupted);
    assert_eq!(sealed.segment.last_step, 2);
}

#[test]
fn an_event_of_a_sealed_step_after_a_kept_one_keeps_that_step_in_the_window() {
    let mut r = Record::settled_steps(3);
    let last = r.start(10);
    r.settle(last);
    // An approval.decided of step 1 after step 3's events: step 1 and later stay.
    r.event(EventType::ApprovalDecided, Some(1));
    let sealed = seal(OWNER, &r.status, &small(2, 1))
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.last_step, 0);
    assert!(sealed
        .segment
        .events
        .iter()
        .all(|e| e.step.is_none_or(|s| s == StepIndex(0))));
}

#[test]
fn a_segment_holds_at_most_segment_bytes_of_steps_and_at_least_one() {
    let mut r = Record::new();
    for _ in 0..6 {
        let i = r.start(1000);
        r.settle(i);
    }
    let limits = SealLimits {
        seal_steps: 1,
        seal_bytes: usize::MAX,
        keep_steps: 0,
        min_keep_steps: 0,
        segment_bytes: 2500,
    };
    let sealed = seal(OWNER, &r.status, &limits)
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.step_count, 2);
    let limits = SealLimits {
        segment_bytes: 1,
        ..limits
    };
    let sealed = seal(OWNER, &r.status, &limits)
        .expect("seal")
        .expect("a seal");
    assert_eq!(sealed.segment.step_count, 1);
}

#[test]
fn a_window_that_does_not_continue_its_archive_is_not_sealed() {
    let r = Record::settled_steps(5);
    let sealed = seal(OWNER, &r.status, &small(3, 2))
        .expect("seal")
        .expect("seal");
    let mut gap = sealed.status.clone();
    gap.steps.remove(0);
    assert!(matches!(
        seal(OWNER, &gap, &small(0, 0)),
        Err(ArchiveError::Window(_))
    ));
    let mut head = sealed.status;
    head.archive.as_mut().expect("archive").head = "sha256:00".into();
    assert!(matches!(
        seal(OWNER, &head, &small(0, 0)),
        Err(ArchiveError::Window(_))
    ));
}

#[test]
fn the_segment_sha256_is_of_its_canonical_json_and_its_name_carries_ten_hex() {
    let r = Record::settled_steps(3);
    let sealed = seal(OWNER, &r.status, &small(1, 0))
        .expect("seal")
        .expect("seal");
    let value = serde_json::to_value(&sealed.segment).expect("JSON");
    let text = crate::engine::canonical::canonical_json(&value).expect("canonical");
    assert_eq!(
        sealed.sha256,
        crate::engine::canonical::sha256_tagged(text.as_bytes())
    );
    let hex = &sealed.sha256["sha256:".len().."sha256:".len() + 10];
    assert_eq!(sealed.name, format!("refund-1042-0-{hex}"));
    // The same window seals to the same name (a create is idempotent by content) ...
    let again = seal(OWNER, &r.status, &small(1, 0))
        .expect("seal")
        .expect("seal");
    assert_eq!(again.name, sealed.name);
    // ... and one sealed differently gets another name.
    let other = seal(OWNER, &r.status, &small(1, 1))
        .expect("seal")
        .expect("seal");
    assert_ne!(other.name, sealed.name);
}

#[test]
fn a_long_run_name_still_gives_a_dns_subdomain_of_at_most_253() {
    let sha = format!("sha256:{}", "ab".repeat(32));
    let long = format!("{}.{}", "a".repeat(200), "b".repeat(52));
    assert_eq!(long.len(), 253);
    let name = segment_name(&long, 12345, &sha);
    assert!(name.len() <= 253, "{}", name.len());
    assert!(name.ends_with("-12345-ababababab"), "{name}");
    // Cut just after a '.', the dot is dropped so no label starts with '-'.
    let dotted = format!("{}.{}", "a".repeat(239), "b".repeat(13));
    let name = segment_name(&dotted, 7, &sha);
    assert_eq!(name, format!("{}-7-ababababab", "a".repeat(239)));
    for name in [segment_name(&long, 0, &sha), name] {
        assert!(name
            .split('.')
            .all(|l| !l.is_empty() && !l.starts_with('-') && !l.ends_with('-')));
    }
}

#[test]
fn an_intact_chain_verifies_and_stitches_back_to_the_whole_record() {
    let mut full = Record::new();
    let mut window = full.status.clone();
    let mut seals = Vec::new();
    for _ in 0..12 {
        let i = full.start(50);
        full.settle(i);
        let sealed_steps: usize = seals.iter().map(|s: &Seal| s.segment.steps.len()).sum();
        window.steps = full.status.steps[sealed_steps..].to_vec();
        window.events = full.status.events[seals_events(&seals)..].to_vec();
        if let Some(s) = seal(OWNER, &window, &small(3, 1)).expect("seal") {
            window = s.status.clone();
            seals.push(s);
        }
    }
    assert!(seals.len() >= 3);
    let verified =
        verify_chain(OWNER.uid, window.archive.as_ref(), &fetched_of(&seals)).expect("intact");
    assert_eq!(verified.report.segments, seals.len());
    assert_eq!(verified.report.sealed_steps.map(|r| r.0), Some(0));
    let whole = stitch(&window, &verified).expect("stitched");
    assert_eq!(whole.steps, full.status.steps);
    assert_eq!(whole.events, full.status.events);
}

fn seals_events(seals: &[Seal]) -> usize {
    seals.iter().map(|s| s.segment.events.len()).sum()
}

fn three_segments() -> (AgentRunStatus, Vec<Seal>) {
    let mut window = Record::settled_steps(8).status;
    let mut seals = Vec::new();
    for _ in 0..3 {
        let s = seal(
            OWNER,
            &window,
            &SealLimits {
                segment_bytes: 1,
                ..small(1, 2)
            },
        )
        .expect("seal")
        .expect("a seal");
        window = s.status.clone();
        seals.push(s);
    }
    (window, seals)
}

#[test]
fn a_missing_segment_is_named() {
    let (window, seals) = three_segments();
    let mut fetched = fetched_of(&seals);
    fetched.remove(&seals[1].name);
    let fault = verify_chain(OWNER.uid, window.archive.as_ref(), &fetched).expect_err("missing");
    assert_eq!(
        fault,
        ChainFault::Missing {
            index: 1,
            name: seals[1].name.clone()
        }
    );
    assert_eq!(fault.segment(), Some(seals[1].name.as_str()));
}

#[test]
fn an_altered_segment_is_named_the_first_one_first() {
    let (window, seals) = three_segments();
    let mut fetched = fetched_of(&seals);
    for s in [&seals[2], &seals[1]] {
        let spec = fetched.get_mut(&s.name).expect("fetched");
        spec["steps"][0]["observation"]["summary"] = json!("rewritten");
    }
    let fault = verify_chain(OWNER.uid, window.archive.as_ref(), &fetched).expect_err("altered");
    assert!(
        matches!(&fault, ChainFault::Altered { index: 1, name, .. } if *name == seals[1].name),
        "{fault}"
    );
    assert!(fault.to_string().contains(&seals[1].name), "{fault}");
}

#[test]
fn a_float_spelled_integer_does_not_alter_a_segment() {
    let (window, seals) = three_segments();
    let mut fetched = fetched_of(&seals);
    let spec = fetched.get_mut(&seals[0].name).expect("fetched");
    spec["steps"][0]["decision"]["args"]["order"] = json!(0.0);
    verify_chain(OWNER.uid, window.archive.as_ref(), &fetched).expect("the same number");
}

#[test]
fn an_edited_archive_index_breaks_the_chain() {
    let (mut window, seals) = three_segments();
    let archive = window.archive.as_mut().expect("archive");
    archive.segments.swap(0, 1);
    let fault = verify_chain(OWNER.uid, Some(archive), &fetched_of(&seals)).expect_err("broken");
    assert!(
        matches!(fault, ChainFault::Broken { index: 0, .. }),
        "{fault}"
    );
    let (mut window, seals) = three_segments();
    window.archive.as_mut().expect("archive").head = seals[1].sha256.clone();
    let fault =
        verify_chain(OWNER.uid, window.archive.as_ref(), &fetched_of(&seals)).expect_err("head");
    assert!(matches!(fault, ChainFault::Record(_)), "{fault}");
    let fault = verify_chain("another-uid", window.archive.as_ref(), &fetched_of(&seals))
        .expect_err("another run");
    assert!(
        matches!(fault, ChainFault::Broken { index: 0, .. }),
        "{fault}"
    );
}

#[test]
fn a_window_that_does_not_continue_the_segments_does_not_stitch() {
    let (mut window, seals) = three_segments();
    let verified =
        verify_chain(OWNER.uid, window.archive.as_ref(), &fetched_of(&seals)).expect("intact");
    window.steps.remove(0);
    assert!(matches!(
        stitch(&window, &verified),
        Err(ChainFault::Record(_))
    ));
}

#[test]
fn a_run_that_never_sealed_verifies_as_empty_and_stitches_to_itself() {
    let r = Record::settled_steps(3);
    let verified = verify_chain(OWNER.uid, None, &BTreeMap::new()).expect("intact");
    assert_eq!(verified.report, ChainReport::default());
    assert_eq!(stitch(&r.status, &verified).expect("whole"), r.status);
}

#[test]
fn a_status_without_archive_still_decodes_and_omits_it() {
    let old: AgentRunStatus =
        serde_json::from_value(json!({"phase": "Running", "stepCount": 0})).expect("old status");
    assert_eq!(old.archive, None);
    let text = serde_json::to_value(&old).expect("JSON");
    assert!(text.get("archive").is_none(), "{text}");
}

/// One step of a generated run: its payload size and the run-level events after it.
#[derive(Debug, Clone)]
struct GenStep {
    payload: usize,
    run_level_after: usize,
    seal_while_executing: bool,
}

fn gen_step() -> impl Strategy<Value = GenStep> {
    (0usize..3000, 0usize..3, any::<bool>()).prop_map(|(payload, run_level_after, seal)| GenStep {
        payload,
        run_level_after,
        seal_while_executing: seal,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// docs/behaviours.md 58: sealing as the run goes, then stitching the segments and the
    /// window, gives back exactly the record that was never sealed; no unsettled step is sealed.
    #[test]
    fn seal_then_stitch_gives_back_exactly_the_unsealed_record(
        steps in prop::collection::vec(gen_step(), 0..40),
        seal_steps in 0usize..6,
        keep_steps in 0usize..4,
        seal_bytes in prop::option::of(1000usize..20_000),
        segment_bytes in prop::option::of(1000usize..10_000),
    ) {
        let limits = SealLimits {
            seal_steps,
            seal_bytes: seal_bytes.unwrap_or(usize::MAX),
            keep_steps,
            min_keep_steps: keep_steps,
            segment_bytes: segment_bytes.unwrap_or(usize::MAX),
        };
        let mut full = Record::new();
        let mut window = full.status.clone();
        let mut seals: Vec<Seal> = Vec::new();
        // The window follows the full record: what the full record gained since the last seal.
        let sync = |full: &Record, window: &mut AgentRunStatus, seals: &[Seal]| {
            let sealed_steps: usize = seals.iter().map(|s| s.segment.steps.len()).sum();
            let sealed_events = seals_events(seals);
            window.steps = full.status.steps[sealed_steps..].to_vec();
            window.events = full.status.events[sealed_events..].to_vec();
        };
        for g in &steps {
            let i = full.start(g.payload);
            sync(&full, &mut window, &seals);
            if g.seal_while_executing {
                if let Some(s) = seal(OWNER, &window, &limits).expect("seal") {
                    prop_assert!(s.segment.steps.iter().all(|st| is_settled(st.status)));
                    prop_assert!(s.status.steps.iter().any(|st| st.index == StepIndex(i)));
                    window = s.status.clone();
                    seals.push(s);
                }
            }
            full.settle(i);
            for _ in 0..g.run_level_after {
                full.event(EventType::LeaseTakenOver, None);
            }
            sync(&full, &mut window, &seals);
            if let Some(s) = seal(OWNER, &window, &limits).expect("seal") {
                prop_assert!(s.segment.steps.iter().all(|st| is_settled(st.status)));
                let settled_left = s.status.steps.iter().filter(|st| is_settled(st.status)).count();
                prop_assert!(settled_left >= keep_steps.min(window.steps.len()));
                window = s.status.clone();
                seals.push(s);
            }
        }
        let verified = verify_chain(OWNER.uid, window.archive.as_ref(), &fetched_of(&seals))
            .expect("an intact chain");
        prop_assert_eq!(verified.report.segments, seals.len());
        let whole = stitch(&window, &verified).expect("stitched");
        prop_assert_eq!(&whole.steps, &full.status.steps);
        prop_assert_eq!(&whole.events, &full.status.events);
        let mut rest = whole;
        rest.archive = None;
        let mut expected = full.status.clone();
        expected.archive = None;
        prop_assert_eq!(rest, expected);
    }
}

/// A fixed segment, written out as its canonical text by hand.
const PINNED_SEGMENT_TEXT: &str = concat!(
    r#"{"bytes":10,"events":[{"seq":1,"time":"2026-01-01T00:00:00.000Z","type":"run.created"}],"#,
    r#""firstSeq":1,"firstStep":0,"index":0,"lastSeq":1,"lastStep":0,"previous":"","#,
    r#""runName":"refund-1042","runUID":"6f1c2a1e-0000-4000-8000-000000001042","stepCount":1,"#,
    r#""steps":[{"attempts":1,"index":0,"status":"done"}]}"#
);

#[test]
fn the_sha256_of_a_fixed_segment_is_that_of_its_hand_written_canonical_text() {
    let spec: crate::api::AgentRunSegmentSpec = serde_json::from_value(json!({
        "runName": "refund-1042",
        "runUID": OWNER.uid,
        "index": 0,
        "firstStep": 0,
        "lastStep": 0,
        "firstSeq": 1,
        "lastSeq": 1,
        "previous": "",
        "stepCount": 1,
        "bytes": 10,
        "steps": [{"index": 0, "status": "done", "attempts": 1}],
        "events": [{"seq": 1, "time": "2026-01-01T00:00:00Z", "type": "run.created"}],
    }))
    .expect("spec");
    assert_eq!(
        segment_sha256(&spec).expect("sha256"),
        crate::engine::canonical::sha256_tagged(PINNED_SEGMENT_TEXT.as_bytes())
    );
}

/// A run sealed `n` times, one step per segment: the window and every seal.
fn many_segments(n: usize) -> (AgentRunStatus, Vec<Seal>) {
    let mut window = Record::settled_steps(n + 2).status;
    let mut seals = Vec::new();
    for _ in 0..n {
        let s = seal(
            OWNER,
            &window,
            &SealLimits {
                segment_bytes: 1,
                ..small(1, 2)
            },
        )
        .expect("seal")
        .expect("a seal");
        window = s.status.clone();
        seals.push(s);
    }
    (window, seals)
}

#[test]
fn the_archive_index_keeps_the_newest_entries_and_a_count_whatever_the_length() {
    let (window, seals) = many_segments(30);
    let archive = window.archive.as_ref().expect("archive");
    assert_eq!(archive.segments.len(), KEPT_ENTRIES);
    assert_eq!(archive.count, Some(30));
    assert_eq!(archive.head, seals[29].sha256);
    let indices: Vec<i64> = archive.segments.iter().map(|e| e.index).collect();
    assert_eq!(indices, (22..30).collect::<Vec<_>>());
    for (i, s) in seals.iter().enumerate() {
        assert_eq!(
            s.segment.index, i as i64,
            "numbered by the count, not the entries"
        );
    }
    // The index's size does not grow with the run.
    let size = |n: usize| {
        serde_json::to_string(&many_segments(n).0.archive)
            .unwrap()
            .len()
    };
    // (The same number of entries; only their numbers' digits differ.)
    assert!(size(40) <= size(12) + 8 * 8, "{} vs {}", size(40), size(12));
    // The whole history walks back from the oldest kept entry through each `previous`.
    let verified = verify_chain(OWNER.uid, Some(archive), &fetched_of(&seals)).expect("intact");
    assert_eq!(verified.report.segments, 30);
    assert_eq!(verified.report.sealed_steps, Some((0, 29)));
}

#[test]
fn a_segment_older_than_the_kept_entries_is_named_when_missing_or_altered() {
    let (window, seals) = many_segments(20);
    let archive = window.archive.as_ref().expect("archive");
    let mut fetched = fetched_of(&seals);
    fetched.remove(&seals[5].name);
    let fault = verify_chain(OWNER.uid, Some(archive), &fetched).expect_err("missing");
    assert_eq!(
        fault,
        ChainFault::Missing {
            index: 5,
            name: seals[5].name.clone()
        }
    );
    let mut fetched = fetched_of(&seals);
    fetched.get_mut(&seals[3].name).expect("fetched")["steps"][0]["observation"]["summary"] =
        json!("rewritten");
    let fault = verify_chain(OWNER.uid, Some(archive), &fetched).expect_err("altered");
    assert!(
        matches!(&fault, ChainFault::Altered { index: 3, name, .. } if *name == seals[3].name),
        "{fault}"
    );
    // A count that says more segments than the chain reaches back to step 0 is broken.
    let mut edited = archive.clone();
    edited.count = Some(25);
    for (i, e) in edited.segments.iter_mut().enumerate() {
        e.index = 17 + i as i64;
    }
    let fault = verify_chain(OWNER.uid, Some(&edited), &fetched_of(&seals)).expect_err("count");
    assert!(fault.segment().is_some(), "{fault}");
}

#[test]
fn a_record_from_before_the_index_was_bounded_seals_on_with_the_next_index() {
    let (mut window, seals) = many_segments(10);
    // Re-create the unbounded index an older controller wrote: every entry, no count.
    let archive = window.archive.as_mut().expect("archive");
    archive.count = None;
    archive.segments = seals
        .iter()
        .map(|s| crate::api::ArchivedSegment {
            name: s.name.clone(),
            index: s.segment.index,
            first_step: s.segment.first_step,
            last_step: s.segment.last_step,
            first_seq: s.segment.first_seq,
            last_seq: s.segment.last_seq,
            bytes: s.segment.bytes,
            sha256: s.sha256.clone(),
        })
        .collect();
    verify_chain(OWNER.uid, Some(archive), &fetched_of(&seals)).expect("the old index verifies");
    let next = seal(
        OWNER,
        &window,
        &SealLimits {
            segment_bytes: 1,
            ..small(1, 1)
        },
    )
    .expect("seal")
    .expect("a seal");
    assert_eq!(next.segment.index, 10);
    let archive = next.status.archive.as_ref().expect("archive");
    assert_eq!(archive.count, Some(11));
    assert_eq!(archive.segments.len(), KEPT_ENTRIES);
    let mut all = seals;
    all.push(next.clone());
    verify_chain(OWNER.uid, Some(archive), &fetched_of(&all)).expect("intact");
}

#[test]
fn sealing_by_bytes_leaves_the_window_at_about_a_third_of_seal_bytes() {
    // 16 KiB answers, 128 KiB seal_bytes, 8 kept: the 8 kept steps alone pass seal_bytes.
    let mut r = Record::new();
    for _ in 0..9 {
        let i = r.start(16 * 1024);
        r.settle(i);
    }
    let limits = SealLimits {
        seal_steps: 64,
        seal_bytes: 128 * 1024,
        keep_steps: 8,
        min_keep_steps: 1,
        segment_bytes: usize::MAX,
    };
    let sealed = seal(OWNER, &r.status, &limits)
        .expect("seal")
        .expect("a seal");
    let left = window_len(&sealed.status);
    assert!(left <= 128 * 1024 / 3 + 16 * 1024, "{left} bytes left");
    assert!(
        left >= 128 * 1024 / 3 - 16 * 1024,
        "not more than needed: {left} bytes left"
    );
    assert!(sealed.status.steps.len() < 8, "fewer than keep_steps stay");
    // The next seal is several steps away: adding steps until the window passes seal_bytes.
    let mut window = sealed.status.clone();
    let mut added = 0;
    while window_len(&window) <= limits.seal_bytes {
        let i = r.start(16 * 1024);
        r.settle(i);
        let sealed_steps = sealed.segment.steps.len();
        window.steps = r.status.steps[sealed_steps..].to_vec();
        window.events = r.status.events[sealed.segment.events.len()..].to_vec();
        added += 1;
    }
    assert!(added >= 5, "a seal again after {added} steps");
    // The floor the engine's rules need still stays.
    let floor = SealLimits {
        min_keep_steps: 6,
        ..limits
    };
    let sealed = seal(OWNER, &r.status, &floor)
        .expect("seal")
        .expect("a seal");
    assert!(sealed.status.steps.len() >= 6);
}
