//! The HTTP deciders end to end: a run decided by a webhook agent, and an interrupted
//! RemoteMutation settled by the consumer's reconcile hook (DESIGN.md sections 5-6).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

/// An HTTP endpoint answering `answer(request)`, keeping every request it got.
async fn endpoint(answer: fn(&Value) -> Value) -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/",
        post(move |Json(request): Json<Value>| {
            let record = record.clone();
            async move {
                let reply = answer(&request);
                record.lock().unwrap().push(request);
                Json(reply)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_decides_each_step() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let (agent, requests) = endpoint(|request| match request["step"].as_i64() {
        Some(0) => json!({"kind": "tool_call", "tool": "quick", "args": {"item": 7}}),
        _ => json!({"kind": "complete", "result": {"saw": request["steps"][0]["observation"]["content"]["args"]}}),
    })
    .await;
    let _controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("c"));
    let yaml = fixture("webhook-agent", &tools.base(), "decided").replace("${AGENT}", &agent);
    create_run(&client, &ns, &yaml).await;
    let done = wait_phase(
        &client,
        &ns,
        "decided",
        "Completed",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(done["result"], json!({"saw": {"item": 7}}));
    assert_seq_contiguous(&done);
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "one request per step");
    assert_eq!(requests[0]["goal"], "Look one thing up, then finish.");
    assert_eq!(tools.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_hook_settles_an_interrupted_side_effect() {
    if !cfg!(feature = "fault-injection") {
        eprintln!("skipped: the crash points need `cargo test --features fault-injection`");
        return;
    }
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("charge", Behaviour::sleeping(1500));
    let (hook, views) =
        endpoint(|_| json!({"outcome": "completed", "result": {"charged": 12, "by": "hook"}}))
            .await;
    let yaml = fixture("reconcile-hook", &tools.base(), "settled").replace("${HOOK}", &hook);
    create_run(&client, &ns, &yaml).await;
    let mut first = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("first").fault("during-tool"),
    );
    assert!(
        first.was_killed(Duration::from_secs(30)),
        "the fault fired:\n{}",
        first.log()
    );
    let _second =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("second"));
    let done = wait_phase(
        &client,
        &ns,
        "settled",
        "Completed",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(done["result"], json!({"charged": 12, "by": "hook"}));
    assert_seq_contiguous(&done);
    assert!(!events_of(&done, "lease.taken_over").is_empty());
    let views = views.lock().unwrap().clone();
    assert_eq!(views.len(), 1, "the hook was asked once");
    assert_eq!(views[0]["run"]["name"], "settled");
    assert_eq!(tools.calls().len(), 1, "the charge was not run again");
    assert!(
        approvals(&client, &ns, "settled").await.is_empty(),
        "no person was asked"
    );
}

/// An agent endpoint whose answer depends on the step asked: `(status, body)`.
async fn agent_endpoint(answer: fn(&Value) -> (u16, Value)) -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new().route(
        "/",
        post(move |Json(request): Json<Value>| {
            let record = record.clone();
            async move {
                let (status, body) = answer(&request);
                record.lock().unwrap().push(request);
                (
                    axum::http::StatusCode::from_u16(status).unwrap(),
                    Json(body),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/"), seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_sees_the_approvals_and_its_answer_is_recorded_verbatim_before_it_is_judged(
) {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let (agent, requests) = agent_endpoint(|request| match request["step"].as_i64() {
        Some(0) => (
            200,
            json!({"kind": "tool_call", "tool": "quick", "args": {"item": 7}}),
        ),
        Some(1) => (
            200,
            json!({"kind": "tool_call", "tool": "guess", "args": {"x": 1}, "why": "a hunch"}),
        ),
        _ => (500, json!({"error": "the agent crashed"})),
    })
    .await;
    let _controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("c"));
    let yaml = fixture("webhook-agent", &tools.base(), "judged").replace("${AGENT}", &agent);
    let mut run: Value = serde_yaml::from_str(&yaml).unwrap();
    run["spec"]["policy"] = json!({"sideEffects": {"ReadOnly": "RequireApproval"}});
    create_run(&client, &ns, &serde_yaml::to_string(&run).unwrap()).await;

    let approval = wait_approval(&client, &ns, "judged", "policy", Duration::from_secs(30)).await;
    decide(&client, &ns, &approval, "Approved").await;
    let done = wait_phase(&client, &ns, "judged", "Failed", Duration::from_secs(30)).await;
    assert_eq!(done["reason"], "agent_error");
    assert!(
        done["reasonDetail"]
            .as_str()
            .is_some_and(|d| d.contains("500")),
        "{done}"
    );
    assert_eq!(step_statuses(&done), ["done", "failed", "failed"]);
    // Recorded verbatim, then judged: an unknown tool is an invalid decision.
    assert_eq!(
        done["steps"][1]["decision"],
        json!({"kind": "tool_call", "tool": "guess", "args": {"x": 1}, "why": "a hunch"})
    );
    assert_eq!(done["steps"][1]["observation"]["kind"], "invalid_decision");
    assert_seq_contiguous(&done);

    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["approvals"], json!([]));
    assert_eq!(
        requests[0]["tools"][0]["inputSchema"]["required"],
        json!(["item"])
    );
    let approvals = requests[1]["approvals"].as_array().expect("approvals");
    assert_eq!(approvals.len(), 1, "{}", requests[1]);
    assert_eq!(
        approvals[0]["name"],
        approval.metadata.name.clone().unwrap()
    );
    assert_eq!(approvals[0]["verdict"], "Approved");
    assert_eq!(approvals[0]["executed"], true);
    assert_eq!(requests[2]["steps"][1]["decision"]["why"], "a hunch");
    assert_eq!(tools.calls().len(), 1);
}
