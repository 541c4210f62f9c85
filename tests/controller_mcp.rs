//! MCP tools end to end (docs/design.md section 6, the `mcp` tool; docs/behaviours.md 60-63,
//! 65): the controller as a child process against the Python MCP SDK's FastMCP server
//! (tests/fixtures/mcp_server.py), on the embedded API server by default.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::controller::*;
use support::mcpserver::PyServer;

const WAIT: Duration = Duration::from_secs(60);

/// The run of tests/fixtures/controller/mcp.yaml named `name` with these decisions.
fn run(server: &str, name: &str, decisions: &str) -> String {
    RunFixture::at("controller/mcp.yaml")
        .set("MCP", server)
        .set("NAME", name)
        .set("DECISIONS", decisions)
        .yaml()
}

/// The `step.tool_finished` events' `error.failure`, in order (`null` for a result).
fn failures(status: &Value) -> Vec<Value> {
    events_of(status, "step.tool_finished")
        .iter()
        .map(|e| e["data"]["error"]["failure"].clone())
        .collect()
}

fn calls_of<'a>(calls: &'a [Value], tool: &str) -> Vec<&'a Value> {
    calls.iter().filter(|c| c["tool"] == tool).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_read_only_call_and_an_approved_remote_mutation_complete_with_their_pins() {
    let server = PyServer::start(&["--json"]);
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let _controller = start_controller(&cluster, "mcp");
    let decisions = "[{kind: tool_call, tool: lookup_order, args: {order: 1042}}, \
                     {kind: tool_call, tool: refund, args: {order: 1042, amount: 25}}, \
                     {kind: complete, result: {refunded: true}}]";
    let approval = cluster
        .run_awaiting_approval(&run(&server.url(), "shop", decisions), "shop", "policy")
        .await;
    let tool = &approval.data["spec"]["request"]["tool"];
    assert_eq!(tool["name"], json!("refund"));
    let pinned = cluster.run_status("shop").await;
    let refund_pin = pinned["toolPins"]
        .as_array()
        .expect("toolPins")
        .iter()
        .find(|p| p["tool"] == "refund")
        .expect("refund is pinned")
        .clone();
    assert_eq!(
        tool["pinSha256"], refund_pin["sha256"],
        "the hash covers the pin"
    );
    assert_eq!(tool["inputSchema"], refund_pin["definition"]["inputSchema"]);
    cluster.decide(&approval, "Approved").await;

    let status = cluster.wait_phase("shop", "Completed", WAIT).await;
    let types = event_types(&status);
    let created = types.iter().position(|t| t == "run.created").unwrap();
    let started = types.iter().position(|t| t == "run.started").unwrap();
    let pinned: Vec<usize> = (0..types.len())
        .filter(|i| types[*i] == "tool.pinned")
        .collect();
    assert_eq!(pinned.len(), 6, "one tool.pinned per mcp tool: {types:?}");
    assert!(
        pinned.iter().all(|i| created < *i && *i < started),
        "{types:?}"
    );
    assert_eq!(failures(&status), [Value::Null, Value::Null]);
    assert_seq_contiguous(&status);

    let calls = server.calls().await;
    assert_eq!(calls_of(&calls, "lookup_order").len(), 1);
    let refunds = calls_of(&calls, "issue_refund");
    assert_eq!(refunds.len(), 1);
    let key = format!(
        "{}/1",
        runs_api(&client, &ns)
            .get("shop")
            .await
            .unwrap()
            .metadata
            .uid
            .unwrap()
    );
    assert_eq!(refunds[0]["headers"]["idempotency-key"], json!(key));
    assert_eq!(refunds[0]["meta"]["agentrt.dev/idempotencyKey"], json!(key));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_definition_changed_mid_run_is_refused_without_a_call_and_the_run_goes_on() {
    let server = PyServer::start(&[]);
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "mcp");
    // The refund waits for a person; meanwhile the server changes flip's definition.
    let decisions = "[{kind: tool_call, tool: refund, args: {order: 1, amount: 1}}, \
                     {kind: tool_call, tool: flip, args: {}}, \
                     {kind: complete, result: {done: true}}]";
    let approval = cluster
        .run_awaiting_approval(
            &run(&server.url(), "changed", decisions),
            "changed",
            "policy",
        )
        .await;
    server.control("change-definition").await;
    cluster.decide(&approval, "Approved").await;

    let status = cluster.wait_phase("changed", "Completed", WAIT).await;
    assert_eq!(
        failures(&status),
        [Value::Null, json!("definition_changed")]
    );
    let calls = server.calls().await;
    assert!(
        calls_of(&calls, "flip").is_empty(),
        "flip was never called: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn is_error_and_a_json_rpc_error_are_tool_errors_the_agent_sees() {
    let server = PyServer::start(&["--json"]);
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "mcp");
    let decisions = "[{kind: tool_call, tool: fails, args: {}}, \
                     {kind: tool_call, tool: rpc_error, args: {}}, \
                     {kind: complete, result: {done: true}}]";
    cluster
        .create_run(&run(&server.url(), "errors", decisions))
        .await;
    let status = cluster.wait_phase("errors", "Completed", WAIT).await;
    assert_eq!(
        failures(&status),
        [json!("tool_reported_error"), json!("mcp_error")]
    );
    let rpc = &status["steps"][1]["observation"]["content"];
    assert_eq!(rpc["code"], json!(-32001), "{rpc}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_down_at_start_fails_the_run_tool_unavailable() {
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "mcp");
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/mcp", listener.local_addr().unwrap())
    };
    cluster.create_run(&run(&down, "down", "[]")).await;
    let status = cluster.wait_phase("down", "Failed", WAIT).await;
    assert_eq!(status["reason"], json!("tool_unavailable"));
    let detail = status["reasonDetail"].as_str().unwrap_or_default();
    assert!(detail.contains(&down), "{detail}");
    assert!(status["steps"].as_array().is_none_or(Vec::is_empty));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hanging_call_interrupted_by_a_crash_is_sent_again_once_approved_with_the_same_key() {
    if !crash_points() {
        return;
    }
    let server = PyServer::start(&["--json"]);
    let cluster = agentrt_cluster().await;
    let decisions = "[{kind: tool_call, tool: hang, args: {}}, \
                     {kind: complete, result: {done: true}}]";
    cluster
        .create_run(&run(&server.url(), "hang", decisions))
        .await;
    let (_first, _second) = crash_then_take_over_in(&cluster, "during-tool", WAIT);
    let approval = cluster
        .wait_approval("hang", "interrupted_side_effect", WAIT)
        .await;
    let shown = &approval.data["spec"]["presentation"]["mcp"];
    assert_eq!(shown["tool"], json!("hang"), "{shown}");
    assert_eq!(shown["server"], json!(server.url()));
    assert_eq!(calls_of(&server.calls().await, "hang").len(), 1);
    cluster.decide(&approval, "Approved").await;

    let deadline = std::time::Instant::now() + WAIT;
    let calls = loop {
        let calls = server.calls().await;
        if calls_of(&calls, "hang").len() >= 2 || std::time::Instant::now() > deadline {
            break calls;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let hangs = calls_of(&calls, "hang");
    assert_eq!(
        hangs.len(),
        2,
        "the server saw exactly two calls: {calls:?}"
    );
    assert_eq!(
        hangs[0]["headers"]["idempotency-key"],
        hangs[1]["headers"]["idempotency-key"]
    );
    assert_eq!(hangs[0]["headers"]["agentrt-attempt"], json!("1"));
    assert_eq!(hangs[1]["headers"]["agentrt-attempt"], json!("2"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls_of(&server.calls().await, "hang").len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn annotations_claiming_more_danger_raise_tool_hints_disagree_and_the_manifest_decides() {
    let server = PyServer::start(&["--json"]);
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "mcp");
    let yaml = RunFixture::at("controller/mcp-hints.yaml")
        .set("MCP", server.url())
        .set("NAME", "hints")
        .yaml();
    cluster.create_run(&yaml).await;
    let status = cluster.wait_phase("hints", "Completed", WAIT).await;
    let condition = status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "ToolHintsDisagree"))
        .unwrap_or_else(|| panic!("no ToolHintsDisagree: {status}"));
    assert_eq!(condition["status"], json!("True"));
    let pinned = events_of(&status, "tool.pinned");
    let hints: Vec<&Value> = pinned[0]["data"]["hintsDisagree"]
        .as_array()
        .map(|h| h.iter().map(|d| &d["hint"]).collect())
        .unwrap_or_default();
    assert_eq!(hints, [&json!("readOnlyHint"), &json!("destructiveHint")]);
    assert_eq!(calls_of(&server.calls().await, "wipe").len(), 1);
}

/// The MCP server's token, as a Secret holds it: distinctive, so a search finds any copy.
const TOKEN: &str = "Bearer mcp-agentrt-test-7d2e91-never-shown";

/// The run of tests/fixtures/controller/mcp.yaml with every tool's server sent the header
/// `Authorization` from the Secret `mcp-token`.
fn run_with_token(server: &str, name: &str, decisions: &str) -> String {
    let mut object: Value = serde_yaml::from_str(&run(server, name, decisions)).expect("YAML");
    for tool in object["spec"]["tools"].as_array_mut().expect("tools") {
        tool["mcp"]["headers"] = json!([
            {"name": "Authorization", "secretKeyRef": {"name": "mcp-token", "key": "authorization"}}
        ]);
    }
    serde_yaml::to_string(&object).expect("YAML")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_token_is_sent_and_never_appears_in_status_events_or_logs() {
    let server = PyServer::start(&["--json"]);
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    create_secret(&client, &ns, "mcp-token", "authorization", TOKEN).await;
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("mcp").log("trace"),
    );
    let decisions = "[{kind: tool_call, tool: lookup_order, args: {order: 1042}}, \
                     {kind: tool_call, tool: rpc_error, args: {}}, \
                     {kind: complete, result: {done: true}}]";
    cluster
        .create_run(&run_with_token(&server.url(), "token", decisions))
        .await;
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/mcp", listener.local_addr().unwrap())
    };
    cluster
        .create_run(&run_with_token(&down, "token-down", "[]"))
        .await;
    let done = cluster.wait_phase("token", "Completed", WAIT).await;
    cluster.wait_phase("token-down", "Failed", WAIT).await;
    let calls = server.calls().await;
    assert_eq!(
        calls_of(&calls, "lookup_order")[0]["headers"]["authorization"],
        json!(TOKEN),
        "the token went where it belongs"
    );
    let places = [
        ("the controller's trace log", controller.log()),
        (
            "the runs",
            cluster.kubectl_ok(&["get", "agentruns", "-o", "json"]),
        ),
        (
            "the Kubernetes Events",
            cluster.kubectl_ok(&["get", "events", "-o", "json"]),
        ),
        ("a status", done.to_string()),
    ];
    let secret = TOKEN.trim_start_matches("Bearer ");
    for (place, text) in places {
        assert!(!text.contains(secret), "the token appears in {place}");
    }
}
