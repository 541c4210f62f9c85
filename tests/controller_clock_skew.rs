//! Clock skew (docs/design.md section 4; docs/behaviours.md 30-31; issue 16): a replica judges another
//! holder's Lease expired only once it has seen it unchanged (same holder, renewTime and
//! resourceVersion) for `leaseDurationSeconds` plus its margin, on its own monotonic clock. Wall
//! clocks of different replicas are never compared, so a replica whose clock runs three lease
//! durations ahead or behind takes over no run whose holder renews, and still takes a run over
//! within `leaseDurationSeconds` + 2 s of its holder's SIGKILL.
//!
//! Each scenario: a holder starts two runs of `long-call` (2-second lease), one whose call sleeps
//! 8 s (twelve renewals) and one whose call never answers. A replica with the other clock starts
//! while both calls run. The first run completes under its holder with one call; then the
//! holder is killed, and the other replica takes the second run over.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

/// The fixture's `leaseDurationSeconds`, in milliseconds.
const LEASE_MILLIS: i64 = 2_000;

fn takeovers(status: &Value) -> Vec<&Value> {
    events_of(status, "lease.taken_over")
}

fn holder_of(status: &Value) -> String {
    status["lease"]["holder"].as_str().unwrap_or("").to_string()
}

/// The scenario, with the holder's clock shifted by `holder_offset_ms` and the other replica's
/// by `other_offset_ms`.
async fn a_renewed_lease_survives_a_skewed_replica(holder_offset_ms: i64, other_offset_ms: i64) {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("renewed", Behaviour::sleeping(8_000));
    tools.set("killed", Behaviour::hanging());

    let mut holder = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec {
            prefix: "holder".into(),
            clock_offset_ms: holder_offset_ms,
            ..ControllerSpec::default()
        },
    );
    let mut uids = Vec::new();
    for name in ["renewed", "killed"] {
        let run = cluster
            .create_run(&fixture("long-call", &tools.base(), name))
            .await;
        uids.push(run.metadata.uid.clone().unwrap());
    }
    let keys: Vec<String> = uids.iter().map(|uid| format!("{uid}/0")).collect();
    for key in &keys {
        tools
            .wait_for_call(key, Duration::from_secs(30), || holder.log())
            .await;
    }
    let other = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec {
            prefix: "skewed".into(),
            clock_offset_ms: other_offset_ms,
            ..ControllerSpec::default()
        },
    );

    // While the holder renews, nothing is taken over and nothing runs twice.
    let done = cluster
        .wait_status(
            "renewed",
            Duration::from_secs(30),
            "the end of the call",
            |s| s["phase"] != "Running",
        )
        .await;
    assert_eq!(
        takeovers(&done),
        Vec::<&Value>::new(),
        "no takeover of a renewed lease:\n{}",
        other.log()
    );
    assert_eq!(done["phase"], "Completed", "{done}");
    assert_seq_contiguous(&done);
    assert!(holder_of(&done).starts_with("holder"), "{done}");
    assert_eq!(events_of(&done, "step.tool_started").len(), 1);
    let renewed_calls = tools.calls_for(&keys[0]);
    assert_eq!(renewed_calls.len(), 1, "{renewed_calls:?}");
    assert!(renewed_calls[0].holder.starts_with("holder"));
    let hanging = cluster.run_status("killed").await;
    assert_eq!(takeovers(&hanging), Vec::<&Value>::new(), "{hanging}");
    assert!(holder_of(&hanging).starts_with("holder"), "{hanging}");
    assert!(cluster.approvals_of("renewed").await.is_empty());

    // The holder dies: the other replica takes its run over within the lease and 2 s.
    holder.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    assert!(holder.was_killed(Duration::from_secs(5)));
    let bound = Duration::from_millis(u64::try_from(LEASE_MILLIS).unwrap() + 2_000);
    let taken = cluster
        .wait_status(
            "killed",
            bound + Duration::from_secs(10),
            "a takeover",
            |s| !takeovers(s).is_empty(),
        )
        .await;
    let latency = killed_at.elapsed();
    println!("takeover {latency:?} after the holder's SIGKILL");
    assert!(
        latency <= bound,
        "taken over {latency:?} after the SIGKILL, over {bound:?}:\n{}",
        other.log()
    );
    let taken_over = takeovers(&taken);
    assert_eq!(taken_over.len(), 1, "{taken}");
    assert!(holder_of(&taken).starts_with("skewed"), "{taken}");
    let previous = taken_over[0]["data"]["previousHolder"]
        .as_str()
        .unwrap_or("");
    assert!(previous.starts_with("holder"), "{taken}");

    // The interrupted call waits for a person; no call ran beyond the first of each step.
    cluster
        .wait_approval("killed", "interrupted_side_effect", Duration::from_secs(15))
        .await;
    assert_eq!(tools.calls_for(&keys[1]).len(), 1);
    assert_eq!(tools.calls().len(), 2, "{:?}", tools.calls());
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_three_leases_ahead_takes_no_renewed_lease() {
    a_renewed_lease_survives_a_skewed_replica(0, 3 * LEASE_MILLIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_three_leases_behind_still_takes_a_dead_holders_lease() {
    a_renewed_lease_survives_a_skewed_replica(0, -3 * LEASE_MILLIS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_clock_runs_three_leases_behind_keeps_its_renewed_lease() {
    a_renewed_lease_survives_a_skewed_replica(-3 * LEASE_MILLIS, 0).await;
}
