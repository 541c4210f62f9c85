//! Deciding many Approvals at once (issue 39 item 3, docs/design.md section 2 "Approval"):
//! `approve`/`reject` by `--run`, `-l`, `--kind` and `--all-pending` list what they will
//! decide, decide each with the hash listed, and skip what can no longer grant; `show run`
//! names who decided each approval.

mod support;

use std::time::Duration;

use support::cli::{agentrt, text};
use support::controller::*;
use support::toolserver::ToolServer;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn approvals_are_decided_by_run_and_by_kind_after_one_listing_and_show_run_names_the_decider()
{
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "bulk");
    for run in ["pay-a", "pay-b", "ship-c"] {
        cluster
            .run_awaiting_approval(
                &fixture("needs-approval", &tools.base(), run),
                run,
                "policy",
            )
            .await;
    }

    // By run: only pay-a's.
    let out = agentrt(
        &cluster,
        &["approve", "--run", "pay-a", "--yes", "--note", "fine"],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("pay-a-0-1") && !said.contains("pay-b"),
        "{said}"
    );
    cluster.wait_phase("pay-a", "Completed", WAIT).await;

    // A name and a selector together are a usage error.
    let out = agentrt(
        &cluster,
        &["approve", "pay-b-0-1", "--run", "pay-b", "--yes"],
    );
    assert!(!out.status.success());

    // Every pending one of a kind: the two left, listed once, rejected with the note.
    let out = agentrt(
        &cluster,
        &[
            "reject",
            "--all-pending",
            "--kind",
            "policy",
            "--yes",
            "--note",
            "not today",
        ],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("pay-b-0-1") && said.contains("ship-c-0-1"),
        "{said}"
    );
    assert!(
        !said.contains("pay-a-0-1"),
        "a decided one is not listed: {said}"
    );
    for run in ["pay-b", "ship-c"] {
        let status = cluster.wait_phase(run, "Cancelled", WAIT).await;
        assert_eq!(status["reason"], "approval_rejected", "{status}");
    }
    assert_eq!(tools.calls().len(), 1, "only pay-a's call ran");

    // Nothing left: a clear refusal, nothing decided.
    let out = agentrt(&cluster, &["approve", "--all-pending", "--yes"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no pending Approval"), "{}", text(&out));

    // show run names each approval's outcome and who decided it.
    let out = agentrt(&cluster, &["show", "run", "pay-b"]);
    let said = text(&out);
    assert!(
        said.contains("approval pay-b-0-1 (policy): Rejected by") && said.contains("not today"),
        "{said}"
    );
    let out = agentrt(&cluster, &["show", "run", "pay-a"]);
    let said = text(&out);
    assert!(
        said.contains("approval pay-a-0-1 (policy): Approved by"),
        "{said}"
    );
    assert!(said.contains("(executed)"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn as_and_as_group_act_as_that_user_as_kubectl_does() {
    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        // It has no authorization: asked to act as another user, it refuses rather than act
        // as the admin it always is.
        let out = agentrt(&cluster, &["approvals", "--as", "jane"]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(text(&out).contains("cannot impersonate"), "{}", text(&out));
        return;
    }
    let nobody = format!("system:serviceaccount:{}:nobody", cluster.namespace());
    let out = agentrt(&cluster, &["approvals", "--as", &nobody]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("forbidden"), "{}", text(&out));
    // As a member of the cluster admins' group, the same user may list.
    let out = agentrt(
        &cluster,
        &["approvals", "--as", &nobody, "--as-group", "system:masters"],
    );
    assert!(out.status.success(), "{}", text(&out));
    // --as-group alone is a usage error (as kubectl's).
    let out = agentrt(&cluster, &["approvals", "--as-group", "system:masters"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
