//! MCP servers that are OAuth 2.0 resource servers (docs/design.md section 6, "MCP OAuth"):
//! the official Python SDK's FastMCP with its bearer-token middleware and RFC 9728 metadata
//! (tests/fixtures/mcp_oauth_server.py, with a client_credentials authorization server on the
//! same origin). The controller discovers the authorization server, gets a token for the
//! server as its RFC 8707 resource with the client credentials of a Secret, caches it across
//! calls and runs, gets a new one after a 401, and never shows the secret or a token.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::controller::*;
use support::mcpserver::PyServer;

const WAIT: Duration = Duration::from_secs(60);
const CLIENT_SECRET: &str = "oauth-client-s3cr3t-7f2a";

fn run(server: &PyServer, name: &str) -> String {
    RunFixture::at("controller/mcp-oauth.yaml")
        .set("MCP", server.url())
        .set("NAME", name)
        .yaml()
}

/// Secret `mcp-oauth` of the test's namespace with client id `agentrt-runs` and `secret`,
/// usable by its runs.
fn client_secret(cluster: &support::cluster::TestCluster, secret: &str) {
    cluster.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "mcp-oauth",
        "--from-literal=client_id=agentrt-runs",
        &format!("--from-literal=client_secret={secret}"),
    ]);
    cluster.kubectl_ok(&[
        "label",
        "secret",
        "mcp-oauth",
        "agentrt.dev/usable-by-runs=true",
    ]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_is_got_with_the_client_credentials_cached_renewed_after_a_401_and_never_shown() {
    let server = PyServer::start_oauth("agentrt-runs", CLIENT_SECRET, 3600);
    let cluster = agentrt_cluster().await;
    client_secret(&cluster, CLIENT_SECRET);
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        cluster.namespace(),
        ControllerSpec::named("oauth").log("trace"),
    );
    cluster.create_run(&run(&server, "first")).await;
    let first = cluster.wait_phase("first", "Completed", WAIT).await;
    let results: Vec<Value> = events_of(&first, "step.tool_finished")
        .iter()
        .map(|e| e["data"].clone())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].to_string().contains("delivered"), "{results:?}");
    let tokens = server.control_get("tokens").await;
    assert_eq!(
        tokens["issued"],
        json!(1),
        "one token served the listing and both calls: {tokens}"
    );
    let request = &tokens["requests"][0];
    assert_eq!(
        request["resource"],
        json!(server.url()),
        "RFC 8707 resource"
    );
    assert_eq!(request["scope"], json!("tools"));

    // The server forgets every token: the next run's listing answers 401, and a new token is
    // got once.
    server.control("revoke").await;
    cluster.create_run(&run(&server, "second")).await;
    let second = cluster.wait_phase("second", "Completed", WAIT).await;
    let tokens = server.control_get("tokens").await;
    assert_eq!(
        tokens["issued"],
        json!(1),
        "a new one after the 401: {tokens}"
    );
    assert_eq!(tokens["requests"].as_array().map(Vec::len), Some(2));
    let issued: Vec<String> = tokens["tokens"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(issued.len(), 1);

    // Never shown: the client secret and the token, in the log, the runs, the events.
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
        ("a status", first.to_string() + &second.to_string()),
    ];
    for (place, text) in &places {
        assert!(
            !text.contains(CLIENT_SECRET),
            "the client secret appears in {place}"
        );
        for token in &issued {
            assert!(
                !text.contains(token.as_str()),
                "the token appears in {place}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_client_credentials_fail_the_run_naming_the_token_endpoint_not_the_secret() {
    let server = PyServer::start_oauth("agentrt-runs", CLIENT_SECRET, 3600);
    let cluster = agentrt_cluster().await;
    client_secret(&cluster, "not-the-secret-9d1e");
    let _controller = start_controller(&cluster, "oauth-bad");
    cluster.create_run(&run(&server, "refused")).await;
    let status = cluster.wait_phase("refused", "Failed", WAIT).await;
    assert_eq!(status["reason"], json!("tool_unavailable"), "{status}");
    let detail = status["reasonDetail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("/token") && detail.contains("invalid_client"),
        "{detail}"
    );
    assert!(!status.to_string().contains("not-the-secret-9d1e"));
}
