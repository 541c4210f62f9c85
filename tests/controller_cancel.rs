//! Cancel while a tool runs (docs/behaviours.md 42-44) and a huge tool answer (guarantee 8), with a
//! controller child process against the embedded API server.

mod support;

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_a_tool_runs_ends_cancelled_and_appends_the_late_outcome() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("report", Behaviour::sleeping(2500));
    let _controller = start_controller(&cluster, "c");
    let run = cluster
        .create_run(&fixture("slow-tool", &tools.base(), "cancelled"))
        .await;
    let uid = run.metadata.uid.clone().unwrap();
    tools
        .wait_for_call(&format!("{uid}/0"), Duration::from_secs(30), String::new)
        .await;
    runs_api(&client, &ns)
        .patch(
            "cancelled",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"cancel": true}})),
        )
        .await
        .expect("cancel");
    let cancelled = cluster
        .wait_phase("cancelled", "Cancelled", Duration::from_secs(10))
        .await;
    assert_eq!(cancelled["reason"], "operator_cancelled");
    // The tool was still running when the cancel landed.
    assert!(
        tools.calls_for(&format!("{uid}/0"))[0].ended.is_none(),
        "the cancel waited for the tool"
    );
    let late = cluster
        .wait_status(
            "cancelled",
            Duration::from_secs(15),
            "the late outcome",
            |s| {
                events_of(s, "step.tool_finished")
                    .iter()
                    .any(|e| e["data"]["late"] == true)
            },
        )
        .await;
    assert_eq!(late["phase"], "Cancelled");
    assert_eq!(late["reason"], "operator_cancelled");
    assert_seq_contiguous(&late);
    let types = event_types(&late);
    let finished = types
        .iter()
        .position(|t| t == "run.finished")
        .expect("run.finished");
    let tool_finished = types
        .iter()
        .rposition(|t| t == "step.tool_finished")
        .expect("late outcome");
    assert!(
        finished < tool_finished,
        "the late outcome comes after run.finished: {types:?}"
    );
    assert_eq!(step_statuses(&late), ["failed"]);
    assert_eq!(tools.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_mebibyte_tool_answer_is_cut_keeping_its_size_and_hash() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    tools.set("report", Behaviour::answering_bytes(1024 * 1024));
    let _controller = start_controller(&cluster, "c");
    cluster
        .create_run(&fixture("slow-tool", &tools.base(), "huge"))
        .await;
    let done = cluster
        .wait_phase("huge", "Completed", Duration::from_secs(30))
        .await;
    let observation = &done["steps"][0]["observation"];
    assert_eq!(observation["kind"], "tool_result");
    let truncated = &observation["truncated"];
    assert!(
        truncated["originalBytes"].as_i64().unwrap_or(0) > 1024 * 1024,
        "{truncated}"
    );
    assert!(
        truncated["sha256"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{truncated}"
    );
    let recorded = serde_json::to_string(&observation["content"]).unwrap();
    assert!(
        recorded.len() <= 16 * 1024 + 1024,
        "the content was cut: {} bytes",
        recorded.len()
    );
    let whole = serde_json::to_vec(&done).unwrap();
    assert!(
        whole.len() < 1024 * 1024,
        "the record stays within the object budget"
    );
    assert_seq_contiguous(&done);
}
