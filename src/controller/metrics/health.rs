//! The health of each watch (`/readyz`, `agentrt_watches_synced`) and the HTTP endpoints
//! `/metrics`, `/healthz` and `/readyz` (`--metrics-addr`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use super::Metrics;

/// The labels of one watch: what it watches and where.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabel {
    /// The watched resource: `agentruns`, `approvals` or `leases`.
    pub watch: String,
    /// The watched namespace, or `*` for all namespaces.
    pub scope: String,
}

/// The health of one watch, written by the watch's stream as events pass and read by
/// `/readyz` and the `agentrt_watches_synced` gauge (1 synced, 0 not).
///
/// A watch is synced from the end of a (re)list, or any change it delivers, until its next
/// error; an error makes it relist (see `watches.rs`), so it is synced again only once the API
/// server has answered a list.
pub struct WatchHealth {
    label: WatchLabel,
    synced: AtomicBool,
    /// Times the watch worked (a list completed or a change arrived); the backoff resets when
    /// it moves.
    successes: AtomicU64,
    /// Whether the last error was 410 Gone (the resourceVersion is too old: relist at once).
    gone: AtomicBool,
    gauge: Gauge,
}

impl WatchHealth {
    /// A watch's health, not yet synced, reported on `gauge`.
    pub(super) fn new(label: WatchLabel, gauge: Gauge) -> WatchHealth {
        gauge.set(0);
        WatchHealth {
            label,
            synced: AtomicBool::new(false),
            successes: AtomicU64::new(0),
            gone: AtomicBool::new(false),
            gauge,
        }
    }

    /// A health no metric reports (tests, the Controller's own trigger backoff).
    pub fn unreported(watch: &str) -> WatchHealth {
        WatchHealth::new(
            WatchLabel {
                watch: watch.to_string(),
                scope: "*".to_string(),
            },
            Gauge::default(),
        )
    }

    /// Whether the watch is synced now.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// How many times the watch has worked so far.
    pub fn successes(&self) -> u64 {
        self.successes.load(Ordering::SeqCst)
    }

    /// Whether the last error was 410 Gone.
    pub fn last_error_was_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// The watch worked: a list completed or a change arrived.
    pub fn worked(&self) {
        self.successes.fetch_add(1, Ordering::SeqCst);
        self.gone.store(false, Ordering::SeqCst);
        if !self.synced.swap(true, Ordering::SeqCst) {
            tracing::info!(watch = %self.label.watch, scope = %self.label.scope, "watch synced");
        }
        self.gauge.set(1);
    }

    /// The watch is relisting (its earlier list no longer holds).
    pub fn relisting(&self) {
        self.synced.store(false, Ordering::SeqCst);
        self.gauge.set(0);
    }

    /// The watch failed; `gone` when the API server answered 410 Gone.
    pub fn failed(&self, gone: bool, err: &dyn std::fmt::Display) {
        self.gone.store(gone, Ordering::SeqCst);
        if self.synced.swap(false, Ordering::SeqCst) {
            tracing::warn!(watch = %self.label.watch, scope = %self.label.scope, %err,
                "watch failed; relisting (readyz fails until it is synced again)");
        } else {
            tracing::debug!(watch = %self.label.watch, scope = %self.label.scope, %err,
                "watch failed again");
        }
        self.gauge.set(0);
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
    if !metrics.ready.load(Ordering::SeqCst) {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    } else if metrics.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watches not synced")
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
