//! The openai agent's HTTP attempts against a local chat-completions server: what is sent
//! (the rendering, the key), how each kind of answer comes back, and that the key never leaks
//! (docs/design.md section 6; docs/behaviours.md 45-48).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::*;

#[derive(Clone)]
enum Script {
    /// Answer this status, these headers and this body.
    Reply {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// Answer 200 after this long.
    Slow(Duration),
    /// Redirect to `/moved/chat/completions` on the same server.
    Redirect,
}

#[derive(Debug, Clone)]
struct Received {
    path: String,
    authorization: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

#[derive(Clone)]
struct ServerState {
    script: Script,
    received: Arc<Mutex<Vec<Received>>>,
}

struct Server {
    base_url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Server {
    fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

async fn handle(State(state): State<ServerState>, request: Request) -> Response {
    let (path, authorization, content_type) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        (
            request.uri().path().to_string(),
            header("authorization"),
            header("content-type"),
        )
    };
    let body = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    if let Ok(mut received) = state.received.lock() {
        received.push(Received {
            path,
            authorization,
            content_type,
            body,
        });
    }
    match state.script {
        Script::Reply {
            status,
            headers,
            body,
        } => {
            let mut response = (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body,
            )
                .into_response();
            for (name, value) in headers {
                if let Ok(value) = HeaderValue::from_str(&value) {
                    response
                        .headers_mut()
                        .insert(HeaderName::from_static(name), value);
                }
            }
            response
        }
        Script::Slow(delay) => {
            tokio::time::sleep(delay).await;
            (StatusCode::OK, "{}").into_response()
        }
        Script::Redirect => (
            StatusCode::TEMPORARY_REDIRECT,
            [("location", "/moved/chat/completions")],
        )
            .into_response(),
    }
}

async fn serve(script: Script) -> Server {
    let received = Arc::new(Mutex::new(Vec::new()));
    let state = ServerState {
        script,
        received: received.clone(),
    };
    let app = axum::Router::new().fallback(handle).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base_url: format!("http://{addr}/v1"),
        received,
    }
}

fn ok(body: Value) -> Script {
    Script::Reply {
        status: 200,
        headers: vec![("content-type", "application/json".to_string())],
        body: body.to_string(),
    }
}

async fn attempt(server_url: &str, timeout: Duration) -> Result<ModelAnswer, ModelCallError> {
    let client = build_client().expect("client");
    let body = render_request(GOAL, &agent(server_url), &tools(), &[], Some(512));
    call(
        &client,
        &agent(server_url),
        Some(&ApiKey::new(KEY)),
        &body,
        timeout,
    )
    .await
}

const SECOND: Duration = Duration::from_secs(5);

#[tokio::test]
async fn call_posts_the_rendering_with_the_key_and_returns_the_tool_call() {
    let reply = completion(
        tool_message(&[("lookup_order", r#"{"order": 1042}"#)]),
        "tool_calls",
    );
    let server = serve(ok(reply)).await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(answer.status, 200);
    assert_eq!(answer.retry_after_millis, None);
    assert_eq!(
        parse_reply(&answer.body, Some(512)).decision,
        json!({"kind": "tool_call", "tool": "lookup_order", "args": {"order": 1042}})
    );
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert_eq!(
        received[0].authorization.as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(
        received[0].content_type.as_deref(),
        Some("application/json")
    );
    let expected = render_request(GOAL, &agent(&server.base_url), &tools(), &[], Some(512));
    assert_eq!(received[0].body, encode(&expected));
}

#[tokio::test]
async fn call_returns_a_final_answer_via_agentrt_complete() {
    let reply = completion(
        tool_message(&[(COMPLETE_FUNCTION, r#"{"result": {"refunded": 250}}"#)]),
        "tool_calls",
    );
    let server = serve(ok(reply)).await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(
        parse_reply(&answer.body, Some(512)).decision,
        json!({"kind": "complete", "result": {"refunded": 250}})
    );
}

#[tokio::test]
async fn call_returns_truncated_no_tool_call_and_invalid_args_replies_as_answers() {
    let cases = [
        (
            completion(tool_message(&[("lookup_order", r#"{"or"#)]), "length"),
            json!("truncated"),
        ),
        (
            completion(json!({"role": "assistant", "content": "Done."}), "stop"),
            json!("no_tool_call"),
        ),
    ];
    for (reply, failure) in cases {
        let server = serve(ok(reply)).await;
        let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
        let decision = parse_reply(&answer.body, Some(512)).decision;
        assert_eq!(decision["kind"], json!("invalid"));
        assert_eq!(decision["failure"], failure);
    }
    let server = serve(ok(completion(
        tool_message(&[("issue_refund", "amount=250")]),
        "tool_calls",
    )))
    .await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(
        parse_reply(&answer.body, Some(512)).decision,
        json!({"kind": "tool_call", "tool": "issue_refund", "invalidArgs": "amount=250"})
    );
}

#[tokio::test]
async fn rate_limited_answer_surfaces_retry_after() {
    let server = serve(Script::Reply {
        status: 429,
        headers: vec![("retry-after", "7".to_string())],
        body: r#"{"error": {"message": "slow down"}}"#.to_string(),
    })
    .await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(answer.status, 429);
    assert_eq!(answer.retry_after_millis, Some(7_000));
    assert_eq!(
        retry_plan(
            Some(answer.status),
            answer.retry_after_millis,
            1,
            &crate::api::Limits::default(),
            &RunClock::default()
        ),
        RetryDecision::RetryAfter { millis: 7_000 }
    );
}

#[tokio::test]
async fn server_error_is_an_answer_with_its_status() {
    let server = serve(Script::Reply {
        status: 500,
        headers: vec![],
        body: "upstream failed".to_string(),
    })
    .await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(answer.status, 500);
    assert_eq!(&answer.body[..], b"upstream failed");
}

#[tokio::test]
async fn slow_reply_past_the_timeout_is_ambiguous() {
    let server = serve(Script::Slow(Duration::from_secs(3))).await;
    let started = Instant::now();
    let err = attempt(&server.base_url, Duration::from_millis(200))
        .await
        .expect_err("the reply is too slow");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(err, ModelCallError::Ambiguous { .. }), "{err:?}");
    assert_eq!(err.outcome(), AttemptOutcome::NoAnswer);
    assert!(err.retryable());
    assert_eq!(server.received().len(), 1, "the request was sent");
}

#[tokio::test]
async fn redirect_is_not_followed() {
    let server = serve(Script::Redirect).await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    assert_eq!(answer.status, 307);
    let paths: Vec<String> = server.received().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/chat/completions"]);
    assert!(matches!(
        retry_plan(
            Some(answer.status),
            None,
            1,
            &crate::api::Limits::default(),
            &RunClock::default()
        ),
        RetryDecision::GiveUp(_)
    ));
}

#[tokio::test]
async fn connection_refused_is_refused_and_sends_nothing() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let err = attempt(&format!("http://127.0.0.1:{port}/v1"), SECOND)
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, ModelCallError::Refused { .. }), "{err:?}");
    assert_eq!(err.outcome(), AttemptOutcome::NotSent);
    assert!(err.retryable());
}

#[tokio::test]
async fn key_is_refused_over_plain_http_to_a_host_that_is_not_loopback() {
    let started = Instant::now();
    // 10.255.255.1 is unroutable here: a connection attempt would hang until the timeout.
    let err = attempt("http://10.255.255.1/v1", Duration::from_secs(30))
        .await
        .expect_err("the key may not go over plain http");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no connection was tried"
    );
    assert_eq!(
        err,
        ModelCallError::Misconfigured {
            url: "http://10.255.255.1/v1/chat/completions".to_string(),
            detail: "refusing to send the API key over plain http to a host that is not a \
                     loopback address; use an https:// baseURL"
                .to_string(),
        }
    );
    assert_eq!(err.outcome(), AttemptOutcome::NotSent);
    assert!(!err.retryable());
}

#[tokio::test]
async fn base_url_that_is_not_http_is_misconfigured() {
    for base in [
        "ftp://models.example/v1",
        "not a url",
        "unix:/var/run/model",
    ] {
        let err = attempt(base, SECOND).await.expect_err("not http(s)");
        assert!(
            matches!(err, ModelCallError::Misconfigured { .. }),
            "{base}: {err:?}"
        );
    }
}

#[tokio::test]
async fn the_key_appears_in_no_error_display_or_debug() {
    let client = build_client().expect("client");
    let body = json!({"model": "m", "messages": []});
    let slow = serve(Script::Slow(Duration::from_secs(3))).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let key = ApiKey::new(KEY);
    let bad_header_key = ApiKey::new(format!("{KEY}\n"));
    let attempts = [
        ("http://10.255.255.1/v1".to_string(), &key),
        (format!("http://user:{KEY}@10.255.255.1/v1"), &key),
        (slow.base_url.clone(), &key),
        (format!("http://127.0.0.1:{port}/v1"), &key),
        (slow.base_url.clone(), &bad_header_key),
        (format!("{}?key={KEY}", slow.base_url), &key),
    ];
    let mut seen = 0;
    for (base_url, key) in attempts {
        let result = call(
            &client,
            &agent(&base_url),
            Some(key),
            &body,
            Duration::from_millis(200),
        )
        .await;
        let printed = match &result {
            Ok(answer) => format!("{answer:?}"),
            Err(err) => {
                seen += 1;
                format!("{err} | {err:?}")
            }
        };
        assert!(!printed.contains(KEY), "{base_url}: {printed}");
        assert!(!printed.contains("do-not-leak"), "{base_url}: {printed}");
    }
    assert!(seen >= 4, "the attempts failed as intended");
}

#[tokio::test]
async fn an_answer_that_echoes_the_key_has_it_replaced() {
    let echo = format!(r#"{{"error": {{"message": "bad key Bearer {KEY}; again: {KEY}"}}}}"#);
    let server = serve(Script::Reply {
        status: 401,
        headers: vec![],
        body: echo,
    })
    .await;
    let answer = attempt(&server.base_url, SECOND).await.expect("an answer");
    let text = String::from_utf8_lossy(&answer.body).into_owned();
    assert!(!text.contains(KEY), "{text}");
    assert_eq!(
        text,
        r#"{"error": {"message": "bad key Bearer ***; again: ***"}}"#
    );
}
