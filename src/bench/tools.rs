//! The benchmark's tool server: a loopback HTTP server the benchmark's runs call. It answers at
//! once (so a step's wall time is the runtime's own), small or large, and records when each
//! call arrived and when its answer left, by run, so the time between two calls of one run
//! (the step overhead: recording the outcome, starting the next step) can be read off.
//!
//! Tools, addressed as `{base}/{tool}`:
//! - `small`: `{"ok": true, "item": <args.item>}`;
//! - `large`: `{"ok": true, "blob": "x…"}`, the blob `answer_bytes` long;
//! - `slow`: sleeps `slow` and answers as `small` (the takeover workload kills a controller
//!   during it).
//!
//! It is also the webhook agent of runs too long to script (`manifests::MAX_SCRIPTED_STEPS`):
//! `agent/{steps}/{tool}` answers the webhook agent's request (docs/design.md section 5) with
//! a call of `tool` (args `{"item": step}`) while its `step` is below `steps`, then
//! `complete`. Agent requests are not filed as calls.
//!
//! It is a measuring instrument, not part of the runtime: it knows nothing about runs beyond the
//! `Agentrt-Run` and `Agentrt-Holder` headers it files calls under.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::tools::http::{HOLDER, IDEMPOTENCY_KEY, RUN};

/// One call as the server saw it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The tool.
    pub tool: String,
    /// `Agentrt-Holder`: the replica that called.
    pub holder: String,
    /// `Idempotency-Key`: the same for a repeated call of one step.
    pub key: String,
    /// When it arrived.
    pub arrived: Instant,
    /// When its answer left (`None` while it runs).
    pub answered: Option<Instant>,
}

#[derive(Default)]
struct Log {
    /// Calls by run (`namespace/name`), in arrival order.
    by_run: HashMap<String, Vec<Call>>,
}

#[derive(Clone)]
struct Shared {
    log: Arc<Mutex<Log>>,
    blob: Arc<str>,
    slow: Duration,
}

/// A running tool server.
#[derive(Clone)]
pub struct ToolServer {
    addr: SocketAddr,
    shared: Shared,
}

impl ToolServer {
    /// Serves on a free loopback port until `shutdown`; `large` answers carry `answer_bytes`,
    /// `slow` calls take `slow`.
    ///
    /// # Errors
    /// When no loopback port can be bound.
    pub async fn start(
        answer_bytes: usize,
        slow: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<ToolServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Shared {
            log: Arc::default(),
            blob: "x".repeat(answer_bytes).into(),
            slow,
        };
        let app = Router::new()
            .route("/{tool}", post(answer))
            .route("/agent/{steps}/{tool}", post(decide))
            .with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
        });
        Ok(ToolServer { addr, shared })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calls of every run in `namespace`, by run name.
    pub fn calls_in(&self, namespace: &str) -> HashMap<String, Vec<Call>> {
        let prefix = format!("{namespace}/");
        self.lock()
            .by_run
            .iter()
            .filter_map(|(run, calls)| {
                run.strip_prefix(&prefix)
                    .map(|name| (name.to_string(), calls.clone()))
            })
            .collect()
    }

    /// The calls of run `namespace/name`.
    pub fn calls_of(&self, namespace: &str, name: &str) -> Vec<Call> {
        self.lock()
            .by_run
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .unwrap_or_default()
    }
}

async fn answer(
    State(shared): State<Shared>,
    Path(tool): Path<String>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Json<Value> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let run = header(RUN);
    let index = {
        let mut log = shared.log.lock().unwrap_or_else(|e| e.into_inner());
        let calls = log.by_run.entry(run.clone()).or_default();
        calls.push(Call {
            tool: tool.clone(),
            holder: header(HOLDER),
            key: header(IDEMPOTENCY_KEY),
            arrived: Instant::now(),
            answered: None,
        });
        calls.len() - 1
    };
    if tool == "slow" {
        tokio::time::sleep(shared.slow).await;
    }
    let item = args.get("item").cloned().unwrap_or(Value::Null);
    let body = if tool == "large" {
        json!({"ok": true, "item": item, "blob": &*shared.blob})
    } else {
        json!({"ok": true, "item": item})
    };
    let mut log = shared.log.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(call) = log.by_run.get_mut(&run).and_then(|c| c.get_mut(index)) {
        call.answered = Some(Instant::now());
    }
    Json(body)
}

/// How many calls of `calls` repeated an `Idempotency-Key` an earlier call carried (a step's
/// tool called twice).
pub fn duplicate_keys(calls: &[Call]) -> usize {
    let mut keys = std::collections::HashSet::new();
    calls
        .iter()
        .filter(|call| !call.key.is_empty() && !keys.insert(call.key.as_str()))
        .count()
}

/// The webhook agent's answer to `request` for a run of `steps` calls of `tool`: a call while
/// the request's `step` (0-based) is below `steps`, then `complete`.
fn decision(steps: u64, tool: &str, request: &Value) -> Value {
    let step = request.get("step").and_then(Value::as_u64).unwrap_or(0);
    if step < steps {
        json!({"kind": "tool_call", "tool": tool, "args": {"item": step}})
    } else {
        json!({"kind": "complete", "result": {"steps": steps}})
    }
}

async fn decide(
    Path((steps, tool)): Path<(u64, String)>,
    Json(request): Json<Value>,
) -> Json<Value> {
    Json(decision(steps, &tool, &request))
}

/// The step overheads of one run's calls: for each call after the first, the time from the
/// previous call's answer to this call's arrival (what the runtime spent between two tools).
pub fn overheads(calls: &[Call]) -> Vec<Duration> {
    calls
        .windows(2)
        .filter_map(|pair| {
            let answered = pair[0].answered?;
            Some(pair[1].arrived.saturating_duration_since(answered))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_agent_calls_the_tool_until_step_n_then_completes() {
        let at = |step: u64| decision(3, "small", &json!({"step": step, "goal": "g"}));
        assert_eq!(
            at(0),
            json!({"kind": "tool_call", "tool": "small", "args": {"item": 0}})
        );
        assert_eq!(at(2)["args"]["item"], json!(2));
        assert_eq!(at(3), json!({"kind": "complete", "result": {"steps": 3}}));
    }
}
