//! An answer of any size is read within a small bound (docs/design.md section 6, "Answers";
//! docs/behaviours.md 83; issue 34): a tool, a webhook agent and a model each answer 200 MB,
//! generated as it is sent (never held by the server either); the run ends as the design
//! says, and the controller child's peak resident memory (`VmHWM`) grows by less than
//! [`PEAK_GROWTH_KIB`] over its peak after a run with small answers.

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use support::controller::*;
use support::modelserver::{usage, Reply};

/// The size of a huge answer: 200 MB.
const HUGE: usize = 200 * 1000 * 1000;
const CHUNK: usize = 64 * 1024;
/// How much a controller's peak RSS may grow for a huge answer (the kept bound is 4 MiB; a
/// whole answer would be 190 MiB).
const PEAK_GROWTH_KIB: u64 = 40 * 1024;
const WAIT: Duration = Duration::from_secs(120);

/// The pieces of a huge answer: `prefix`, `x` repeated, `suffix`, about [`HUGE`] bytes.
fn pieces(prefix: &'static str, suffix: &'static str) -> impl Iterator<Item = Bytes> {
    let filler = Bytes::from(vec![b'x'; CHUNK]);
    std::iter::once(Bytes::from_static(prefix.as_bytes()))
        .chain(std::iter::repeat_n(filler, HUGE / CHUNK))
        .chain(std::iter::once(Bytes::from_static(suffix.as_bytes())))
}

/// The size and `sha256:<hex>` of [`pieces`].
fn size_and_hash(prefix: &'static str, suffix: &'static str) -> (u64, String) {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    for piece in pieces(prefix, suffix) {
        hasher.update(&piece);
        size += piece.len() as u64;
    }
    (size, format!("sha256:{}", hex::encode(hasher.finalize())))
}

fn streamed(prefix: &'static str, suffix: &'static str) -> axum::response::Response {
    let stream = futures::stream::iter(pieces(prefix, suffix).map(Ok::<_, Infallible>));
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .expect("a response")
}

/// A server whose `/huge/...` answers are 200 MB on the first call (small ones after it) and
/// whose `/small/...` answers are small.
struct HugeServer {
    base: String,
}

const TOOL_PREFIX: &str = "{\"blob\": \"";
const TOOL_SUFFIX: &str = "\"}";

impl HugeServer {
    async fn start() -> HugeServer {
        let agent_calls = Arc::new(AtomicUsize::new(0));
        let model_calls = Arc::new(AtomicUsize::new(0));
        let complete =
            |n: &Arc<AtomicUsize>, huge: bool| huge && n.fetch_add(1, Ordering::SeqCst) == 0;
        let app = Router::new()
            .route(
                "/small/report",
                post(|| async { axum::Json(json!({"ok": true})) }),
            )
            .route(
                "/huge/report",
                post(|| async { streamed(TOOL_PREFIX, TOOL_SUFFIX) }),
            )
            .route(
                "/{size}/agent",
                post(
                    move |axum::extract::Path(size): axum::extract::Path<String>| {
                        let calls = agent_calls.clone();
                        async move {
                            if complete(&calls, size == "huge") {
                                return streamed("{\"kind\": \"complete\", \"result\": \"", "\"}");
                            }
                            axum::Json(json!({"kind": "complete", "result": {"done": true}}))
                                .into_response()
                        }
                    },
                ),
            )
            .route(
                "/{size}/v1/chat/completions",
                post(
                    move |axum::extract::Path(size): axum::extract::Path<String>| {
                        let calls = model_calls.clone();
                        async move {
                            if complete(&calls, size == "huge") {
                                return streamed("{\"id\": \"", "\"}");
                            }
                            let reply = Reply::complete(json!({"done": true}), usage(10, 5, 0));
                            axum::response::Response::builder()
                                .header("content-type", "application/json")
                                .body(Body::from(reply.body))
                                .expect("a response")
                        }
                    },
                ),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        HugeServer {
            base: format!("http://{addr}"),
        }
    }

    fn url(&self, size: &str) -> String {
        format!("{}/{size}", self.base)
    }
}

use axum::response::IntoResponse;

/// The peak resident set size of process `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// Runs `small` then `huge` (each a manifest for its run name) on one controller; returns the
/// huge run's final status and the peak RSS growth in KiB the huge answer caused.
async fn peak_growth(
    small: (&str, String),
    huge: (&str, String),
    setup: impl std::future::Future<Output = ()>,
    cluster: &support::cluster::TestCluster,
) -> (Value, u64) {
    setup.await;
    let controller = start_controller(cluster, "big");
    cluster.create_run(&small.1).await;
    cluster.wait_phase(small.0, "Completed", WAIT).await;
    let before = peak_rss_kib(controller.pid());
    cluster.create_run(&huge.1).await;
    let done = cluster
        .wait_status(huge.0, WAIT, "an end", |s| {
            matches!(s["phase"].as_str(), Some("Completed" | "Failed"))
        })
        .await;
    let after = peak_rss_kib(controller.pid());
    eprintln!(
        "peak RSS before the huge answer {before} KiB, after {after} KiB (+{} KiB)",
        after.saturating_sub(before)
    );
    (done, after.saturating_sub(before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_tool_answer_is_response_too_large_with_its_size_and_hash_in_a_small_bound() {
    let cluster = agentrt_cluster().await;
    let server = HugeServer::start().await;
    let small = fixture("slow-tool", &server.url("small"), "small");
    let huge = fixture("slow-tool", &server.url("huge"), "huge");
    let (done, growth) = peak_growth(("small", small), ("huge", huge), async {}, &cluster).await;
    assert_eq!(done["phase"], "Completed", "{done:#}");
    let observation = &done["steps"][0]["observation"];
    assert_eq!(observation["kind"], "tool_error", "{observation:#}");
    assert!(
        observation["summary"]
            .as_str()
            .is_some_and(|s| s.contains("response_too_large")),
        "{observation:#}"
    );
    let (size, hash) = size_and_hash(TOOL_PREFIX, TOOL_SUFFIX);
    assert_eq!(
        observation["content"]["bytes"],
        json!(size),
        "{observation:#}"
    );
    assert_eq!(
        observation["content"]["sha256"],
        json!(hash),
        "{observation:#}"
    );
    let head = observation["content"]["head"].as_str().unwrap_or_default();
    assert!(
        head.starts_with("{\"blob\": \"xxx") && head.len() <= 1024,
        "{head}"
    );
    assert!(growth < PEAK_GROWTH_KIB, "peak RSS grew by {growth} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_webhook_agent_answer_is_an_invalid_decision_in_a_small_bound() {
    let cluster = agentrt_cluster().await;
    let server = HugeServer::start().await;
    let manifest = |size: &str, name: &str| {
        RunFixture::new("webhook-agent", &server.url("small"), name)
            .agent(&format!("{}/agent", server.url(size)))
            .yaml()
    };
    let (done, growth) = peak_growth(
        ("small", manifest("small", "small")),
        ("huge", manifest("huge", "huge")),
        async {},
        &cluster,
    )
    .await;
    assert_eq!(done["phase"], "Completed", "{done:#}");
    let first = &done["steps"][0];
    assert_eq!(first["status"], "failed", "{first:#}");
    let decision = first["decision"].to_string();
    assert!(
        decision.contains("invalid") && decision.contains("over 4194304 bytes"),
        "{first:#}"
    );
    assert!(growth < PEAK_GROWTH_KIB, "peak RSS grew by {growth} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mb_model_reply_is_a_failed_attempt_read_no_further_than_the_bound() {
    let cluster = agentrt_cluster().await;
    let server = HugeServer::start().await;
    let manifest = |size: &str, name: &str| {
        RunFixture::new("openai-agent", &server.url("small"), name)
            .model(&format!("{}/v1", server.url(size)))
            .yaml()
    };
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let (done, growth) = peak_growth(
        ("small", manifest("small", "small")),
        ("huge", manifest("huge", "huge")),
        async {
            create_secret(&client, &ns, "model-key", "apiKey", "sk-test").await;
        },
        &cluster,
    )
    .await;
    assert_eq!(
        (&done["phase"], &done["reason"]),
        (&json!("Failed"), &json!("model_unavailable")),
        "{done:#}"
    );
    let failed = events_of(&done, "model.failed");
    assert_eq!(failed.len(), 1, "{done:#}");
    assert_eq!(failed[0]["data"]["status"], 200, "{done:#}");
    let detail = failed[0]["data"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("over 8388608 bytes"), "{detail}");
    assert!(growth < PEAK_GROWTH_KIB, "peak RSS grew by {growth} KiB");
}
