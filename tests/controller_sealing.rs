//! Sealing as a run goes (docs/design.md section 4a, docs/behaviours.md 54-58): controllers
//! that seal constantly (`--seal-steps 4 --keep-steps 1`) move a run's settled history into
//! AgentRunSegments; a crash between a segment's create and the status write loses nothing and
//! runs nothing twice; `agentrt show run -o json` prints what an unsealed record would hold and
//! `agentrt verify` finds the chain intact; a long run's status stays small while
//! `show run -o json` returns every step. Runs against the embedded API server, or a real
//! cluster when `AGENTRT_TEST_KUBECONFIG` is set.

mod support;

use std::time::Duration;

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;
use support::cli::{agentrt_in, text};
use support::controller::*;
use support::metrics::{sample, scrape};
use support::toolserver::ToolServer;

/// Tool steps in `tests/fixtures/controller/sealing.yaml`.
const TOOL_STEPS: usize = 12;

/// `agentrt show run NAME -o json`'s status, after `agentrt verify NAME` exited 0.
fn whole_history(cluster: &support::cluster::TestCluster, ns: &str, name: &str) -> Value {
    let out = agentrt_in(cluster, ns, &["verify", name]);
    assert_eq!(out.status.code(), Some(0), "verify: {}", text(&out));
    let out = agentrt_in(cluster, ns, &["show", "run", name, "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "show: {}", text(&out));
    let shown: Value = serde_json::from_slice(&out.stdout).expect("show -o json is JSON");
    shown["status"].clone()
}

/// Steps with index 0..n and events with seq 1..n, without gaps.
fn assert_gapless(status: &Value) {
    let indices: Vec<i64> = status["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["index"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(indices, (0..indices.len() as i64).collect::<Vec<_>>());
    assert_seq_contiguous(status);
}

async fn segments(client: &kube::Client, ns: &str) -> Vec<DynamicObject> {
    let resource = kube::api::ApiResource {
        group: "agentrt.dev".into(),
        version: "v1alpha1".into(),
        api_version: "agentrt.dev/v1alpha1".into(),
        kind: "AgentRunSegment".into(),
        plural: "agentrunsegments".into(),
    };
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
        .list(&ListParams::default())
        .await
        .expect("segments list")
        .items
}

/// What two runs of one manifest share, whoever ran them and when: the record without times,
/// holders and durations.
fn timeless(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "time" | "startedAt" | "finishedAt" | "durationMs" | "holder"
                    )
                })
                .map(|(k, v)| (k.clone(), timeless(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(timeless).collect()),
        other => other.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_segment_was_created_loses_nothing_and_runs_nothing_twice() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let run = RunFixture::new("sealing", &tools.base(), "sealed-crash")
        .create_in(&cluster)
        .await;
    let uid = run.metadata.uid.clone().expect("uid");
    // The first controller dies right after creating its first segment, before the status
    // write that drops those steps; the second goes on.
    let (first, second) =
        crash_then_take_over_in(&cluster, "after-segment-created", Duration::from_secs(60));
    let done = cluster
        .wait_phase("sealed-crash", "Completed", Duration::from_secs(90))
        .await;
    assert!(done["archive"]["segments"]
        .as_array()
        .is_some_and(|s| !s.is_empty()));
    // Each call once: the step whose outcome the crash lost (a ReadOnly lookup) was recorded
    // interrupted and not repeated.
    let counts = tools.counts();
    assert_eq!(counts.len(), TOOL_STEPS, "{counts:?}");
    for (key, count) in &counts {
        assert!(key.starts_with(&uid), "{key}");
        assert_eq!(*count, 1, "{key} called {count} times: {counts:?}");
    }
    let whole = whole_history(&cluster, &ns, "sealed-crash");
    assert_gapless(&whole);
    // The takeover and the interruption are in the history (by now sealed away).
    assert!(
        !events_of(&whole, "lease.taken_over").is_empty(),
        "{whole}\nfirst:\n{}\nsecond:\n{}",
        first.log(),
        second.log()
    );
    assert_eq!(events_of(&whole, "step.interrupted").len(), 1, "{whole}");
    // The twelve lookups and the completion: the interrupted step took its decision with it.
    assert_eq!(
        whole["steps"].as_array().map(Vec::len),
        Some(TOOL_STEPS + 1)
    );
    // The orphan or the same segment again: every segment the record names exists.
    let names: Vec<String> = segments(&client, &ns)
        .await
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    for entry in done["archive"]["segments"].as_array().unwrap() {
        assert!(names.iter().any(|n| n == entry["name"].as_str().unwrap()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_sealed_constantly_shows_what_an_unsealed_run_holds() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let sealed_ns = format!("{}-sealed", cluster.namespace());
    let plain_ns = format!("{}-plain", cluster.namespace());
    for ns in [&sealed_ns, &plain_ns] {
        create_namespace(&client, ns).await;
    }
    let tools = ToolServer::start().await;
    let _sealing = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &sealed_ns,
        ControllerSpec::named("sealing").sealing(),
    );
    let _plain = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &plain_ns,
        ControllerSpec::named("plain"),
    );
    for ns in [&sealed_ns, &plain_ns] {
        RunFixture::new("sealing", &tools.base(), "lookups")
            .create(&client, ns)
            .await;
    }
    let mut finished = Vec::new();
    for ns in [&sealed_ns, &plain_ns] {
        finished
            .push(wait_phase(&client, ns, "lookups", "Completed", Duration::from_secs(60)).await);
    }
    let (sealed, plain) = (&finished[0], &finished[1]);
    assert!(plain.get("archive").is_none_or(Value::is_null), "{plain}");
    let kept = sealed["steps"].as_array().map_or(0, Vec::len);
    // At most the step a seal keeps, 4 more before the next seal, and the completion (a
    // terminal write does not seal).
    assert!(kept <= 6, "the window stays small: {kept} steps");
    assert_eq!(sealed["stepCount"], plain["stepCount"]);
    assert!(!segments(&client, &sealed_ns).await.is_empty());
    assert!(segments(&client, &plain_ns).await.is_empty());

    let whole = whole_history(&cluster, &sealed_ns, "lookups");
    let unsealed = whole_history(&cluster, &plain_ns, "lookups");
    assert_gapless(&whole);
    assert_eq!(timeless(&whole["steps"]), timeless(&unsealed["steps"]));
    assert_eq!(timeless(&whole["events"]), timeless(&unsealed["events"]));
}

/// How many steps the long run takes: 300 by default, `AGENTRT_TEST_LONG_STEPS` for more
/// (docs/behaviours.md 54 names 10,000; in a debug build against the embedded server a step
/// costs 45-90 ms here, so 10,000 steps take far longer than a test should: that figure is the
/// benchmark's, `agentrt bench --workload long --steps 10000`).
fn long_steps() -> i64 {
    std::env::var("AGENTRT_TEST_LONG_STEPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_keeps_a_small_status_and_shows_every_step() {
    let steps = long_steps();
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let agent = support::stub::Stub::json(move |request| {
        let step = request["step"].as_i64().unwrap_or(0);
        if step + 1 < steps {
            serde_json::json!({"kind": "tool_call", "tool": "quick", "args": {"item": step}})
        } else {
            serde_json::json!({"kind": "complete", "result": {"steps": step + 1}})
        }
    })
    .await;
    // The controller's default sealing (64 settled steps, 8 kept).
    let controller = start_controller(&cluster, "long");
    RunFixture::new("long-webhook", &tools.base(), "long")
        .agent(&agent.url)
        .set("STEPS", steps)
        .create_in(&cluster)
        .await;
    let started = std::time::Instant::now();
    let done = wait_status(
        &client,
        &ns,
        "long",
        Duration::from_secs(600),
        "the run's end",
        |s| matches!(s["phase"].as_str(), Some("Completed" | "Failed")),
    )
    .await;
    eprintln!("{steps} steps in {:?}", started.elapsed());
    assert_eq!(
        done["phase"],
        "Completed",
        "{}\n{}",
        done["reasonDetail"],
        controller.log()
    );
    assert_eq!(done["stepCount"], steps);
    let window = serde_json::to_vec(&done).expect("JSON").len();
    assert!(
        window < 256 * 1024,
        "the status stays small: {window} bytes"
    );
    assert_eq!(tools.calls().len() as i64, steps - 1);
    let whole = whole_history(&cluster, &ns, "long");
    assert_gapless(&whole);
    assert_eq!(
        whole["steps"].as_array().map(Vec::len),
        Some(steps as usize)
    );
}

/// The orders of the `lookup_order` results a chat-completions request shows, in order.
fn orders_shown(request: &Value) -> Vec<i64> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| {
            let observation: Value = serde_json::from_str(m["content"].as_str()?).ok()?;
            observation["content"]["args"]["order"].as_i64()
        })
        .collect()
}

/// docs/behaviours.md 59 (docs/design.md section 4a): once its steps are sealed, an openai
/// agent is still asked with them, by the controller that sealed them and by one that took the
/// run over, which reads each segment once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_agent_is_asked_with_its_sealed_steps_and_each_segment_is_read_once() {
    use support::modelserver::{usage, ModelServer, Reply};
    const CALLS: i64 = 10;
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    create_secret(&client, &ns, "model-key", "apiKey", "sk-sealed").await;
    let tools = ToolServer::start().await;
    let mut script: Vec<Reply> = (0..CALLS)
        .map(|i| {
            Reply::tool_call(
                "lookup_order",
                serde_json::json!({"order": i}),
                usage(100, 10, 0),
            )
        })
        .collect();
    // The first controller dies while this attempt is in flight.
    script.push(Reply::hang());
    script.push(Reply::complete(
        serde_json::json!({"looked": CALLS}),
        usage(100, 10, 0),
    ));
    let model = ModelServer::start(script).await;
    RunFixture::new("openai-agent", &tools.base(), "sealed-model")
        .model(&model.base_url())
        .create_in(&cluster)
        .await;
    let mut first = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("first").sealing(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while model.received().len() <= CALLS as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "the model was asked {} times\n{}",
            model.received().len(),
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.signal(libc::SIGKILL);
    assert!(first.was_killed(Duration::from_secs(5)));
    let sealed = status(&client, &ns, "sealed-model").await;
    let segment_count = sealed["archive"]["segments"].as_array().map_or(0, Vec::len);
    assert!(segment_count >= 2, "sealed constantly: {sealed}");
    let window_first = sealed["steps"][0]["index"].as_i64().expect("a window");
    assert!(window_first >= 4, "most steps are sealed: {sealed}");

    let port = support::free_port();
    let second = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("second").sealing().metrics_on(port),
    );
    let done = cluster
        .wait_phase("sealed-model", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(
        done["result"],
        serde_json::json!({"looked": CALLS}),
        "{}",
        second.log()
    );

    // Both holders asked with every result, sealed or not: the one that sealed them from what
    // it created, the one that took over from the segments.
    let received = model.received();
    assert_eq!(received.len(), CALLS as usize + 2);
    let all: Vec<i64> = (0..CALLS).collect();
    for (who, request) in [
        ("first", &received[CALLS as usize]),
        ("second", &received[CALLS as usize + 1]),
    ] {
        assert_eq!(
            orders_shown(&request.json()),
            all,
            "the {who} controller's request"
        );
    }

    // The second controller read each segment once (a terminal write seals nothing more).
    let text = scrape(port).await;
    let reads = sample(&text, "agentrt_segment_reads_total").expect("segment reads counted");
    let segments_at_end = done["archive"]["segments"].as_array().map_or(0, Vec::len);
    assert_eq!(segments_at_end, segment_count, "{done}");
    assert_eq!(reads, segment_count as f64, "{text}");
}
