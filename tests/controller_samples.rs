//! The samples of `config/samples/`, applied with kubectl against the embedded API server (or
//! AGENTRT_TEST_KUBECONFIG) with a controller child process, the sample tools, model and hook
//! served as `agentrt dev` serves them: each reaches its phase, and the approval sample
//! completes after `kubectl patch` with the hash the Approval carries, while a patch with another
//! hash is refused by the API server. The reconcile-hook sample, its controller killed during
//! the export, is settled by the sample hook without exporting twice; the status-URL sample,
//! killed likewise, by its tool's own word. The MCP samples use the
//! sample MCP server at `/mcp`: one completes with its tools pinned, one waits on an Approval
//! that shows the pin.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::controller::*;
use tokio_util::sync::CancellationToken;

fn samples_for(addr: &str) -> String {
    sample_files(
        addr,
        &[
            "readonly-lookup.yaml",
            "refund-approval.yaml",
            "slow-export.yaml",
            "model-lookup.yaml",
            "export-reconciled.yaml",
            "export-by-status.yaml",
            "mcp-lookup.yaml",
            "mcp-refund-approval.yaml",
        ],
    )
}

fn sample_files(addr: &str, names: &[&str]) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples");
    let mut out = String::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(name)).expect("sample");
        out.push_str("---\n");
        out.push_str(&text.replace("127.0.0.1:8089", addr));
    }
    out
}

/// The sample tools (`agentrt::tools::samples`) served on a free port of 127.0.0.1,
/// `slow_export` taking `slow`; their address. Panics when they cannot be served.
async fn sample_tools(slow: Duration) -> std::net::SocketAddr {
    agentrt::tools::samples::serve(
        "127.0.0.1:0".parse().unwrap(),
        slow,
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

/// `kubectl apply -f -` of `manifest`; panics with kubectl's standard error when it fails.
fn apply_ok(cluster: &support::cluster::TestCluster, manifest: &str) {
    let out = cluster.apply(manifest);
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_samples_reach_their_phases_and_the_approval_sample_completes_after_kubectl_patch() {
    let cluster = agentrt_cluster().await;
    let tools = sample_tools(Duration::from_secs(2)).await;
    let _controller = start_controller(&cluster, "samples");

    apply_ok(&cluster, &samples_for(&tools.to_string()));

    let done = cluster
        .wait_phase("readonly-lookup", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(done["reason"], "goal_completed");
    assert_seq_contiguous(&done);
    let slow = cluster
        .wait_phase("slow-export", "Completed", Duration::from_secs(40))
        .await;
    assert_eq!(slow["result"]["exported"], "orders");
    let reconciled = cluster
        .wait_phase("export-reconciled", "Completed", Duration::from_secs(40))
        .await;
    assert!(
        events_of(&reconciled, "lease.taken_over").is_empty(),
        "without a crash the hook is not asked"
    );
    let by_status = cluster
        .wait_phase("export-by-status", "Completed", Duration::from_secs(40))
        .await;
    assert!(
        events_of(&by_status, "lease.taken_over").is_empty(),
        "without a crash the status URL is not asked"
    );
    // The sample model decided each step; every attempt was recorded and priced.
    let decided = cluster
        .wait_phase("model-lookup", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(
        decided["result"],
        serde_json::json!({"order": 1042, "status": "delivered", "damaged": true})
    );
    assert_eq!(decided["usage"]["modelCalls"], 2);
    assert_eq!(decided["usage"]["outputTokens"], 48);
    assert!(decided["usage"]["estimatedCostMicros"].as_i64() > Some(0));
    assert_eq!(events_of(&decided, "model.completed").len(), 2);
    assert_seq_contiguous(&decided);
    // The MCP samples: pinned before run.started, one completes, one waits for a person.
    let mcp = cluster
        .wait_phase("mcp-lookup", "Completed", Duration::from_secs(30))
        .await;
    let pins: Vec<&str> = mcp["toolPins"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["tool"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(pins, ["lookup_order", "shop__issue_refund"]);
    // The sample server speaks the stateless 2026-07-28 revision, recorded in each pin.
    for pin in mcp["toolPins"].as_array().into_iter().flatten() {
        assert_eq!(pin["protocolVersion"], "2026-07-28", "{pin}");
    }
    assert_eq!(events_of(&mcp, "tool.pinned").len(), 2);
    let mcp_waiting = cluster
        .wait_phase(
            "mcp-refund-approval",
            "WaitingForApproval",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(step_statuses(&mcp_waiting), ["done", "awaiting_approval"]);
    let mcp_approval = cluster
        .wait_approval("mcp-refund-approval", "policy", Duration::from_secs(10))
        .await;
    let shown = &mcp_approval.data["spec"]["presentation"]["mcp"];
    assert_eq!(shown["tool"], "issue_refund", "{shown}");
    assert!(shown["pinSha256"]
        .as_str()
        .is_some_and(|h| h.starts_with("sha256:")));
    let waiting = cluster
        .wait_phase(
            "refund-approval",
            "WaitingForApproval",
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(step_statuses(&waiting), ["done", "awaiting_approval"]);

    // The printer columns show the runs.
    let table = cluster.kubectl_ok(&["get", "agentruns"]);
    assert!(
        table.contains("PHASE") && table.contains("WaitingForApproval"),
        "{table}"
    );

    let approval = cluster
        .wait_approval("refund-approval", "policy", Duration::from_secs(10))
        .await;
    let name = approval.metadata.name.clone().unwrap();
    assert_eq!(name, "refund-approval-1-1");
    let hash = cluster.kubectl_ok(&["get", "approval", &name, "-o", "jsonpath={.spec.hash}"]);
    assert!(hash.starts_with("sha256:"), "{hash}");

    let wrong = format!("sha256:{}", "0".repeat(64));
    let refused = cluster.kubectl(&[
        "patch",
        "approval",
        &name,
        "--type",
        "merge",
        "-p",
        &format!(r#"{{"spec":{{"decision":{{"verdict":"Approved","hash":"{wrong}"}}}}}}"#),
    ]);
    assert!(
        !refused.status.success(),
        "a decision with another hash was accepted"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("hash"), "{stderr}");

    cluster.kubectl_ok(&[
        "patch",
        "approval",
        &name,
        "--type",
        "merge",
        "-p",
        &format!(r#"{{"spec":{{"decision":{{"verdict":"Approved","hash":"{hash}"}}}}}}"#),
    ]);
    let finished = cluster
        .wait_phase("refund-approval", "Completed", Duration::from_secs(30))
        .await;
    assert_eq!(finished["result"], serde_json::json!({"refunded": 250}));
    assert_seq_contiguous(&finished);
    let types = event_types(&finished);
    assert!(
        types.contains(&"approval.requested".to_string()),
        "{types:?}"
    );
    assert!(types.contains(&"approval.decided".to_string()), "{types:?}");
    assert!(types.contains(&"run.resumed".to_string()), "{types:?}");

    // The refund was issued once.
    let refunds: Value = reqwest::get(format!("http://{tools}/refunds"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(refunds.as_object().map(|o| o.len()), Some(1), "{refunds}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_hook_sample_settles_an_export_interrupted_by_a_crash() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let tools = sample_tools(Duration::from_secs(4)).await;
    // The sample as written, with a 2-second lease so the takeover comes soon.
    let yaml = sample_files(&tools.to_string(), &["export-reconciled.yaml"])
        .replace("leaseDurationSeconds: 10", "leaseDurationSeconds: 2");
    apply_ok(&cluster, &yaml);
    let _controllers = crash_then_take_over_in(&cluster, "during-tool", Duration::from_secs(30));
    let done = cluster
        .wait_phase("export-reconciled", "Completed", Duration::from_secs(60))
        .await;
    // The hook's answer: the export the sample tool finished, not a second one.
    assert_eq!(done["result"]["rows"], 1200, "{done}");
    assert_eq!(done["result"]["dataset"], "orders");
    assert!(!events_of(&done, "lease.taken_over").is_empty());
    assert!(cluster.approvals_of("export-reconciled").await.is_empty());
    assert_seq_contiguous(&done);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_url_sample_settles_an_export_interrupted_by_a_crash() {
    if !crash_points() {
        return;
    }
    let cluster = agentrt_cluster().await;
    let tools = sample_tools(Duration::from_secs(4)).await;
    let yaml = sample_files(&tools.to_string(), &["export-by-status.yaml"])
        .replace("leaseDurationSeconds: 10", "leaseDurationSeconds: 2");
    apply_ok(&cluster, &yaml);
    let _controllers = crash_then_take_over_in(&cluster, "during-tool", Duration::from_secs(30));
    let done = cluster
        .wait_phase("export-by-status", "Completed", Duration::from_secs(60))
        .await;
    // The export the sample tool finished, as its status URL said, not a second one.
    let step = &done["steps"][0];
    assert_eq!(step["observation"]["content"]["rows"], 1200, "{done}");
    assert_eq!(
        events_of(&done, "step.tool_started").len(),
        1,
        "exported once: {done}"
    );
    assert_eq!(
        events_of(&done, "step.tool_finished")[0]["data"]["settledBy"]["state"],
        "succeeded"
    );
    assert!(!events_of(&done, "lease.taken_over").is_empty());
    assert!(cluster.approvals_of("export-by-status").await.is_empty());
    assert_seq_contiguous(&done);
}
