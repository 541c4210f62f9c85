//! The http executor against a real local server, one test per ending (docs/behaviours.md 15-17).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use super::*;

type Seen = Arc<Mutex<Vec<BTreeMap<String, String>>>>;

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

async fn tool_server() -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let router = Router::new()
        .route(
            "/ok",
            post(move |headers: HeaderMap, body: Bytes| {
                let record = record.clone();
                async move {
                    let mut map = BTreeMap::new();
                    for (name, value) in &headers {
                        map.insert(
                            name.as_str().to_string(),
                            value.to_str().unwrap_or("").to_string(),
                        );
                    }
                    record.lock().unwrap().push(map);
                    let args: Value = serde_json::from_slice(&body).unwrap();
                    axum::Json(json!({"echo": args}))
                }
            }),
        )
        .route(
            "/fail",
            post(|| async { (StatusCode::CONFLICT, axum::Json(json!({"error": "busy"}))) }),
        )
        .route(
            "/fail-text",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "it broke") }),
        )
        .route(
            "/redirect",
            post(|| async {
                (
                    StatusCode::FOUND,
                    [(http::header::LOCATION, "/ok")],
                    "moved",
                )
            }),
        )
        .route("/text", post(|| async { "plain words" }))
        .route(
            "/binary",
            post(|| async { Bytes::from_static(&[0xff, 0xfe, 0x00, 0x01]) }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                axum::Json(json!({"late": true}))
            }),
        )
        .route(
            "/abort",
            post(|| async {
                (
                    [(ABORT, "the account is frozen")],
                    axum::Json(json!({"frozen": true})),
                )
                    .into_response()
            }),
        );
    (serve(router).await, seen)
}

fn call_to(addr: SocketAddr, path: &str) -> HttpCall {
    HttpCall {
        url: format!("http://{addr}{path}"),
        args: json!({"order": 1042}),
        idempotency_key: "uid-1/3".into(),
        attempt: 2,
        run: "shop/refund-1042".into(),
        holder: "agentrt-test-abcd".into(),
        headers: vec![("X-Api-Key".into(), "secret-value".into())],
        timeout: Duration::from_secs(2),
    }
}

#[tokio::test]
async fn a_2xx_json_answer_is_a_result_and_carries_the_headers() {
    let (addr, seen) = tool_server().await;
    let outcome = call(&client().unwrap(), call_to(addr, "/ok")).await;
    let ToolOutcome::Result {
        status, content, ..
    } = outcome
    else {
        panic!("expected a result, got {outcome:?}")
    };
    assert_eq!(status, 200);
    assert_eq!(content, json!({"echo": {"order": 1042}}));
    let seen = seen.lock().unwrap();
    let headers = &seen[0];
    assert_eq!(headers["idempotency-key"], "uid-1/3");
    assert_eq!(headers["agentrt-attempt"], "2");
    assert_eq!(headers["agentrt-run"], "shop/refund-1042");
    assert_eq!(headers["agentrt-holder"], "agentrt-test-abcd");
    assert_eq!(headers["x-api-key"], "secret-value");
    assert_eq!(headers["content-type"], "application/json");
}

#[tokio::test]
async fn a_non_2xx_answer_is_a_tool_error_keeping_the_body() {
    let (addr, _) = tool_server().await;
    let outcome = call(&client().unwrap(), call_to(addr, "/fail")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, status: Some(409), content, .. }
            if *failure == ToolFailure::HttpStatus && *content == json!({"error": "busy"})),
        "{outcome:?}"
    );
    let outcome = call(&client().unwrap(), call_to(addr, "/fail-text")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, status: Some(500), content, .. }
            if *failure == ToolFailure::HttpStatus && *content == json!("it broke")),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_is_a_tool_error() {
    let (addr, seen) = tool_server().await;
    let outcome = call(&client().unwrap(), call_to(addr, "/redirect")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, status: Some(302), .. } if *failure == ToolFailure::HttpStatus),
        "{outcome:?}"
    );
    assert!(
        seen.lock().unwrap().is_empty(),
        "the redirect target was called"
    );
}

#[tokio::test]
async fn content_that_is_not_json_is_invalid_content_keeping_the_bytes() {
    let (addr, _) = tool_server().await;
    let outcome = call(&client().unwrap(), call_to(addr, "/text")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, content, .. }
            if *failure == ToolFailure::InvalidContent && *content == json!("plain words")),
        "{outcome:?}"
    );
    let outcome = call(&client().unwrap(), call_to(addr, "/binary")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, content, .. }
            if *failure == ToolFailure::InvalidContent && *content == json!({"base64": "//4AAQ=="})),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_refused_connection_is_a_tool_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let outcome = call(&client().unwrap(), call_to(addr, "/ok")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, status: None, .. } if *failure == ToolFailure::ConnectionRefused),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_timeout_after_sending_leaves_the_outcome_unknown() {
    let (addr, _) = tool_server().await;
    let mut request = call_to(addr, "/slow");
    request.timeout = Duration::from_millis(300);
    let outcome = call(&client().unwrap(), request).await;
    assert!(
        matches!(&outcome, ToolOutcome::Unknown { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_connection_lost_after_sending_leaves_the_outcome_unknown() {
    // A server that reads the request and closes the connection without answering.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            drop(socket);
        }
    });
    let outcome = call(&client().unwrap(), call_to(addr, "/ok")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Unknown { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn an_answer_cut_off_mid_body_leaves_the_outcome_unknown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"par")
                .await;
            drop(socket);
        }
    });
    let outcome = call(&client().unwrap(), call_to(addr, "/ok")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Unknown { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn an_abort_header_asks_to_abort_the_run() {
    let (addr, _) = tool_server().await;
    let outcome = call(&client().unwrap(), call_to(addr, "/abort")).await;
    assert!(
        matches!(&outcome, ToolOutcome::Abort { detail, content, .. }
            if detail == "the account is frozen" && *content == json!({"frozen": true})),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_panic_in_the_executor_is_a_tool_error() {
    let outcome = guarded(async {
        if std::hint::black_box(true) {
            panic!("boom");
        }
        ToolOutcome::Unknown {
            detail: String::new(),
            duration_ms: 0,
        }
    })
    .await;
    assert!(
        matches!(&outcome, ToolOutcome::Error { failure, content, .. }
            if *failure == ToolFailure::ExecutorPanic && content["detail"] == "boom"),
        "{outcome:?}"
    );
}

struct Secrets(BTreeMap<(String, String), String>);

impl SecretSource for Secrets {
    async fn secret_value(&self, namespace: &str, secret: &SecretKeyRef) -> Result<String, String> {
        let _ = namespace;
        self.0
            .get(&(secret.name.clone(), secret.key.clone()))
            .cloned()
            .ok_or_else(|| "not found".to_string())
    }
}

#[tokio::test]
async fn headers_from_secrets_are_read_at_call_time() {
    let tool = HttpTool {
        url: "http://127.0.0.1:1/x".into(),
        headers: vec![
            crate::api::HttpHeader {
                name: "X-Plain".into(),
                value: Some("v".into()),
                secret_key_ref: None,
            },
            crate::api::HttpHeader {
                name: "Authorization".into(),
                value: None,
                secret_key_ref: Some(SecretKeyRef {
                    name: "tool-auth".into(),
                    key: "token".into(),
                }),
            },
        ],
        reconcile: None,
    };
    let mut map = BTreeMap::new();
    map.insert(
        ("tool-auth".to_string(), "token".to_string()),
        "Bearer t".to_string(),
    );
    let headers = resolve_headers(&tool, "shop", &Secrets(map)).await.unwrap();
    assert_eq!(
        headers,
        vec![
            ("X-Plain".to_string(), "v".to_string()),
            ("Authorization".to_string(), "Bearer t".to_string())
        ]
    );
    let err = resolve_headers(&tool, "shop", &Secrets(BTreeMap::new()))
        .await
        .unwrap_err();
    assert!(err.contains("Secret shop/tool-auth"), "{err}");
}

/// A status URL answering 202 (with `Retry-After: 0`) `running` times, then `last`.
async fn status_server(
    running: usize,
    last: (StatusCode, String),
) -> (SocketAddr, Arc<Mutex<usize>>) {
    let asked: Arc<Mutex<usize>> = Arc::default();
    let count = asked.clone();
    let router = Router::new().route(
        "/calls/{key}",
        axum::routing::get(
            move |axum::extract::Path(key): axum::extract::Path<String>| {
                let count = count.clone();
                let last = last.clone();
                async move {
                    assert_eq!(key, "uid/0", "the key arrives decoded, as one segment");
                    let n = {
                        let mut n = count.lock().unwrap();
                        *n += 1;
                        *n
                    };
                    if n <= running {
                        return (StatusCode::ACCEPTED, [("retry-after", "0")], String::new())
                            .into_response();
                    }
                    (last.0, last.1).into_response()
                }
            },
        ),
    );
    (serve(router).await, asked)
}

fn status_request(addr: SocketAddr, timeout: Duration) -> status::StatusRequest {
    status::StatusRequest {
        url: format!("http://{addr}/calls/uid%2F0"),
        idempotency_key: "uid/0".into(),
        run: "ns/r".into(),
        holder: "h".into(),
        headers: Vec::new(),
        timeout,
    }
}

#[tokio::test]
async fn a_status_url_is_asked_again_while_running_then_read() {
    let client = client().unwrap();
    let body = json!({"state": "succeeded", "result": {"n": 1}}).to_string();
    let (addr, asked) = status_server(2, (StatusCode::OK, body)).await;
    let answer = status::ask(&client, &status_request(addr, Duration::from_secs(10))).await;
    assert_eq!(
        answer,
        crate::engine::StatusAnswer::Succeeded {
            result: json!({"n": 1})
        }
    );
    assert_eq!(*asked.lock().unwrap(), 3);
}

#[tokio::test]
async fn a_status_url_answers_read_as_the_contract_says() {
    let client = client().unwrap();
    let failed = json!({"state": "failed", "error": "declined"}).to_string();
    let cases = [
        (
            (StatusCode::OK, failed),
            crate::engine::StatusAnswer::Failed {
                error: json!("declined"),
            },
        ),
        (
            (StatusCode::NOT_FOUND, String::new()),
            crate::engine::StatusAnswer::NotFound,
        ),
        (
            (StatusCode::INTERNAL_SERVER_ERROR, "down".into()),
            crate::engine::StatusAnswer::Unsettled {
                said: json!({"status": 500, "body": "down"}),
            },
        ),
        (
            (StatusCode::OK, "not json".into()),
            crate::engine::StatusAnswer::Unsettled {
                said: json!({"status": 200, "body": "not json", "error": "not usable JSON: expected ident at line 1 column 2"}),
            },
        ),
    ];
    let cases = cases.into_iter().chain([(
        (StatusCode::OK, json!({"state": "succeeded"}).to_string()),
        crate::engine::StatusAnswer::Unsettled {
            said: json!({
                "status": 200,
                "body": "{\"state\":\"succeeded\"}",
                "error": "state is succeeded but there is no result",
            }),
        },
    )]);
    for (last, expected) in cases {
        let (addr, _) = status_server(0, last).await;
        let answer = status::ask(&client, &status_request(addr, Duration::from_secs(5))).await;
        assert_eq!(answer, expected);
    }
}

#[tokio::test]
async fn a_status_url_still_running_at_the_timeout_is_unsettled() {
    let client = client().unwrap();
    let (addr, asked) = status_server(usize::MAX, (StatusCode::OK, String::new())).await;
    let answer = status::ask(&client, &status_request(addr, Duration::from_millis(1200))).await;
    let crate::engine::StatusAnswer::Unsettled { said } = answer else {
        panic!("{answer:?}");
    };
    assert!(
        said["error"]
            .as_str()
            .is_some_and(|e| e.contains("still running")),
        "{said}"
    );
    assert!(*asked.lock().unwrap() >= 2);
}
