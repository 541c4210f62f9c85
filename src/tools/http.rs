//! The `http` tool executor (docs/design.md section 6; docs/behaviours.md 15-17): POST the args as JSON to
//! the tool's URL and say how the call ended, as a [`ToolOutcome`].
//!
//! What each ending means is the contract with the engine:
//! - 2xx with a JSON body → [`ToolOutcome::Result`].
//! - any other status (a 3xx too: redirects are never followed) → [`ToolOutcome::Error`]
//!   `http_status`, keeping the body (as JSON when it is JSON, else as text, else base64).
//! - 2xx whose body is not JSON → [`ToolOutcome::Error`] `invalid_content`, keeping the bytes.
//! - a body over [`MAX_BODY_BYTES`] (any status) → [`ToolOutcome::Error`] `response_too_large`
//!   with its size, SHA-256 and head ([`too_large_content`]): the body is read to its end
//!   within the tool's timeout, counted and hashed as it streams by, and never held whole.
//! - a connection that could not be made (nothing was sent) → [`ToolOutcome::Error`]
//!   `connection_refused`.
//! - a timeout or a connection lost after the request may have been sent →
//!   [`ToolOutcome::Unknown`]: whether it took effect is unknown, and the engine handles it as
//!   an interruption.
//! - an answer carrying the header `Agentrt-Abort: <reason>` → [`ToolOutcome::Abort`].
//! - a panic anywhere in here → [`ToolOutcome::Error`] `executor_panic` ([`guarded`]), never a
//!   crash of the controller.
//!
//! Every request carries `Idempotency-Key: <run uid>/<step>` (the same for every attempt of a
//! step, so a tool that honours it makes a granted re-run safe), `Agentrt-Attempt`,
//! `Agentrt-Run: <namespace>/<name>`, `Agentrt-Holder` (the replica calling, for audits), and the
//! tool's own headers, whose Secret values are read at call time and never recorded.
//!
//! This module must not decide anything about the run: it performs one call. `status.rs`
//! asks a tool's `reconcile.statusURL` about an interrupted call.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::FutureExt;
use serde_json::{json, Value};

use crate::api::{HttpTool, SecretKeyRef, ToolFailure};
use crate::engine::content::answer::{AnswerBody, ReadAnswer, MAX_ANSWER_BYTES};
use crate::engine::ToolOutcome;

/// The header naming the step a call belongs to: `<run uid>/<step>`.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The header carrying the attempt number of the step's call (1, 2, ...).
pub const ATTEMPT: &str = "Agentrt-Attempt";
/// The header naming the run: `<namespace>/<name>`.
pub const RUN: &str = "Agentrt-Run";
/// The header naming the replica (holder identity) that made the call.
pub const HOLDER: &str = "Agentrt-Holder";
/// A tool that answers with this header asks to abort the run (`tool_abort`).
pub const ABORT: &str = "Agentrt-Abort";

/// Most bytes of an answer held: an answer over this is read to its end (or the tool's
/// timeout), counted and hashed as it streams by, only its head kept, and the call is a
/// `response_too_large` tool error (docs/design.md section 6; the engine cuts recorded content
/// far below this anyway).
pub const MAX_BODY_BYTES: usize = MAX_ANSWER_BYTES;

/// Why a client for tool calls could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client for tool calls: {0}")]
pub struct ClientError(#[from] reqwest::Error);

/// The HTTP client every tool call uses: no redirects, no proxy from the environment (tools
/// are addressed directly), no default timeout (each call sets its tool's `timeoutSeconds`).
///
/// # Errors
/// When the TLS backend cannot be initialised.
pub fn client() -> Result<reqwest::Client, ClientError> {
    Ok(reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("agentrt/", env!("CARGO_PKG_VERSION")))
        .build()?)
}

/// One call, as the controller asks for it.
#[derive(Debug, Clone)]
pub struct HttpCall {
    /// Where to POST.
    pub url: String,
    /// The args, sent as the JSON body.
    pub args: Value,
    /// `<run uid>/<step>`.
    pub idempotency_key: String,
    /// 1 for the first start of the step, 2 after a granted re-run, ...
    pub attempt: i64,
    /// `<namespace>/<name>` of the run.
    pub run: String,
    /// The holder identity of the replica calling.
    pub holder: String,
    /// The tool's headers, Secret values already read.
    pub headers: Vec<(String, String)>,
    /// The tool's `timeoutSeconds`.
    pub timeout: Duration,
}

/// Reads the value of one Secret key at call time. Implemented over the Kubernetes API by the
/// controller and by maps in tests.
pub trait SecretSource: Send + Sync {
    /// The value of `key` in Secret `name` of `namespace`, as text.
    fn secret_value(
        &self,
        namespace: &str,
        secret: &SecretKeyRef,
    ) -> impl Future<Output = Result<String, String>> + Send;
}

/// Resolves the tool's headers: literal values as written, Secret keys read now.
///
/// # Errors
/// A sentence naming the header and the Secret when a value cannot be read; the call then ends
/// as a tool error without being sent.
pub async fn resolve_headers(
    tool: &HttpTool,
    namespace: &str,
    secrets: &impl SecretSource,
) -> Result<Vec<(String, String)>, String> {
    resolve_header_list(&tool.headers, namespace, secrets).await
}

/// [`resolve_headers`] for any executor's headers (an `mcp` tool's or toolset's server too).
///
/// # Errors
/// As [`resolve_headers`].
pub async fn resolve_header_list(
    headers: &[crate::api::HttpHeader],
    namespace: &str,
    secrets: &impl SecretSource,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::with_capacity(headers.len());
    for header in headers {
        let value = match (&header.value, &header.secret_key_ref) {
            (Some(value), _) => value.clone(),
            (None, Some(secret)) => {
                secrets
                    .secret_value(namespace, secret)
                    .await
                    .map_err(|err| {
                        format!(
                            "header {}: cannot read key {:?} of Secret {namespace}/{}: {err}",
                            header.name, secret.key, secret.name
                        )
                    })?
            }
            (None, None) => {
                return Err(format!(
                    "header {}: set either value or secretKeyRef",
                    header.name
                ))
            }
        };
        out.push((header.name.clone(), value));
    }
    Ok(out)
}

/// Runs `fut`, turning a panic inside it into a `tool_error` with failure `executor_panic`
/// (docs/behaviours.md 15: a panic around a tool is a tool error, never a crash).
pub async fn guarded<F>(fut: F) -> ToolOutcome
where
    F: Future<Output = ToolOutcome>,
{
    let started = Instant::now();
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_string());
            tracing::error!(%message, "the tool executor panicked; recorded as a tool error");
            ToolOutcome::Error {
                failure: ToolFailure::ExecutorPanic,
                status: None,
                content: json!({"error": "the tool executor panicked", "detail": message}),
                duration_ms: millis(started),
            }
        }
    }
}

/// Performs one call and says how it ended. Never panics outward (see [`guarded`]).
pub async fn call(client: &reqwest::Client, call: HttpCall) -> ToolOutcome {
    guarded(call_unguarded(client, call)).await
}

async fn call_unguarded(client: &reqwest::Client, call: HttpCall) -> ToolOutcome {
    let started = Instant::now();
    let body = match serde_json::to_vec(&call.args) {
        Ok(body) => body,
        Err(err) => {
            return tool_error(
                ToolFailure::InvalidArgs,
                None,
                json!(err.to_string()),
                started,
            );
        }
    };
    let mut request = client
        .post(&call.url)
        .timeout(call.timeout)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .header(IDEMPOTENCY_KEY, &call.idempotency_key)
        .header(ATTEMPT, call.attempt.to_string())
        .header(RUN, &call.run)
        .header(HOLDER, &call.holder);
    for (name, value) in &call.headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = match request.body(body).build() {
        Ok(request) => request,
        Err(err) => {
            return tool_error(
                ToolFailure::InvalidRequest,
                None,
                json!(format!("cannot build the request to {}: {err}", call.url)),
                started,
            )
        }
    };
    let response = match client.execute(request).await {
        Ok(response) => response,
        Err(err) => return send_failure(&call.url, &err, started),
    };
    let status = response.status();
    let abort = response
        .headers()
        .get(ABORT)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let bytes = match read_body(response).await {
        Ok(ReadAnswer {
            body: Some(bytes), ..
        }) => bytes,
        Ok(over) => {
            return tool_error(
                ToolFailure::ResponseTooLarge,
                Some(status.as_u16()),
                too_large_content(&over),
                started,
            )
        }
        Err(err) => {
            return ToolOutcome::Unknown {
                detail: format!(
                    "the answer from {} was cut off after the request was sent: {}",
                    call.url,
                    error_chain(&err)
                ),
                duration_ms: millis(started),
            }
        }
    };
    let parsed = serde_json::from_slice::<Value>(&bytes);
    if let Some(reason) = abort {
        let content = parsed.unwrap_or_else(|_| raw_content(&bytes));
        return ToolOutcome::Abort {
            detail: reason,
            content,
            duration_ms: millis(started),
        };
    }
    if !status.is_success() {
        let content = parsed.unwrap_or_else(|_| raw_content(&bytes));
        return tool_error(
            ToolFailure::HttpStatus,
            Some(status.as_u16()),
            content,
            started,
        );
    }
    match parsed {
        Ok(content) => ToolOutcome::Result {
            status: status.as_u16(),
            content,
            duration_ms: millis(started),
        },
        Err(_) => tool_error(
            ToolFailure::InvalidContent,
            Some(status.as_u16()),
            raw_content(&bytes),
            started,
        ),
    }
}

/// How a send failed: before anything was sent (a tool error) or after (unknown).
fn send_failure(url: &str, err: &reqwest::Error, started: Instant) -> ToolOutcome {
    if err.is_connect() {
        // No connection, so no request reached the tool.
        return tool_error(
            ToolFailure::ConnectionRefused,
            None,
            json!(format!("cannot connect to {url}: {}", error_chain(err))),
            started,
        );
    }
    if err.is_builder() {
        return tool_error(
            ToolFailure::InvalidRequest,
            None,
            json!(format!("cannot send to {url}: {}", error_chain(err))),
            started,
        );
    }
    let what = if err.is_timeout() {
        "no answer within the tool's timeoutSeconds"
    } else {
        "the connection was lost after the request was sent"
    };
    ToolOutcome::Unknown {
        detail: format!("{what} ({url}): {}", error_chain(err)),
        duration_ms: millis(started),
    }
}

/// Reads the whole body within [`MAX_BODY_BYTES`]: past it, the bytes are counted and hashed
/// as they come and dropped.
async fn read_body(mut response: reqwest::Response) -> Result<ReadAnswer, reqwest::Error> {
    let mut answer = AnswerBody::new(MAX_BODY_BYTES);
    while let Some(chunk) = response.chunk().await? {
        answer.feed(&chunk);
    }
    Ok(answer.finish())
}

/// The content of a `response_too_large` error: the bound, the answer's size and SHA-256 (of
/// its bytes as received) and its head as text.
pub fn too_large_content(read: &ReadAnswer) -> Value {
    json!({
        "error": format!("the answer is over {MAX_BODY_BYTES} bytes"),
        "bytes": read.bytes,
        "sha256": read.sha256,
        "head": String::from_utf8_lossy(&read.head),
    })
}

/// Bytes that are not JSON, kept: as text when UTF-8, else `{"base64": "..."}`.
pub fn raw_content(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => Value::String(text.to_string()),
        Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(bytes)}),
    }
}

fn tool_error(
    failure: ToolFailure,
    status: Option<u16>,
    content: Value,
    started: Instant,
) -> ToolOutcome {
    ToolOutcome::Error {
        failure,
        status,
        content,
        duration_ms: millis(started),
    }
}

/// Milliseconds since `started` (saturating).
pub(crate) fn millis(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// An error and its sources, `outer: inner: innermost` (what a tool_error's detail shows).
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

pub mod status;

#[cfg(test)]
mod tests;
