//! A test tool server: a real HTTP server on 127.0.0.1 (axum) that counts calls per
//! Idempotency-Key, records the holder and attempt headers of each call, and can be told per
//! tool to sleep, fail, answer huge, abort or hang. Tools are addressed as `{base}/{tool}`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

/// What a tool does when called.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Sleep this long before answering.
    pub sleep: Duration,
    /// Answer this status (default 200).
    pub status: Option<u16>,
    /// Answer a JSON string of this many bytes.
    pub huge: Option<usize>,
    /// Never answer.
    pub hang: bool,
    /// Answer with `Agentrt-Abort: <reason>`.
    pub abort: Option<String>,
}

impl Behaviour {
    /// Sleeps `millis` then answers.
    pub fn sleeping(millis: u64) -> Behaviour {
        Behaviour {
            sleep: Duration::from_millis(millis),
            ..Behaviour::default()
        }
    }

    /// Never answers (the call hangs until its caller gives up).
    pub fn hanging() -> Behaviour {
        Behaviour {
            hang: true,
            ..Behaviour::default()
        }
    }

    /// Answers HTTP status `status` (an error, say) at once.
    pub fn answering_status(status: u16) -> Behaviour {
        Behaviour {
            status: Some(status),
            ..Behaviour::default()
        }
    }

    /// Answers a JSON string of `bytes` bytes.
    pub fn answering_bytes(bytes: usize) -> Behaviour {
        Behaviour {
            huge: Some(bytes),
            ..Behaviour::default()
        }
    }

    /// Answers with `Agentrt-Abort: <reason>`.
    pub fn aborting(reason: &str) -> Behaviour {
        Behaviour {
            abort: Some(reason.to_string()),
            ..Behaviour::default()
        }
    }
}

/// One call as the server saw it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The tool (path).
    pub tool: String,
    /// `Idempotency-Key`.
    pub key: String,
    /// `Agentrt-Attempt`.
    pub attempt: String,
    /// `Agentrt-Holder`.
    pub holder: String,
    /// `Agentrt-Run`.
    pub run: String,
    /// The args.
    pub args: Value,
    /// `Authorization` (what a header from a Secret carries).
    pub authorization: String,
    /// When it arrived and, once answered, when it ended (relative to the server's start).
    pub started: Duration,
    /// When it ended.
    pub ended: Option<Duration>,
}

#[derive(Default)]
struct Inner {
    behaviours: BTreeMap<String, Behaviour>,
    calls: Vec<Call>,
}

/// The server; dropping it does not stop it (it lives as long as the test's runtime).
#[derive(Clone)]
pub struct ToolServer {
    /// Where it listens.
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    epoch: Instant,
}

impl ToolServer {
    /// Starts a server on a free loopback port.
    pub async fn start() -> ToolServer {
        Self::start_on("127.0.0.1").await
    }

    /// Starts a server on a free port of `ip` (e.g. `10.244.0.1`, the envtest node's bridge
    /// address, which Pods reach).
    pub async fn start_on(ip: &str) -> ToolServer {
        let inner: Arc<Mutex<Inner>> = Arc::default();
        let epoch = Instant::now();
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0"))
            .await
            .unwrap_or_else(|err| panic!("cannot listen on {ip}: {err}"));
        let addr = listener.local_addr().expect("addr");
        let server = ToolServer { addr, inner, epoch };
        let app = Router::new()
            .route("/{tool}", post(handle))
            .with_state(server.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        server
    }

    /// `http://IP:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets what `tool` does.
    pub fn set(&self, tool: &str, behaviour: Behaviour) {
        self.inner
            .lock()
            .unwrap()
            .behaviours
            .insert(tool.to_string(), behaviour);
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().unwrap().calls.clone()
    }

    /// Calls carrying `Idempotency-Key: key`.
    pub fn calls_for(&self, key: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.key == key).collect()
    }

    /// Waits up to `within` for a call carrying `Idempotency-Key: key` (`<run uid>/<step>`);
    /// panics naming it, with `log()` (the calling controller's), when none came.
    pub async fn wait_for_call(&self, key: &str, within: Duration, log: impl Fn() -> String) {
        super::cluster::wait_until_or(within, &format!("a call {key}"), log, || {
            !self.calls_for(key).is_empty()
        })
        .await;
    }

    /// Calls of run `namespace/name`.
    pub fn calls_of_run(&self, run: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.run == run).collect()
    }

    /// How many calls each Idempotency-Key got.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for call in self.calls() {
            *out.entry(call.key).or_insert(0) += 1;
        }
        out
    }
}

async fn handle(
    State(server): State<ToolServer>,
    Path(tool): Path<String>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let index;
    let behaviour;
    {
        let mut inner = server.inner.lock().unwrap();
        behaviour = inner.behaviours.get(&tool).cloned().unwrap_or_default();
        index = inner.calls.len();
        inner.calls.push(Call {
            tool: tool.clone(),
            key: header("idempotency-key"),
            attempt: header("agentrt-attempt"),
            holder: header("agentrt-holder"),
            run: header("agentrt-run"),
            args: args.clone(),
            authorization: header("authorization"),
            started: server.epoch.elapsed(),
            ended: None,
        });
    }
    if behaviour.hang {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(behaviour.sleep).await;
    server.inner.lock().unwrap().calls[index].ended = Some(server.epoch.elapsed());
    let status = StatusCode::from_u16(behaviour.status.unwrap_or(200)).unwrap_or(StatusCode::OK);
    let body = match behaviour.huge {
        Some(size) => json!({"blob": "x".repeat(size)}),
        None => json!({"tool": tool, "args": args, "ok": true}),
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(reason) = behaviour.abort {
        response
            .headers_mut()
            .insert("agentrt-abort", reason.parse().expect("header value"));
    }
    response
}
