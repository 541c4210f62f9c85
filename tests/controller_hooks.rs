//! The HTTP deciders end to end: a run decided by a webhook agent, and an interrupted
//! RemoteMutation settled by the consumer's reconcile hook (docs/design.md sections 5-6).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::controller::*;
use support::stub::Stub;
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_decides_each_step() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let agent = Stub::json(|request| match request["step"].as_i64() {
        Some(0) => json!({"kind": "tool_call", "tool": "quick", "args": {"item": 7}}),
        _ => json!({"kind": "complete", "result": {"saw": request["steps"][0]["observation"]["content"]["args"]}}),
    })
    .await;
    let _controller = start_controller(&cluster, "c");
    RunFixture::new("webhook-agent", &tools.base(), "decided")
        .agent(&agent.url)
        .create(&client, &ns)
        .await;
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
    let requests = agent.requests();
    assert_eq!(requests.len(), 2, "one request per step");
    assert_eq!(requests[0]["goal"], "Look one thing up, then finish.");
    assert_eq!(tools.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_hook_settles_an_interrupted_side_effect() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("charge", Behaviour::sleeping(1500));
    let hook =
        Stub::json(|_| json!({"outcome": "completed", "result": {"charged": 12, "by": "hook"}}))
            .await;
    RunFixture::new("reconcile-hook", &tools.base(), "settled")
        .hook(&hook.url)
        .create(&client, &ns)
        .await;
    let _controllers = crash_then_take_over(
        cluster.kubeconfig(),
        &ns,
        "during-tool",
        Duration::from_secs(30),
    );
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
    let views = hook.requests();
    assert_eq!(views.len(), 1, "the hook was asked once");
    assert_eq!(views[0]["run"]["name"], "settled");
    assert_eq!(tools.calls().len(), 1, "the charge was not run again");
    assert!(
        approvals(&client, &ns, "settled").await.is_empty(),
        "no person was asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_sees_the_approvals_and_its_answer_is_recorded_verbatim_before_it_is_judged(
) {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let agent = Stub::with_status(|request| match request["step"].as_i64() {
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
    let _controller = start_controller(&cluster, "c");
    let yaml = RunFixture::new("webhook-agent", &tools.base(), "judged")
        .agent(&agent.url)
        .yaml();
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

    let requests = agent.requests();
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
