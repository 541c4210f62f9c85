//! The crash matrix (docs/design.md section 9): for each fault point and each side-effect class, a
//! controller child process (built with `--features fault-injection`) kills itself at the point,
//! another one with another holder id takes the run over after its 2-second lease expires, and
//! the record and the tool's call counts are checked: never more calls than recorded starts,
//! never a second call without an approved Approval, every interruption recorded.
//!
//! One test per side-effect class runs its seven cells concurrently, each in its own namespace
//! with its own controllers.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

const POINTS: [&str; 7] = [
    "after-step-started",
    "after-decided",
    "after-tool-started",
    "during-tool",
    "after-tool-returned",
    "after-interrupted",
    "after-resumed",
];

/// The faults each controller of a cell carries, in start order: the point itself, or, for the
/// points only a takeover reaches, `during-tool` first.
fn faults_for(point: &str) -> Vec<&'static str> {
    match point {
        "after-interrupted" => vec!["during-tool", "after-interrupted"],
        "after-resumed" => vec!["during-tool", "after-resumed"],
        other => vec![POINTS.into_iter().find(|p| *p == other).expect("a point")],
    }
}

struct Outcome {
    status: Value,
    approvals: Vec<kube::api::DynamicObject>,
    killed: usize,
}

/// Runs one cell to a terminal phase: starts controllers in turn (each with its fault, then
/// clean ones), approves whatever Approval waits, and returns the record.
async fn run_cell(
    cluster: &support::cluster::TestCluster,
    tools: &ToolServer,
    class: &str,
    point: &str,
    index: usize,
) -> Outcome {
    let client = cluster.client();
    let ns = format!("{}-{}", cluster.namespace(), index);
    create_namespace(&client, &ns).await;
    let name = "crash";
    let yaml = RunFixture::new("one-tool", &tools.base(), name)
        .class(class)
        .yaml();
    create_run(&client, &ns, &yaml).await;

    let mut faults: Vec<&str> = faults_for(point);
    faults.reverse();
    let mut started = 0usize;
    let start_next = |faults: &mut Vec<&str>, started: &mut usize| {
        *started += 1;
        let mut spec = ControllerSpec::named(&format!("c{started}")).sealing();
        if let Some(fault) = faults.pop() {
            spec = spec.fault(fault);
        }
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, spec)
    };
    let mut current_has_fault = !faults.is_empty();
    let mut current = start_next(&mut faults, &mut started);
    let mut killed = 0usize;
    let mut decided = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = status(&client, &ns, name).await;
        let phase = status["phase"].as_str().unwrap_or("");
        if matches!(phase, "Completed" | "Failed" | "Cancelled") && faults.is_empty() {
            // A fault may fire on the very write that ended the run.
            if current_has_fault && current.was_killed(Duration::from_secs(3)) {
                killed += 1;
            }
            let approvals = approvals(&client, &ns, name).await;
            return Outcome {
                status,
                approvals,
                killed,
            };
        }
        if current.was_killed(Duration::from_millis(1)) {
            killed += 1;
            current_has_fault = !faults.is_empty();
            current = start_next(&mut faults, &mut started);
        }
        for approval in approvals(&client, &ns, name).await {
            let approval_name = approval.metadata.name.clone().unwrap_or_default();
            if approval.data["spec"].get("decision").is_none() && decided.insert(approval_name) {
                decide(&client, &ns, &approval, "Approved").await;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{class}/{point}: no terminal phase within 120 s; status: {status}\nlast controller log:\n{}",
            current.log()
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

fn check_cell(class: &str, point: &str, uid: &str, tools: &ToolServer, outcome: &Outcome) {
    let status = &outcome.status;
    let label = format!("{class}/{point}");
    assert_eq!(
        outcome.killed,
        faults_for(point).len(),
        "{label}: every planned fault fired"
    );
    assert_eq!(status["phase"], "Completed", "{label}: {status}");
    assert_seq_contiguous(status);
    let key = format!("{uid}/0");
    let calls = tools.calls_for(&key);
    let starts = events_of(status, "step.tool_started")
        .into_iter()
        .filter(|e| e["step"] == 0)
        .count();
    assert!(
        calls.len() <= starts,
        "{label}: {} calls of step 0 but {starts} recorded starts",
        calls.len()
    );
    // Every interruption is recorded: killed during or after a start → a takeover names the
    // previous holder, and the step is marked interrupted.
    let takeovers = events_of(status, "lease.taken_over");
    let interrupted = events_of(status, "step.interrupted");
    if point != "after-tool-returned" {
        assert!(
            !takeovers.is_empty(),
            "{label}: no lease.taken_over: {status}"
        );
        assert!(
            !interrupted.is_empty(),
            "{label}: no step.interrupted: {status}"
        );
        assert!(
            takeovers.iter().all(|t| t["data"]["previousHolder"]
                .as_str()
                .is_some_and(|h| h.starts_with('c'))),
            "{label}: a takeover names its previous holder: {takeovers:?}"
        );
    }
    let approved_reruns = outcome
        .approvals
        .iter()
        .filter(|a| {
            a.data["spec"]["kind"] == "interrupted_side_effect"
                && a.data["spec"]["decision"]["verdict"] == "Approved"
        })
        .count();
    if class == "ReadOnly" {
        assert!(
            outcome.approvals.is_empty(),
            "{label}: a ReadOnly step never pauses for a person"
        );
    } else {
        // Never a second call without an approved Approval.
        assert!(
            calls.len() <= 1 + approved_reruns,
            "{label}: {} calls with {approved_reruns} approved re-runs",
            calls.len()
        );
        for call in calls.iter().skip(1) {
            assert_ne!(call.attempt, "1", "{label}: a second call reused attempt 1");
        }
        if matches!(
            point,
            "after-step-started" | "after-decided" | "after-tool-started" | "during-tool"
        ) {
            assert!(
                outcome.approvals.iter().any(|a| a.data["spec"]["kind"] == "interrupted_side_effect"),
                "{label}: an interrupted non-ReadOnly step pauses on an interrupted_side_effect Approval"
            );
            let step0 = &status["steps"][0];
            assert!(
                step0["approvals"].as_array().is_some_and(|a| !a.is_empty()),
                "{label}: the record names the step's approvals: {step0}"
            );
        }
    }
    if point == "after-tool-returned" {
        assert_eq!(
            calls.len(),
            1,
            "{label}: a recorded outcome is never run again"
        );
    }
    if point == "during-tool" && class == "ReadOnly" {
        assert_eq!(
            calls.len(),
            1,
            "{label}: the agent moves on after an interrupted ReadOnly step"
        );
    }
}

async fn crash_matrix_for(class: &'static str) {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    tools.set("work", Behaviour::sleeping(1500));
    let cells = POINTS.iter().enumerate().map(|(index, point)| {
        let cluster = &cluster;
        let tools = &tools;
        async move {
            let outcome = run_cell(cluster, tools, class, point, index).await;
            (point, index, outcome)
        }
    });
    let outcomes = futures::future::join_all(cells).await;
    for (point, index, outcome) in outcomes {
        let ns = format!("{}-{}", cluster.namespace(), index);
        let run = runs_api(&cluster.client(), &ns)
            .get("crash")
            .await
            .expect("run");
        let uid = run.metadata.uid.clone().expect("uid");
        check_cell(class, point, &uid, &tools, &outcome);
    }
    if !cluster.is_embedded() {
        for index in 0..POINTS.len() {
            let ns = format!("{}-{}", cluster.namespace(), index);
            let _ = cluster.kubectl(&["delete", "namespace", &ns, "--wait=false"]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_points_never_repeat_a_read_only_step_beyond_its_starts() {
    crash_matrix_for("ReadOnly").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_points_never_repeat_a_local_mutation_without_an_approval() {
    crash_matrix_for("LocalMutation").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_points_never_repeat_a_remote_mutation_without_an_approval() {
    crash_matrix_for("RemoteMutation").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_points_never_repeat_a_destructive_step_without_an_approval() {
    crash_matrix_for("Destructive").await;
}
