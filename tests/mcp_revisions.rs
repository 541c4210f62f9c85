//! The MCP client choosing a protocol revision against real servers (issue 38 item 1;
//! docs/design.md section 6, "MCP revisions"): the official Python SDK 2.3.0's MCPServer
//! (tests/fixtures/mcp_server_modern.py, `scripts/install-mcp 2.3.0`), which answers
//! `server/discover` and stateless 2026-07-28 requests beside the initialize handshake, and the
//! SDK 1.30.0's FastMCP (tests/fixtures/mcp_server.py), which knows only the handshake. Each
//! test starts its own server process and kills it at the end.

mod support;

use agentrt::engine::pins::{self, PinCheck};
use agentrt::tools::mcp::ProtocolVersion;
use serde_json::{json, Value};
use support::mcpserver::{call, client, result, PyServer};

/// A tool's text result as JSON, whether the server gave it as the SDK's `{result: text}`
/// structured content or as a text block.
fn text_json(content: &Value) -> Value {
    let text = content["result"]
        .as_str()
        .or_else(|| content[0]["text"].as_str())
        .unwrap_or_else(|| panic!("no text in {content}"));
    serde_json::from_str(text).expect("the tool answers JSON text")
}

#[tokio::test]
async fn a_modern_server_is_spoken_to_statelessly_at_2026_07_28_in_json_and_sse() {
    for args in [&["--json"][..], &[][..], &["--stateless"][..]] {
        let server = PyServer::start_modern(args);
        let mut c = client(&server);
        let session = c.initialize().await.unwrap().clone();
        assert_eq!(session.protocol, ProtocolVersion::V2026_07_28, "{args:?}");
        assert_eq!(session.id, None, "2026-07-28 has no session");
        assert_eq!(session.server_info["name"], "agentrt-test-modern-shop");
        let tools = c.list_tools().await.unwrap();
        assert!(
            tools.iter().any(|t| t["name"] == "lookup_order"),
            "{tools:?}"
        );
        let answer = result(
            c.call_tool(&call("lookup_order", json!({"order": 2}), "u/0"))
                .await,
        );
        assert_eq!(text_json(&answer)["status"], "delivered", "{answer}");
        let calls = server.calls().await;
        assert_eq!(calls.len(), 1, "{calls:?}");
        let seen = &calls[0];
        assert_eq!(seen["protocol"], "2026-07-28", "{seen}");
        let headers = &seen["headers"];
        assert_eq!(headers["mcp-protocol-version"], "2026-07-28");
        assert_eq!(headers["mcp-method"], "tools/call");
        assert_eq!(headers["mcp-name"], "lookup_order");
        assert_eq!(headers["idempotency-key"], "u/0");
        assert!(
            headers.get("mcp-session-id").is_none(),
            "no session header: {headers}"
        );
    }
}

#[tokio::test]
async fn a_handshake_only_server_falls_back_to_initialize_at_the_highest_revision_it_answers() {
    let server = PyServer::start(&["--json"]);
    let mut c = client(&server);
    let session = c.initialize().await.unwrap().clone();
    assert!(
        !session.protocol.is_stateless(),
        "the 1.x server has no server/discover: {session:?}"
    );
    assert!(
        session.protocol >= ProtocolVersion::V2025_06_18,
        "initialize proposed 2025-11-25 and the server answered {:?}",
        session.protocol
    );
    assert!(session.id.is_some(), "a handshake server gives a session");
    eprintln!(
        "mcp_revisions: mcp 1.30.0 FastMCP negotiated {}",
        session.protocol.as_str()
    );
    result(
        c.call_tool(&call("lookup_order", json!({"order": 1}), "u/1"))
            .await,
    );
    let calls = server.calls().await;
    assert_eq!(
        calls[0]["headers"]["mcp-protocol-version"],
        session.protocol.as_str()
    );
}

#[tokio::test]
async fn a_revision_asked_for_is_the_one_spoken() {
    for version in [
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_03_26,
    ] {
        let server = PyServer::start_modern(&["--json"]);
        let mut c = client(&server).with_protocol(version);
        let session = c.initialize().await.unwrap().clone();
        assert_eq!(session.protocol, version);
        result(
            c.call_tool(&call("lookup_order", json!({"order": 3}), "u/3"))
                .await,
        );
        let calls = server.calls().await;
        assert_eq!(calls[0]["protocol"], version.as_str(), "{calls:?}");
        assert!(calls[0]["headers"].get("mcp-method").is_none());
    }
    // 2026-07-28 asked of a server that does not speak it: refused, naming what happened.
    let legacy = PyServer::start(&["--json"]);
    let err = client(&legacy)
        .with_protocol(ProtocolVersion::V2026_07_28)
        .initialize()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("2026-07-28"), "{err}");
}

#[tokio::test]
async fn a_mutation_at_2026_07_28_counts_once_per_idempotency_key() {
    let server = PyServer::start_modern(&["--json"]);
    let mut c = client(&server);
    let first = text_json(&result(
        c.call_tool(&call(
            "issue_refund",
            json!({"order": 7, "amount": 20}),
            "run/3",
        ))
        .await,
    ));
    let again = text_json(&result(
        c.call_tool(&call(
            "issue_refund",
            json!({"order": 7, "amount": 20}),
            "run/3",
        ))
        .await,
    ));
    assert_eq!(first["refundId"], again["refundId"]);
    assert_eq!(again["replayed"], true);
}

#[tokio::test]
async fn a_definition_the_modern_server_changed_no_longer_matches_its_pin() {
    let server = PyServer::start_modern(&["--json"]);
    let url = server.url();
    let mut c = client(&server);
    let listed = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    let flip = listed.iter().find(|d| d.name == "flip").unwrap().clone();
    let pin = pins::pin("flip", &url, flip).unwrap();
    let relisted = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    assert_eq!(pins::check(&pin, &relisted).unwrap(), PinCheck::Unchanged);
    server.control("change-definition").await;
    let changed = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    assert!(matches!(
        pins::check(&pin, &changed).unwrap(),
        PinCheck::Changed { .. }
    ));
}
