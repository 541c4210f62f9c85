//! The CRD contract as an API server enforces it (issue 3 acceptance, docs/behaviours.md 1 and 20):
//! `kubectl apply -f crds/` works, defaults are filled, a bad field is refused with a message
//! naming it, immutable fields stay immutable, and an Approval's decision must carry its hash
//! and is written once. Runs against the embedded API server, or a real cluster when
//! `AGENTRT_TEST_KUBECONFIG` is set.

mod support;

use std::process::Output;

use support::cli::text;
use support::cluster::TestCluster;

fn run_yaml() -> String {
    std::fs::read_to_string(support::fixtures::path("api/refund-run.yaml")).expect("fixture")
}

/// `refund-run.yaml` with one line replaced.
fn run_with(from: &str, to: &str) -> String {
    let yaml = run_yaml();
    assert!(yaml.contains(from), "fixture has no {from:?}");
    yaml.replacen(from, to, 1)
}

fn refused(c: &TestCluster, yaml: &str) -> String {
    let out = c.apply(yaml);
    assert!(
        !out.status.success(),
        "the API server accepted:\n{yaml}\n{}",
        text(&out)
    );
    text(&out)
}

#[tokio::test]
async fn crds_apply_and_a_run_gets_the_documented_defaults() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.apply(&run_yaml());
    let spec: serde_json::Value = serde_json::from_str(&c.kubectl_ok(&[
        "get",
        "agentrun",
        "refund-1042",
        "-o",
        "jsonpath={.spec}",
    ]))
    .expect("spec is JSON");
    assert_eq!(spec["limits"]["maxSteps"], 50);
    assert_eq!(spec["limits"]["maxConsecutiveToolFailures"], 3);
    assert_eq!(spec["limits"]["loopThreshold"], 3);
    assert!(
        spec["limits"].get("maxModelCalls").is_none(),
        "optional limits are off: {spec}"
    );
    assert_eq!(spec["leaseDurationSeconds"], 30);
    assert_eq!(spec["cancel"], false);
    assert_eq!(
        spec["policy"]["sideEffects"],
        serde_json::json!({"ReadOnly": "Allow", "LocalMutation": "Allow", "RemoteMutation": "RequireApproval", "Destructive": "Deny"})
    );
    // Free JSON survives: the scripted decisions and the input schemas are kept as written.
    assert_eq!(
        spec["agent"]["scripted"]["decisions"][1]["args"]["amount"],
        250
    );
    assert_eq!(
        spec["tools"][1]["inputSchema"]["required"],
        serde_json::json!(["order", "amount"])
    );
    // Short name and category work.
    let names = c.kubectl_ok(&["get", "ar", "-o", "name"]);
    assert_eq!(names.trim(), "agentrun.agentrt.dev/refund-1042");
    let by_category = c.kubectl_ok(&["get", "agentrt", "-o", "name"]);
    assert!(
        by_category.contains("agentrun.agentrt.dev/refund-1042"),
        "{by_category}"
    );
}

#[tokio::test]
async fn a_bad_field_is_refused_with_a_message_naming_it() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let msg = refused(&c, &run_with("timeoutSeconds: 10", "timeoutSeconds: 0"));
    assert!(msg.contains("spec.tools[0].timeoutSeconds"), "{msg}");
    let msg = refused(
        &c,
        &run_with("sideEffect: ReadOnly", "sideEffect: Sometimes"),
    );
    assert!(
        msg.contains("spec.tools[0].sideEffect") && msg.contains("Unsupported value"),
        "{msg}"
    );
    let msg = refused(&c, &run_with("  goal:", "  gaol: typo\n  goal:"));
    assert!(msg.contains("unknown field \"spec.gaol\""), "{msg}");
    let msg = refused(
        &c,
        &run_with("  policy:", "  limits: {maxSteps: 0}\n  policy:"),
    );
    assert!(msg.contains("spec.limits.maxSteps"), "{msg}");
    let msg = refused(
        &c,
        &run_with("  policy:", "  limits: {loopThreshold: -1}\n  policy:"),
    );
    assert!(msg.contains("spec.limits.loopThreshold"), "{msg}");
}

#[tokio::test]
async fn a_run_name_longer_than_63_characters_is_refused_at_creation() {
    // The name is the value of its Approvals' label agentrt.dev/run (docs/behaviours.md 80).
    let c = TestCluster::start_with_agentrt_crds().await;
    let long = "r".repeat(64);
    let yaml = run_yaml();
    let name = "refund-1042";
    assert!(yaml.contains(&format!("name: {name}")));
    let msg = refused(
        &c,
        &yaml.replacen(&format!("name: {name}"), &format!("name: {long}"), 1),
    );
    assert!(
        msg.contains("metadata.name must be no more than 63 characters"),
        "{msg}"
    );
    let fits = yaml.replacen(
        &format!("name: {name}"),
        &format!("name: {}", "r".repeat(63)),
        1,
    );
    let out = c.apply(&fits);
    assert!(out.status.success(), "{}", text(&out));
}

/// An openai run with `extra` under `spec.agent.openai`.
fn openai_run(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {{name: {name}}}
spec:
  goal: Look it up.
  agent:
    openai: {{baseURL: \"http://127.0.0.1:1/v1\", model: m{extra}}}
  tools:
  - name: lookup_order
    description: Read an order.
    sideEffect: ReadOnly
    timeoutSeconds: 10
    inputSchema: {{type: object}}
    http: {{url: \"http://127.0.0.1:1/lookup_order\"}}
"
    )
}

/// docs/design.md section 4a: `maxContextBytes` defaults to 256 KiB and is at least 4096.
#[tokio::test]
async fn max_context_bytes_defaults_to_256_kib_and_is_at_least_4096() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.apply(&openai_run("modelled", ""));
    let max = c.kubectl_ok(&[
        "get",
        "agentrun",
        "modelled",
        "-o",
        "jsonpath={.spec.agent.openai.maxContextBytes}",
    ]);
    assert_eq!(max.trim(), "262144");
    let msg = refused(&c, &openai_run("tiny", ", maxContextBytes: 100"));
    assert!(msg.contains("spec.agent.openai.maxContextBytes"), "{msg}");
}

#[tokio::test]
async fn tool_names_must_be_unique_and_non_empty_and_schemas_non_empty() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let msg = refused(&c, &run_with("name: issue_refund", "name: lookup_order"));
    assert!(
        msg.contains("spec.tools[1]") && msg.contains("Duplicate value"),
        "{msg}"
    );
    let msg = refused(&c, &run_with("name: lookup_order", "name: \"\""));
    assert!(msg.contains("spec.tools[0].name"), "{msg}");
    let msg = refused(
        &c,
        &run_with(
            "inputSchema: {type: object, required: [order], properties: {order: {type: integer}}}",
            "inputSchema: {}",
        ),
    );
    assert!(msg.contains("spec.tools[0].inputSchema"), "{msg}");
}

#[tokio::test]
async fn exactly_one_agent_kind_is_required() {
    let c = TestCluster::start_with_agentrt_crds().await;
    let msg = refused(
        &c,
        &run_with(
            "    scripted:",
            "    webhook: {url: \"http://127.0.0.1:9/agent\"}\n    scripted:",
        ),
    );
    assert!(
        msg.contains("exactly one of scripted, openai, webhook"),
        "{msg}"
    );
}

#[tokio::test]
async fn goal_agent_and_tools_are_immutable_and_cancel_only_goes_true() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.apply(&run_yaml());
    let out = c.merge_patch(
        "ar",
        "refund-1042",
        r#"{"spec":{"goal":"Refund everything"}}"#,
    );
    assert!(
        !out.status.success() && text(&out).contains("spec.goal is immutable"),
        "{}",
        text(&out)
    );
    let out = c.kubectl(&[
        "patch",
        "ar",
        "refund-1042",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/tools/0/timeoutSeconds","value":99}]"#,
    ]);
    assert!(
        !out.status.success() && text(&out).contains("spec.tools is immutable"),
        "{}",
        text(&out)
    );
    // Policy and limits may change.
    c.merge_patch_ok(
        "ar",
        "refund-1042",
        r#"{"spec":{"limits":{"maxSteps":10}}}"#,
    );
    c.merge_patch_ok("ar", "refund-1042", r#"{"spec":{"cancel":true}}"#);
    let out = c.merge_patch("ar", "refund-1042", r#"{"spec":{"cancel":false}}"#);
    assert!(
        !out.status.success()
            && text(&out).contains("spec.cancel may only change from false to true"),
        "{}",
        text(&out)
    );
}

fn approval_yaml() -> String {
    std::fs::read_to_string(support::fixtures::path("api/approval.yaml")).expect("fixture")
}

const HASH: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn decide(c: &TestCluster, verdict: &str, hash: &str) -> Output {
    let patch = format!(
        r#"{{"spec":{{"decision":{{"verdict":"{verdict}","hash":"{hash}","approver":"alice"}}}}}}"#
    );
    c.merge_patch("approval", "refund-1042-1-1", &patch)
}

#[tokio::test]
async fn a_decision_must_carry_the_approvals_hash_and_is_written_once() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.apply(&approval_yaml());
    let out = decide(&c, "Approved", OTHER);
    assert!(
        !out.status.success(),
        "a decision with another hash was accepted"
    );
    assert!(
        text(&out).contains("spec.decision.hash must equal spec.hash"),
        "{}",
        text(&out)
    );
    let out = decide(&c, "Approved", HASH);
    assert!(out.status.success(), "{}", text(&out));
    let out = decide(&c, "Rejected", HASH);
    assert!(!out.status.success(), "a second decision was accepted");
    assert!(
        text(&out).contains("spec.decision is written once"),
        "{}",
        text(&out)
    );
    let stored = c.kubectl_ok(&[
        "get",
        "approval",
        "refund-1042-1-1",
        "-o",
        "jsonpath={.spec.decision.verdict}",
    ]);
    assert_eq!(stored.trim(), "Approved");
}

#[tokio::test]
async fn an_approvals_request_cannot_be_changed() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.apply(&approval_yaml());
    let out = c.kubectl(&[
        "patch",
        "approval",
        "refund-1042-1-1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"request":{"args":{"order":1042,"amount":25000}}}}"#,
    ]);
    assert!(!out.status.success(), "the request was changed");
    assert!(
        text(&out).contains("an Approval's spec is immutable"),
        "{}",
        text(&out)
    );
    let out = c.merge_patch(
        "approval",
        "refund-1042-1-1",
        r#"{"spec":{"presentation":{"note":"looks fine"}}}"#,
    );
    assert!(!out.status.success(), "a presentation was added");
    let printed = c.kubectl_ok(&["get", "apv"]);
    assert!(
        printed.contains("issue_refund") && printed.contains("refund-1042"),
        "{printed}"
    );
}

/// The runtime writes a run's status without its spec (issue 15): the status subresource takes
/// everything but the status from the stored object. Checked here on the server itself: a PUT
/// of `/status` whose body has no spec keeps the spec, its generation and the spec's manager
/// (kubectl's server-side apply), and records the writer as the status's manager.
#[tokio::test]
async fn a_status_write_without_the_spec_keeps_the_spec_and_its_manager() {
    let c = TestCluster::start_with_agentrt_crds().await;
    c.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=author",
            "-f",
            "-",
        ],
        &run_yaml(),
    );
    let client = c.client();
    let uri = format!(
        "/apis/agentrt.dev/v1alpha1/namespaces/{}/agentruns/refund-1042",
        c.namespace()
    );
    let get = |client: kube::Client, uri: String| async move {
        let text = client
            .request_text(http::Request::get(uri).body(Vec::new()).expect("request"))
            .await
            .expect("GET the run");
        serde_json::from_str::<serde_json::Value>(&text).expect("JSON")
    };
    let before = get(client.clone(), uri.clone()).await;
    // The metadata as read, managedFields included, as the runtime sends it.
    let body = serde_json::json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": before["metadata"],
        "status": {"phase": "Running", "stepCount": 0},
    });
    let answer = client
        .request_text(
            http::Request::put(format!("{uri}/status?fieldManager=runtime"))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&body).expect("body"))
                .expect("request"),
        )
        .await
        .expect("a status write without the spec is accepted");
    let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(
        answer["spec"], before["spec"],
        "the answer shows the stored spec"
    );
    let after = get(client, uri).await;
    assert_eq!(after["spec"], before["spec"], "the spec is kept");
    assert_eq!(after["status"]["phase"], "Running");
    assert_eq!(
        after["metadata"]["generation"], before["metadata"]["generation"],
        "a status write does not move the generation"
    );
    let managers = after["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .clone();
    let author = managers
        .iter()
        .find(|m| m["manager"] == "author")
        .unwrap_or_else(|| panic!("the spec's manager is kept: {managers:?}"));
    assert!(
        author["fieldsV1"]["f:spec"]["f:goal"].is_object(),
        "the author still owns spec.goal: {author}"
    );
    let runtime = managers
        .iter()
        .find(|m| m["manager"] == "runtime")
        .unwrap_or_else(|| panic!("the status writer is a manager: {managers:?}"));
    assert_eq!(runtime["subresource"], "status", "{runtime}");
    assert!(
        runtime["fieldsV1"]["f:status"]["f:phase"].is_object(),
        "the status writer owns status.phase: {runtime}"
    );
    assert!(
        runtime["fieldsV1"].get("f:spec").is_none(),
        "the status writer owns nothing of the spec: {runtime}"
    );
}
