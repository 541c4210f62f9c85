//! The HTTP deciders end to end: a run decided by a webhook agent, and an interrupted
//! RemoteMutation settled by the consumer's reconcile hook (docs/design.md sections 5-6).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::controller::*;
use support::stub::{Answer, Stub};
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_decides_each_step() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let agent = Stub::json(|request| match request["step"].as_i64() {
        Some(0) => json!({"kind": "tool_call", "tool": "quick", "args": {"item": 7}}),
        _ => json!({"kind": "complete", "result": {"saw": request["steps"][0]["observation"]["content"]["args"]}}),
    })
    .await;
    let _controller = start_controller(&cluster, "c");
    RunFixture::new("webhook-agent", &tools.base(), "decided")
        .agent(&agent.url)
        .create_in(&cluster)
        .await;
    let done = cluster
        .wait_phase("decided", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(done["result"], json!({"saw": {"item": 7}}));
    assert_seq_contiguous(&done);
    let requests = agent.requests();
    assert_eq!(requests.len(), 2, "one request per step");
    assert_eq!(requests[0]["goal"], "Look one thing up, then finish.");
    assert_eq!(tools.calls().len(), 1);
}

/// docs/behaviours.md 66: a webhook agent that refuses connections, then answers 503 and 500,
/// then decides: the run completes, and the journal holds each failed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_that_refuses_then_fails_then_answers_is_asked_again() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let mut agent = Stub::down("/decide");
    let _controller = start_controller(&cluster, "c");
    // 30 s of asking, so the attempts after the agent comes up fit whatever the timing.
    let yaml = RunFixture::new("webhook-agent", &tools.base(), "blip")
        .agent(&agent.url)
        .yaml()
        .replace("timeoutSeconds: 5}", "timeoutSeconds: 30}");
    cluster.create_run(&yaml).await;
    // The agent comes up only once a refused attempt is on record.
    cluster
        .wait_status(
            "blip",
            Duration::from_secs(30),
            "a refused attempt in the journal",
            |s| !events_of(s, "agent.failed").is_empty(),
        )
        .await;
    let decide = |request: &Value| match request["step"].as_i64() {
        Some(0) => (
            200,
            json!({"kind": "tool_call", "tool": "quick", "args": {"item": 7}}),
        ),
        _ => (200, json!({"kind": "complete", "result": {"done": true}})),
    };
    agent
        .come_up(vec![
            Answer::Raw(503, "busy"),
            Answer::Raw(500, "oops"),
            Answer::By(std::sync::Arc::new(decide)),
        ])
        .await;
    let done = cluster
        .wait_phase("blip", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(done["result"], json!({"done": true}));
    assert_seq_contiguous(&done);
    let failed = events_of(&done, "agent.failed");
    assert!(failed.len() >= 3, "{failed:?}");
    assert!(failed.iter().all(|e| e["step"] == 0), "{failed:?}");
    let statuses: Vec<&Value> = failed.iter().map(|e| &e["data"]["status"]).collect();
    assert_eq!(
        statuses[0],
        &Value::Null,
        "the first was refused: {failed:?}"
    );
    assert_eq!(
        &statuses[statuses.len() - 2..],
        [&json!(503), &json!(500)],
        "{failed:?}"
    );
    let numbers: Vec<i64> = failed
        .iter()
        .map(|e| e["data"]["attempt"].as_i64().unwrap())
        .collect();
    assert_eq!(numbers, (1..=failed.len() as i64).collect::<Vec<_>>());
    assert_eq!(
        agent.requests().len(),
        4,
        "503, 500, the decision, the completion"
    );
    assert_eq!(tools.calls().len(), 1);
}

/// docs/behaviours.md 66: an agent that always answers 500 ends the run `agent_error` after
/// its timeoutSeconds (5 s in the fixture), each attempt in the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_that_always_fails_ends_agent_error_after_its_timeout() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let agent = Stub::start("/decide", vec![Answer::Raw(500, "down for good")]).await;
    let _controller = start_controller(&cluster, "c");
    RunFixture::new("webhook-agent", &tools.base(), "down")
        .agent(&agent.url)
        .create_in(&cluster)
        .await;
    let done = cluster
        .wait_phase("down", "Failed", Duration::from_secs(40))
        .await;
    assert_eq!(done["reason"], "agent_error");
    let detail = done["reasonDetail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("timeoutSeconds (5 s") && detail.contains("500"),
        "{detail}"
    );
    let failed = events_of(&done, "agent.failed");
    assert!(failed.len() >= 3, "{failed:?}");
    assert_eq!(
        failed.len(),
        agent.requests().len(),
        "one event per attempt"
    );
    assert!(
        detail.contains(&format!("{} attempts", failed.len())),
        "{detail}"
    );
    let started = done["startedAt"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    let finished = done["finishedAt"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap();
    let took = (finished - started).total(jiff::Unit::Second).unwrap();
    assert!((2.0..=6.0).contains(&took), "gave up after {took} s");
    assert!(tools.calls().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_hook_settles_an_interrupted_side_effect() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    tools.set("charge", Behaviour::sleeping(1500));
    let hook =
        Stub::json(|_| json!({"outcome": "completed", "result": {"charged": 12, "by": "hook"}}))
            .await;
    RunFixture::new("reconcile-hook", &tools.base(), "settled")
        .hook(&hook.url)
        .create_in(&cluster)
        .await;
    let _controllers = crash_then_take_over_in(&cluster, "during-tool", Duration::from_secs(30));
    let done = cluster
        .wait_phase("settled", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(done["result"], json!({"charged": 12, "by": "hook"}));
    assert_seq_contiguous(&done);
    assert!(!events_of(&done, "lease.taken_over").is_empty());
    let views = hook.requests();
    assert_eq!(views.len(), 1, "the hook was asked once");
    assert_eq!(views[0]["run"]["name"], "settled");
    assert_eq!(tools.calls().len(), 1, "the charge was not run again");
    assert!(
        cluster.approvals_of("settled").await.is_empty(),
        "no person was asked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_agent_sees_the_approvals_and_its_answer_is_recorded_verbatim_before_it_is_judged(
) {
    let cluster = agentrt_cluster().await;
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
    cluster
        .create_run(&serde_yaml::to_string(&run).unwrap())
        .await;

    let approval = cluster
        .wait_approval("judged", "policy", Duration::from_secs(30))
        .await;
    cluster.decide(&approval, "Approved").await;
    let done = cluster
        .wait_phase("judged", "Failed", Duration::from_secs(30))
        .await;
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
    // The third step's 500 was asked again until its timeoutSeconds (docs/behaviours.md 66),
    // each attempt in the journal.
    assert!(requests.len() > 3, "{}", requests.len());
    assert!(requests[2..].iter().all(|r| r["step"] == 2));
    assert_eq!(events_of(&done, "agent.failed").len(), requests.len() - 2);
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
