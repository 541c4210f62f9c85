//! How a tool's answer ends its step, end to end through the http executor (docs/behaviours.md
//! 15-17): an error status is a tool error the agent sees, a tool that never answers within
//! its timeout leaves the outcome unknown (an interruption: a non-ReadOnly call pauses for a
//! person), and an abort header fails the run `tool_abort`.

mod support;

use std::time::Duration;

use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

async fn run_one(
    class: &str,
    behaviour: Behaviour,
    name: &str,
) -> (support::cluster::TestCluster, ToolServer, ControllerProcess) {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    tools.set("act", behaviour);
    let controller = start_controller(&cluster, "c");
    let yaml = RunFixture::new("one-call", &tools.base(), name)
        .class(class)
        .yaml();
    cluster.create_run(&yaml).await;
    (cluster, tools, controller)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_status_is_a_tool_error_the_agent_sees() {
    let behaviour = Behaviour::answering_status(503);
    let (cluster, tools, _c) = run_one("LocalMutation", behaviour, "errored").await;
    let done = cluster
        .wait_phase("errored", "Completed", Duration::from_secs(30))
        .await;
    let observation = &done["steps"][0]["observation"];
    assert_eq!(observation["kind"], "tool_error", "{observation}");
    assert_eq!(step_statuses(&done), ["failed", "done"]);
    assert_eq!(tools.calls().len(), 1);
    assert_seq_contiguous(&done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_never_answers_leaves_a_side_effect_waiting_for_a_person() {
    let behaviour = Behaviour::hanging();
    let (cluster, tools, _c) = run_one("RemoteMutation", behaviour, "hung").await;
    let approval = cluster
        .wait_approval("hung", "interrupted_side_effect", Duration::from_secs(30))
        .await;
    let waiting = cluster.run_status("hung").await;
    assert_eq!(waiting["phase"], "WaitingForApproval");
    assert!(
        !events_of(&waiting, "step.interrupted").is_empty(),
        "{waiting}"
    );
    assert_eq!(
        tools.calls().len(),
        1,
        "the call was not repeated on its own"
    );
    // Rejecting it ends the run without calling the tool again.
    cluster.decide(&approval, "Rejected").await;
    let done = cluster
        .wait_phase("hung", "Cancelled", Duration::from_secs(30))
        .await;
    assert_eq!(done["reason"], "approval_rejected");
    assert_eq!(tools.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_header_fails_the_run_tool_abort() {
    let behaviour = Behaviour::aborting("account frozen");
    let (cluster, _tools, _c) = run_one("ReadOnly", behaviour, "aborted").await;
    let done = cluster
        .wait_phase("aborted", "Failed", Duration::from_secs(30))
        .await;
    assert_eq!(done["reason"], "tool_abort");
    assert_seq_contiguous(&done);
}
