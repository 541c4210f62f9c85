//! Split brain (DESIGN.md section 4; BEHAVIOURS.md 28-33): a replica whose clock is skewed, or
//! that is paused (SIGSTOP) past its lease and resumed (SIGCONT), starts no side effect after
//! another replica took the run over. The run record is the fence.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

fn seq_of(status: &Value, kind: &str) -> Vec<i64> {
    events_of(status, kind)
        .into_iter()
        .filter_map(|e| e["seq"].as_i64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_resumed_after_a_takeover_starts_no_side_effect() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("slow", Behaviour::sleeping(1500));
    let run = create_run(
        &client,
        &ns,
        &fixture("slow-then-fast", &tools.base(), "paused"),
    )
    .await;
    let uid = run.metadata.uid.clone().unwrap();

    let first = ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("first"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while tools.calls_for(&format!("{uid}/0")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the slow tool was not called:\n{}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.signal(libc::SIGSTOP);
    // Past its 2-second lease; meanwhile the slow call answers into the stopped process.
    let second =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("second"));
    let taken = wait_status(
        &client,
        &ns,
        "paused",
        Duration::from_secs(30),
        "a takeover",
        |s| !events_of(s, "lease.taken_over").is_empty(),
    )
    .await;
    assert_eq!(
        taken["lease"]["holder"]
            .as_str()
            .map(|h| h.starts_with("second")),
        Some(true)
    );
    first.signal(libc::SIGCONT);
    // The deposed holder now sees its call's answer; give it time to (not) act on it, then stop
    // it, so what follows is the new holder's alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut first = first;
    first.signal(libc::SIGKILL);
    assert!(first.was_killed(Duration::from_secs(5)));

    // The interrupted RemoteMutation waits for a person; approve, and the run finishes.
    let approval = wait_approval(
        &client,
        &ns,
        "paused",
        "interrupted_side_effect",
        Duration::from_secs(30),
    )
    .await;
    decide(&client, &ns, &approval, "Approved").await;
    let done = wait_phase(&client, &ns, "paused", "Completed", Duration::from_secs(30)).await;
    assert_seq_contiguous(&done);

    let first_calls: Vec<_> = tools
        .calls()
        .into_iter()
        .filter(|c| c.holder.starts_with("first"))
        .collect();
    assert_eq!(
        first_calls.len(),
        1,
        "the paused holder made only its one call: {first_calls:?}"
    );
    assert!(
        tools
            .calls_for(&format!("{uid}/1"))
            .iter()
            .all(|c| c.holder.starts_with("second")),
        "the second step was started by the new holder only"
    );
    let slow_calls = tools.calls_for(&format!("{uid}/0"));
    assert_eq!(
        slow_calls.len(),
        2,
        "the first step ran again only after its approval"
    );
    assert!(slow_calls[1].holder.starts_with("second"));
    // The deposed holder's outcome was not recorded as the step's outcome.
    let finished = events_of(&done, "step.tool_finished");
    assert!(
        finished.iter().filter(|e| e["step"] == 0).count() <= 1,
        "{finished:?}"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_with_a_skewed_clock_starts_no_side_effect_after_a_takeover() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("step", Behaviour::sleeping(400));
    // The skewed replica's clock runs 5 s behind: the renewals it writes look expired to a
    // replica with the right time, which takes the run over while the skewed one still runs it.
    let skewed = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec {
            prefix: "skewed".into(),
            clock_offset_ms: -5000,
            ..ControllerSpec::default()
        },
    );
    let run = create_run(&client, &ns, &fixture("many-steps", &tools.base(), "skew")).await;
    let uid = run.metadata.uid.clone().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tools.calls_for(&format!("{uid}/0")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no first call:\n{}",
            skewed.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let right = ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("right"));
    let done = wait_phase(&client, &ns, "skew", "Completed", Duration::from_secs(60)).await;
    assert_seq_contiguous(&done);
    let takeovers = seq_of(&done, "lease.taken_over");
    assert!(
        !takeovers.is_empty(),
        "the right replica took the run over: {done}"
    );

    // Every call by the skewed replica is of a step whose start it recorded before the first
    // takeover; no call of any step exceeds its recorded starts.
    let first_takeover = takeovers[0];
    for call in tools.calls() {
        let step: i64 = call.key.rsplit('/').next().unwrap().parse().unwrap();
        let starts: Vec<i64> = events_of(&done, "step.tool_started")
            .into_iter()
            .filter(|e| e["step"] == step)
            .filter_map(|e| e["seq"].as_i64())
            .collect();
        assert!(
            tools.calls_for(&call.key).len() <= starts.len(),
            "step {step}: more calls than recorded starts"
        );
        if call.holder.starts_with("skewed") {
            assert!(
                starts.iter().any(|seq| *seq < first_takeover),
                "the skewed replica called step {step} after the takeover (seq {first_takeover}): {done}"
            );
        }
    }
    drop((skewed, right));
}
