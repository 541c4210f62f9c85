//! The samples of `config/samples/`, applied with kubectl against the embedded API server (or
//! AGENTRT_TEST_KUBECONFIG) with a controller child process: each reaches its phase, and the
//! approval sample completes after `kubectl patch` with the hash the Approval carries, while a
//! patch with another hash is refused by the API server.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::controller::*;
use tokio_util::sync::CancellationToken;

fn samples_for(addr: &str) -> String {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples");
    let mut out = String::new();
    for name in [
        "readonly-lookup.yaml",
        "refund-approval.yaml",
        "slow-export.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(name)).expect("sample");
        out.push_str("---\n");
        out.push_str(&text.replace("127.0.0.1:8089", addr));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_samples_reach_their_phases_and_the_approval_sample_completes_after_kubectl_patch() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = agentrt::tools::samples::serve(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_secs(2),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let _controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("samples"));

    let out = cluster.kubectl_stdin(&["apply", "-f", "-"], &samples_for(&tools.to_string()));
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let done = wait_phase(
        &client,
        &ns,
        "readonly-lookup",
        "Completed",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(done["reason"], "goal_completed");
    assert_seq_contiguous(&done);
    let slow = wait_phase(
        &client,
        &ns,
        "slow-export",
        "Completed",
        Duration::from_secs(40),
    )
    .await;
    assert_eq!(slow["result"]["exported"], "orders");
    let waiting = wait_phase(
        &client,
        &ns,
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

    let approval = wait_approval(
        &client,
        &ns,
        "refund-approval",
        "policy",
        Duration::from_secs(10),
    )
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
    let finished = wait_phase(
        &client,
        &ns,
        "refund-approval",
        "Completed",
        Duration::from_secs(30),
    )
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
