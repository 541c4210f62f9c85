//! Sealed history on an API server (docs/design.md sections 2 and 4a, docs/behaviours.md 58):
//! an AgentRunSegment's spec cannot be edited and it has no status; `agentrt verify`, `agentrt
//! show run -o json|yaml` and `agentrt events` read a run's whole history from its window and
//! its segments, and exit 1 naming a segment that was deleted or replaced by other content.
//!
//! The segments are sealed by `engine::archive::seal` and created by hand here (the controller
//! that seals as a run goes is not part of this test). Runs against the embedded API server, or
//! a real cluster when `AGENTRT_TEST_KUBECONFIG` is set. No controller runs
//! ([`agentrt_cluster`]): the runs here are written by hand and none may be picked up.

mod support;

use std::process::Output;

use agentrt::api::{
    AgentRun, AgentRunSegment, AgentRunStatus, DecisionRecord, EventType, Observation,
    ObservationKind, RunEvent, RunPhase, Step, StepStatus, Time, SEGMENT_RUN_UID_LABEL,
};
use agentrt::engine::archive::{seal, Seal, SealLimits, SegmentOwner};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use support::cli::{agentrt, table_row, text};
use support::cluster::TestCluster;
use support::controller::agentrt_cluster;

fn segment_yaml() -> String {
    std::fs::read_to_string(support::fixtures::path("archive/segment.yaml")).expect("fixture")
}

#[tokio::test]
async fn a_segments_spec_cannot_be_edited_and_it_cannot_gain_a_status() {
    let c = agentrt_cluster().await;
    let out = c.apply(&segment_yaml());
    assert!(out.status.success(), "{}", text(&out));
    let table = c.kubectl_ok(&["get", "arseg"]);
    let header = table_row(&table, 0);
    assert_eq!(header, ["NAME", "RUN", "INDEX", "STEPS", "BYTES", "AGE"]);
    let row = table_row(&table, 1);
    assert_eq!(
        row[..5],
        ["refund-1042-0-0123456789", "refund-1042", "0", "1", "412"]
    );
    assert!(
        c.kubectl_ok(&["get", "agentrt", "-o", "name"])
            .contains("agentrunsegment.agentrt.dev/refund-1042-0-0123456789"),
        "segments are in the agentrt category"
    );

    let edited = segment_yaml().replace("summary: ok", "summary: rewritten");
    let out = c.apply(&edited);
    assert!(!out.status.success(), "an edit of the spec was accepted");
    assert!(text(&out).contains("spec is immutable"), "{}", text(&out));
    for patch in [
        r#"{"spec":{"bytes":5}}"#,
        r#"{"spec":{"runName":"another-run"}}"#,
    ] {
        let out = c.merge_patch("arseg", "refund-1042-0-0123456789", patch);
        assert!(!out.status.success(), "{patch} was accepted");
    }

    // A JSON patch is refused with a message naming the field and saying why.
    for (path, value, field) in [
        ("/spec/bytes", "5", "spec.bytes"),
        (
            "/spec/steps/0/observation/summary",
            r#""rewritten""#,
            "spec.steps",
        ),
    ] {
        let out = c.kubectl(&[
            "patch",
            "arseg",
            "refund-1042-0-0123456789",
            "--type",
            "json",
            "-p",
            &format!(r#"[{{"op":"replace","path":"{path}","value":{value}}}]"#),
        ]);
        assert!(!out.status.success(), "{path} was changed");
        let message = text(&out);
        assert!(
            message.contains("spec is immutable")
                && message.contains(&format!("{field} may not be changed")),
            "{path}: {message}"
        );
    }

    // No status: what is written there is pruned.
    let _ = c.merge_patch(
        "arseg",
        "refund-1042-0-0123456789",
        r#"{"status":{"phase":"Edited"}}"#,
    );
    let object: Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "arseg",
        "refund-1042-0-0123456789",
        "-o",
        "json",
    ]))
    .expect("JSON");
    assert!(object.get("status").is_none(), "{object}");
    assert_eq!(object["spec"]["steps"][0]["observation"]["summary"], "ok");

    let inconsistent = segment_yaml()
        .replace(
            "name: refund-1042-0-0123456789",
            "name: refund-1042-0-1111111111",
        )
        .replace("stepCount: 1", "stepCount: 2");
    let out = c.apply(&inconsistent);
    assert!(!out.status.success(), "a wrong stepCount was accepted");
    assert!(text(&out).contains("spec.stepCount"), "{}", text(&out));
}

/// A run's whole record, written as the engine writes it, sealed as it goes.
struct History {
    full: AgentRunStatus,
    window: AgentRunStatus,
    seals: Vec<Seal>,
}

fn event(status: &mut AgentRunStatus, type_: EventType, step: Option<i64>) {
    let seq = status.events.len() as i64 + 1;
    status.events.push(RunEvent {
        seq,
        time: Time::from_millis(1_767_225_600_000 + seq),
        type_,
        step: step.map(agentrt::api::StepIndex),
        data: Some(json!({"n": seq})),
    });
}

fn history(name: &str, uid: &str, steps: i64) -> History {
    let mut full = AgentRunStatus {
        phase: RunPhase::Running,
        ..AgentRunStatus::default()
    };
    event(&mut full, EventType::RunCreated, None);
    event(&mut full, EventType::RunStarted, None);
    let limits = SealLimits {
        seal_steps: 3,
        keep_steps: 1,
        ..SealLimits::default()
    };
    let mut window = full.clone();
    let mut seals: Vec<Seal> = Vec::new();
    for index in 0..steps {
        full.steps.push(Step {
            index: agentrt::api::StepIndex(index),
            status: StepStatus::Done,
            decision: Some(DecisionRecord {
                kind: Some("tool_call".into()),
                tool: Some("lookup_order".into()),
                args: Some(json!({"order": 1042, "try": index})),
                ..DecisionRecord::default()
            }),
            policy: None,
            observation: Some(Observation {
                kind: ObservationKind::ToolResult,
                content: Some(json!({"arrived": "damaged", "step": index})),
                summary: format!("order 1042, step {index}"),
                content_hash: String::new(),
                truncated: None,
            }),
            approvals: Vec::new(),
            attempts: 1,
            started_at: Some(Time::from_millis(1_767_225_600_000)),
            finished_at: Some(Time::from_millis(1_767_225_601_000)),
        });
        event(&mut full, EventType::StepStarted, Some(index));
        event(&mut full, EventType::StepToolFinished, Some(index));
        let sealed_steps: usize = seals.iter().map(|s| s.segment.steps.len()).sum();
        let sealed_events: usize = seals.iter().map(|s| s.segment.events.len()).sum();
        window.steps = full.steps[sealed_steps..].to_vec();
        window.events = full.events[sealed_events..].to_vec();
        let owner = SegmentOwner { name, uid };
        if let Some(s) = seal(owner, &window, &limits).expect("seal") {
            window = s.status.clone();
            seals.push(s);
        }
    }
    event(&mut full, EventType::RunFinished, None);
    let sealed_events: usize = seals.iter().map(|s| s.segment.events.len()).sum();
    window.events = full.events[sealed_events..].to_vec();
    for status in [&mut full, &mut window] {
        status.phase = RunPhase::Completed;
        status.step_count = steps;
    }
    History {
        full,
        window,
        seals,
    }
}

fn segment_object(run: &AgentRun, sealed: &Seal) -> AgentRunSegment {
    let mut object = AgentRunSegment::new(&sealed.name, sealed.segment.clone());
    object.metadata.labels = Some(
        [(
            SEGMENT_RUN_UID_LABEL.to_string(),
            run.metadata.uid.clone().unwrap_or_default(),
        )]
        .into(),
    );
    object.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "agentrt.dev/v1alpha1".into(),
        kind: "AgentRun".into(),
        name: run.metadata.name.clone().unwrap_or_default(),
        uid: run.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    object
}

/// `kubectl apply` of the fixture run `refund-1042` (tests/fixtures/api/refund-run.yaml; no
/// controller touches it).
fn apply_the_fixture_run(c: &TestCluster) {
    let run_yaml =
        std::fs::read_to_string(support::fixtures::path("api/refund-run.yaml")).expect("fixture");
    c.apply(&run_yaml);
}

/// [`apply_the_fixture_run`], then the run read back; panics when it cannot be read.
async fn the_fixture_run(c: &TestCluster) -> (Api<AgentRun>, AgentRun) {
    apply_the_fixture_run(c);
    let runs: Api<AgentRun> = Api::namespaced(c.client(), c.namespace());
    let run = runs.get("refund-1042").await.expect("the run");
    (runs, run)
}

/// Writes `h` as the controller would have left it: `h.window` as the run's status, and an
/// AgentRunSegment per seal, owned by the run. Returns the segments' API.
async fn write_sealed_history(
    c: &TestCluster,
    runs: &Api<AgentRun>,
    run: &AgentRun,
    h: &History,
) -> Api<AgentRunSegment> {
    runs.patch_status(
        "refund-1042",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": h.window})),
    )
    .await
    .expect("status written");
    let segments: Api<AgentRunSegment> = Api::namespaced(c.client(), c.namespace());
    for sealed in &h.seals {
        segments
            .create(&PostParams::default(), &segment_object(run, sealed))
            .await
            .expect("segment created");
    }
    segments
}

fn failed_naming(out: &Output, segment: &str, what: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(segment) && stderr.contains(what),
        "stderr names {segment} as {what}: {stderr}"
    );
}

#[tokio::test]
async fn verify_show_and_events_read_the_whole_history_and_name_a_deleted_or_edited_segment() {
    let c = agentrt_cluster().await;
    let (runs, run) = the_fixture_run(&c).await;
    let uid = run.metadata.uid.clone().expect("uid");
    let h = history("refund-1042", &uid, 10);
    assert!(h.seals.len() >= 3, "{} segments", h.seals.len());
    let segments = write_sealed_history(&c, &runs, &run, &h).await;

    // Intact: verify says what it checked.
    let out = agentrt(&c, &["verify", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    let last = h.seals.last().expect("a seal");
    for expected in [
        "history intact".to_string(),
        format!("segments: {} checked", h.seals.len()),
        format!("sealed:   steps 0..{}", last.segment.last_step),
        format!("events seq 1..{}", last.segment.last_seq),
        format!("whole:    10 steps, {} events", h.full.events.len()),
        format!("head:     {}", last.sha256),
    ] {
        assert!(report.contains(&expected), "{expected:?} in:\n{report}");
    }

    // show -o json and -o yaml: every step and event, exactly the unsealed record's.
    let out = agentrt(&c, &["show", "run", "refund-1042", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown: AgentRun = serde_json::from_slice(&out.stdout).expect("show -o json is a run");
    let status = shown.status.expect("status");
    assert_eq!(status.steps, h.full.steps);
    assert_eq!(status.events, h.full.events);
    let seqs: Vec<i64> = status.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=h.full.events.len() as i64).collect::<Vec<_>>());
    let out = agentrt(&c, &["show", "run", "refund-1042", "-o", "yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown: AgentRun = serde_yaml::from_slice(&out.stdout).expect("show -o yaml is a run");
    assert_eq!(shown.status.expect("status").steps, h.full.steps);
    let out = agentrt(&c, &["show", "run", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("order 1042, step 0"),
        "the human view shows sealed steps: {}",
        text(&out)
    );

    // events: every event, stitched.
    let out = agentrt(&c, &["events", "refund-1042", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let events: Vec<RunEvent> = serde_json::from_slice(&out.stdout).expect("events JSON");
    assert_eq!(events, h.full.events);
    let out = agentrt(&c, &["events", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("run.created"));

    // A deleted segment: verify, show and events exit 1 naming it.
    let deleted = &h.seals[1];
    segments
        .delete(&deleted.name, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_gone(&segments, &deleted.name).await;
    for args in [
        vec!["verify", "refund-1042"],
        vec!["show", "run", "refund-1042", "-o", "json"],
        vec!["show", "run", "refund-1042", "-o", "yaml"],
        vec!["events", "refund-1042"],
    ] {
        failed_naming(&agentrt(&c, &args), &deleted.name, "is missing");
    }

    // Put it back, then edit another (delete and create with other content: the spec is
    // immutable): exit 1 naming the edited one.
    segments
        .create(&PostParams::default(), &segment_object(&run, deleted))
        .await
        .expect("recreated");
    assert_eq!(
        agentrt(&c, &["verify", "refund-1042"]).status.code(),
        Some(0)
    );
    let edited = &h.seals[2];
    segments
        .delete(&edited.name, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_gone(&segments, &edited.name).await;
    let mut other = segment_object(&run, edited);
    other.spec.steps[0]
        .observation
        .as_mut()
        .expect("observation")
        .summary = "rewritten by hand".into();
    segments
        .create(&PostParams::default(), &other)
        .await
        .expect("created with other content");
    for args in [
        vec!["verify", "refund-1042"],
        vec!["show", "run", "refund-1042", "-o", "json"],
        vec!["events", "refund-1042", "-o", "json"],
    ] {
        failed_naming(&agentrt(&c, &args), &edited.name, "was altered");
    }
}

#[tokio::test]
async fn a_run_that_never_sealed_verifies_with_nothing_sealed() {
    let c = agentrt_cluster().await;
    apply_the_fixture_run(&c);
    let out = agentrt(&c, &["verify", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("segments: 0 checked") && report.contains("(nothing sealed)"),
        "{report}"
    );
    let out = agentrt(&c, &["verify", "no-such-run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = agentrt(&c, &["verify", "Not_A_Name"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

/// Waits until `name` is gone (a real API server may answer the delete before the object is).
async fn wait_gone(api: &Api<AgentRunSegment>, name: &str) {
    for _ in 0..100 {
        if api.get_opt(name).await.expect("get").is_none() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{name} is still there");
}

#[tokio::test]
async fn a_run_that_is_not_there_is_not_found_said_once() {
    let c = agentrt_cluster().await;
    let out = agentrt(&c, &["verify", "nosuch"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(stderr.contains("nosuch"), "{stderr}");
    assert_eq!(
        stderr.matches("not found").count() + stderr.matches("notfound").count(),
        1,
        "said once: {stderr}"
    );
}

#[tokio::test]
async fn a_long_chain_is_walked_back_from_the_kept_entries_and_a_missing_segment_still_shows_the_window(
) {
    let c = agentrt_cluster().await;
    let (runs, run) = the_fixture_run(&c).await;
    let uid = run.metadata.uid.clone().expect("uid");
    let h = history("refund-1042", &uid, 45);
    let archive = h.window.archive.clone().expect("sealed");
    assert!(h.seals.len() > 10, "{} segments", h.seals.len());
    // The record keeps only the newest entries of its index, and how many there are.
    assert_eq!(archive.segments.len(), 8);
    assert_eq!(archive.count, Some(h.seals.len() as i64));
    let segments = write_sealed_history(&c, &runs, &run, &h).await;
    let out = agentrt(&c, &["verify", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("segments: {} checked", h.seals.len())),
        "{}",
        text(&out)
    );
    let out = agentrt(&c, &["show", "run", "refund-1042", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown: AgentRun = serde_json::from_slice(&out.stdout).expect("show -o json is a run");
    let status = shown.status.expect("status");
    assert_eq!(status.steps, h.full.steps);
    assert_eq!(status.events, h.full.events);

    // A segment older than the kept entries, deleted: verify names it; show and events print
    // the window, then exit 1 naming it.
    let deleted = &h.seals[1];
    segments
        .delete(&deleted.name, &DeleteParams::default())
        .await
        .expect("deleted");
    wait_gone(&segments, &deleted.name).await;
    failed_naming(
        &agentrt(&c, &["verify", "refund-1042"]),
        &deleted.name,
        "is missing",
    );
    let out = agentrt(&c, &["show", "run", "refund-1042"]);
    failed_naming(&out, &deleted.name, "is missing");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("order 1042, step 44"),
        "the window is shown: {}",
        text(&out)
    );
    let out = agentrt(&c, &["events", "refund-1042"]);
    failed_naming(&out, &deleted.name, "is missing");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("run.finished"),
        "the window's events are shown: {}",
        text(&out)
    );

    // Put back without its label (found by name, the sha256 the next segment names), intact.
    let mut unlabelled = segment_object(&run, deleted);
    unlabelled.metadata.labels = None;
    segments
        .create(&PostParams::default(), &unlabelled)
        .await
        .expect("recreated");
    let out = agentrt(&c, &["verify", "refund-1042"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
