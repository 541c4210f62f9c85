//! Prometheus metrics and the health endpoints (`--metrics-addr`): `/metrics` in the
//! Prometheus text format, `/healthz` (the process serves), `/readyz` (the watches started).
//! A few counters; they are projections, never inputs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// One label: how something ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// The outcome word.
    pub outcome: String,
}

impl Outcome {
    fn of(word: &str) -> Outcome {
        Outcome {
            outcome: word.to_string(),
        }
    }
}

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles started.
    pub reconciles: Counter,
    /// Run status writes by outcome (`ok`, `conflict`, `error`).
    pub status_writes: Family<Outcome, Counter>,
    /// Tool calls by outcome (`result`, `error`, `unknown`, `abort`).
    pub tool_calls: Family<Outcome, Counter>,
    /// Leases won (acquisitions and takeovers).
    pub leases_acquired: Counter,
    /// Leases lost (another holder, or expired unrenewed).
    pub leases_lost: Counter,
    /// Runs this replica executes now.
    pub executors: Gauge,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentrt");
        let reconciles = Counter::default();
        let status_writes = Family::<Outcome, Counter>::default();
        let tool_calls = Family::<Outcome, Counter>::default();
        let leases_acquired = Counter::default();
        let leases_lost = Counter::default();
        let executors = Gauge::default();
        registry.register("reconciles", "Reconciles started", reconciles.clone());
        registry.register(
            "status_writes",
            "AgentRun status writes (compare-and-set) by outcome",
            status_writes.clone(),
        );
        registry.register("tool_calls", "Tool calls by outcome", tool_calls.clone());
        registry.register(
            "leases_acquired",
            "Run leases won (acquisitions and takeovers)",
            leases_acquired.clone(),
        );
        registry.register(
            "leases_lost",
            "Run leases lost to another holder or to expiry",
            leases_lost.clone(),
        );
        registry.register(
            "executors",
            "Runs this replica is executing",
            executors.clone(),
        );
        Metrics {
            registry,
            reconciles,
            status_writes,
            tool_calls,
            leases_acquired,
            leases_lost,
            executors,
            ready: AtomicBool::new(false),
        }
    }
}

impl Metrics {
    /// Counts one status write.
    pub fn status_write(&self, outcome: &str) {
        self.status_writes
            .get_or_create(&Outcome::of(outcome))
            .inc();
    }

    /// Counts one tool call.
    pub fn tool_call(&self, outcome: &str) {
        self.tool_calls.get_or_create(&Outcome::of(outcome)).inc();
    }

    /// Marks the controller ready (its watches started).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

async fn metrics_text(
    State(metrics): State<Arc<Metrics>>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        metrics.encode(),
    )
}

async fn ready(State(metrics): State<Arc<Metrics>>) -> (StatusCode, &'static str) {
    if metrics.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `addr` until `shutdown`.
///
/// # Errors
/// When `addr` cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|err| {
        anyhow::anyhow!("cannot serve metrics on {addr}: {err}; pass another --metrics-addr")
    })?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(metrics);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn metrics_and_health_are_served() {
        let metrics = Arc::new(Metrics::default());
        metrics.status_write("ok");
        metrics.tool_call("result");
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics.clone(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
        let get = |path: &'static str| async move {
            let response = reqwest::Client::builder()
                .no_proxy()
                .build()
                .unwrap()
                .get(format!("http://{addr}{path}"))
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        };
        assert_eq!(get("/healthz").await.0, 200);
        assert_eq!(get("/readyz").await.0, 503);
        metrics.set_ready();
        assert_eq!(get("/readyz").await.0, 200);
        let (status, text) = get("/metrics").await;
        assert_eq!(status, 200);
        assert!(
            text.contains("agentrt_status_writes_total{outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("agentrt_tool_calls_total{outcome=\"result\"} 1"),
            "{text}"
        );
    }
}
