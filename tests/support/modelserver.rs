//! A scripted chat-completions server for the model scenarios (tests/controller_model.rs): a
//! real HTTP server on 127.0.0.1 (axum) that answers `POST {base}/chat/completions` with the
//! next reply of its script (tool calls, final answers, replies with no tool call or cut off,
//! error statuses with `Retry-After`, slow or hanging replies, any usage) and keeps every
//! request exactly as it arrived (body bytes, `Authorization`, arrival time).
//!
//! When the script is used up it answers 400 (not retried), so a run that asks more than the
//! test planned ends `model_unavailable` at once instead of waiting.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The body (JSON text or anything else).
    pub body: String,
    /// Extra response headers.
    pub headers: Vec<(String, String)>,
    /// Wait this long before answering.
    pub delay: Duration,
    /// Never answer.
    pub hang: bool,
    /// Put the request's `Authorization` header into the body in place of `{AUTHORIZATION}`
    /// (a server that echoes what it got).
    pub echo_authorization: bool,
}

/// `usage` of a reply: `prompt_tokens`, `completion_tokens`, and `cached_tokens` when not 0.
pub fn usage(prompt: i64, completion: i64, cached: i64) -> Value {
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if cached != 0 {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    usage
}

fn completion(message: Value, finish_reason: &str, usage: Value) -> String {
    json!({
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "scripted-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": usage,
    })
    .to_string()
}

fn call_message(name: &str, arguments: &Value) -> Value {
    json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{
            "id": "call_x",
            "type": "function",
            "function": {"name": name, "arguments": arguments.to_string()},
        }],
    })
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: String) -> Reply {
        Reply {
            status: 200,
            body,
            headers: vec![("content-type".into(), "application/json".into())],
            delay: Duration::ZERO,
            hang: false,
            echo_authorization: false,
        }
    }

    /// A call of tool `tool` with `args`.
    pub fn tool_call(tool: &str, args: Value, usage: Value) -> Reply {
        Reply::ok(completion(call_message(tool, &args), "tool_calls", usage))
    }

    /// The final answer: a call of `agentrt_complete` with `result`.
    pub fn complete(result: Value, usage: Value) -> Reply {
        Reply::ok(completion(
            call_message("agentrt_complete", &json!({"result": result})),
            "tool_calls",
            usage,
        ))
    }

    /// A reply with text and no tool call.
    pub fn text(content: &str, usage: Value) -> Reply {
        Reply::ok(completion(
            json!({"role": "assistant", "content": content}),
            "stop",
            usage,
        ))
    }

    /// A reply cut off at the output cap (`finish_reason: length`) in the middle of a call.
    pub fn truncated(usage: Value) -> Reply {
        let message = json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_x",
                "type": "function",
                "function": {"name": "lookup_order", "arguments": "{\"order\": 10"},
            }],
        });
        Reply::ok(completion(message, "length", usage))
    }

    /// An answer with `status` and `body`.
    pub fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            ..Reply::ok(String::new())
        }
    }

    /// With `Retry-After: seconds`.
    pub fn retry_after(mut self, seconds: u64) -> Reply {
        self.headers
            .push(("retry-after".into(), seconds.to_string()));
        self
    }

    /// Answered after `delay`.
    pub fn slow(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    /// Never answered.
    pub fn hang() -> Reply {
        Reply {
            hang: true,
            ..Reply::ok(String::new())
        }
    }

    /// An error body that echoes the request's `Authorization` header.
    pub fn echoing_authorization(status: u16) -> Reply {
        Reply {
            echo_authorization: true,
            ..Reply::status(
                status,
                r#"{"error": {"message": "rejected credentials: {AUTHORIZATION}"}}"#,
            )
        }
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The request path.
    pub path: String,
    /// `Authorization`, when sent.
    pub authorization: Option<String>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// When it arrived, since the server started.
    pub at: Duration,
}

impl Received {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the request body is JSON")
    }
}

#[derive(Default)]
struct Inner {
    script: VecDeque<Reply>,
    received: Vec<Received>,
}

/// The server; it lives as long as the test's runtime.
#[derive(Clone)]
pub struct ModelServer {
    /// Where it listens.
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    epoch: Instant,
}

impl ModelServer {
    /// Starts a server on a free loopback port answering `script` in order.
    pub async fn start(script: Vec<Reply>) -> ModelServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = ModelServer {
            addr,
            inner: Arc::new(Mutex::new(Inner {
                script: script.into(),
                received: Vec::new(),
            })),
            epoch: Instant::now(),
        };
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(server.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        server
    }

    /// The `baseURL` to give the agent: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request so far, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.inner.lock().unwrap().received.clone()
    }

    /// How many scripted replies are left.
    pub fn left(&self) -> usize {
        self.inner.lock().unwrap().script.len()
    }
}

async fn handle(State(server): State<ModelServer>, request: Request) -> Response {
    let path = request.uri().path().to_string();
    let authorization = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(request.into_body(), 16 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    let reply = {
        let mut inner = server.inner.lock().unwrap();
        inner.received.push(Received {
            path: path.clone(),
            authorization: authorization.clone(),
            body,
            at: server.epoch.elapsed(),
        });
        inner.script.pop_front()
    };
    if path != "/v1/chat/completions" {
        return (StatusCode::NOT_FOUND, format!("no route {path}")).into_response();
    }
    let Some(reply) = reply else {
        return (
            StatusCode::BAD_REQUEST,
            "the test's script has no more replies",
        )
            .into_response();
    };
    if reply.hang {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(reply.delay).await;
    let body = if reply.echo_authorization {
        reply
            .body
            .replace("{AUTHORIZATION}", authorization.as_deref().unwrap_or(""))
    } else {
        reply.body
    };
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, body).into_response();
    for (name, value) in reply.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}
