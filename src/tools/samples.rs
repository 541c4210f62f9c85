//! The sample tools `agentrt dev` serves on loopback (`--sample-tools`, at
//! `--sample-tools-addr`, default 127.0.0.1:8089) for the runs in `config/samples/`:
//! - `POST /lookup_order` (ReadOnly): `{order}` → the order, with a `damaged` flag.
//! - `POST /issue_refund` (RemoteMutation): `{order, amount}` → a refund, recorded once per
//!   `Idempotency-Key` (a second call with the same key answers the first refund, `replayed`).
//! - `POST /slow_export` (LocalMutation): sleeps (20 s by default) and answers how many rows it
//!   exported: long enough to kill the controller during the call. Each export is kept per
//!   `Idempotency-Key` (running, then done) for the sample hook.
//! - `GET /exports/{key}`: what became of the export of an Idempotency-Key, as a status URL
//!   answers (docs/design.md section 5, "a tool that answers by key"): 200 `{"state":
//!   "succeeded", "result"}` once done, 202 `{"state": "running"}` meanwhile, 404 when it
//!   never arrived.
//! - `POST /v1/chat/completions`: the sample model ([`model`]), a scripted chat-completions
//!   endpoint, so the `openai` sample needs no external model.
//! - `POST /reconcile`: the sample reconcile hook ([`hook`]), which settles an interrupted
//!   refund or export from what the tools above recorded.
//! - `POST /mcp`: the sample MCP server ([`mcp`]): `lookup_order` and `issue_refund` over the
//!   Streamable HTTP transport, refunds in the same ledger as `POST /issue_refund`.
//!
//! They are demonstrations, not part of the runtime: nothing here writes a run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub mod hook;
pub mod mcp;
pub mod model;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The default address of the sample tools (the samples' URLs name it).
pub const DEFAULT_ADDR: &str = "127.0.0.1:8089";

#[derive(Default)]
struct Ledger {
    refunds: BTreeMap<String, Value>,
    exports: BTreeMap<String, Export>,
}

/// An export as `slow_export` recorded it, per Idempotency-Key.
#[derive(Debug, Clone, PartialEq)]
enum Export {
    Running,
    Done(Value),
}

#[derive(Clone)]
struct Samples {
    ledger: Arc<Mutex<Ledger>>,
    slow: Duration,
    /// The sample MCP server's open sessions.
    sessions: Arc<Mutex<BTreeSet<String>>>,
}

impl Samples {
    fn refund(&self, key: &str) -> Option<Value> {
        self.ledger.lock().ok()?.refunds.get(key).cloned()
    }

    fn export(&self, key: &str) -> Option<Export> {
        self.ledger.lock().ok()?.exports.get(key).cloned()
    }

    /// Records a refund for `key` once; a repeat answers the first one with `replayed: true`.
    /// `None` when the ledger is poisoned.
    fn record_refund(&self, key: &str, order: i64, amount: f64) -> Option<Value> {
        let mut ledger = self.ledger.lock().ok()?;
        if let Some(previous) = ledger.refunds.get(key) {
            let mut replay = previous.clone();
            replay["replayed"] = json!(true);
            return Some(replay);
        }
        let refund = json!({
            "refundId": format!("rf-{}", ledger.refunds.len() + 1),
            "order": order,
            "amount": amount,
            "status": "issued"
        });
        ledger.refunds.insert(key.to_string(), refund.clone());
        Some(refund)
    }

    fn set_export(&self, key: &str, export: Export) {
        if let Ok(mut ledger) = self.ledger.lock() {
            ledger.exports.insert(key.to_string(), export);
        }
    }
}

fn idempotency_key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The sample tools, model and hook as a router; `slow` is how long `slow_export` takes.
pub fn router(slow: Duration) -> Router {
    let state = Samples {
        ledger: Arc::default(),
        slow,
        sessions: Arc::default(),
    };
    Router::new()
        .route("/lookup_order", post(lookup_order))
        .route("/issue_refund", post(issue_refund))
        .route("/slow_export", post(slow_export))
        .route("/refunds", get(refunds))
        .route("/exports/{key}", get(export_status))
        .route("/v1/chat/completions", post(model::chat_completions))
        .route("/reconcile", post(hook::reconcile))
        .route("/mcp", post(mcp::post).delete(mcp::delete))
        .with_state(state)
}

/// Binds `addr` and serves the sample tools until `shutdown` fires; returns the bound address.
///
/// # Errors
/// When the address cannot be bound (e.g. another `agentrt dev` already serves the samples).
pub async fn serve(
    addr: SocketAddr,
    slow: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|err| {
        anyhow::anyhow!(
            "cannot serve the sample tools on {addr}: {err}; pass --sample-tools-addr with a free port (the samples name 127.0.0.1:8089) or --sample-tools=false"
        )
    })?;
    let bound = listener.local_addr()?;
    let app = router(slow);
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::warn!(%err, "the sample tools server stopped");
        }
    });
    tracing::info!(addr = %bound, "serving the sample tools");
    Ok(bound)
}

fn order_number(args: &Value) -> Result<i64, (StatusCode, Json<Value>)> {
    args.get("order").and_then(Value::as_i64).ok_or_else(|| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "args.order must be an integer"})),
        )
    })
}

async fn lookup_order(Json(args): Json<Value>) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    Ok(Json(order(order_number(&args)?)))
}

/// The sample order numbered `order` (even numbers arrived damaged).
fn order(order: i64) -> Value {
    json!({
        "order": order,
        "customer": "Ada Lovelace",
        "status": "delivered",
        "damaged": order % 2 == 0,
        "total": 250,
        "currency": "EUR",
        "items": [{"sku": "LAMP-7", "name": "Desk lamp", "price": 250}]
    })
}

async fn issue_refund(
    State(samples): State<Samples>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    let order = order_number(&args)?;
    let amount = args.get("amount").and_then(Value::as_f64).ok_or_else(|| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "args.amount must be a number"})),
        )
    })?;
    let key = idempotency_key(&headers);
    samples
        .record_refund(&key, order, amount)
        .map(Json)
        .ok_or_else(|| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"error": "ledger poisoned"})),
            )
        })
}

async fn slow_export(
    State(samples): State<Samples>,
    headers: HeaderMap,
    Json(args): Json<Value>,
) -> Json<Value> {
    let key = idempotency_key(&headers);
    samples.set_export(&key, Export::Running);
    // The export runs to its end even when the caller goes away, as a real one would.
    let export = tokio::spawn(async move {
        tokio::time::sleep(samples.slow).await;
        let result = json!({
            "dataset": args.get("dataset").cloned().unwrap_or(Value::Null),
            "rows": 1200,
            "tookSeconds": samples.slow.as_secs()
        });
        samples.set_export(&key, Export::Done(result.clone()));
        result
    });
    Json(export.await.unwrap_or(Value::Null))
}

async fn export_status(
    State(samples): State<Samples>,
    axum::extract::Path(key): axum::extract::Path<String>,
) -> (StatusCode, Json<Value>) {
    match samples.export(&key) {
        Some(Export::Done(result)) => (
            StatusCode::OK,
            Json(json!({"state": "succeeded", "result": result})),
        ),
        Some(Export::Running) => (StatusCode::ACCEPTED, Json(json!({"state": "running"}))),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no export was asked with key {key}")})),
        ),
    }
}

async fn refunds(State(samples): State<Samples>) -> Json<Value> {
    let refunds = samples
        .ledger
        .lock()
        .map(|ledger| ledger.refunds.clone())
        .unwrap_or_default();
    Json(json!(refunds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refund_is_recorded_once_per_idempotency_key() {
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Duration::from_millis(10),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let client = reqwest::Client::new();
        let post = |key: &'static str| {
            client
                .post(format!("http://{addr}/issue_refund"))
                .header("Idempotency-Key", key)
                .json(&json!({"order": 1042, "amount": 250}))
                .send()
        };
        let first: Value = post("u/1").await.unwrap().json().await.unwrap();
        let again: Value = post("u/1").await.unwrap().json().await.unwrap();
        let other: Value = post("u/2").await.unwrap().json().await.unwrap();
        assert_eq!(first["refundId"], "rf-1");
        assert_eq!(again["refundId"], "rf-1");
        assert_eq!(again["replayed"], true);
        assert_eq!(other["refundId"], "rf-2");
        let order: Value = client
            .post(format!("http://{addr}/lookup_order"))
            .json(&json!({"order": 1042}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(order["damaged"], true);
    }
}
