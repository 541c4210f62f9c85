//! A test tool server: a real HTTP server on 127.0.0.1 (axum) that counts calls per
//! Idempotency-Key, records the holder and attempt headers of each call, and can be told per
//! tool to sleep, fail, answer huge, abort or hang, or to honour idempotency keys (a repeated
//! key gets the first outcome, its effect not performed again; a key in flight gets 409).
//! Tools are addressed as `{base}/{tool}`; `GET {base}/status/{key}` says what became of a
//! key's call (200 succeeded once it ended, 202 while it works, 404 when it never arrived),
//! unless told to answer something else ([`ToolServer::answer_status`]).

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
    /// Honour Idempotency-Key: a key already performed gets the first answer, nothing done.
    pub honor_keys: bool,
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
    /// Per key: the effects performed, and the first answer once it ended.
    effects: BTreeMap<String, usize>,
    answers: BTreeMap<String, Value>,
    /// What `GET /status/{key}` answers instead of the truth.
    status_answer: Option<(u16, Value)>,
    /// Every `GET /status/{key}`: the key asked about.
    status_asked: Vec<String>,
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
            .route("/status/{key}", axum::routing::get(status))
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

    /// How many times the effect of `key`'s call was performed (a call honouring a repeated
    /// key performs none).
    pub fn effects(&self, key: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .effects
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// From now on `GET /status/{key}` answers `status` with `body` for every key.
    pub fn answer_status(&self, status: u16, body: Value) {
        self.inner.lock().unwrap().status_answer = Some((status, body));
    }

    /// The keys `GET /status/{key}` was asked about, in order.
    pub fn status_asked(&self) -> Vec<String> {
        self.inner.lock().unwrap().status_asked.clone()
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
    let key = header("idempotency-key");
    {
        let mut inner = server.inner.lock().unwrap();
        behaviour = inner.behaviours.get(&tool).cloned().unwrap_or_default();
        index = inner.calls.len();
        let repeated = behaviour.honor_keys && inner.effects.contains_key(&key);
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
        if repeated {
            // The first outcome, nothing performed; a key still in flight is a conflict.
            let now = server.epoch.elapsed();
            inner.calls[index].ended = Some(now);
            return match inner.answers.get(&key) {
                Some(first) => (StatusCode::OK, Json(first.clone())).into_response(),
                None => (
                    StatusCode::CONFLICT,
                    Json(json!({"error": "a request with this key is in progress"})),
                )
                    .into_response(),
            };
        }
        *inner.effects.entry(key.clone()).or_insert(0) += 1;
    }
    if behaviour.hang {
        std::future::pending::<()>().await;
    }
    // The work goes on when the caller is gone (a SIGKILLed controller): it runs in a task of
    // its own, which dropping this handler does not cancel.
    let worker = server.clone();
    let sleep = behaviour.sleep;
    let huge = behaviour.huge;
    let body = tokio::spawn(async move {
        tokio::time::sleep(sleep).await;
        let body = match huge {
            Some(size) => json!({"blob": "x".repeat(size)}),
            None => json!({"tool": tool, "args": args, "ok": true}),
        };
        let mut inner = worker.inner.lock().unwrap();
        inner.calls[index].ended = Some(worker.epoch.elapsed());
        inner.answers.insert(key, body.clone());
        body
    })
    .await
    .expect("the tool's work");
    let status = StatusCode::from_u16(behaviour.status.unwrap_or(200)).unwrap_or(StatusCode::OK);
    let mut response = (status, Json(body)).into_response();
    if let Some(reason) = behaviour.abort {
        response
            .headers_mut()
            .insert("agentrt-abort", reason.parse().expect("header value"));
    }
    response
}

/// `GET /status/{key}`: what became of the call of `key` (see the module doc).
async fn status(State(server): State<ToolServer>, Path(key): Path<String>) -> Response {
    let mut inner = server.inner.lock().unwrap();
    inner.status_asked.push(key.clone());
    if let Some((status, body)) = inner.status_answer.clone() {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        return (status, Json(body)).into_response();
    }
    match (inner.answers.get(&key), inner.effects.contains_key(&key)) {
        (Some(first), _) => (
            StatusCode::OK,
            Json(json!({"state": "succeeded", "result": first})),
        )
            .into_response(),
        (None, true) => (StatusCode::ACCEPTED, Json(json!({"state": "running"}))).into_response(),
        (None, false) => StatusCode::NOT_FOUND.into_response(),
    }
}
