//! The controller's metrics (`--metrics-addr`) after a crash: a replica is SIGKILLed during a
//! tool call, another takes the run over and finishes it; its `/metrics` counts the takeover,
//! the interruption (by the status it found), the steps, the tool calls' durations and the run
//! that finished, and shows the gauges read from the watches (runs by phase, Approvals pending
//! by kind and namespace) and the series that read zero until something goes wrong (conflicts, failed
//! renewals). `/healthz` and `/readyz` answer.

mod support;

use std::time::{Duration, Instant};

use support::controller::*;
use support::free_port;
use support::metrics::{get, sample};
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_takeover_after_a_crash() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("step", Behaviour::sleeping(700));
    let run = cluster
        .create_run(&fixture("many-steps", &tools.base(), "counted"))
        .await;
    let uid = run.metadata.uid.clone().expect("uid");
    let mut first = start_controller(&cluster, "first");
    tools
        .wait_for_call(&format!("{uid}/1"), Duration::from_secs(30), || first.log())
        .await;
    first.signal(libc::SIGKILL);
    assert!(first.was_killed(Duration::from_secs(5)));

    let port = free_port();
    let second = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("second").metrics_on(port),
    );
    let done = cluster
        .wait_phase("counted", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(events_of(&done, "lease.taken_over").len(), 1, "{done}");
    let waiting = cluster
        .create_run(&fixture("needs-approval", &tools.base(), "waiting"))
        .await;
    assert!(waiting.metadata.uid.is_some());
    cluster
        .wait_phase("waiting", "WaitingForApproval", Duration::from_secs(30))
        .await;

    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(get(&format!("{base}/healthz")).await.0, 200);
    assert_eq!(get(&format!("{base}/readyz")).await.0, 200);
    // The gauges are read from the watch, which may trail the write just seen by a moment.
    let pending = format!("agentrt_approvals_pending{{kind=\"policy\",namespace=\"{ns}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (status, text) = get(&format!("{base}/metrics")).await;
        assert_eq!(status, 200);
        if sample(&text, &pending) == Some(1.0) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |series: &str| {
        sample(&text, series)
            .unwrap_or_else(|| panic!("{series} missing:\n{text}\n{}", second.log()))
    };
    // The crash: one takeover, one step interrupted while its tool was executing.
    assert_eq!(value("agentrt_takeovers_total"), 1.0);
    assert_eq!(
        value("agentrt_interruptions_total{previous=\"executing\"}"),
        1.0
    );
    assert_eq!(value("agentrt_steps_total{outcome=\"interrupted\"}"), 1.0);
    // The second replica finished the remaining tool steps (and the completing one).
    let done_steps = value("agentrt_steps_total{outcome=\"done\"}");
    assert!((5.0..=7.0).contains(&done_steps), "{done_steps} steps done");
    assert_eq!(
        value("agentrt_runs_finished_total{phase=\"Completed\",reason=\"goal_completed\"}"),
        1.0
    );
    // Every tool call of the second replica took the tool's 700 ms, give or take.
    let calls = value("agentrt_tool_call_duration_seconds_count{tool=\"step\"}");
    let seconds = value("agentrt_tool_call_duration_seconds_sum{tool=\"step\"}");
    assert!(calls >= 4.0, "{calls} tool calls");
    assert!(seconds >= 0.6 * calls, "{seconds} s over {calls} calls");
    assert_eq!(value("agentrt_tool_calls_total{outcome=\"result\"}"), calls);
    // Gauges from the watched runs.
    assert_eq!(value("agentrt_runs{phase=\"Completed\"}"), 1.0);
    assert_eq!(value("agentrt_runs{phase=\"WaitingForApproval\"}"), 1.0);
    assert_eq!(value(&pending), 1.0);
    // Writes, leases, reconciles.
    assert!(value("agentrt_status_writes_total{outcome=\"ok\"}") >= 6.0);
    assert!(value("agentrt_status_writes_total{outcome=\"conflict\"}") >= 0.0);
    assert!(value("agentrt_leases_acquired_total") >= 2.0);
    assert_eq!(value("agentrt_lease_renew_failures_total"), 0.0);
    assert!(value("agentrt_reconcile_duration_seconds_count") >= 1.0);
    // No model: nothing charged.
    assert_eq!(
        value("agentrt_model_tokens_total{direction=\"input\"}"),
        0.0
    );
    assert_eq!(value("agentrt_model_cost_micros_total"), 0.0);
}
