//! The effect performer (reconcile + executor) against the fake API and a small scripted
//! engine: the protocol of `src/engine/mod.rs` as the controller holds it up.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::cluster::RunKey;
use super::cluster::{ApiError, ClusterApi};
use super::context::{Context, ContextParts, Settings};
use super::fake::{run_object, FakeApi};
use super::identity::{Clock, HolderId};
use super::metrics::Metrics;
use super::projection::EventSink;
use super::reconcile::observe;
use crate::api::Time;
use crate::engine::{
    ApprovalSnapshot, Bookkeeping, Budgets, Caller, Engine, EngineError, ExternalCall, Input,
    LeaseView, Next, ObserveNext, Observed, RunSnapshot, SegmentCreate, ToolCall, ToolOutcome,
    Transition,
};

/// Inputs the fake engine saw, per run name.
fn journal() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static JOURNAL: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    JOURNAL.get_or_init(Mutex::default)
}

fn seen(run: &str) -> Vec<String> {
    journal()
        .lock()
        .unwrap()
        .get(run)
        .cloned()
        .unwrap_or_default()
}

fn note(run: &str, word: &str) {
    journal()
        .lock()
        .unwrap()
        .entry(run.to_string())
        .or_default()
        .push(word.to_string());
}

/// The one-step engine's observer: take the lease unless it is live, leave a completed run.
fn fake_observe(
    run: &RunSnapshot,
    _approvals: &[ApprovalSnapshot],
    _caller: &Caller,
    _budgets: &Budgets,
    lease: &LeaseView,
) -> Observed {
    note(&run.name, "observe");
    let phase = run.status["phase"].as_str().unwrap_or("Pending");
    let live = matches!(
        crate::engine::lease_liveness(lease, run.spec.lease_duration_seconds),
        crate::engine::LeaseLiveness::Live { .. }
    );
    let next = if phase == "Completed" {
        ObserveNext::Nothing
    } else if live {
        ObserveNext::RequeueAfter { millis: 1000 }
    } else {
        ObserveNext::AcquireLease { takeover: None }
    };
    Observed {
        next,
        ..Observed::default()
    }
}

/// A one-step engine: take the lease, start the run's first tool, complete with its content.
fn fake_step(
    run: &RunSnapshot,
    _approvals: &[ApprovalSnapshot],
    caller: &Caller,
    budgets: &Budgets,
    input: Input,
) -> Result<Transition, EngineError> {
    let word = match &input {
        Input::LeaseAcquired { .. } => "lease_acquired",
        Input::ToolFinished { .. } => "tool_finished",
        Input::LeaseLost => "lease_lost",
        _ => "other",
    };
    note(&run.name, word);
    let status = &run.status;
    let holder = status["lease"]["holder"].as_str();
    Ok(match input {
        _ if holder.is_some_and(|h| h != caller.holder) => Transition::stop(),
        Input::LeaseAcquired { .. } => {
            let mut next = status.clone();
            if next.is_null() {
                next = json!({});
            }
            next["phase"] = json!("Running");
            next["lease"] = json!({"holder": caller.holder, "epoch": 1});
            next["events"] = json!([{"seq": 1, "type": "step.tool_started", "step": 0}]);
            let tool = run.spec.tools[0].clone();
            Transition {
                seal: None,
                write: Some(next),
                record: None,
                bookkeeping: Vec::new(),
                next: Next::Call(ExternalCall::Tool(ToolCall {
                    step: crate::api::StepIndex(0),
                    attempt: 1,
                    tool,
                    args: json!({"n": 1}),
                    idempotency_key: format!("{}/0", run.uid),
                    pin: None,
                    delay_millis: 0,
                    job: None,
                    task: None,
                })),
            }
        }
        Input::ToolFinished { outcome, .. } => {
            let mut next = status.clone();
            next["phase"] = json!("Completed");
            next["result"] = match outcome {
                ToolOutcome::Result { content, .. } => content,
                other => json!(format!("{other:?}")),
            };
            Transition {
                // A run named `seal-…` seals with its outcome's write (unless sealing is off).
                seal: (run.name.starts_with("seal") && !budgets.seal.is_off())
                    .then(|| fake_segment(run)),
                write: Some(next),
                record: None,
                bookkeeping: vec![Bookkeeping::ReleaseLease],
                next: Next::Stop,
            }
        }
        _ => Transition::stop(),
    })
}

/// The segment the fake engine seals for `run`: its step 0.
fn fake_segment(run: &RunSnapshot) -> SegmentCreate {
    let spec = segment_spec(run, "read");
    let sha256 = crate::engine::archive::segment_sha256(&spec).unwrap();
    let name = crate::engine::archive::segment_name(&run.name, 0, &sha256);
    SegmentCreate {
        object: json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRunSegment",
            "metadata": {"name": name, "namespace": run.namespace},
            "spec": spec,
        }),
        name,
        sha256,
    }
}

fn segment_spec(run: &RunSnapshot, tool: &str) -> crate::api::AgentRunSegmentSpec {
    let step: crate::api::Step = serde_json::from_value(json!({
        "index": 0, "status": "done", "decision": {"kind": "tool_call", "tool": tool},
    }))
    .unwrap();
    crate::api::AgentRunSegmentSpec {
        run_name: run.name.clone(),
        run_uid: run.uid.clone(),
        index: 0,
        first_step: 0,
        last_step: 0,
        first_seq: 1,
        last_seq: 0,
        previous: String::new(),
        step_count: 1,
        bytes: 0,
        steps: vec![step],
        events: Vec::new(),
    }
}

/// The scripted engine the controller tests drive.
const FAKE: Engine = Engine {
    step: fake_step,
    observe: fake_observe,
};

struct Tool {
    addr: SocketAddr,
    calls: Arc<AtomicU32>,
}

async fn tool(delay: Duration) -> Tool {
    let calls = Arc::new(AtomicU32::new(0));
    let counter = calls.clone();
    let app = Router::new().route(
        "/t",
        post(move |Json(args): Json<Value>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                Json(json!({"got": args}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Tool { addr, calls }
}

fn context(api: Arc<FakeApi>, prefix: &str, skew_ms: u64) -> Arc<Context> {
    context_with_slots(api, prefix, skew_ms, 8)
}

fn context_with_slots(api: Arc<FakeApi>, prefix: &str, skew_ms: u64, slots: usize) -> Arc<Context> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Arc::new(Context::new(ContextParts {
        api,
        settings: Settings {
            engine: FAKE,
            max_concurrent_runs: slots,
            skew_margin: Duration::from_millis(skew_ms),
            ..Settings::new(HolderId::with_random_suffix(prefix))
        },
        events: EventSink::disabled(),
        metrics: Arc::new(Metrics::default()),
        http: crate::tools::http::client().unwrap(),
        shutdown: CancellationToken::new(),
        kicks: tx,
    }))
}

fn run_with_tool(name: &str, addr: SocketAddr, lease_seconds: i64) -> Value {
    let mut run = run_object("ns", name, lease_seconds);
    run["spec"]["tools"][0]["http"]["url"] = json!(format!("http://{addr}/t"));
    run
}

async fn until_idle(ctx: &Context) {
    for _ in 0..200 {
        if ctx.executors.executing() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the executor did not stop");
}

fn key(name: &str) -> RunKey {
    RunKey::new("ns", name)
}

#[tokio::test]
async fn observe_wins_the_lease_and_an_executor_runs_the_tool_once() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("once", tool.addr, 3)));
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("once"), None).await.unwrap();
    until_idle(&ctx).await;
    let run = api.run("ns", "once");
    assert_eq!(run["status"]["phase"], "Completed");
    assert_eq!(run["status"]["result"], json!({"got": {"n": 1}}));
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(seen("once"), ["observe", "lease_acquired", "tool_finished"]);
    // A finished run keeps no Lease: its holder deleted it (issue 35).
    assert!(
        api.lease("ns", "once").is_none(),
        "the Lease of a run that ended is deleted"
    );
    // Looking again changes nothing.
    observe(&ctx, &key("once"), None).await.unwrap();
    assert_eq!(ctx.executors.executing(), 0);
}

#[tokio::test]
async fn a_shutdown_after_the_start_is_recorded_still_sends_the_call_and_records_it() {
    // SIGTERM arrives between the `step.tool_started` write and the call (seen in an
    // eviction): the start is on the record, so the call goes out and its outcome is recorded
    // before the Lease is released; not sending it would leave a start no call made, and the
    // next holder would ask a person (docs/design.md section 9, "In a Pod").
    let tool = tool(Duration::from_millis(200)).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("sigterm", tool.addr, 3)));
    let ctx = context(api.clone(), "a", 500);
    let shutdown = ctx.executors.shutdown.clone();
    api.state.lock().unwrap().after_status_write = Some(Box::new(move |status: &Value| {
        let started = status["events"]
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e["type"] == "step.tool_started"));
        if started {
            shutdown.cancel();
        }
    }));
    observe(&ctx, &key("sigterm"), None).await.unwrap();
    until_idle(&ctx).await;
    assert!(ctx.executors.shutdown.is_cancelled(), "the shutdown began");
    assert_eq!(
        tool.calls.load(Ordering::SeqCst),
        1,
        "the recorded start was sent"
    );
    assert_eq!(
        seen("sigterm"),
        ["observe", "lease_acquired", "tool_finished"]
    );
    let run = api.run("ns", "sigterm");
    assert_eq!(run["status"]["phase"], "Completed", "{}", run["status"]);
    assert_eq!(run["status"]["result"], json!({"got": {"n": 1}}));
}

#[tokio::test]
async fn a_conflicting_write_is_decided_again_never_retried_blind() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("conflict", tool.addr, 3)));
    api.state
        .lock()
        .unwrap()
        .fail_status_writes
        .push(ApiError::Conflict("someone wrote".into()));
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("conflict"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(
        seen("conflict"),
        [
            "observe",
            "lease_acquired",
            "lease_acquired",
            "tool_finished"
        ]
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(api.state.lock().unwrap().status_writes, 2);
}

#[tokio::test]
async fn a_write_of_unknown_fate_is_settled_by_reading_back() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("unknown", tool.addr, 3)));
    api.state
        .lock()
        .unwrap()
        .fail_status_writes
        .push(ApiError::Kube(kube::Error::Service(
            "connection reset".into(),
        )));
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("unknown"), None).await.unwrap();
    until_idle(&ctx).await;
    // It did not land: decided again from what is stored, and the tool ran once.
    assert_eq!(
        seen("unknown"),
        [
            "observe",
            "lease_acquired",
            "lease_acquired",
            "tool_finished"
        ]
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(api.run("ns", "unknown")["status"]["phase"], "Completed");
}

#[tokio::test]
async fn a_sealed_segment_is_created_before_the_status_write() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("seal-new", tool.addr, 3)));
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("seal-new"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(api.run("ns", "seal-new")["status"]["phase"], "Completed");
    let state = api.state.lock().unwrap();
    assert_eq!(state.segments.len(), 1);
    assert_eq!(state.segment_creates, 1);
    assert_eq!(ctx.metrics.segments_created.get(), 1);
}

#[tokio::test]
async fn a_segment_already_there_with_the_same_content_is_success() {
    // A holder that died between the create and its status write (docs/behaviours.md 56).
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("seal-same", tool.addr, 3)));
    let run = super::cluster::StoredRun::from_object(api.run("ns", "seal-same")).unwrap();
    let segment = fake_segment(&run.snapshot);
    api.create_segment("ns", &segment.object).await.unwrap();
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("seal-same"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(api.run("ns", "seal-same")["status"]["phase"], "Completed");
    assert_eq!(api.state.lock().unwrap().segments.len(), 1);
    assert_eq!(
        ctx.metrics.segments_created.get(),
        0,
        "it was there already"
    );
}

#[tokio::test]
async fn a_segment_name_holding_other_content_is_never_overwritten_and_the_outcome_is_written_unsealed(
) {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("seal-other", tool.addr, 3)));
    let run = super::cluster::StoredRun::from_object(api.run("ns", "seal-other")).unwrap();
    let mut edited = fake_segment(&run.snapshot).object;
    edited["spec"] = serde_json::to_value(segment_spec(&run.snapshot, "edited")).unwrap();
    api.create_segment("ns", &edited).await.unwrap();
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("seal-other"), None).await.unwrap();
    until_idle(&ctx).await;
    // The tool's outcome is not lost for want of a segment: the same input is decided again
    // without sealing and written (else a takeover would find a received result "unknown").
    let stored = api.run("ns", "seal-other");
    assert_eq!(
        stored["status"]["phase"], "Completed",
        "the outcome was written without sealing"
    );
    assert_eq!(stored["status"]["result"], json!({"got": {"n": 1}}));
    assert_eq!(ctx.metrics.segment_failures.get(), 1);
    let state = api.state.lock().unwrap();
    let name = edited["metadata"]["name"].as_str().unwrap();
    assert_eq!(
        state.segments[&("ns".to_string(), name.to_string())]["spec"],
        edited["spec"],
        "never overwritten"
    );
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_live_lease_held_by_another_replica_is_left_alone() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("held", tool.addr, 30)));
    let other = HolderId::with_random_suffix("other");
    let run = super::cluster::StoredRun::from_object(api.run("ns", "held")).unwrap();
    super::lease::acquire(
        api.as_ref(),
        &run,
        None,
        &super::lease::view(None),
        &other,
        Clock::default().now(),
    )
    .await
    .unwrap()
    .unwrap();
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("held"), None).await.unwrap();
    assert_eq!(ctx.executors.executing(), 0);
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(seen("held"), ["observe"]);
}

#[tokio::test]
async fn a_lease_owned_by_another_uid_is_replaced_not_adopted() {
    // A run of this name was deleted while another replica held its Lease (live: seen just
    // now); the run created again under the name (a new uid) must not wait for it, nor adopt it.
    let tool = tool(Duration::ZERO).await;
    let mut deleted = run_with_tool("again", tool.addr, 30);
    deleted["metadata"]["uid"] = json!("uid-deleted");
    let api = Arc::new(FakeApi::with_run(deleted));
    held_by_other(&api, "again", Clock::default().now()).await;
    assert_eq!(
        super::lease::owner_uid(&api.lease("ns", "again").unwrap()),
        Some("uid-deleted")
    );
    api.put_run(run_with_tool("again", tool.addr, 30));
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("again"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(api.run("ns", "again")["status"]["phase"], "Completed");
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert!(
        api.lease("ns", "again").is_none(),
        "deleted once the run ended"
    );
    let lease = api
        .deleted_lease("ns", "again")
        .expect("the run's own Lease");
    assert_eq!(super::lease::owner_uid(&lease), Some("uid-again"));
    assert_eq!(
        lease.spec.unwrap().lease_transitions,
        Some(0),
        "a fresh Lease"
    );
}

#[tokio::test]
async fn a_lease_of_another_uid_is_judged_absent_but_kept_as_stored_in_the_observations() {
    // The Lease watch listed a deleted run's Lease; judging it for the run created again under
    // the name must not forget it: a reconcile reads what the watch delivered, and the watch
    // delivers it only again when it changes (a replica once retried a create on a Lease it
    // had forgotten, forever).
    let mut deleted = run_object("ns", "again", 30);
    deleted["metadata"]["uid"] = json!("uid-deleted");
    let api = Arc::new(FakeApi::with_run(deleted));
    held_by_other(&api, "again", Clock::default().now()).await;
    let foreign = api.lease("ns", "again").expect("the deleted run's Lease");
    let ctx = context(api.clone(), "a", 500);
    let now = std::time::Instant::now();
    ctx.leases
        .watched(Some("ns"), &kube::runtime::watcher::Event::Init, now);
    ctx.leases.watched(
        Some("ns"),
        &kube::runtime::watcher::Event::InitApply(foreign.clone()),
        now,
    );
    ctx.leases
        .watched(Some("ns"), &kube::runtime::watcher::Event::InitDone, now);
    let seen = ctx.observe_lease(
        &key("again"),
        Some(&foreign),
        "uid-again",
        crate::controller::lease::observation::LeaseRead::Cached,
    );
    assert_eq!(seen.holder, None, "another run's Lease is judged absent");
    let cached = ctx.leases.cached(&key("again")).expect("the watch listed");
    assert_eq!(
        cached.as_deref(),
        Some(&foreign),
        "the observations still hold the Lease as stored"
    );
}

#[tokio::test]
async fn a_new_run_is_not_read_while_every_slot_is_taken_and_a_cancelled_one_is() {
    // One slot, taken by a run whose tool takes its time.
    let slow = tool(Duration::from_secs(5)).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("busy", slow.addr, 30)));
    api.put_run(run_object("ns", "queued", 30));
    let ctx = context_with_slots(api.clone(), "a", 500, 1);
    observe(&ctx, &key("busy"), None).await.unwrap();
    for _ in 0..200 {
        if slow.calls.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ctx.executors.is_full(), "the one slot is taken");
    api.state.lock().unwrap().run_reads = 0;
    let watched = |generation: i64| {
        let run: super::watched::WatchedRun = serde_json::from_value(json!({
            "metadata": {"name": "queued", "namespace": "ns", "uid": "uid-queued",
                         "generation": generation},
            "status": {"phase": "Pending"},
        }))
        .unwrap();
        Arc::new(run)
    };
    super::reconcile::reconcile(watched(1), ctx.clone())
        .await
        .unwrap();
    assert_eq!(
        api.state.lock().unwrap().run_reads,
        0,
        "as created, it waits for a slot unread"
    );
    // A cancel (a new generation) is read at once, slots or not.
    super::reconcile::reconcile(watched(2), ctx.clone())
        .await
        .unwrap();
    assert_eq!(api.state.lock().unwrap().run_reads, 1);
}

#[tokio::test]
async fn a_run_held_elsewhere_whose_lease_the_watch_has_not_delivered_waits_for_it_unread() {
    // Another replica won the Lease, then wrote the status that records it; this replica's run
    // watch delivered that write before its Lease watch delivered the Lease. Reading the run
    // could only end in a create of a Lease that exists (issue 15: most of the races left).
    let api = Arc::new(FakeApi::with_run(run_object("ns", "held", 30)));
    let other = held_by_other(&api, "held", Clock::default().now()).await;
    api.state.lock().unwrap().lease_creates = 0;
    let ctx = context(api.clone(), "a", 500);
    let now = std::time::Instant::now();
    lease_watch_listed_none(&ctx, now);
    let watched = |generation: i64| {
        let run: super::watched::WatchedRun = serde_json::from_value(json!({
            "metadata": {"name": "held", "namespace": "ns", "uid": "uid-held",
                         "generation": generation},
            "status": {"phase": "Running", "observedGeneration": 1,
                       "lease": {"holder": other.as_str()}},
        }))
        .unwrap();
        Arc::new(run)
    };
    let reads = || api.state.lock().unwrap().run_reads;
    let creates = || api.state.lock().unwrap().lease_creates;
    let action = super::reconcile::reconcile(watched(1), ctx.clone())
        .await
        .unwrap();
    assert_eq!((reads(), creates()), (0, 0), "left alone unread");
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(Duration::from_secs(2)),
        "for the Lease watch's event, or at most 2 s"
    );
    // A cancel since the last write is read at once.
    super::reconcile::reconcile(watched(2), ctx.clone())
        .await
        .unwrap();
    assert_eq!(reads(), 1, "a new generation is read");
    {
        let mut state = api.state.lock().unwrap();
        state.run_reads = 0;
        state.lease_creates = 0;
    }
    // The Lease arrives: the run is held live elsewhere, and still not read.
    let lease = api.lease("ns", "held").expect("the other replica's Lease");
    ctx.leases.watched(
        Some("ns"),
        &kube::runtime::watcher::Event::Apply(lease),
        std::time::Instant::now(),
    );
    super::reconcile::reconcile(watched(1), ctx.clone())
        .await
        .unwrap();
    assert_eq!((reads(), creates()), (0, 0), "held elsewhere, live");
    assert!(api.lease("ns", "held").is_some());
}

#[tokio::test]
async fn a_run_whose_lease_expired_behind_a_watch_lagging_past_a_minute_waits_while_its_holder_is_up(
) {
    // 10,000 runs on kube-apiserver: the run watch ran more than a minute behind, and each
    // ended run, its kept Lease unrenewed, was read by both other replicas (issue 15). While
    // the holder renews its presence Lease it is up, and the watch's lag is waited out.
    let api = Arc::new(FakeApi::with_run(run_object("ns", "ended", 30)));
    let other = held_by_other(&api, "ended", Clock::default().now()).await;
    let ctx = context(api.clone(), "a", 500);
    let now = std::time::Instant::now();
    let ago = |seconds: u64| now.checked_sub(Duration::from_secs(seconds)).unwrap_or(now);
    // The Lease, unrenewed for 100 s (its 30 s, the margin and a minute's lag are past); the
    // watch 90 s behind.
    let lease = api.lease("ns", "ended").expect("the other replica's Lease");
    lease_watch_listed_none(&ctx, ago(100));
    ctx.leases.watched(
        Some("ns"),
        &kube::runtime::watcher::Event::Apply(lease),
        ago(100),
    );
    ctx.watch_lag.wrote("probe", ago(90));
    let presence = super::lease::presence::presence_lease(
        &other,
        "ns",
        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now()),
    );
    ctx.leases.watched(
        Some("ns"),
        &kube::runtime::watcher::Event::Apply(presence.clone()),
        ago(4),
    );
    let run: super::watched::WatchedRun = serde_json::from_value(json!({
        "metadata": {"name": "ended", "namespace": "ns", "uid": "uid-ended", "generation": 1},
        "status": {"phase": "Running", "observedGeneration": 1,
                   "lease": {"holder": other.as_str()}},
    }))
    .unwrap();
    let run = Arc::new(run);
    let reads = || api.state.lock().unwrap().run_reads;
    let action = super::reconcile::reconcile(run.clone(), ctx.clone())
        .await
        .unwrap();
    assert_eq!(reads(), 0, "left alone unread");
    // For the rest of the lag: 20.5 s from `now` (and 50 ms).
    assert!(
        (19_000..=20_550).any(|millis| action
            == kube::runtime::controller::Action::requeue(Duration::from_millis(millis))),
        "{action:?}"
    );
    // The holder withdrew its presence (or it goes unrenewed): the minute's cap, so the run
    // is read as before.
    ctx.leases.watched(
        Some("ns"),
        &kube::runtime::watcher::Event::Delete(presence),
        now,
    );
    super::reconcile::reconcile(run, ctx.clone()).await.unwrap();
    assert!(reads() >= 1, "read without the holder's presence");
}

#[tokio::test]
async fn past_a_quarter_of_the_budget_a_new_run_is_kept_only_by_the_replica_it_ranks_first() {
    // 10,000 runs on kube-apiserver: each replica kept the first 2,200 new runs it saw, a
    // third of which it started, and read the others it started (issue 15).
    let ctx = context(Arc::new(FakeApi::default()), "a", 500);
    let now = jiff::Timestamp::now();
    for peer in ["b", "c"] {
        let presence = super::lease::presence::presence_lease(
            &HolderId::with_random_suffix(peer),
            "ns",
            k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
        );
        ctx.leases.watched(
            Some("ns"),
            &kube::runtime::watcher::Event::Apply(presence),
            std::time::Instant::now(),
        );
    }
    let peers = ctx
        .leases
        .holders_seen(std::time::Instant::now(), super::spread::PEER_MEMORY);
    assert_eq!(peers.len(), 2);
    let over = super::watched::FRESH_OTHERS_BYTES + 1;
    let (mut first, mut not_first) = (0, 0);
    for n in 0..60 {
        let uid = format!("uid-{n}");
        assert!(super::watches::keeps_fresh(&ctx, &uid, 0), "below: kept");
        let ranks_first = super::spread::place(&uid, ctx.settings.holder.as_str(), &peers) == 0;
        assert_eq!(super::watches::keeps_fresh(&ctx, &uid, over), ranks_first);
        if ranks_first {
            first += 1;
        } else {
            not_first += 1;
        }
    }
    assert!(first > 0 && not_first > first, "{first} / {not_first}");
}

#[tokio::test]
async fn a_run_held_elsewhere_whose_lease_never_comes_is_read_after_the_wait() {
    // The Lease is really gone (deleted by hand): after the wait the run is read and its
    // Lease taken as an absent one, as before.
    let api = Arc::new(FakeApi::with_run(run_object("ns", "bare", 30)));
    let ctx = context(api.clone(), "a", 500);
    let now = std::time::Instant::now();
    lease_watch_listed_none(&ctx, now);
    let run: super::watched::WatchedRun = serde_json::from_value(json!({
        "metadata": {"name": "bare", "namespace": "ns", "uid": "uid-bare", "generation": 1},
        "status": {"phase": "Running", "observedGeneration": 1,
                   "lease": {"holder": "gone-1"}},
    }))
    .unwrap();
    let run = Arc::new(run);
    super::reconcile::reconcile(run.clone(), ctx.clone())
        .await
        .unwrap();
    assert_eq!(api.state.lock().unwrap().run_reads, 0, "left alone first");
    // The wait began 3 s ago (the test does not sleep it).
    ctx.lease_watch_behind.settled(&key("bare"));
    let three_seconds_ago = now.checked_sub(Duration::from_secs(3)).unwrap_or(now);
    assert_eq!(
        ctx.lease_watch_behind
            .once(&key("bare"), three_seconds_ago, 2_000),
        Some(2_000)
    );
    super::reconcile::reconcile(run, ctx.clone()).await.unwrap();
    assert!(
        api.state.lock().unwrap().run_reads >= 1,
        "read after the wait"
    );
    assert_eq!(
        api.state.lock().unwrap().lease_creates,
        1,
        "and its absent Lease taken over"
    );
    ctx.executors.shutdown.cancel();
}

#[tokio::test]
async fn a_new_run_takes_its_slot_before_it_is_read() {
    // One slot. A new run read live (its watch event was not kept) holds the slot through its
    // read, so a run kicked meanwhile waits unread instead of being read for a slot the first
    // one then takes (issue 15: 0.43 reads per run at scale on kube-apiserver).
    use super::reconcile::{slot_before_read, SlotBeforeRead};
    let api = Arc::new(FakeApi::with_run(run_object("ns", "first", 30)));
    api.put_run(run_object("ns", "second", 30));
    let ctx = context_with_slots(api.clone(), "a", 500, 1);
    let watched = |name: &str| -> super::watched::WatchedRun {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "generation": 1},
            "status": {"phase": "Pending"},
        }))
        .unwrap()
    };
    let first = slot_before_read(&watched("first"), &key("first"), &ctx);
    assert!(matches!(first, SlotBeforeRead::Reserved(_)));
    assert!(
        ctx.executors.is_full(),
        "the slot is taken while the run is read"
    );
    let second = slot_before_read(&watched("second"), &key("second"), &ctx);
    assert!(matches!(second, SlotBeforeRead::Full));
    assert_eq!(
        ctx.executors.slot_waiting(),
        1,
        "the second waits to be kicked"
    );
    drop(first);
    assert!(!ctx.executors.is_full(), "unused, the slot is given back");
    // A cancelled run (a new generation) needs no slot to be read.
    let mut cancelled = watched("second");
    cancelled.metadata.generation = Some(2);
    assert!(matches!(
        slot_before_read(&cancelled, &key("second"), &ctx),
        SlotBeforeRead::NotNeeded
    ));
    // The slot given back was offered to the second, kicked: the first's reconcile waits
    // unread, and the second's whole reconcile reads it once and acquires its Lease with the
    // slot taken before the read.
    super::reconcile::reconcile(Arc::new(watched("first")), ctx.clone())
        .await
        .unwrap();
    assert_eq!(api.state.lock().unwrap().run_reads, 0);
    super::reconcile::reconcile(Arc::new(watched("second")), ctx.clone())
        .await
        .unwrap();
    assert_eq!(api.state.lock().unwrap().run_reads, 1);
    assert_eq!(api.state.lock().unwrap().lease_creates, 1);
    assert!(ctx.executors.is_executing(&key("second"), "uid-second"));
    ctx.executors.shutdown.cancel();
}

/// `ctx`'s Lease watch (scope `ns`) listed at `at` and found no Lease.
fn lease_watch_listed_none(ctx: &Context, at: std::time::Instant) {
    ctx.leases
        .watched(Some("ns"), &kube::runtime::watcher::Event::Init, at);
    ctx.leases
        .watched(Some("ns"), &kube::runtime::watcher::Event::InitDone, at);
}

/// Another replica `other-…` holds `name`'s Lease, its renewTime `renewed_at` (by its clock).
async fn held_by_other(api: &FakeApi, name: &str, renewed_at: Time) -> HolderId {
    let other = HolderId::with_random_suffix("other");
    let run = super::cluster::StoredRun::from_object(api.run("ns", name)).unwrap();
    super::lease::acquire(
        api,
        &run,
        None,
        &super::lease::view(None),
        &other,
        renewed_at,
    )
    .await
    .unwrap()
    .unwrap();
    other
}

#[tokio::test]
async fn a_lease_first_seen_is_left_alone_however_old_its_renew_time() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("old", tool.addr, 3)));
    // By this replica's clock the holder's renewTime is an hour old (its clock is behind).
    let an_hour_ago = Time::from_millis(Clock::default().now().as_millis() - 3_600_000);
    let other = held_by_other(&api, "old", an_hour_ago).await;
    let ctx = context(api.clone(), "a", 500);
    observe(&ctx, &key("old"), None).await.unwrap();
    assert_eq!(ctx.executors.executing(), 0);
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(seen("old"), ["observe"]);
    let lease = api.lease("ns", "old").unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(other.as_str()));
}

#[tokio::test]
async fn a_lease_seen_unchanged_past_its_duration_and_margin_is_taken_over() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("stale", tool.addr, 3)));
    // Its renewTime is ahead of this replica's clock; only the observation counts.
    let ahead = Time::from_millis(Clock::default().now().as_millis() + 3_600_000);
    held_by_other(&api, "stale", ahead).await;
    let ctx = context(api.clone(), "a", 500);
    // First seen 3.5 s ago (3 s lease + 500 ms margin) and unchanged since.
    let first_seen = std::time::Instant::now() - Duration::from_millis(3_500);
    ctx.leases
        .observe(&key("stale"), api.lease("ns", "stale").as_ref(), first_seen);
    observe(&ctx, &key("stale"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        seen("stale"),
        ["observe", "lease_acquired", "tool_finished"]
    );
    let lease = api.deleted_lease("ns", "stale").unwrap().spec.unwrap();
    assert_eq!(lease.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_lease_renewed_since_it_was_first_seen_is_left_alone() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("renewed", tool.addr, 3)));
    let now = Clock::default().now();
    let other = held_by_other(&api, "renewed", now).await;
    let ctx = context(api.clone(), "a", 500);
    let first_seen = std::time::Instant::now() - Duration::from_secs(60);
    ctx.leases.observe(
        &key("renewed"),
        api.lease("ns", "renewed").as_ref(),
        first_seen,
    );
    // The holder renews (a new resourceVersion) after that first sight.
    let mut renewed = api.lease("ns", "renewed").unwrap();
    if let Some(spec) = renewed.spec.as_mut() {
        spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            now.plus_seconds(1).0,
        ));
    }
    api.replace_lease("ns", &renewed).await.unwrap();
    observe(&ctx, &key("renewed"), None).await.unwrap();
    assert_eq!(ctx.executors.executing(), 0);
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(seen("renewed"), ["observe"]);
    let lease = api.lease("ns", "renewed").unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(other.as_str()));
}

#[tokio::test]
async fn a_lease_lost_during_the_call_does_not_record_the_outcome() {
    let tool = tool(Duration::from_millis(2500)).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("lost", tool.addr, 2)));
    let ctx = context(api.clone(), "a", 100);
    observe(&ctx, &key("lost"), None).await.unwrap();
    // Another replica takes the Lease while the tool runs.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let read = api.lease("ns", "lost");
    let run = super::cluster::StoredRun::from_object(api.run("ns", "lost")).unwrap();
    let thief = HolderId::with_random_suffix("thief");
    // The thief has seen the Lease unchanged for a minute (as if the holder had stopped).
    let stale = super::lease::observed(read.as_ref(), 60_000, 0);
    let now = Clock::default().now();
    super::lease::acquire(api.as_ref(), &run, read.as_ref(), &stale, &thief, now)
        .await
        .unwrap()
        .unwrap();
    until_idle(&ctx).await;
    assert_eq!(seen("lost"), ["observe", "lease_acquired", "lease_lost"]);
    assert_eq!(api.run("ns", "lost")["status"]["phase"], "Running");
    // The thief's lease was not released by the deposed executor.
    let lease = api.lease("ns", "lost").unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some(thief.as_str())
    );
}

/// docs/design.md section 5 (issue 34 item 5): renewals fail past the lease's expiry while the
/// tool runs, nobody takes the Lease, and the holder wins it back: the outcome it holds is
/// recorded (no interruption, nobody asked).
#[tokio::test]
async fn a_lease_lost_during_the_call_and_won_back_untaken_records_the_outcome() {
    let tool = tool(Duration::from_millis(3500)).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("regained", tool.addr, 2)));
    let ctx = context(api.clone(), "a", 100);
    observe(&ctx, &key("regained"), None).await.unwrap();
    // Every renewal fails from 0.2 s to 3 s into the call: the 2 s lease runs out on the
    // holder's clock; then the API server answers again, before the tool does.
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.state.lock().unwrap().fail_lease_writes = (0..100)
        .map(|_| ApiError::Refused {
            reason: "ServiceUnavailable".into(),
            message: "the API server is restarting".into(),
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(2800)).await;
    assert!(
        ctx.metrics.leases_lost.get() >= 1,
        "the lease ran out while renewals failed"
    );
    api.state.lock().unwrap().fail_lease_writes.clear();
    until_idle(&ctx).await;
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(ctx.metrics.leases_won_back.get(), 1);
    assert_eq!(
        seen("regained"),
        ["observe", "lease_acquired", "tool_finished"]
    );
    assert_eq!(api.run("ns", "regained")["status"]["phase"], "Completed");
}

#[tokio::test]
async fn a_lease_expired_by_this_replicas_clock_starts_no_side_effect() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("expired", tool.addr, 2)));
    // A skew margin as long as the lease: the check before the call always fails.
    let ctx = context(api.clone(), "a", 2_000);
    observe(&ctx, &key("expired"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(seen("expired"), ["observe", "lease_acquired", "lease_lost"]);
}

#[tokio::test]
async fn renewals_keep_a_long_call_alive() {
    let tool = tool(Duration::from_millis(2500)).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("long", tool.addr, 2)));
    let ctx = context(api.clone(), "a", 200);
    observe(&ctx, &key("long"), None).await.unwrap();
    until_idle(&ctx).await;
    assert_eq!(seen("long"), ["observe", "lease_acquired", "tool_finished"]);
    assert_eq!(api.run("ns", "long")["status"]["phase"], "Completed");
    let _ = api.get_lease("ns", "long").await.unwrap();
}

#[tokio::test]
async fn a_failed_reconcile_is_counted_by_kind_and_backs_off_per_run_until_it_succeeds() {
    use super::cluster::RunError;
    use super::failures::ReconcileError;
    use super::reconcile::entry::{error_policy, reconcile};
    use super::watched::WatchedRun;
    use kube::runtime::controller::Action;

    let api = Arc::new(FakeApi::default());
    let ctx = context(api, "a", 500);
    let mut watched = WatchedRun::default();
    watched.metadata.namespace = Some("ns".into());
    watched.metadata.name = Some("flaky".into());
    let obj = Arc::new(watched);
    let down = || {
        ReconcileError::new(
            key("flaky"),
            RunError::Api(ApiError::Kube(kube::Error::Service(
                "connection refused".into(),
            ))),
        )
    };
    let waits: Vec<Action> = (0..3)
        .map(|_| error_policy(obj.clone(), &down(), ctx.clone()))
        .collect();
    assert_eq!(
        waits,
        [2, 4, 8].map(|s| Action::requeue(Duration::from_secs(s)))
    );
    let text = ctx.metrics.encode();
    assert!(
        text.contains("agentrt_reconcile_errors_total{kind=\"api\"} 3"),
        "{text}"
    );
    // A successful reconcile (the run is gone: nothing to do) resets the backoff.
    reconcile(obj.clone(), ctx.clone()).await.unwrap();
    assert_eq!(ctx.failures.failures(&key("flaky")), 0);
    assert_eq!(
        error_policy(obj, &down(), ctx.clone()),
        Action::requeue(Duration::from_secs(2))
    );
}

/// docs/behaviours.md 67: a decision that lands on an Approval as its run ends (the Approval's
/// resourceVersion moved since the engine read it) does not leave it `Pending` forever: the
/// `Cancelled` status is written on a fresh read, still only forward and only on its request.
#[tokio::test]
async fn an_approval_status_that_meets_a_concurrent_decision_is_written_on_a_fresh_read() {
    let api = Arc::new(FakeApi::default());
    let hash = format!("sha256:{}", "a".repeat(64));
    let approval = json!({
        "metadata": {"name": "r-0-1", "namespace": "ns"},
        "spec": {"hash": hash, "runUID": "u"},
        "status": {"phase": "Pending"},
    });
    api.create_approval("ns", &approval).await.unwrap();
    let read = api.get_approval("ns", "r-0-1").await.unwrap().unwrap();
    let read_rv = read.object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    {
        // A person's decision lands after the engine read the Approval.
        let mut state = api.state.lock().unwrap();
        state.version += 1;
        let version = state.version.to_string();
        let stored = state
            .approvals
            .get_mut(&("ns".to_string(), "r-0-1".to_string()))
            .unwrap();
        stored["spec"]["decision"] = json!({"verdict": "Approved", "hash": hash});
        stored["metadata"]["resourceVersion"] = json!(version);
    }
    let ctx = context(api.clone(), "a", 500);
    let cancelled = json!({"phase": "Cancelled", "reason": "run cancelled"});
    ctx.write_approval_status("ns", "r-0-1", &cancelled, Some(read_rv), None, &hash)
        .await;
    let stored = api
        .get_approval("ns", "r-0-1")
        .await
        .unwrap()
        .unwrap()
        .object;
    assert_eq!(stored["status"], cancelled);
    assert_eq!(
        stored["spec"]["decision"]["verdict"], "Approved",
        "the spec is untouched"
    );

    // Only forward: an Executed Approval is never made Cancelled, however fresh the read.
    let executed = json!({"phase": "Executed"});
    let rv = stored["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    ctx.write_approval_status("ns", "r-0-1", &executed, Some(rv), None, &hash)
        .await;
    ctx.write_approval_status("ns", "r-0-1", &cancelled, Some("1".into()), None, &hash)
        .await;
    let stored = api
        .get_approval("ns", "r-0-1")
        .await
        .unwrap()
        .unwrap()
        .object;
    assert_eq!(stored["status"], executed);
}

/// The run `name` as a watch event delivers it now: with its whole object kept while it has
/// no status.
fn watched(api: &FakeApi, name: &str) -> super::watched::WatchedRun {
    serde_json::from_value(api.run("ns", name)).expect("a watched run decodes")
}

#[tokio::test]
async fn a_new_run_taken_from_its_watch_event_starts_without_being_read() {
    let tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("unread", tool.addr, 3)));
    let ctx = context(api.clone(), "a", 500);
    let run = watched(&api, "unread");
    assert!(run.fresh.is_some(), "a run without a status is kept whole");
    observe(&ctx, &key("unread"), run.fresh.as_ref())
        .await
        .unwrap();
    until_idle(&ctx).await;
    let stored = api.run("ns", "unread");
    assert_eq!(stored["status"]["phase"], "Completed");
    assert_eq!(tool.calls.load(Ordering::SeqCst), 1);
    assert_eq!(api.state.lock().unwrap().run_reads, 0, "no GET of the run");
    // Once it has a status, the watch keeps none of it.
    assert!(watched(&api, "unread").fresh.is_none());
}

#[tokio::test]
async fn a_watched_new_run_edited_since_its_event_is_read_before_anything_starts() {
    let old_tool = tool(Duration::ZERO).await;
    let new_tool = tool(Duration::ZERO).await;
    let api = Arc::new(FakeApi::with_run(run_with_tool("edited", old_tool.addr, 3)));
    let ctx = context(api.clone(), "a", 500);
    let stale = watched(&api, "edited");
    // The spec changes after the event the watch delivered (a new resourceVersion).
    api.put_run(run_with_tool("edited", new_tool.addr, 3));
    observe(&ctx, &key("edited"), stale.fresh.as_ref())
        .await
        .unwrap();
    until_idle(&ctx).await;
    // The first write, on the watched version, was refused; the run was read and decided
    // again, and the one call went to the tool the stored spec names.
    assert_eq!(
        seen("edited"),
        [
            "observe",
            "lease_acquired",
            "lease_acquired",
            "tool_finished"
        ]
    );
    assert_eq!(old_tool.calls.load(Ordering::SeqCst), 0);
    assert_eq!(new_tool.calls.load(Ordering::SeqCst), 1);
    assert!(api.state.lock().unwrap().run_reads >= 1);
    assert_eq!(api.run("ns", "edited")["status"]["phase"], "Completed");
}

#[test]
fn a_watched_run_that_was_started_or_lists_mcp_tools_first_is_read_live() {
    let api = FakeApi::with_run(run_object("ns", "w", 30));
    let fresh = watched(&api, "w").fresh.expect("kept whole");
    let state = super::reconcile::watched_state(&key("w"), &fresh, None).expect("taken");
    // As read, but without the managedFields (their bytes counted all the same).
    let read = super::cluster::StoredRun::from_object(api.run("ns", "w")).unwrap();
    let mut unmanaged = api.run("ns", "w");
    unmanaged["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    let mut expected = super::cluster::StoredRun::from_object(unmanaged).unwrap();
    expected.snapshot.metadata_bytes = read.snapshot.metadata_bytes;
    assert_eq!(state.run, expected);
    assert!(state.approvals.is_empty());
    // Its own Lease, even a dead holder's, means it was started: read live.
    let own = k8s_openapi::api::coordination::v1::Lease {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("w".into()),
            namespace: Some("ns".into()),
            owner_references: Some(vec![super::lease::run_owner("w", "uid-w")]),
            ..Default::default()
        },
        spec: None,
    };
    assert!(super::reconcile::watched_state(&key("w"), &fresh, Some(&own)).is_none());
    // A Lease another run of that name left counts as none.
    let mut left = own.clone();
    left.metadata.owner_references = Some(vec![super::lease::run_owner("w", "uid-old")]);
    assert!(super::reconcile::watched_state(&key("w"), &fresh, Some(&left)).is_some());
    // A run with MCP tools lists its servers before its first write: read live.
    let mut mcp = run_object("ns", "m", 30);
    mcp["spec"]["toolSets"] = json!([{"name": "fs", "mcp": {"url": "http://127.0.0.1:1/mcp"},
        "include": ["*"], "sideEffect": "ReadOnly"}]);
    api.put_run(mcp);
    let fresh = watched(&api, "m").fresh.expect("kept whole");
    assert!(super::reconcile::watched_state(&key("m"), &fresh, None).is_none());
}

/// Issue 15 (session 16): a status write's answer of the same run and generation is read for
/// its metadata only and the run goes on with the status sent, the same run a whole decode of
/// the answer makes; an answer of another generation is decoded whole, status included; debug
/// builds refuse an answer whose stored status is not the one sent.
#[test]
fn a_status_write_answer_of_the_same_generation_keeps_the_status_sent() {
    use super::cluster::StoredRun;
    let mut object = run_object("ns", "w", 30);
    object["metadata"]["resourceVersion"] = json!("7");
    let held = StoredRun::from_object(object.clone()).unwrap();
    let sent = json!({"phase": "Running", "stepCount": 1, "activeSeconds": 1.0});

    // The server writes 1.0 as 1 (Go's unstructured JSON): the same number.
    let mut answer = object.clone();
    answer["metadata"]["resourceVersion"] = json!("8");
    answer["status"] = json!({"phase": "Running", "stepCount": 1, "activeSeconds": 1});
    let text = serde_json::to_string(&answer).unwrap();
    let run = held
        .landed(&text, &sent)
        .unwrap()
        .into_run(sent.clone(), None);
    assert_eq!(run.resource_version, "8");
    assert_eq!(
        run.snapshot.status, sent,
        "the status sent, not decoded again"
    );
    assert!(Arc::ptr_eq(&run.snapshot.spec, &held.snapshot.spec));
    let whole = StoredRun::from_object(answer.clone()).unwrap();
    assert_eq!(run.object, whole.object);
    assert_eq!(run.snapshot.metadata_bytes, whole.snapshot.metadata_bytes);

    // A spec edited meanwhile: the whole answer, its status as stored.
    let mut edited = answer.clone();
    edited["metadata"]["generation"] = json!(2);
    edited["status"] = json!({"phase": "Running", "stepCount": 2});
    let run = held
        .landed(&serde_json::to_string(&edited).unwrap(), &sent)
        .unwrap()
        .into_run(sent.clone(), None);
    assert_eq!(run.snapshot.status["stepCount"], 2);
    assert_eq!(run, StoredRun::from_object(edited).unwrap());

    // Not JSON: an error naming the run.
    let err = held.landed("{\"metadata\": ", &sent).unwrap_err();
    assert!(err.to_string().contains("ns/w"), "{err}");

    // Debug builds: a stored status that is not the one sent is a bug the tests must see.
    if cfg!(debug_assertions) {
        let mut other = answer;
        other["status"]["stepCount"] = json!(5);
        let text = serde_json::to_string(&other).unwrap();
        let refused = std::panic::catch_unwind(|| held.landed(&text, &sent).map(|_| ()));
        assert!(
            refused.is_err(),
            "a different stored status must not pass a debug build"
        );
    }
}

/// Issue 15: the answer to a status write of the same generation keeps the spec already held
/// (shared, not decoded again), and reads as the same run a whole decode of it makes; an
/// answer of another generation, or of another run of the name, is decoded whole.
#[test]
fn a_status_write_answer_keeps_the_spec_of_its_generation() {
    use super::cluster::StoredRun;
    let mut object = run_object("ns", "w", 30);
    object["metadata"]["resourceVersion"] = json!("7");
    object["metadata"]["annotations"] = json!({crate::engine::CREATED_BY_ANNOTATION: "alice"});
    let held = StoredRun::from_object(object.clone()).unwrap();

    let mut answer = object.clone();
    answer["metadata"]["resourceVersion"] = json!("8");
    answer["status"] = json!({"phase": "Running", "stepCount": 1});
    let text = serde_json::to_string(&answer).unwrap();
    let written = held.written(&text).unwrap();
    assert!(
        Arc::ptr_eq(&written.spec, &held.spec),
        "the spec json is shared"
    );
    assert!(
        Arc::ptr_eq(&written.snapshot.spec, &held.snapshot.spec),
        "the decoded spec is shared"
    );
    assert_eq!(written, StoredRun::from_object(answer.clone()).unwrap());
    assert_eq!(written.resource_version, "8");
    assert_eq!(written.snapshot.status["phase"], "Running");
    assert_eq!(written.snapshot.created_by.as_deref(), Some("alice"));

    // A spec edited meanwhile (the generation moved): decoded from the answer.
    let mut edited = answer.clone();
    edited["metadata"]["generation"] = json!(2);
    edited["spec"]["goal"] = json!("another goal");
    let written = held
        .written(&serde_json::to_string(&edited).unwrap())
        .unwrap();
    assert!(!Arc::ptr_eq(&written.snapshot.spec, &held.snapshot.spec));
    assert_eq!(written.snapshot.spec.goal, "another goal");
    assert_eq!(written, StoredRun::from_object(edited).unwrap());

    // Another run of the same name (another uid) at the same generation: decoded whole.
    let mut other = answer;
    other["metadata"]["uid"] = json!("uid-other");
    other["spec"]["goal"] = json!("the other run's goal");
    let written = held
        .written(&serde_json::to_string(&other).unwrap())
        .unwrap();
    assert_eq!(written.snapshot.spec.goal, "the other run's goal");

    // An answer that is not JSON is an error naming the run.
    let err = held.written("{\"metadata\": ").unwrap_err();
    assert!(
        matches!(err, super::cluster::DecodeError::Answer { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("ns/w"), "{err}");
}

/// `agentrt_watch_lag_seconds` shows the replica's watch lag at the scrape: a probe in flight
/// counts as its age (docs/design.md section 7).
#[tokio::test]
async fn the_watch_lag_is_a_gauge_read_at_each_scrape() {
    let api = Arc::new(FakeApi::default());
    let ctx = context(api, "a", 500);
    let gauge = |text: &str| -> f64 {
        text.lines()
            .find_map(|line| line.strip_prefix("agentrt_watch_lag_seconds "))
            .expect("the gauge is exported")
            .trim()
            .parse()
            .expect("a number")
    };
    assert_eq!(gauge(&ctx.metrics.encode()), 0.0);
    let answered = std::time::Instant::now() - Duration::from_secs(2);
    ctx.watch_lag.wrote("5", answered);
    let lag = gauge(&ctx.metrics.encode());
    assert!((2.0..10.0).contains(&lag), "a probe 2 s in flight: {lag}");
    ctx.watch_lag
        .delivered("5", answered + Duration::from_millis(1_500));
    assert_eq!(gauge(&ctx.metrics.encode()), 1.5);
}

mod jobs;
