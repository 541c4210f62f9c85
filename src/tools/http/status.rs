//! Asking an `http` tool's `reconcile.statusURL` what became of an interrupted call
//! (docs/design.md section 5, "a tool that answers by key"): a GET, asked again while the tool
//! says the call is still running, read into a [`StatusAnswer`].
//!
//! - 200 JSON `{"state": "succeeded", "result": ...}` → [`StatusAnswer::Succeeded`] (without
//!   `result`, unsettled);
//!   `{"state": "failed", "error": ...}` → [`StatusAnswer::Failed`];
//! - 404 → [`StatusAnswer::NotFound`] (the call never arrived);
//! - 202, or 200 `{"state": "running"}` → asked again after a backoff (250 ms doubling to 5 s,
//!   or the answer's `Retry-After` seconds when given), while the deadline allows;
//! - anything else (another status, another state, a body that is not JSON or is over
//!   [`super::MAX_BODY_BYTES`], no connection, the deadline reached) →
//!   [`StatusAnswer::Unsettled`] saying what it was, the body cut to 1 KiB.
//!
//! Asking changes nothing on the tool; this module never sends the call itself.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{error_chain, raw_content, read_body, HOLDER, IDEMPOTENCY_KEY, RUN};
use crate::engine::content::answer::ReadAnswer;
use crate::engine::StatusAnswer;

/// Most bytes of a body an unsettled answer shows.
const SHOWN_BYTES: usize = 1024;
/// The first wait before asking again, then doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between two questions (unless `Retry-After` asks for longer).
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// One question to a status URL.
#[derive(Debug, Clone)]
pub struct StatusRequest {
    /// The status URL with the key filled in.
    pub url: String,
    /// The call's idempotency key, sent as `Idempotency-Key`.
    pub idempotency_key: String,
    /// `<namespace>/<name>`, sent as `Agentrt-Run`.
    pub run: String,
    /// The replica asking, sent as `Agentrt-Holder`.
    pub holder: String,
    /// The tool's headers, Secrets resolved.
    pub headers: Vec<(String, String)>,
    /// How long to keep asking while the call is running (the tool's `timeoutSeconds`).
    pub timeout: Duration,
}

/// Asks until the status URL settles the call, says it never arrived, says something else, or
/// `request.timeout` runs out (see the module doc).
pub async fn ask(client: &reqwest::Client, request: &StatusRequest) -> StatusAnswer {
    let deadline = Instant::now() + request.timeout;
    let mut backoff = FIRST_BACKOFF;
    let mut asked = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return StatusAnswer::Unsettled {
                said: json!({
                    "error": format!(
                        "still running when the tool's timeoutSeconds ({} s) ran out, asked {} time(s)",
                        request.timeout.as_secs(),
                        asked
                    ),
                }),
            };
        }
        asked = asked.saturating_add(1);
        let wait = match ask_once(client, request, left).await {
            Once::Settled(answer) => return answer,
            Once::Running { retry_after } => retry_after.unwrap_or(backoff).max(backoff),
        };
        backoff = (backoff * 2).min(MAX_BACKOFF);
        let left = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(wait.min(left)).await;
    }
}

enum Once {
    Settled(StatusAnswer),
    Running { retry_after: Option<Duration> },
}

async fn ask_once(client: &reqwest::Client, request: &StatusRequest, left: Duration) -> Once {
    let unsettled = |said: Value| Once::Settled(StatusAnswer::Unsettled { said });
    let mut get = client
        .get(&request.url)
        .timeout(left)
        .header(http::header::ACCEPT, "application/json")
        .header(IDEMPOTENCY_KEY, &request.idempotency_key)
        .header(RUN, &request.run)
        .header(HOLDER, &request.holder);
    for (name, value) in &request.headers {
        get = get.header(name.as_str(), value.as_str());
    }
    let response = match get.send().await {
        Ok(response) => response,
        Err(err) => {
            return unsettled(json!({
                "error": format!("cannot ask {}: {}", request.url, error_chain(&err)),
            }))
        }
    };
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let bytes = match read_body(response).await {
        Ok(ReadAnswer {
            body: Some(bytes), ..
        }) => bytes,
        Ok(over) => {
            return unsettled(json!({
                "status": status,
                "error": format!("the answer is over {} bytes", super::MAX_BODY_BYTES),
                "bytes": over.bytes,
            }))
        }
        Err(err) => {
            return unsettled(json!({
                "status": status,
                "error": format!("the answer was cut off: {}", error_chain(&err)),
            }))
        }
    };
    let shown = || raw_content(&bytes[..bytes.len().min(SHOWN_BYTES)]);
    match status {
        404 => Once::Settled(StatusAnswer::NotFound),
        202 => Once::Running { retry_after },
        200 => {
            let body = match serde_json::from_slice::<Value>(&bytes) {
                Ok(body) => body,
                Err(err) => {
                    return unsettled(json!({
                        "status": status,
                        "body": shown(),
                        "error": format!("not usable JSON: {err}"),
                    }))
                }
            };
            match (
                body.get("state").and_then(Value::as_str),
                body.get("result"),
            ) {
                (Some("succeeded"), Some(result)) => Once::Settled(StatusAnswer::Succeeded {
                    result: result.clone(),
                }),
                (Some("succeeded"), None) => unsettled(json!({
                    "status": status,
                    "body": shown(),
                    "error": "state is succeeded but there is no result",
                })),
                (Some("failed"), _) => Once::Settled(StatusAnswer::Failed {
                    error: body.get("error").cloned().unwrap_or(Value::Null),
                }),
                (Some("running"), _) => Once::Running { retry_after },
                _ => unsettled(json!({
                    "status": status,
                    "body": shown(),
                    "error": "state is not succeeded, failed or running",
                })),
            }
        }
        _ => unsettled(json!({"status": status, "body": shown()})),
    }
}
