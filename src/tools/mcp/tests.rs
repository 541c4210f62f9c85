//! The MCP client against the sample MCP server (`tools::samples::mcp`, in process) and a
//! server that echoes what it is sent: sessions, both protocol revisions, the idempotency
//! headers and `_meta`, a forgotten session, a server that is down, and secrets kept out of
//! every text (docs/design.md section 6). The Python SDK's server is in tests/mcp_client.rs.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;

const TOKEN: &str = "s3cr3t-t0ken-of-the-shop";

async fn sample_server() -> String {
    let addr = crate::tools::samples::serve(
        "127.0.0.1:0".parse().unwrap(),
        Duration::from_millis(10),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    format!("http://{addr}/mcp")
}

fn client(url: &str) -> McpClient {
    McpClient::new(
        crate::tools::http::client().unwrap(),
        url,
        vec![("Authorization".into(), format!("Bearer {TOKEN}"))],
    )
}

fn call(name: &str, arguments: Value, key: &str) -> ToolsCall {
    ToolsCall {
        name: name.into(),
        arguments,
        idempotency_key: key.into(),
        attempt: 1,
        run: "default/refund-1042".into(),
        holder: "replica-a".into(),
        timeout: Duration::from_secs(5),
        task_ttl: None,
    }
}

#[tokio::test]
async fn the_sample_server_lists_and_answers_a_read_only_call() {
    let url = sample_server().await;
    let mut c = client(&url);
    let session = c.initialize().await.unwrap().clone();
    assert_eq!(session.protocol, ProtocolVersion::V2026_07_28);
    assert_eq!(session.id, None, "2026-07-28 has no session");
    assert_eq!(session.server_info["name"], "agentrt-sample-shop");
    let tools = c.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["lookup_order", "issue_refund"]);
    match c
        .call_tool(&call("lookup_order", json!({"order": 1042}), "u/0"))
        .await
    {
        CallOutcome::Result {
            content,
            structured,
            answer,
            ..
        } => {
            assert!(structured);
            assert_eq!(content["damaged"], true);
            assert!(answer.complete && answer.bytes > 0 && answer.sha256.starts_with("sha256:"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_mutation_is_recorded_once_per_idempotency_key() {
    let url = sample_server().await;
    let mut c = client(&url);
    let refund =
        |key: &'static str| call("issue_refund", json!({"order": 1042, "amount": 25}), key);
    let content = |o: CallOutcome| match o {
        CallOutcome::Result { content, .. } => content,
        other => panic!("{other:?}"),
    };
    let first = content(c.call_tool(&refund("u/1")).await);
    let again = content(c.call_tool(&refund("u/1")).await);
    let other = content(c.call_tool(&refund("u/2")).await);
    assert_eq!(
        (first["refundId"].as_str(), first.get("replayed")),
        (Some("rf-1"), None)
    );
    assert_eq!(
        (again["refundId"].as_str(), again["replayed"].as_bool()),
        (Some("rf-1"), Some(true))
    );
    assert_eq!(other["refundId"], "rf-2");
}

#[tokio::test]
async fn every_protocol_revision_is_negotiated() {
    let url = sample_server().await;
    for version in ProtocolVersion::ALL {
        let mut c = client(&url).with_protocol(version);
        assert_eq!(c.initialize().await.unwrap().protocol, version);
        assert_eq!(c.list_tools().await.unwrap().len(), 2);
    }
}

#[tokio::test]
async fn a_forgotten_session_is_replaced_and_the_call_sent_once() {
    let url = sample_server().await;
    let mut c = client(&url).with_protocol(ProtocolVersion::V2025_11_25);
    let old = c.initialize().await.unwrap().id.clone().unwrap();
    let ended = reqwest::Client::new()
        .delete(&url)
        .header(SESSION_ID, &old)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    let outcome = c
        .call_tool(&call(
            "issue_refund",
            json!({"order": 7, "amount": 1}),
            "u/9",
        ))
        .await;
    assert!(matches!(outcome, CallOutcome::Result { .. }), "{outcome:?}");
    let new = c.session().unwrap().id.clone().unwrap();
    assert_ne!(new, old);
    let again = c
        .call_tool(&call(
            "issue_refund",
            json!({"order": 7, "amount": 1}),
            "u/9",
        ))
        .await;
    match again {
        CallOutcome::Result { content, .. } => assert_eq!(
            (content["refundId"].as_str(), content["replayed"].as_bool()),
            (Some("rf-1"), Some(true))
        ),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_server_that_is_down_gets_nothing_sent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let mut c = client(&url);
    let err = c.list_tools().await.unwrap_err();
    assert!(matches!(err, McpError::NotSent { .. }), "{err:?}");
    let outcome = c
        .call_tool(&call("lookup_order", json!({"order": 1}), "u/1"))
        .await;
    match outcome {
        CallOutcome::NotSent { detail, .. } => {
            assert!(detail.contains("initialize failed"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

/// A server that answers every request 401 with the headers it was sent in the body.
async fn echo_server(status: StatusCode) -> String {
    let router = Router::new().route(
        "/mcp",
        post(move |headers: HeaderMap| async move {
            let echoed: Vec<String> = headers
                .iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap_or("")))
                .collect();
            (status, echoed.join("\n"))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn a_token_never_appears_in_debug_output_or_errors() {
    let url = echo_server(StatusCode::UNAUTHORIZED).await;
    let mut c = client(&url);
    let debug = format!("{c:?}");
    assert!(
        !debug.contains(TOKEN) && debug.contains("Authorization"),
        "{debug}"
    );
    let err = c.initialize().await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("<redacted>"),
        "the echo carried the token: {text}"
    );
    assert!(!text.contains(TOKEN), "{text}");
    let outcome = c.call_tool(&call("lookup_order", json!({}), "u/1")).await;
    let text = format!("{outcome:?}");
    assert!(
        matches!(outcome, CallOutcome::NotSent { .. }) && !text.contains(TOKEN),
        "{text}"
    );
    let url = echo_server(StatusCode::OK).await;
    let mut c = client(&url);
    let text = format!("{:?}", c.initialize().await.unwrap_err());
    assert!(!text.contains(TOKEN), "{text}");
}

#[tokio::test]
async fn the_call_carries_the_idempotency_headers_and_meta() {
    let seen: std::sync::Arc<std::sync::Mutex<Vec<(HeaderMap, Value)>>> = Default::default();
    let record = seen.clone();
    let router = Router::new().route(
        "/mcp",
        post(move |headers: HeaderMap, axum::Json(body): axum::Json<Value>| {
            let record = record.clone();
            async move {
                record.lock().unwrap().push((headers, body.clone()));
                let result = match body["method"].as_str() {
                    Some("initialize") => json!({"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "echo"}}),
                    _ => json!({"content": [{"type": "text", "text": "ok"}]}),
                };
                if body.get("id").is_none() {
                    return (StatusCode::ACCEPTED, [("mcp-session-id", "s-1")], String::new());
                }
                (StatusCode::OK, [("mcp-session-id", "s-1")], json!({"jsonrpc": "2.0", "id": body["id"], "result": result}).to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut c = client(&format!("http://{addr}/mcp"));
    let mut the_call = call("issue_refund", json!({"order": 1}), "uid-1/3");
    the_call.attempt = 2;
    match c.call_tool(&the_call).await {
        CallOutcome::Result {
            content,
            structured,
            ..
        } => {
            assert!(!structured);
            assert_eq!(content, json!([{"type": "text", "text": "ok"}]));
        }
        other => panic!("{other:?}"),
    }
    let seen = seen.lock().unwrap();
    let methods: Vec<&str> = seen
        .iter()
        .filter_map(|(_, b)| b["method"].as_str())
        .collect();
    // server/discover first: an answer without supportedVersions is no modern server, so the
    // handshake follows.
    assert_eq!(
        methods,
        [
            "server/discover",
            "initialize",
            "notifications/initialized",
            "tools/call"
        ]
    );
    let (headers, body) = &seen[3];
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(header("idempotency-key"), "uid-1/3");
    assert_eq!(header("agentrt-attempt"), "2");
    assert_eq!(header("agentrt-run"), "default/refund-1042");
    assert_eq!(header("mcp-session-id"), "s-1");
    assert_eq!(header("mcp-protocol-version"), "2025-06-18");
    assert_eq!(header("authorization"), format!("Bearer {TOKEN}"));
    assert_eq!(
        body["params"]["_meta"],
        json!({"agentrt.dev/idempotencyKey": "uid-1/3", "agentrt.dev/attempt": 2})
    );
    // The discover probe speaks 2026-07-28 with its envelope; the initialize has no session
    // and no version header yet.
    assert_eq!(seen[0].0.get("mcp-protocol-version").unwrap(), "2026-07-28");
    assert_eq!(seen[0].0.get("mcp-method").unwrap(), "server/discover");
    assert_eq!(
        seen[0].1["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        "2026-07-28"
    );
    assert!(
        seen[1].0.get("mcp-session-id").is_none()
            && seen[1].0.get("mcp-protocol-version").is_none()
    );
    assert_eq!(seen[1].1["params"]["protocolVersion"], "2025-11-25");
}

/// A server answering every request with `body` as `content_type` (and a session id).
async fn canned_server(content_type: &'static str, body: fn(&Value) -> String) -> String {
    let router = Router::new().route(
        "/mcp",
        post(move |axum::Json(message): axum::Json<Value>| async move {
            let method = message["method"].as_str().unwrap_or("");
            if message.get("id").is_none() {
                return (StatusCode::ACCEPTED, [("content-type", "application/json")], String::new());
            }
            let text = if method == "initialize" {
                json!({"jsonrpc": "2.0", "id": message["id"], "result": {"protocolVersion": "2025-03-26", "capabilities": {}, "serverInfo": {}}}).to_string()
            } else {
                body(&message)
            };
            let ct = if method == "initialize" { "application/json" } else { content_type };
            (StatusCode::OK, [("content-type", ct)], text)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn an_sse_answer_is_read_to_the_response_past_notifications_server_requests_and_other_ids() {
    let url = canned_server("text/event-stream", |m| {
        let id = &m["id"];
        format!(
            ": keep-alive\n\nevent: message\ndata: {}\n\ndata: {}\n\ndata: {}\n\nevent: message\nid: 4\ndata: {}\n\n",
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}),
            json!({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"}),
            json!({"jsonrpc": "2.0", "id": 999, "result": {"content": []}}),
            json!({"jsonrpc": "2.0", "id": id, "result": {"content": [{"type": "text", "text": "mine"}]}}),
        )
    })
    .await;
    let mut c = client(&url);
    match c.call_tool(&call("t", json!({}), "u/1")).await {
        CallOutcome::Result {
            content, answer, ..
        } => {
            assert_eq!(content[0]["text"], "mine");
            assert!(!answer.complete, "reading stops at the response");
        }
        other => panic!("{other:?}"),
    }
    let url = canned_server("text/event-stream", |_| {
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n".to_string()
    })
    .await;
    let outcome = client(&url).call_tool(&call("t", json!({}), "u/1")).await;
    assert!(
        matches!(outcome, CallOutcome::Unknown { .. }),
        "a stream that ends without the response: {outcome:?}"
    );
}

#[tokio::test]
async fn a_json_batch_answer_is_searched_for_the_response() {
    let url = canned_server("application/json", |m| {
        json!([
            {"jsonrpc": "2.0", "method": "notifications/message"},
            {"jsonrpc": "2.0", "id": m["id"], "result": {"content": [], "isError": true}}
        ])
        .to_string()
    })
    .await;
    let outcome = client(&url).call_tool(&call("t", json!({}), "u/1")).await;
    assert!(
        matches!(outcome, CallOutcome::ToolReportedError { .. }),
        "{outcome:?}"
    );
    let url = canned_server("application/json", |_| "{not json".to_string()).await;
    let outcome = client(&url).call_tool(&call("t", json!({}), "u/1")).await;
    assert!(
        matches!(outcome, CallOutcome::InvalidAnswer { .. }),
        "{outcome:?}"
    );
}

/// Collects what the tracing subscriber writes.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_token_never_appears_in_the_logs_even_at_trace_level() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let url = sample_server().await;
    let mut c = client(&url);
    c.list_tools().await.unwrap();
    c.call_tool(&call("lookup_order", json!({"order": 1}), "u/1"))
        .await;
    let refused = echo_server(StatusCode::UNAUTHORIZED).await;
    let err = client(&refused).initialize().await.unwrap_err();
    tracing::warn!(%err, "initialize failed");
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        logs.contains("initialize failed") && logs.contains("<redacted>"),
        "the capture works: {logs}"
    );
    assert!(!logs.contains(TOKEN), "{logs}");
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_call_counts_as_not_sent() {
    let hits: std::sync::Arc<std::sync::atomic::AtomicUsize> = Default::default();
    let seen = hits.clone();
    let router = Router::new()
        .route(
            "/mcp",
            post(|| async {
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [("location", "/elsewhere")],
                    "",
                )
            }),
        )
        .route(
            "/elsewhere",
            post(move || {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "{}" }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut c = client(&format!("http://{addr}/mcp"));
    let err = c.initialize().await.unwrap_err();
    assert!(
        matches!(err, McpError::HttpStatus { status: 307, .. }),
        "{err:?}"
    );
    let outcome = c.call_tool(&call("t", json!({}), "u/1")).await;
    assert!(
        matches!(outcome, CallOutcome::NotSent { .. }),
        "{outcome:?}"
    );
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 0);
}
