//! Approvals of big requests, end to end (issue 10, docs/behaviours.md 19-22): a call whose args
//! are large still gets its Approval created (the API server's CEL immutability rules over the
//! request stay within their cost budget on a real kube-apiserver), decided with kubectl's
//! merge patch, and executed once with exactly the args shown.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::cli::{agentrt, text};
use support::cluster::eventually;
use support::controller::*;
use support::runs::name_of;
use support::toolserver::ToolServer;

/// Args of about 150 KB: a long string and a list of a thousand objects.
fn large_args() -> Value {
    let lines: Vec<Value> = (0..1000)
        .map(
            |i| json!({"line": i, "text": format!("item {i} of the order, as the agent wrote it")}),
        )
        .collect();
    json!({"item": 1, "note": "n".repeat(100_000), "lines": lines})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_whose_request_carries_large_args_is_created_and_decided() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let args = large_args();
    let yaml = fixture("needs-approval", &tools.base(), "big-args")
        .replace("args: {item: 1}", &format!("args: {args}"));
    assert!(yaml.len() > 150_000, "the run carries the large args");
    let _controller = start_controller(&cluster, "c");

    let approval = cluster
        .run_awaiting_approval(&yaml, "big-args", "policy")
        .await;
    assert_eq!(
        approval.data["spec"]["request"]["args"], args,
        "the Approval shows the args whole"
    );
    let name = name_of(&approval);
    let hash = approval.data["spec"]["hash"]
        .as_str()
        .expect("hash")
        .to_string();
    // A change to the request is refused even when it is this big.
    let mut changed = args.clone();
    changed["item"] = json!(2);
    let tamper = cluster.dir().join("tamper.json");
    std::fs::write(
        &tamper,
        json!({"spec": {"request": {"args": changed}}}).to_string(),
    )
    .expect("patch file");
    let out = cluster.kubectl(&[
        "patch",
        "approval",
        &name,
        "--type",
        "merge",
        "--patch-file",
        &tamper.to_string_lossy(),
    ]);
    assert!(
        !out.status.success(),
        "the API server let the request change"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("an Approval's spec is immutable"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decision = format!(
        r#"{{"spec":{{"decision":{{"verdict":"Approved","hash":"{hash}","approver":"a"}}}}}}"#
    );
    cluster.merge_patch_ok("approval", &name, &decision);

    let done = cluster
        .wait_phase("big-args", "Completed", Duration::from_secs(60))
        .await;
    let calls = tools.calls();
    assert_eq!(
        calls.len(),
        1,
        "one call: {:?}",
        calls.iter().map(|c| &c.key).collect::<Vec<_>>()
    );
    assert_eq!(
        calls[0].args, args,
        "the tool got exactly the approved args"
    );
    assert_eq!(events_of(&done, "approval.decided").len(), 1);
    assert_seq_contiguous(&done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_approval_of_a_deleted_run_is_never_adopted() {
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let first = fixture("needs-approval", &tools.base(), "again");
    let old = cluster
        .run_awaiting_approval(&first, "again", "policy")
        .await;
    let old_name = name_of(&old);
    // The run goes, its Approval stays (as when the garbage collector is down).
    cluster.kubectl_ok(&[
        "delete",
        "agentrun",
        "again",
        "--cascade=orphan",
        "--wait=true",
    ]);
    let api = approvals_api(&client, &ns);
    if api.get_opt(&old_name).await.expect("get").is_none() {
        // A real garbage collector that had not yet seen the Approval when its owner was
        // deleted collects it as the dependent of a vanished owner; put back what the orphan
        // policy leaves (the object without its ownerReferences).
        let mut orphan = old.clone();
        orphan.metadata.owner_references = None;
        orphan.metadata.uid = None;
        orphan.metadata.resource_version = None;
        orphan.metadata.creation_timestamp = None;
        orphan.metadata.managed_fields = None;
        api.create(&Default::default(), &orphan)
            .await
            .expect("the leftover is put back");
    }
    let left = api.get(&old_name).await.expect("left over");

    let second = first.replace("args: {item: 1}", "args: {item: 2}");
    cluster.create_run(&second).await;
    let run = cluster
        .wait_status(
            "again",
            Duration::from_secs(60),
            "an ApprovalConflict",
            |s| {
                s["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "ApprovalConflict" && c["status"] == "True")
                })
            },
        )
        .await;
    let fresh = run["steps"][0]["approvals"]
        .as_array()
        .and_then(|a| a.last())
        .and_then(|a| a["name"].as_str())
        .expect("the step names its Approval")
        .to_string();
    assert_ne!(fresh, old_name, "the run pauses on a fresh name");
    let now = approvals_api(&client, &ns)
        .get(&old_name)
        .await
        .expect("still there");
    assert_eq!(now.data["spec"], left.data["spec"]);
    assert_eq!(
        now.data["status"], left.data["status"],
        "the leftover is never written to"
    );
    let warning = eventually(
        "a Warning Event naming the leftover",
        Duration::from_secs(30),
        || {
            let out = cluster.kubectl(&[
                "get",
                "events",
                "--field-selector",
                "reason=ApprovalConflict",
                "-o",
                "json",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let found = text.contains(&old_name);
            async move { found.then_some(text) }
        },
    )
    .await;
    assert!(warning.contains("Warning"), "{warning}");

    let approval = eventually("the fresh Approval", Duration::from_secs(30), || {
        let api = approvals_api(&client, &ns);
        let fresh = fresh.clone();
        async move { api.get_opt(&fresh).await.ok().flatten() }
    })
    .await;
    assert_eq!(approval.data["spec"]["request"]["args"], json!({"item": 2}));
    cluster.decide(&approval, "Approved").await;
    cluster
        .wait_phase("again", "Completed", Duration::from_secs(60))
        .await;
    let calls = tools.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].args,
        json!({"item": 2}),
        "the new run's request ran, once"
    );
}

/// docs/behaviours.md 42 and 67: a run cancelled while it waits moves its pending Approval to
/// `Cancelled` ("run cancelled"), and `agentrt approve` refuses it (exit 1, saying why) instead
/// of printing "approved"; nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approvals_of_a_cancelled_run_are_cancelled_and_cannot_be_approved() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let yaml = fixture("needs-approval", &tools.base(), "called-off");
    let approval = cluster
        .run_awaiting_approval(&yaml, "called-off", "policy")
        .await;
    let name = name_of(&approval);
    cluster.cancel_run("called-off");
    cluster
        .wait_phase("called-off", "Cancelled", Duration::from_secs(30))
        .await;
    let cancelled = cluster
        .wait_approval_phase(&name, "Cancelled", Duration::from_secs(30))
        .await;
    assert_eq!(cancelled.data["status"]["reason"], "run cancelled");
    let columns = cluster.kubectl_ok(&["get", "approval", &name, "--no-headers"]);
    assert!(columns.contains("Cancelled"), "the Phase column: {columns}");

    // `agentrt approve NAME --yes`, standard input closed.
    let out = agentrt(&cluster, &["approve", &format!("{ns}/{name}"), "--yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains("Cancelled (run cancelled)") && stderr.contains("can no longer grant"),
        "{stderr}"
    );
    assert!(!stdout.contains(" approved"), "{stdout}");
    let after = cluster.approval(&name).await;
    assert!(
        after.data["spec"].get("decision").is_none(),
        "nothing decided"
    );
    assert!(tools.calls().is_empty());
}

/// docs/behaviours.md 69: deleting a waiting run's Approval wakes the run at once (the
/// Approval watch maps it to its owner): the Approval is created again from the record within
/// seconds, not at a resync minutes later, and deciding it lets the run go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_approval_wakes_its_run_and_is_created_again_at_once() {
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let yaml = fixture("needs-approval", &tools.base(), "woken");
    let first = cluster
        .run_awaiting_approval(&yaml, "woken", "policy")
        .await;
    let name = name_of(&first);
    let first_uid = first.metadata.uid.clone().expect("uid");
    // Let the replica settle (its own writes woke it already), then delete.
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.kubectl_ok(&["delete", "approval", &name, "--wait=true"]);
    let deleted_at = std::time::Instant::now();
    let again = eventually(
        "the Approval created again",
        Duration::from_secs(10),
        || {
            let api = approvals_api(&client, &ns);
            let name = name.clone();
            let first_uid = first_uid.clone();
            async move {
                api.get_opt(&name)
                    .await
                    .ok()
                    .flatten()
                    .filter(|a| a.metadata.uid.as_deref() != Some(first_uid.as_str()))
            }
        },
    )
    .await;
    assert!(
        deleted_at.elapsed() < Duration::from_secs(10),
        "recreated after {:?}",
        deleted_at.elapsed()
    );
    assert_eq!(
        again.data["spec"], first.data["spec"],
        "the same request, from the record"
    );
    cluster.decide(&again, "Approved").await;
    cluster
        .wait_phase("woken", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(tools.calls().len(), 1);
}

/// docs/behaviours.md 12: a `when` that fails on the agent's args (here a key the args lack)
/// does not end the run `internal_error`: the call pauses on a `policy_error` Approval showing
/// the rule, the error and the args; approved, it runs once and the run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_when_that_fails_on_the_args_pauses_on_a_policy_error_approval_a_person_decides() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "policy-error");
    let yaml = RunFixture::new("one-tool", &tools.base(), "unguarded")
        .class("RemoteMutation")
        .yaml()
        .replace(
            "  policy:\n",
            "  policy:\n    rules:\n    - {name: small, when: 'args.amount <= 100', outcome: Allow}\n",
        );
    cluster.create_run(&yaml).await;
    let approval = cluster
        .wait_approval("unguarded", "policy_error", Duration::from_secs(30))
        .await;
    let shown = &approval.data["spec"]["presentation"];
    assert_eq!(
        shown["rule"],
        json!({"index": 0, "name": "small", "when": "args.amount <= 100"})
    );
    assert_eq!(shown["args"], json!({"item": 1}));
    assert!(
        shown["error"]
            .as_str()
            .is_some_and(|e| e.contains("amount")),
        "{shown}"
    );
    let run = cluster.run_status("unguarded").await;
    assert_eq!(run["phase"], "WaitingForApproval", "the run is kept: {run}");
    assert!(
        tools.calls().is_empty(),
        "nothing ran before a person decided"
    );
    cluster.decide(&approval, "Approved").await;
    let done = cluster
        .wait_phase("unguarded", "Completed", Duration::from_secs(30))
        .await;
    assert_seq_contiguous(&done);
    assert_eq!(tools.calls().len(), 1, "the approved call ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_by_another_holder_is_in_the_journal_with_its_holder_and_epoch() {
    // docs/behaviours.md 81: paused under holder first (epoch 1), first is killed; on approve,
    // second executes at epoch 2, and the journal says so in the write of its first action.
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let mut first = start_controller(&cluster, "first");
    let yaml = fixture("needs-approval", &tools.base(), "handed-over");
    let approval = cluster
        .run_awaiting_approval(&yaml, "handed-over", "policy")
        .await;
    first.signal(libc::SIGKILL);
    assert!(first.was_killed(Duration::from_secs(5)));
    let _second = start_controller(&cluster, "second");
    cluster.decide(&approval, "Approved").await;
    let done = cluster
        .wait_phase("handed-over", "Completed", Duration::from_secs(60))
        .await;
    assert_seq_contiguous(&done);
    let resumed = events_of(&done, "run.resumed");
    assert_eq!(resumed.len(), 1, "{:?}", event_types(&done));
    let data = &resumed[0]["data"];
    let starts = |field: &str, prefix: &str| {
        data[field]
            .as_str()
            .is_some_and(|holder| holder.starts_with(prefix))
    };
    assert!(starts("holder", "second-"), "{data}");
    assert!(starts("previousHolder", "first-"), "{data}");
    assert_eq!(data["epoch"], 2, "{data}");
    assert_eq!(done["lease"]["epoch"], 2);
    assert_eq!(done["lease"]["holder"], data["holder"]);
    let started = events_of(&done, "step.tool_started");
    assert_eq!(started.len(), 1);
    assert_eq!(
        resumed[0]["seq"].as_i64().map(|seq| seq + 2),
        started[0]["seq"].as_i64(),
        "resumed, policy and the start share one write"
    );
    assert!(tools
        .calls()
        .iter()
        .all(|c| c.holder.starts_with("second-")));
}
