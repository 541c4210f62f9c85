//! Interrupted calls an http tool settles itself (issue 37 item 2, docs/design.md section 5 "a
//! tool that answers by key"; docs/behaviours.md 111-114), on both servers. A controller is
//! SIGKILLed around a `RemoteMutation` call of a real HTTP tool server of the tests' own (it
//! counts calls and effects per Idempotency-Key, honours keys, and answers `GET
//! /status/{key}` from what it did); a second controller takes the run over. Every case ends
//! without an Approval unless the status URL cannot tell, and no effect is ever performed twice.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

const WAIT: Duration = Duration::from_secs(60);

/// The tool server (its `work` tool working `work` per call, honouring keys) and a run of
/// `by-key` on it with `reconcile` and `timeout_seconds`; returns the server and the run's
/// Idempotency-Key for step 0 (`<uid>/0`).
async fn tool_and_run(
    cluster: &support::cluster::TestCluster,
    name: &str,
    reconcile: &str,
    timeout_seconds: u64,
    work: Duration,
) -> (ToolServer, String) {
    let tools = ToolServer::start().await;
    tools.set(
        "work",
        Behaviour {
            sleep: work,
            honor_keys: true,
            ..Behaviour::default()
        },
    );
    let run = RunFixture::new("by-key", &tools.base(), name)
        .set("RECONCILE", reconcile.replace("${TOOLS}", &tools.base()))
        .set("TIMEOUT", timeout_seconds)
        .create_in(cluster)
        .await;
    let key = format!("{}/0", run.metadata.uid.clone().expect("uid"));
    (tools, key)
}

/// [`tool_and_run`], the first controller killed at `fault`; returns the tool server, the key
/// and the controllers (the second, which takes over, keeps running).
async fn crashed(
    cluster: &support::cluster::TestCluster,
    name: &str,
    reconcile: &str,
    timeout_seconds: u64,
    work: Duration,
    fault: &str,
) -> (ToolServer, String, (ControllerProcess, ControllerProcess)) {
    let (tools, key) = tool_and_run(cluster, name, reconcile, timeout_seconds, work).await;
    let controllers = crash_then_take_over_in(cluster, fault, WAIT);
    (tools, key, controllers)
}

/// The `resent` of each `step.tool_started` of step 0, in order (`null` for a first send).
fn resent(status: &Value) -> Vec<Value> {
    events_of(status, "step.tool_started")
        .iter()
        .map(|e| e["data"]["resent"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn honored_keys_send_an_interrupted_call_again_and_the_effect_happens_once() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, (_first, second)) = crashed(
        &cluster,
        "honored",
        "{idempotencyKeys: Honored}",
        5,
        Duration::from_millis(3000),
        "during-tool",
    )
    .await;
    let status = cluster.wait_phase("honored", "Completed", WAIT).await;
    let calls = tools.calls_for(&key);
    assert_eq!(calls.len(), 2, "sent twice with one key: {calls:?}");
    assert_eq!(tools.effects(&key), 1, "the tool performed the effect once");
    // Sent again only once the first attempt could no longer be running (its start plus
    // timeoutSeconds), so the tool answered the first outcome rather than "in progress".
    assert!(
        calls[1].started >= calls[0].started + Duration::from_millis(4800),
        "re-sent {:?} after the first attempt:\n{}",
        calls[1].started - calls[0].started,
        second.log()
    );
    assert_eq!(
        resent(&status),
        [
            Value::Null,
            json!({"by": "idempotencyKeys", "idempotencyKeys": "Honored"})
        ]
    );
    assert_eq!(status["steps"][0]["status"], json!("done"), "{status}");
    assert_eq!(
        status["steps"][0]["observation"]["content"]["ok"],
        json!(true)
    );
    cluster.assert_no_approval("honored").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn honored_keys_send_a_call_that_never_left_once() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, _controllers) = crashed(
        &cluster,
        "unsent",
        "{idempotencyKeys: Honored}",
        5,
        Duration::ZERO,
        "after-tool-started",
    )
    .await;
    let status = cluster.wait_phase("unsent", "Completed", WAIT).await;
    assert_eq!(tools.calls_for(&key).len(), 1, "the first never left");
    assert_eq!(tools.effects(&key), 1);
    assert_eq!(resent(&status).len(), 2, "{status}");
    cluster.assert_no_approval("unsent").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_url_that_says_succeeded_settles_the_step_with_its_result() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, _controllers) = crashed(
        &cluster,
        "succeeded",
        "{statusURL: '${TOOLS}/status/{key}'}",
        5,
        Duration::from_millis(1000),
        "during-tool",
    )
    .await;
    let status = cluster.wait_phase("succeeded", "Completed", WAIT).await;
    assert_eq!(tools.calls_for(&key).len(), 1, "nothing was sent again");
    assert_eq!(tools.effects(&key), 1);
    assert!(
        tools.status_asked().contains(&key),
        "{:?}",
        tools.status_asked()
    );
    let finished = events_of(&status, "step.tool_finished");
    assert_eq!(finished.len(), 1, "{status}");
    assert_eq!(
        finished[0]["data"]["settledBy"]["state"],
        json!("succeeded")
    );
    assert_eq!(
        status["steps"][0]["observation"]["content"]["ok"],
        json!(true),
        "the first attempt's answer, as the status URL gave it: {status}"
    );
    cluster.assert_no_approval("succeeded").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_url_that_says_running_is_asked_again_until_it_succeeded() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    // The call works 8 s; the takeover comes after the 2-second lease, so the first questions
    // find it running.
    let (tools, key, _controllers) = crashed(
        &cluster,
        "running",
        "{statusURL: '${TOOLS}/status/{key}'}",
        12,
        Duration::from_secs(8),
        "during-tool",
    )
    .await;
    let status = cluster.wait_phase("running", "Completed", WAIT).await;
    let asked = tools.status_asked();
    assert!(asked.len() >= 2, "asked again while running: {asked:?}");
    assert_eq!(tools.calls_for(&key).len(), 1);
    assert_eq!(tools.effects(&key), 1);
    assert_eq!(
        events_of(&status, "step.tool_finished")[0]["data"]["settledBy"]["state"],
        json!("succeeded")
    );
    cluster.assert_no_approval("running").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_url_that_never_saw_the_call_has_it_sent_once() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    // Killed after recording the start, before sending: the tool never saw it (404).
    let (tools, key, _controllers) = crashed(
        &cluster,
        "notfound",
        "{statusURL: '${TOOLS}/status/{key}'}",
        5,
        Duration::ZERO,
        "after-tool-started",
    )
    .await;
    let status = cluster.wait_phase("notfound", "Completed", WAIT).await;
    assert_eq!(tools.calls_for(&key).len(), 1, "sent once, by the second");
    assert_eq!(tools.effects(&key), 1);
    assert_eq!(
        resent(&status),
        [Value::Null, json!({"by": "statusURL", "status": 404})]
    );
    cluster.assert_no_approval("notfound").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_url_that_says_failed_records_the_tool_error_and_the_agent_goes_on() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, _controllers) = crashed(
        &cluster,
        "failed",
        "{statusURL: '${TOOLS}/status/{key}'}",
        5,
        Duration::from_millis(500),
        "during-tool",
    )
    .await;
    tools.answer_status(
        200,
        json!({"state": "failed", "error": {"message": "card declined"}}),
    );
    let status = cluster.wait_phase("failed", "Completed", WAIT).await;
    let step = &status["steps"][0];
    assert_eq!(step["status"], json!("failed"), "{step}");
    assert_eq!(step["observation"]["kind"], json!("tool_error"), "{step}");
    assert_eq!(
        step["observation"]["content"],
        json!({"message": "card declined"})
    );
    assert_eq!(tools.calls_for(&key).len(), 1);
    cluster.assert_no_approval("failed").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_status_url_that_cannot_tell_pauses_on_the_approval_showing_what_it_said() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, _controllers) = crashed(
        &cluster,
        "unsure",
        "{statusURL: '${TOOLS}/status/{key}'}",
        5,
        Duration::from_millis(500),
        "during-tool",
    )
    .await;
    tools.answer_status(500, json!("the ledger is down"));
    let approval = cluster
        .wait_approval("unsure", "interrupted_side_effect", WAIT)
        .await;
    let shown = &approval.data["spec"]["presentation"]["statusURL"];
    assert_eq!(shown["said"]["status"], json!(500), "{shown}");
    assert_eq!(
        shown["said"]["body"],
        json!("\"the ledger is down\""),
        "{shown}"
    );
    assert_eq!(tools.calls_for(&key).len(), 1, "nothing was sent again");
}

/// [`tool_and_run`] (timeoutSeconds 5) with two deaths: the first controller killed at
/// `first`, the second (which takes over) at `second`; a third settles the run.
async fn crashed_twice(
    cluster: &support::cluster::TestCluster,
    name: &str,
    reconcile: &str,
    work: Duration,
    (first, second): (&str, &str),
) -> (ToolServer, String, Vec<ControllerProcess>) {
    let (tools, key) = tool_and_run(cluster, name, reconcile, 5, work).await;
    let one = crash_at(cluster.kubeconfig(), cluster.namespace(), first, WAIT);
    let two = crash_at(cluster.kubeconfig(), cluster.namespace(), second, WAIT);
    let three = start_controller(cluster, "third");
    (tools, key, vec![one, two, three])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_killed_between_the_status_answer_and_its_write_leaves_it_to_the_next() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let (tools, key, _controllers) = crashed_twice(
        &cluster,
        "answered",
        "{statusURL: '${TOOLS}/status/{key}'}",
        Duration::from_millis(500),
        ("during-tool", "after-status-answered"),
    )
    .await;
    let status = cluster.wait_phase("answered", "Completed", WAIT).await;
    assert!(
        tools.status_asked().len() >= 2,
        "asked by the second and again by the third: {:?}",
        tools.status_asked()
    );
    assert_eq!(tools.calls_for(&key).len(), 1, "nothing was sent again");
    assert_eq!(tools.effects(&key), 1);
    assert_eq!(events_of(&status, "step.tool_finished").len(), 1);
    assert_eq!(events_of(&status, "lease.taken_over").len(), 2, "{status}");
    cluster.assert_no_approval("answered").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resent_call_interrupted_again_is_resent_again_and_the_effect_still_happens_once() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    // The second holder dies right after recording its re-send (attempt 2), before it waited
    // out attempt 1 and sent: the third sends attempt 3, waiting out both bounds.
    let (tools, key, _controllers) = crashed_twice(
        &cluster,
        "twice",
        "{idempotencyKeys: Honored}",
        Duration::from_millis(1500),
        ("during-tool", "after-tool-started"),
    )
    .await;
    let status = cluster.wait_phase("twice", "Completed", WAIT).await;
    let calls = tools.calls_for(&key);
    assert_eq!(calls.len(), 2, "attempts 1 and 3 were sent: {calls:?}");
    assert_eq!(
        (calls[0].attempt.as_str(), calls[1].attempt.as_str()),
        ("1", "3")
    );
    assert_eq!(tools.effects(&key), 1, "performed once");
    assert!(
        calls[1].started >= calls[0].started + Duration::from_millis(4800),
        "the last send waited out the first attempt: {calls:?}"
    );
    assert_eq!(
        resent(&status)
            .iter()
            .filter(|r| r["by"] == "idempotencyKeys")
            .count(),
        2,
        "{status}"
    );
    cluster.assert_no_approval("twice").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_404_while_the_first_attempt_may_still_run_is_asked_again_after_it_and_never_overlaps() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    // A status URL that answers 404 even for a call it is working on (a lie, or one that learns
    // of calls late): the re-send still waits until the first attempt can no longer run.
    let (tools, key, (_first, second)) = crashed(
        &cluster,
        "late",
        "{statusURL: '${TOOLS}/status/{key}'}",
        5,
        Duration::from_millis(3000),
        "during-tool",
    )
    .await;
    tools.answer_status(404, json!({"error": "unknown key"}));
    let status = cluster.wait_phase("late", "Completed", WAIT).await;
    let calls = tools.calls_for(&key);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls[1].started >= calls[0].started + Duration::from_millis(4800),
        "the re-send came {:?} after the first attempt, which may run 5 s:\n{}",
        calls[1].started - calls[0].started,
        second.log()
    );
    assert!(
        tools.status_asked().len() >= 2,
        "asked again after the bound"
    );
    assert_eq!(
        resent(&status),
        [Value::Null, json!({"by": "statusURL", "status": 404})]
    );
}
