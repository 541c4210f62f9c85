//! A Kubernetes user's habits (issue 14, docs/behaviours.md 70-78), on the embedded server and
//! on a real kube-apiserver: `kubectl wait --for=condition=Complete` and `--for=condition=Failed`
//! return when a run ends; `--field-selector status.phase=...`; `kubectl patch` of a live run's
//! limits is journaled `spec.changed`; the printer columns before and after a run; and the words
//! a person reads (`agentrt cancel` of a finished run, an API server's error said once).

mod support;

use std::time::Duration;

use support::cli::{agentrt, text};
use support::controller::*;
use support::toolserver::ToolServer;

const WAIT: Duration = Duration::from_secs(60);

/// The fixture `answer` for `name`, its one decision `decision` (inline YAML).
fn answer(name: &str, decision: &str) -> String {
    RunFixture::new("answer", "http://127.0.0.1:9", name)
        .set("DECISION", decision)
        .yaml()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_wait_for_condition_complete_and_failed_returns_when_the_run_ends() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");

    cluster
        .create_run(&answer("done", "{kind: complete, result: {refunded: 250}}"))
        .await;
    let out = cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Complete",
        "ar/done",
        "--timeout=60s",
    ]);
    assert!(out.contains("condition met"), "{out}");
    // The controller's writes name it: the status is managed by `agentrt` (not `unknown`).
    let managers = cluster.kubectl_ok(&[
        "get",
        "ar/done",
        "--show-managed-fields",
        "-o",
        r#"jsonpath={range .metadata.managedFields[?(@.subresource=="status")]}{.manager}{"\n"}{end}"#,
    ]);
    assert_eq!(managers.trim(), "agentrt", "{managers}");

    let refused = fixture("needs-approval", &tools.base(), "refused");
    let approval = cluster
        .run_awaiting_approval(&refused, "refused", "policy")
        .await;
    let waiting = cluster.kubectl_spawn(&[
        "wait",
        "--for=condition=Failed",
        "ar/refused",
        "--timeout=60s",
    ]);
    cluster.decide(&approval, "Rejected").await;
    waiting
        .wait_for("kubectl wait --for=condition=Failed", WAIT, |lines| {
            lines.iter().any(|l| l.contains("condition met"))
        })
        .await;
    let reason = cluster.kubectl_ok(&[
        "get",
        "ar/refused",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Failed")].reason}"#,
    ]);
    assert_eq!(reason, "ApprovalRejected");
    let complete = cluster.kubectl_ok(&[
        "get",
        "ar/refused",
        "-o",
        r#"jsonpath={.status.conditions[?(@.type=="Complete")].status}"#,
    ]);
    assert_eq!(complete, "", "a rejected run has no Complete condition");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_field_selector_status_phase_lists_the_runs_in_that_phase() {
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "c");
    cluster
        .create_run(&answer("done", "{kind: complete, result: {}}"))
        .await;
    cluster
        .create_run(&answer(
            "broke",
            "{kind: fail, message: the order does not exist}",
        ))
        .await;
    cluster.wait_phase("done", "Completed", WAIT).await;
    cluster.wait_phase("broke", "Failed", WAIT).await;

    let failed = cluster.kubectl_ok(&[
        "get",
        "ar",
        "--field-selector",
        "status.phase=Failed",
        "-o",
        "name",
    ]);
    assert_eq!(failed.trim(), "agentrun.agentrt.dev/broke");
    let not_failed = cluster.kubectl_ok(&[
        "get",
        "ar",
        "--field-selector",
        "status.phase!=Failed",
        "-o",
        "name",
    ]);
    assert_eq!(not_failed.trim(), "agentrun.agentrt.dev/done");

    let out = cluster.kubectl(&["get", "ar", "--field-selector", "spec.goal=x"]);
    assert!(!out.status.success(), "spec.goal is not selectable");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("field label not supported: spec.goal"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_patch_of_a_live_runs_limits_is_journaled_spec_changed() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let edited = fixture("needs-approval", &tools.base(), "edited");
    let approval = cluster
        .run_awaiting_approval(&edited, "edited", "policy")
        .await;
    cluster.kubectl_ok(&[
        "patch",
        "ar/edited",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"limits":{"maxSteps":9}}}"#,
    ]);
    cluster.decide(&approval, "Approved").await;
    let done = cluster.wait_phase("edited", "Completed", WAIT).await;
    let changed = events_of(&done, "spec.changed");
    assert_eq!(changed.len(), 1, "{done}");
    assert_eq!(
        changed[0]["data"],
        serde_json::json!({"generation": 2, "fields": ["spec.limits"]})
    );
    assert_eq!(done["observedGeneration"], 2);
    assert!(
        done["specHashes"]["limits"]
            .as_str()
            .is_some_and(|h| h.len() == 16),
        "{done}"
    );
}

/// The cells of `kubectl get ar NAME` under each header (by the header's position, so an empty
/// cell reads as "").
fn columns(out: &str) -> Vec<(String, String)> {
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    let row = lines.next().unwrap_or_default();
    let starts: Vec<usize> = header
        .char_indices()
        .filter(|(i, c)| !c.is_whitespace() && (*i == 0 || header[..*i].ends_with(' ')))
        .map(|(i, _)| i)
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &start)| {
            let end = starts.get(n + 1).copied().unwrap_or(usize::MAX);
            let cell = |line: &str| {
                line.get(start..end.min(line.len()))
                    .unwrap_or("")
                    .trim()
                    .to_string()
            };
            (cell(header), cell(row))
        })
        .collect()
}

fn cell(out: &str, header: &str) -> String {
    columns(out)
        .into_iter()
        .find(|(h, _)| h == header)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no column {header} in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_pending_before_a_controller_and_no_tool_once_finished() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let yaml = RunFixture::new("one-call", &tools.base(), "shown")
        .class("ReadOnly")
        .yaml();
    cluster.create_run(&yaml).await;
    let before = cluster.kubectl_ok(&["get", "ar", "shown"]);
    assert_eq!(cell(&before, "PHASE"), "Pending", "{before}");
    assert_eq!(cell(&before, "TOOL"), "", "{before}");

    let _controller = start_controller(&cluster, "c");
    let done = cluster.wait_phase("shown", "Completed", WAIT).await;
    assert_eq!(done["steps"][0]["decision"]["tool"], "act", "a tool ran");
    let after = cluster.kubectl_ok(&["get", "ar", "shown"]);
    assert_eq!(cell(&after, "PHASE"), "Completed", "{after}");
    assert_eq!(cell(&after, "STEPS"), "2", "{after}");
    assert_eq!(
        cell(&after, "TOOL"),
        "",
        "a finished run has no current tool: {after}"
    );
    assert_eq!(cell(&after, "REASON"), "goal_completed", "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentrt_cancel_of_a_finished_run_says_so_and_writes_nothing() {
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let _controller = start_controller(&cluster, "c");
    cluster
        .create_run(&answer("over", "{kind: complete, result: {}}"))
        .await;
    cluster.wait_phase("over", "Completed", WAIT).await;
    let before = runs_api(&client, &ns).get("over").await.expect("run");
    let out = agentrt(&cluster, &["cancel", "over"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        stdout.trim(),
        format!(
            "agentrun {ns}/over already finished (Completed, goal_completed); nothing to cancel"
        )
    );
    let after = runs_api(&client, &ns).get("over").await.expect("run");
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "nothing was written"
    );
    assert_eq!(after.data["spec"]["cancel"], serde_json::json!(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_is_named_once_in_the_api_servers_words() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let yaml = RunFixture::new("one-tool", &tools.base(), "secretless")
        .class("ReadOnly")
        .yaml()
        .replace(
            "http: {url: \"",
            "http: {headers: [{name: X-Token, secretKeyRef: {name: nope, key: token}}], url: \"",
        );
    cluster.create_run(&yaml).await;
    let status = cluster
        .wait_status("secretless", WAIT, "a failed step", |s| {
            s["steps"][0]["status"] == "failed"
        })
        .await;
    let observation = &status["steps"][0]["observation"];
    let text = observation.to_string();
    assert!(text.contains(r#"secrets \"nope\" not found"#), "{text}");
    assert_eq!(text.matches("not found").count(), 1, "said once: {text}");
    for dump in ["ApiError", "Status {", "ErrorResponse"] {
        assert!(!text.contains(dump), "a debug dump ({dump}): {text}");
    }
}
