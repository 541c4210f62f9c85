//! Split brain (docs/design.md section 4; docs/behaviours.md 28-33): a replica that is paused (SIGSTOP)
//! past its lease and resumed (SIGCONT) starts no side effect after another replica took the
//! run over. The run record is the fence. (A skewed clock no longer causes a takeover at all:
//! `tests/controller_clock_skew.rs`.)

mod support;

use std::time::Duration;

use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_resumed_after_a_takeover_starts_no_side_effect() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    tools.set("slow", Behaviour::sleeping(1500));
    let run = cluster
        .create_run(&fixture("slow-then-fast", &tools.base(), "paused"))
        .await;
    let uid = run.metadata.uid.clone().unwrap();

    let first = start_sealing_controller(&cluster, "first");
    tools
        .wait_for_call(&format!("{uid}/0"), Duration::from_secs(30), || first.log())
        .await;
    first.signal(libc::SIGSTOP);
    // Past its 2-second lease; meanwhile the slow call answers into the stopped process.
    let second = start_sealing_controller(&cluster, "second");
    let taken = cluster
        .wait_status("paused", Duration::from_secs(30), "a takeover", |s| {
            !events_of(s, "lease.taken_over").is_empty()
        })
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
    let approval = cluster
        .wait_approval("paused", "interrupted_side_effect", Duration::from_secs(30))
        .await;
    cluster.decide(&approval, "Approved").await;
    let done = cluster
        .wait_phase("paused", "Completed", Duration::from_secs(30))
        .await;
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
