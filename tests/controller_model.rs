//! The `openai` agent end to end (docs/design.md section 6; docs/behaviours.md 8, 10, 45-48): a controller
//! child process, a real tool server, and a real local HTTP server speaking the
//! chat-completions API with scripted replies (tests/support/modelserver.rs). Each test
//! asserts the record: decisions, usage totals, cost in micros, the `model.*` events in order
//! with their usage, cost and latency, and the terminal reason.
//!
//! Prices in the fixture (micros per million tokens): input 150 000, cached input 75 000,
//! output 600 000; every call's output is capped at 200 tokens.
//!
//! Two rooms of their own: the API key's secrecy (`controller_model/secrets.rs`) and a takeover
//! during a model call (`controller_model/takeover.rs`).

mod support;

/// The API key never leaks.
#[path = "controller_model/secrets.rs"]
mod secrets;
/// A takeover during a model call.
#[path = "controller_model/takeover.rs"]
mod takeover;

use std::time::Duration;

use serde_json::{json, Value};
use support::cluster::TestCluster;
use support::controller::*;
use support::modelserver::{usage, ModelServer, Reply};
use support::toolserver::ToolServer;

/// The API key the Secret holds: distinctive, so a grep finds any copy of it.
const KEY: &str = "sk-agentrt-test-4f1c9e27-never-shown";
const CAP: i64 = 200;
const WAIT: Duration = Duration::from_secs(60);

/// A cluster with the model key's Secret, and a tool server.
async fn setup() -> (TestCluster, ToolServer) {
    let cluster = agentrt_cluster().await;
    create_secret(
        &cluster.client(),
        cluster.namespace(),
        "model-key",
        "apiKey",
        KEY,
    )
    .await;
    (cluster, ToolServer::start().await)
}

/// The `openai-agent` fixture named `name`, talking to `model`, with `patch` applied to its
/// spec.
fn run_yaml(name: &str, model: &str, tools: &ToolServer, patch: impl FnOnce(&mut Value)) -> String {
    let yaml = RunFixture::new("openai-agent", &tools.base(), name)
        .model(model)
        .yaml();
    let mut object: Value = serde_yaml::from_str(&yaml).expect("the fixture is YAML");
    patch(&mut object["spec"]);
    serde_yaml::to_string(&object).expect("YAML")
}

async fn start_run(
    cluster: &TestCluster,
    tools: &ToolServer,
    name: &str,
    model: &str,
    patch: impl FnOnce(&mut Value),
) {
    let yaml = run_yaml(name, model, tools, patch);
    cluster.create_run(&yaml).await;
}

async fn wait_done(cluster: &TestCluster, name: &str) -> Value {
    cluster
        .wait_status(name, WAIT, "a terminal phase", |s| {
            matches!(
                s["phase"].as_str(),
                Some("Completed" | "Failed" | "Cancelled")
            )
        })
        .await
}

/// `type@step` of the events whose type is one of `types`, in order.
fn journal(status: &Value, types: &[&str]) -> Vec<String> {
    status["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| types.iter().any(|t| e["type"] == *t))
        .map(|e| match e["step"].as_i64() {
            Some(step) => format!("{}@{step}", e["type"].as_str().unwrap_or("?")),
            None => e["type"].as_str().unwrap_or("?").to_string(),
        })
        .collect()
}

const MODEL_EVENTS: [&str; 4] = [
    "model.dispatched",
    "model.completed",
    "model.failed",
    "step.decided",
];

/// The data of the `model.*` events of `kind`, in order.
fn data_of(status: &Value, kind: &str) -> Vec<Value> {
    events_of(status, kind)
        .into_iter()
        .map(|e| e["data"].clone())
        .collect()
}

/// docs/behaviours.md 46: input ≈ request bytes / 3 + 1.
fn projected_input(body: &[u8]) -> i64 {
    i64::try_from(body.len() / 3 + 1).expect("small")
}

/// Micros of `input` (of which `cached`) and `output` tokens at the fixture's prices, rounded
/// up.
fn cost(input: i64, cached: i64, output: i64) -> i64 {
    let total = (input - cached) * 150_000 + cached * 75_000 + output * 600_000;
    (total + 999_999) / 1_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_decides_each_step_and_every_attempt_is_accounted() {
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![
        Reply::tool_call("lookup_order", json!({"order": 1042}), usage(1000, 50, 200)),
        Reply::complete(json!({"damaged": true}), usage(1500, 40, 0)),
    ])
    .await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "decided", &model.base_url(), |_| {}).await;
    let done = wait_done(&cluster, "decided").await;

    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(done["reason"], "goal_completed");
    assert_eq!(done["result"], json!({"damaged": true}));
    assert_eq!(step_statuses(&done), ["done", "done"]);
    assert_eq!(
        done["steps"][0]["decision"],
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1042}})
    );
    assert_eq!(
        done["steps"][1]["decision"],
        json!({"kind": "complete", "result": {"damaged": true}})
    );
    assert_eq!(tools.calls().len(), 1);
    assert_seq_contiguous(&done);

    // Each attempt: dispatched before it is sent, completed after, then the decision.
    assert_eq!(
        journal(&done, &MODEL_EVENTS),
        [
            "model.dispatched@0",
            "model.completed@0",
            "step.decided@0",
            "model.dispatched@1",
            "model.completed@1",
            "step.decided@1",
        ]
    );
    let received = model.received();
    assert_eq!(received.len(), 2);
    let dispatched = data_of(&done, "model.dispatched");
    for (attempt, request) in dispatched.iter().zip(&received) {
        assert_eq!(attempt["attempt"], 1);
        assert_eq!(attempt["model"], "scripted-model");
        assert_eq!(attempt["maxOutputTokens"], CAP);
        let input = projected_input(&request.body);
        assert_eq!(
            attempt["projection"],
            json!({"inputTokens": input, "outputTokens": CAP, "costMicros": cost(input, 0, CAP)}),
        );
    }
    let completed = data_of(&done, "model.completed");
    assert_eq!(completed[0]["inputTokens"], 1000);
    assert_eq!(completed[0]["cachedInputTokens"], 200);
    assert_eq!(completed[0]["outputTokens"], 50);
    assert_eq!(completed[0]["costMicros"], cost(1000, 200, 50));
    assert_eq!(completed[0]["charged"], "reported");
    assert_eq!(completed[1]["costMicros"], cost(1500, 0, 40));
    for data in &completed {
        assert!(data["latencyMs"].is_u64(), "{data}");
    }
    assert_eq!(
        done["usage"],
        json!({
            "modelCalls": 2,
            "inputTokens": 2500,
            "outputTokens": 90,
            "estimatedCostMicros": cost(1000, 200, 50) + cost(1500, 0, 40),
        })
    );

    // The requests: the key as a bearer token, the cap, and the second one rendered from the
    // record (the call and its observation).
    for request in &received {
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(
            request.authorization.as_deref(),
            Some(&*format!("Bearer {KEY}"))
        );
        assert_eq!(request.json()["max_tokens"], CAP);
        assert_eq!(request.json()["model"], "scripted-model");
    }
    let second = received[1].json();
    let messages = second["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 4, "{second}");
    assert_eq!(
        messages[1]["content"],
        "Look order 1042 up and say whether it arrived damaged."
    );
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["name"],
        "lookup_order"
    );
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], "call_0");
    assert!(
        messages[3]["content"]
            .as_str()
            .is_some_and(|c| c.contains("tool_result")),
        "{}",
        messages[3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_text_answer_completes_the_run_with_its_text() {
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![
        Reply::tool_call("lookup_order", json!({"order": 1042}), usage(800, 12, 0)),
        Reply::text("Order 1042 arrived intact.", usage(900, 8, 0)),
    ])
    .await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "says", &model.base_url(), |_| {}).await;
    let done = wait_done(&cluster, "says").await;
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(done["reason"], "goal_completed");
    assert_eq!(
        done["result"],
        json!({"text": "Order 1042 arrived intact."})
    );
    assert_eq!(step_statuses(&done), ["done", "done"]);
    let last = &done["steps"][1];
    assert_eq!(
        last["decision"]["failure"], "no_tool_call",
        "recorded as received"
    );
    assert_eq!(last["decision"]["finishReason"], "stop");
    assert_eq!(
        data_of(&done, "step.decided")[1],
        json!({"kind": "invalid", "textAnswer": true})
    );
    assert_eq!(model.left(), 0, "two replies, no third request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_with_no_tool_call_or_cut_off_are_invalid_decisions_that_count_as_failures() {
    let (cluster, tools) = setup().await;
    let recovers = ModelServer::start(vec![
        Reply::text("It probably arrived fine.", usage(900, 8, 0)),
        Reply::truncated(usage(950, CAP, 0)),
        Reply::complete(json!({"damaged": false}), usage(1000, 20, 0)),
    ])
    .await;
    let gives_up = ModelServer::start(vec![
        Reply::text("Let me think.", usage(900, 5, 0)),
        Reply::truncated(usage(950, CAP, 0)),
    ])
    .await;
    let _controller = start_controller(&cluster, "c");
    // `textAnswer: Invalid`: a text reply is no answer (docs/behaviours.md 72).
    start_run(&cluster, &tools, "recovers", &recovers.base_url(), |spec| {
        spec["agent"]["openai"]["textAnswer"] = json!("Invalid");
    })
    .await;
    start_run(&cluster, &tools, "gives-up", &gives_up.base_url(), |spec| {
        spec["agent"]["openai"]["textAnswer"] = json!("Invalid");
        spec["limits"] = json!({"maxConsecutiveToolFailures": 2});
    })
    .await;

    let done = wait_done(&cluster, "recovers").await;
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(step_statuses(&done), ["failed", "failed", "done"]);
    for (step, failure) in [(0, "no_tool_call"), (1, "truncated")] {
        let record = &done["steps"][step];
        // Recorded verbatim, then judged.
        assert_eq!(record["decision"]["kind"], "invalid", "{record}");
        assert_eq!(record["decision"]["failure"], failure, "{record}");
        assert_eq!(record["observation"]["kind"], "invalid_decision");
        assert_eq!(record["observation"]["content"]["failure"], failure);
    }
    assert_eq!(
        done["steps"][0]["decision"]["content"]["content"],
        "It probably arrived fine."
    );
    assert_eq!(
        journal(&done, &["model.completed", "step.decided", "step.failed"]),
        [
            "model.completed@0",
            "step.decided@0",
            "step.failed@0",
            "model.completed@1",
            "step.decided@1",
            "step.failed@1",
            "model.completed@2",
            "step.decided@2",
        ]
    );
    assert_eq!(done["usage"]["modelCalls"], 3);
    assert_eq!(done["usage"]["outputTokens"], 8 + CAP + 20);
    assert!(tools.calls().is_empty(), "nothing was run");
    // The model saw its text reply and what became of it.
    let third = recovers.received()[2].json();
    let messages = third["messages"].as_array().expect("messages");
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(messages[2]["content"], "It probably arrived fine.");
    assert_eq!(messages[3]["role"], "user");
    assert!(
        messages[3]["content"]
            .as_str()
            .is_some_and(|c| c.contains("no_tool_call")),
        "{}",
        messages[3]
    );

    let failed = wait_done(&cluster, "gives-up").await;
    assert_eq!(failed["phase"], "Failed", "{failed}");
    assert_eq!(failed["reason"], "repeated_tool_failures");
    assert_eq!(step_statuses(&failed), ["failed", "failed"]);
    assert_eq!(gives_up.received().len(), 2);
    assert_seq_contiguous(&failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failures_are_retried_with_backoff_honouring_retry_after() {
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![
        Reply::status(429, r#"{"error": "slow down"}"#).retry_after(2),
        Reply::status(500, r#"{"error": "upstream failed"}"#),
        Reply::complete(json!({"damaged": true}), usage(1000, 30, 0)),
    ])
    .await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "retried", &model.base_url(), |_| {}).await;
    let done = wait_done(&cluster, "retried").await;
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(
        journal(&done, &MODEL_EVENTS),
        [
            "model.dispatched@0",
            "model.failed@0",
            "model.dispatched@0",
            "model.failed@0",
            "model.dispatched@0",
            "model.completed@0",
            "step.decided@0",
        ]
    );
    let received = model.received();
    assert_eq!(received.len(), 3);
    let dispatched = data_of(&done, "model.dispatched");
    let failed = data_of(&done, "model.failed");
    // The 429 asked for 2 s, more than the first backoff (1 s); the 500 got the second backoff
    // (2 s).
    assert_eq!(
        dispatched
            .iter()
            .map(|d| d["attempt"].clone())
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(
        dispatched
            .iter()
            .map(|d| d["delayMs"].clone())
            .collect::<Vec<_>>(),
        [0, 2000, 2000]
    );
    assert_eq!(failed[0]["status"], 429);
    assert_eq!(failed[0]["charged"], "nothing");
    assert_eq!(failed[0]["inputTokens"], 0);
    assert!(failed[0]["detail"]
        .as_str()
        .is_some_and(|d| d.contains("slow down")));
    assert_eq!(failed[1]["status"], 500);
    assert_eq!(failed[1]["charged"], "projection");
    let lost = projected_input(&received[1].body);
    assert_eq!(failed[1]["inputTokens"], lost);
    assert_eq!(failed[1]["outputTokens"], CAP);
    assert_eq!(failed[1]["costMicros"], cost(lost, 0, CAP));
    for data in &failed {
        assert!(data["latencyMs"].is_u64(), "{data}");
    }
    assert_eq!(
        done["usage"],
        json!({
            "modelCalls": 3,
            "inputTokens": lost + 1000,
            "outputTokens": CAP + 30,
            "estimatedCostMicros": cost(lost, 0, CAP) + cost(1000, 0, 30),
        })
    );
    // The waits were waited (a lower bound only: a loaded machine may wait longer).
    assert!(received[1].at - received[0].at >= Duration::from_millis(1900));
    assert!(received[2].at - received[1].at >= Duration::from_millis(1900));
    // The retries are the same request.
    assert_eq!(received[0].body, received[1].body);
    assert_eq!(received[1].body, received[2].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reply_past_the_timeout_is_charged_its_projection_and_tried_again() {
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![
        Reply::complete(json!({"late": true}), usage(10, 1, 0)).slow(Duration::from_secs(60)),
        Reply::complete(json!({"damaged": false}), usage(1000, 30, 0)),
    ])
    .await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "slow", &model.base_url(), |spec| {
        spec["agent"]["openai"]["timeoutSeconds"] = json!(3);
    })
    .await;
    let done = wait_done(&cluster, "slow").await;
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_eq!(done["result"], json!({"damaged": false}));
    assert_eq!(
        journal(&done, &MODEL_EVENTS),
        [
            "model.dispatched@0",
            "model.failed@0",
            "model.dispatched@0",
            "model.completed@0",
            "step.decided@0",
        ]
    );
    let received = model.received();
    let lost = projected_input(&received[0].body);
    let failed = &data_of(&done, "model.failed")[0];
    assert_eq!(failed["outcome"], "no_answer", "{failed}");
    assert_eq!(failed["charged"], "projection");
    assert_eq!(failed["inputTokens"], lost);
    assert_eq!(failed["outputTokens"], CAP);
    assert_eq!(data_of(&done, "model.dispatched")[1]["delayMs"], 1000);
    assert_eq!(done["usage"]["inputTokens"], lost + 1000);
    assert_eq!(done["usage"]["outputTokens"], CAP + 30);
    assert_eq!(done["usage"]["modelCalls"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_usage_is_replaced_by_the_projection_and_ends_the_run_model_unavailable() {
    let (cluster, tools) = setup().await;
    let model = ModelServer::start(vec![Reply::tool_call(
        "lookup_order",
        json!({"order": 1042}),
        usage(-5, 20, 0),
    )])
    .await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "negative", &model.base_url(), |_| {}).await;
    let done = wait_done(&cluster, "negative").await;
    assert_eq!(done["phase"], "Failed", "{done}");
    assert_eq!(done["reason"], "model_unavailable");
    assert_eq!(
        journal(
            &done,
            &[
                "model.dispatched",
                "model.failed",
                "limit.exceeded",
                "run.finished"
            ]
        ),
        [
            "model.dispatched@0",
            "model.failed@0",
            "limit.exceeded",
            "run.finished"
        ]
    );
    let lost = projected_input(&model.received()[0].body);
    let failed = &data_of(&done, "model.failed")[0];
    assert_eq!(failed["charged"], "projection", "{failed}");
    assert!(failed["unusableUsage"]
        .as_str()
        .is_some_and(|d| d.contains("negative")));
    assert_eq!(
        done["usage"],
        json!({
            "modelCalls": 1,
            "inputTokens": lost,
            "outputTokens": CAP,
            "estimatedCostMicros": cost(lost, 0, CAP),
        })
    );
    assert!(tools.calls().is_empty(), "the reply was not acted on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_limits_are_checked_before_each_attempt_against_totals_plus_the_projection() {
    let (cluster, tools) = setup().await;
    let step = || Reply::tool_call("lookup_order", json!({"order": 1042}), usage(900, 10, 0));
    let calls = ModelServer::start(vec![step()]).await;
    // After the first reply 4 800 tokens are recorded; the next projection adds its cap (200)
    // and at least one input token: over 5 000.
    let tokens = ModelServer::start(vec![Reply::tool_call(
        "lookup_order",
        json!({"order": 1042}),
        usage(4790, 10, 0),
    )])
    .await;
    // 12 500 input and 50 output tokens cost 1 905 micros; the next cap alone costs 120.
    let money = ModelServer::start(vec![Reply::tool_call(
        "lookup_order",
        json!({"order": 1042}),
        usage(12_500, 50, 0),
    )])
    .await;
    let uncapped = ModelServer::start(vec![step()]).await;
    let _controller = start_controller(&cluster, "c");
    start_run(&cluster, &tools, "calls", &calls.base_url(), |spec| {
        spec["limits"] = json!({"maxModelCalls": 1});
    })
    .await;
    start_run(&cluster, &tools, "tokens", &tokens.base_url(), |spec| {
        spec["limits"] = json!({"maxTotalTokens": 5000});
    })
    .await;
    start_run(&cluster, &tools, "money", &money.base_url(), |spec| {
        spec["limits"] = json!({"maxEstimatedCostMicros": 2000});
    })
    .await;
    start_run(&cluster, &tools, "uncapped", &uncapped.base_url(), |spec| {
        spec["limits"] = json!({"maxTotalTokens": 1_000_000});
        spec["agent"]["openai"]
            .as_object_mut()
            .expect("openai")
            .remove("maxOutputTokens");
    })
    .await;
    for (name, server, reason, limit, sent) in [
        ("calls", &calls, "limit_model_calls", "maxModelCalls", 1),
        ("tokens", &tokens, "limit_tokens", "maxTotalTokens", 1),
        ("money", &money, "limit_cost", "maxEstimatedCostMicros", 1),
        ("uncapped", &uncapped, "limit_tokens", "maxTotalTokens", 0),
    ] {
        let done = wait_done(&cluster, name).await;
        assert_eq!(done["phase"], "Failed", "{name}: {done}");
        assert_eq!(done["reason"], reason, "{name}: {done}");
        let exceeded = data_of(&done, "limit.exceeded");
        assert_eq!(exceeded.len(), 1, "{name}: {done}");
        assert_eq!(exceeded[0]["limit"], limit, "{name}: {done}");
        assert_eq!(
            server.received().len(),
            sent,
            "{name}: nothing more was sent"
        );
        assert_eq!(
            events_of(&done, "model.dispatched").len(),
            sent,
            "{name}: the refused attempt was never dispatched"
        );
        assert_seq_contiguous(&done);
    }
    assert_eq!(tools.calls().len(), 3, "each sent step ran its lookup");
}
