//! The MCP client against a real MCP server: the official Python SDK's FastMCP over
//! Streamable HTTP (tests/fixtures/mcp_server.py, installed by scripts/install-mcp), in its
//! JSON and SSE answer modes (docs/design.md section 6; docs/behaviours.md 60-63). Each test
//! starts its own server process and kills it at the end.

mod support;

use std::time::{Duration, Instant};

use agentrt::api::SideEffect;
use agentrt::engine::pins::{self, PinCheck};
use agentrt::tools::mcp::{CallOutcome, McpError, ProtocolVersion};
use serde_json::{json, Value};
use support::mcpserver::{call, client, result, PyServer};

/// FastMCP answers a `-> str` tool with `structuredContent: {result: "<the string>"}`.
fn returned_json(outcome: CallOutcome) -> Value {
    let content = result(outcome);
    serde_json::from_str(content["result"].as_str().expect("result string")).unwrap()
}

fn calls_of<'a>(calls: &'a [Value], tool: &str) -> Vec<&'a Value> {
    calls.iter().filter(|c| c["tool"] == tool).collect()
}

#[tokio::test]
async fn a_read_only_call_answers_its_result_in_json_and_in_sse() {
    for mode in [&["--json"][..], &[][..]] {
        let server = PyServer::start(mode);
        let mut c = client(&server);
        let order = returned_json(
            c.call_tool(&call("lookup_order", json!({"order": 1042}), "u/0"))
                .await,
        );
        assert_eq!(
            order,
            json!({"order": 1042, "status": "delivered", "damaged": true}),
            "{mode:?}"
        );
        match c.call_tool(&call("structured", json!({}), "u/1")).await {
            CallOutcome::Result {
                content,
                structured,
                answer,
                ..
            } => {
                assert!(structured);
                assert_eq!(content, json!({"total": 250, "currency": "EUR"}));
                assert!(answer.sha256.starts_with("sha256:") && answer.bytes > 0);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn the_sse_mode_really_answers_an_event_stream() {
    let server = PyServer::start(&[]);
    let answer = reqwest::Client::new()
        .post(server.url())
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()["content-type"], "text/event-stream");
    let mut c = client(&server);
    assert_eq!(c.list_tools().await.unwrap().len(), 9);
}

#[tokio::test]
async fn is_error_is_the_tool_reporting_an_error_and_a_json_rpc_error_is_an_mcp_error() {
    let server = PyServer::start(&["--json"]);
    let mut c = client(&server);
    match c.call_tool(&call("fails", json!({}), "u/1")).await {
        CallOutcome::ToolReportedError { content, .. } => {
            assert!(
                content[0]["text"]
                    .as_str()
                    .unwrap()
                    .contains("the warehouse is closed"),
                "{content}"
            )
        }
        other => panic!("{other:?}"),
    }
    match c.call_tool(&call("rpc_error", json!({}), "u/2")).await {
        CallOutcome::RpcError {
            code,
            message,
            data,
            ..
        } => {
            assert_eq!((code, message.as_str()), (-32001, "the shop is on fire"));
            assert_eq!(data, Some(json!({"retry": false})));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_is_down_gets_nothing_sent() {
    let server = PyServer::start(&["--json"]);
    let mut c = client(&server);
    drop(server);
    assert!(matches!(
        c.list_tools().await,
        Err(McpError::NotSent { .. })
    ));
    let outcome = c
        .call_tool(&call(
            "issue_refund",
            json!({"order": 1, "amount": 1}),
            "u/1",
        ))
        .await;
    assert!(
        matches!(outcome, CallOutcome::NotSent { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_call_that_hangs_is_unknown_after_its_timeout_and_was_sent_exactly_once() {
    for mode in [&["--json"][..], &[][..]] {
        let server = PyServer::start(mode);
        let mut c = client(&server);
        let mut hang = call("hang", json!({}), "u/5");
        hang.timeout = Duration::from_secs(1);
        let started = Instant::now();
        let outcome = c.call_tool(&hang).await;
        assert!(
            matches!(outcome, CallOutcome::Unknown { .. }),
            "{outcome:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let calls = server.calls().await;
        assert_eq!(calls_of(&calls, "hang").len(), 1, "{mode:?}: {calls:?}");
    }
}

#[tokio::test]
async fn a_session_the_server_forgot_is_replaced_and_the_call_runs_once() {
    for mode in [&["--json"][..], &[][..]] {
        let server = PyServer::start(mode);
        let mut c = client(&server);
        let old = c
            .initialize()
            .await
            .unwrap()
            .id
            .clone()
            .expect("a session id");
        assert_eq!(server.control("forget-sessions").await["forgotten"], 1);
        let refund = returned_json(
            c.call_tool(&call(
                "issue_refund",
                json!({"order": 7, "amount": 5}),
                "u/7",
            ))
            .await,
        );
        assert_eq!(refund["refundId"], "rf-1");
        assert_ne!(c.session().unwrap().id.as_deref(), Some(old.as_str()));
        assert_eq!(calls_of(&server.calls().await, "issue_refund").len(), 1);
        server.control("forget-sessions").await;
        assert_eq!(
            c.list_tools().await.unwrap().len(),
            9,
            "{mode:?}: a list reopens the session too"
        );
    }
}

#[tokio::test]
async fn a_10_mib_answer_is_cut_hashed_and_wedges_nothing() {
    for mode in [&["--json"][..], &[][..]] {
        let server = PyServer::start(mode);
        let hashes: Vec<String> = {
            let mut out = Vec::new();
            for _ in 0..2 {
                let mut c = client(&server).with_bounds(1024 * 1024, 64 * 1024 * 1024);
                let started = Instant::now();
                match c.call_tool(&call("big", json!({}), "u/1")).await {
                    CallOutcome::TooLarge { max, answer, .. } => {
                        assert_eq!(max, 1024 * 1024);
                        assert!(answer.complete, "{mode:?}: read to its end");
                        assert!(answer.bytes > 10 * 1024 * 1024, "{mode:?}: {answer:?}");
                        assert!(answer.sha256.starts_with("sha256:") && answer.sha256.len() == 71);
                        out.push(answer.sha256);
                    }
                    other => panic!("{other:?}"),
                }
                assert!(started.elapsed() < Duration::from_secs(20));
                let after = returned_json(
                    c.call_tool(&call("lookup_order", json!({"order": 3}), "u/2"))
                        .await,
                );
                assert_eq!(after["order"], 3, "{mode:?}: the client still works");
            }
            out
        };
        assert_eq!(
            hashes[0], hashes[1],
            "{mode:?}: the same answer hashes alike"
        );
        let mut c = client(&server).with_bounds(1024 * 1024, 2 * 1024 * 1024);
        match c.call_tool(&call("big", json!({}), "u/3")).await {
            CallOutcome::TooLarge { answer, .. } => {
                assert!(
                    !answer.complete && answer.bytes >= 2 * 1024 * 1024,
                    "{answer:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn tools_list_follows_every_page() {
    let paged = PyServer::start(&["--json", "--page-size", "2"]);
    let whole = PyServer::start(&["--json"]);
    let listed = client(&paged).list_tools().await.unwrap();
    let at_once = client(&whole).list_tools().await.unwrap();
    let names = |tools: &[Value]| -> Vec<String> {
        tools
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed.len(), 9);
    assert_eq!(names(&listed), names(&at_once));
    assert_eq!(
        names(&listed)[..3],
        ["lookup_order", "issue_refund", "fails"]
    );
}

#[tokio::test]
async fn both_protocol_revisions_are_negotiated_and_the_header_sent_only_for_2025_06_18() {
    for (version, header) in [
        (ProtocolVersion::V2025_03_26, None),
        (ProtocolVersion::V2025_06_18, Some("2025-06-18")),
    ] {
        let server = PyServer::start(&[]);
        let mut c = client(&server).with_protocol(version);
        assert_eq!(c.initialize().await.unwrap().protocol, version);
        returned_json(
            c.call_tool(&call("lookup_order", json!({"order": 1}), "u/1"))
                .await,
        );
        let calls = server.calls().await;
        assert_eq!(
            calls[0]["headers"]
                .get("mcp-protocol-version")
                .and_then(Value::as_str),
            header
        );
    }
}

#[tokio::test]
async fn a_mutation_counts_once_per_idempotency_key_sent_as_header_and_meta() {
    let server = PyServer::start(&["--json"]);
    let mut c = client(&server);
    let first = returned_json(
        c.call_tool(&call(
            "issue_refund",
            json!({"order": 1042, "amount": 25}),
            "uid/1",
        ))
        .await,
    );
    let again = returned_json(
        c.call_tool(&call(
            "issue_refund",
            json!({"order": 1042, "amount": 25}),
            "uid/1",
        ))
        .await,
    );
    assert_eq!(first["refundId"], again["refundId"]);
    assert_eq!(again["replayed"], true);
    let calls = server.calls().await;
    let seen = &calls_of(&calls, "issue_refund")[0];
    assert_eq!(seen["headers"]["idempotency-key"], "uid/1");
    assert_eq!(seen["headers"]["agentrt-attempt"], "1");
    assert_eq!(seen["headers"]["agentrt-run"], "default/mcp-shop");
    assert_eq!(
        seen["meta"],
        json!({"agentrt.dev/idempotencyKey": "uid/1", "agentrt.dev/attempt": 1})
    );
}

#[tokio::test]
async fn a_definition_the_server_changed_no_longer_matches_its_pin() {
    let server = PyServer::start(&["--json"]);
    let url = server.url();
    let mut c = client(&server);
    let listed = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    let flip = listed.iter().find(|d| d.name == "flip").unwrap().clone();
    let pin = pins::pin("flip", &url, flip).unwrap();
    assert_eq!(pins::check(&pin, &listed).unwrap(), PinCheck::Unchanged);
    let relisted = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    assert_eq!(
        pins::check(&pin, &relisted).unwrap(),
        PinCheck::Unchanged,
        "listing twice pins alike"
    );
    server.control("change-definition").await;
    let changed = pins::definitions(&url, &c.list_tools().await.unwrap()).unwrap();
    assert!(matches!(
        pins::check(&pin, &changed).unwrap(),
        PinCheck::Changed { .. }
    ));
}

#[tokio::test]
async fn annotations_are_pinned_and_those_claiming_more_danger_disagree() {
    let server = PyServer::start(&["--json"]);
    let url = server.url();
    let listed = pins::definitions(&url, &client(&server).list_tools().await.unwrap()).unwrap();
    let hints = |name: &str| {
        listed
            .iter()
            .find(|d| d.name == name)
            .unwrap()
            .annotations
            .clone()
    };
    let wipe = hints("wipe");
    assert_eq!(wipe.as_ref().and_then(|a| a.destructive_hint), Some(true));
    let said: Vec<&str> = pins::hint_disagreements(wipe.as_ref(), SideEffect::ReadOnly)
        .iter()
        .map(|d| d.hint)
        .collect();
    assert_eq!(said, ["readOnlyHint", "destructiveHint"]);
    assert!(pins::hint_disagreements(wipe.as_ref(), SideEffect::Destructive).is_empty());
    assert!(
        pins::hint_disagreements(hints("lookup_order").as_ref(), SideEffect::ReadOnly).is_empty()
    );
}
