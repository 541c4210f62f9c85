//! An interrupted call settled by a person (issue 34 item 4, docs/design.md section 5), on both
//! servers: a controller is SIGKILLed while a `RemoteMutation` call is in flight
//! (`AGENTRT_FAULT=during-tool`), a second one takes the run over and pauses on an
//! `interrupted_side_effect` Approval, and a person decides it at once:
//! - `Approved`: the re-run waits until the first attempt can no longer be running (its start
//!   plus the tool's `timeoutSeconds`), so the tool server never sees two attempts of the step
//!   at once, and it carries the same Idempotency-Key;
//! - `TookEffect` with a result: nothing runs again, the result is the step's outcome;
//! - `DidNotTakeEffect`: nothing runs again, the agent sees the step not executed and goes on.

mod support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

const WAIT: Duration = Duration::from_secs(60);
/// How long the tool works on each call: close to the fixture's `timeoutSeconds` (5), so an
/// early re-run would overlap it.
const WORK: Duration = Duration::from_millis(4500);

/// A run of `one-tool` (a `RemoteMutation` tool `work`, timeoutSeconds 5, lease 2 s) whose first
/// call is interrupted by a crash; returns the interrupted call's Approval, the tool server and
/// the controllers (the second keeps running).
async fn interrupted(
    cluster: &support::cluster::TestCluster,
    name: &str,
) -> (
    kube::api::DynamicObject,
    ToolServer,
    (ControllerProcess, ControllerProcess),
) {
    let tools = ToolServer::start().await;
    tools.set(
        "work",
        Behaviour {
            sleep: WORK,
            ..Behaviour::default()
        },
    );
    RunFixture::new("one-tool", &tools.base(), name)
        .class("RemoteMutation")
        .create_in(cluster)
        .await;
    let controllers = crash_then_take_over_in(cluster, "during-tool", WAIT);
    let approval = cluster
        .wait_approval(name, "interrupted_side_effect", WAIT)
        .await;
    (approval, tools, controllers)
}

/// Patches `approval`'s decision (`verdict`, its own hash, `result` when given).
async fn settle(
    cluster: &support::cluster::TestCluster,
    approval: &kube::api::DynamicObject,
    verdict: &str,
    result: Option<Value>,
) {
    let name = approval.metadata.name.clone().expect("name");
    let mut decision = json!({
        "verdict": verdict,
        "hash": approval.data["spec"]["hash"],
        "approver": "test",
    });
    if let Some(result) = result {
        decision["result"] = result;
    }
    approvals_api(&cluster.client(), cluster.namespace())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"decision": decision}})),
        )
        .await
        .expect("the decision is accepted");
}

/// The phase of `approval` as stored now; panics when it cannot be read.
async fn approval_phase(
    cluster: &support::cluster::TestCluster,
    approval: &kube::api::DynamicObject,
) -> Value {
    approvals_api(&cluster.client(), cluster.namespace())
        .get(approval.metadata.name.as_deref().unwrap())
        .await
        .expect("get approval")
        .data["status"]["phase"]
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_call_approved_at_once_is_sent_again_only_after_the_first_attempt_could_run()
{
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let (approval, tools, (_first, second)) = interrupted(&cluster, "early").await;
    // The Approval says when the first attempt started, until when it may run, and the key.
    let first_attempt = &approval.data["spec"]["presentation"]["firstAttempt"];
    let calls = tools.calls_of_run(&format!("{ns}/early"));
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(first_attempt["idempotencyKey"], json!(calls[0].key));
    assert_eq!(first_attempt["attempt"], json!(1));
    let started: agentrt::api::Time =
        serde_json::from_value(first_attempt["startedAt"].clone()).expect("startedAt");
    let until: agentrt::api::Time =
        serde_json::from_value(first_attempt["mayRunUntil"].clone()).expect("mayRunUntil");
    assert!(
        until.as_millis() - started.as_millis() >= 5_000,
        "mayRunUntil is at least startedAt + timeoutSeconds: {first_attempt}"
    );
    // Approved as soon as it appears.
    cluster.decide(&approval, "Approved").await;
    let status = cluster.wait_phase("early", "Completed", WAIT).await;
    let calls = tools.calls_of_run(&format!("{ns}/early"));
    assert_eq!(calls.len(), 2, "exactly two attempts: {calls:?}");
    let (one, two) = (&calls[0], &calls[1]);
    assert_eq!(
        one.key, two.key,
        "the re-run sends the same Idempotency-Key"
    );
    assert_eq!((one.attempt.as_str(), two.attempt.as_str()), ("1", "2"));
    // The first attempt works for WORK whether or not its caller is alive; the second starts
    // only after it could no longer be running (start + timeoutSeconds, a few milliseconds
    // of recording ahead of the server's arrival).
    assert!(
        two.started >= one.started + WORK,
        "the re-run started {:?} after the first attempt, which works for {WORK:?}:\n{}",
        two.started - one.started,
        second.log()
    );
    assert!(
        two.started >= one.started + Duration::from_millis(4800),
        "the re-run waited out timeoutSeconds (5 s): {:?}",
        two.started - one.started
    );
    let types = event_types(&status);
    assert!(types.contains(&"step.interrupted".to_string()), "{types:?}");
    assert_eq!(approval_phase(&cluster, &approval).await, json!("Executed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_call_settled_took_effect_records_the_given_result_and_runs_nothing_again() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let (approval, tools, _controllers) = interrupted(&cluster, "took").await;
    settle(
        &cluster,
        &approval,
        "TookEffect",
        Some(json!({"ticket": "closed", "by": "hand"})),
    )
    .await;
    let status = cluster.wait_phase("took", "Completed", WAIT).await;
    let step = &status["steps"][0];
    assert_eq!(step["status"], json!("done"), "{step}");
    assert_eq!(
        step["observation"]["content"],
        json!({"ticket": "closed", "by": "hand"}),
        "{step}"
    );
    let finished = events_of(&status, "step.tool_finished");
    assert_eq!(finished.len(), 1, "{status}");
    assert_eq!(
        finished[0]["data"]["settledBy"]["verdict"],
        json!("TookEffect")
    );
    assert_eq!(finished[0]["data"]["settledBy"]["approver"], json!("test"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tools.calls_of_run(&format!("{ns}/took")).len(),
        1,
        "nothing ran again"
    );
    assert_eq!(approval_phase(&cluster, &approval).await, json!("Settled"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_call_settled_did_not_take_effect_runs_nothing_and_the_agent_goes_on() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let (approval, tools, _controllers) = interrupted(&cluster, "skipped").await;
    settle(&cluster, &approval, "DidNotTakeEffect", None).await;
    // The scripted agent's next decision completes the run.
    let status = cluster.wait_phase("skipped", "Completed", WAIT).await;
    let step = &status["steps"][0];
    assert_eq!(step["status"], json!("interrupted"), "{step}");
    assert_eq!(
        step["observation"]["content"]["executed"],
        json!(false),
        "{step}"
    );
    assert_eq!(
        step["observation"]["content"]["settledBy"]["verdict"],
        json!("DidNotTakeEffect")
    );
    assert!(
        status["steps"].as_array().is_some_and(|s| s.len() == 2),
        "{status}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        tools.calls_of_run(&format!("{ns}/skipped")).len(),
        1,
        "nothing ran again"
    );
    assert_eq!(approval_phase(&cluster, &approval).await, json!("Settled"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_settle_verdict_on_an_approval_of_another_kind_is_refused_by_the_schema() {
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "kinds");
    RunFixture::new("needs-approval", &tools.base(), "asks")
        .create_in(&cluster)
        .await;
    let approval = cluster.approvals_of("asks").await;
    let approval = match approval.into_iter().next() {
        Some(a) => a,
        None => {
            // Not yet created: wait for any kind.
            let mut found = None;
            for _ in 0..600 {
                if let Some(a) = cluster.approvals_of("asks").await.into_iter().next() {
                    found = Some(a);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            found.expect("an Approval within 60 s")
        }
    };
    assert_ne!(
        approval.data["spec"]["kind"],
        json!("interrupted_side_effect")
    );
    let name = approval.metadata.name.clone().expect("name");
    let refused = approvals_api(&client, &ns)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"decision": {
                "verdict": "DidNotTakeEffect",
                "hash": approval.data["spec"]["hash"],
                "approver": "test",
            }}})),
        )
        .await
        .expect_err("the schema refuses a settle verdict elsewhere");
    assert!(
        refused.to_string().contains("interrupted_side_effect"),
        "{refused}"
    );
    let refused = approvals_api(&client, &ns)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"decision": {
                "verdict": "Approved",
                "hash": approval.data["spec"]["hash"],
                "result": {"x": 1},
            }}})),
        )
        .await
        .expect_err("the schema refuses a result without TookEffect");
    assert!(refused.to_string().contains("result"), "{refused}");
}
