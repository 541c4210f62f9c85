//! The `openai` agent (docs/design.md section 6): any OpenAI-compatible chat-completions endpoint
//! with tool calling (OpenAI, vLLM, Ollama, the llama.cpp server).
//!
//! Owns: the wire format — the engine's conversation as a chat-completions request
//! ([`render`], [`encode`]; the engine gets both as [`WIRE`]), reading a reply into the decision to record ([`parse_reply`]), and one HTTP
//! attempt ([`call`]). Must not: decide anything about the run. Limits, charges and retries
//! are the engine's (`crate::engine::model`); this module sends one attempt when asked and
//! reports exactly what happened: an answer (any status), nothing sent, or sent without an
//! answer (whose outcome is unknown and which the engine charges its projection).
//!
//! The API key: held in an [`ApiKey`], whose `Debug` and `Display` print `***`; it is sent
//! only as `Authorization: Bearer …`, never over plain `http` to a host that is not a loopback
//! address, never to a redirect target (redirects are not followed), never through a
//! plain-http proxy; no error, log line or `Debug` output contains it, and an answer body that
//! echoes it has it replaced by `***` before anything reads the body.

mod reply;
mod request;

use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;

use super::webhook::error_chain;
use crate::api::OpenAiAgent;
use crate::engine::content::answer::AnswerBody;
use crate::engine::model::{AttemptOutcome, INSECURE_KEY_REFUSAL};

pub use crate::engine::conversation::{COMPLETE_FUNCTION, DEFAULT_SYSTEM_PROMPT, FAIL_FUNCTION};
pub use crate::engine::model::ReportedUsage;
pub use reply::{parse_reply, ParsedReply};
pub use request::{encode, render, render_request, WIRE};

/// The largest reply body read, in bytes (docs/design.md section 6, "Answers"): reading stops
/// there and the connection is dropped, and the attempt is a failed one
/// ([`ModelAnswer::too_large`]; the engine ends the run `model_unavailable` naming the bound).
pub const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// An API key. `Debug` and `Display` print `***`; only [`ApiKey::expose`] gives the text.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps the key read from the Secret named by `apiKeySecretRef`.
    pub fn new(key: impl Into<String>) -> ApiKey {
        ApiKey(key.into())
    }

    /// The key itself, for the `Authorization` header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The server's answer to one attempt, whatever its status.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelAnswer {
    /// The HTTP status (a 3xx is returned as is: redirects are not followed).
    pub status: u16,
    /// The body as received (at most [`MAX_REPLY_BYTES`]; empty when `too_large`).
    pub body: Bytes,
    /// Whether the body passed [`MAX_REPLY_BYTES`] (reading stopped there).
    pub too_large: bool,
    /// How long the server asked to wait before retrying, in milliseconds: `retry-after-ms`,
    /// else `Retry-After` in seconds or as an HTTP date (0 when the date has passed).
    pub retry_after_millis: Option<u64>,
    /// From sending to the end of the body, in milliseconds.
    pub latency_ms: u64,
}

/// Why an attempt has no answer. Messages name the endpoint (scheme, host, port and path
/// only) and never contain the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelCallError {
    /// Not sent, and sending again will not help: the base URL is unusable, or the key would
    /// go over plain http to a host that is not a loopback address. Charged nothing; the run
    /// ends `model_unavailable`.
    #[error("model endpoint {url}: not sent: {detail}")]
    Misconfigured {
        /// The endpoint as far as it could be read.
        url: String,
        /// What to fix.
        detail: String,
    },
    /// Not sent: the connection could not be made (refused, unreachable, name not resolved).
    /// Charged nothing; transient.
    #[error("model endpoint {url}: not sent: {detail}")]
    Refused {
        /// The endpoint.
        url: String,
        /// What failed.
        detail: String,
    },
    /// Sent, and no answer came (timeout, connection lost, body unreadable): the
    /// model may have run. Charged its projection; transient.
    #[error("model endpoint {url}: sent, no answer after {latency_ms} ms: {detail}")]
    Ambiguous {
        /// The endpoint.
        url: String,
        /// What failed.
        detail: String,
        /// From sending to the failure, in milliseconds.
        latency_ms: u64,
    },
}

impl ModelCallError {
    /// How the engine charges this attempt (`NotSent` or `NoAnswer`).
    pub fn outcome(&self) -> AttemptOutcome {
        match self {
            ModelCallError::Misconfigured { .. } | ModelCallError::Refused { .. } => {
                AttemptOutcome::NotSent
            }
            ModelCallError::Ambiguous { .. } => AttemptOutcome::NoAnswer,
        }
    }

    /// Whether another attempt could succeed (everything but [`ModelCallError::Misconfigured`]);
    /// a retryable failure goes to `engine::model::retry_plan` with no status.
    pub fn retryable(&self) -> bool {
        !matches!(self, ModelCallError::Misconfigured { .. })
    }
}

/// The HTTP client for model calls: redirects are not followed, and a proxy is used only for
/// `https` endpoints (from `HTTPS_PROXY`/`https_proxy`, honouring `NO_PROXY`), where the
/// tunnel keeps the key encrypted; plain-http calls always go direct.
///
/// # Errors
/// [`ModelCallError::Misconfigured`] when the TLS backend or the proxy setting cannot be used.
pub fn build_client() -> Result<reqwest::Client, ModelCallError> {
    let misconfigured = |detail: String| ModelCallError::Misconfigured {
        url: "-".to_string(),
        detail,
    };
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    let https_proxy = std::env::var("HTTPS_PROXY").or_else(|_| std::env::var("https_proxy"));
    if let Ok(proxy) = https_proxy.as_deref().map(str::trim) {
        if !proxy.is_empty() {
            let proxy = reqwest::Proxy::https(proxy)
                .map_err(|err| misconfigured(format!("HTTPS_PROXY is not a usable URL: {err}")))?
                .no_proxy(reqwest::NoProxy::from_env());
            builder = builder.proxy(proxy);
        }
    }
    builder
        .build()
        .map_err(|err| misconfigured(format!("cannot build the HTTP client: {err}")))
}

/// Sends one chat-completions attempt: POST `{baseURL}/chat/completions` with [`encode`]`(body)`
/// and, when `api_key` is given, `Authorization: Bearer <key>`; `timeout` bounds the whole
/// attempt, body included. `client` should come from [`build_client`] (no redirects).
///
/// Any status is an answer ([`ModelAnswer`]); the engine decides what it means.
///
/// # Errors
/// [`ModelCallError::Misconfigured`] before anything is sent when the base URL is not
/// `http(s)` or when a key would go over plain `http` to a host that is not a loopback address
/// (127.0.0.0/8, ::1, `localhost`); [`ModelCallError::Refused`] when the connection could not
/// be made; [`ModelCallError::Ambiguous`] when the request may have been sent and no answer
/// came.
pub async fn call(
    client: &reqwest::Client,
    agent: &OpenAiAgent,
    api_key: Option<&ApiKey>,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<ModelAnswer, ModelCallError> {
    let url = endpoint(&agent.base_url)?;
    let shown = shown_url(&url);
    let misconfigured = |detail: &str| ModelCallError::Misconfigured {
        url: shown.clone(),
        detail: detail.to_string(),
    };
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(key) = api_key {
        if url.scheme() != "https" && !is_loopback(&url) {
            return Err(misconfigured(&format!(
                "{INSECURE_KEY_REFUSAL}; use an https:// baseURL"
            )));
        }
        let mut value =
            HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                misconfigured("the API key is not a valid HTTP header value (check the Secret)")
            })?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    let started = Instant::now();
    let elapsed_ms = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // Past the connection, the request may have been sent: no answer is an unknown outcome.
    let no_answer = |err: reqwest::Error| ModelCallError::Ambiguous {
        url: shown.clone(),
        detail: scrub(&error_chain(&err.without_url()), api_key),
        latency_ms: elapsed_ms(),
    };
    let sent = client
        .post(url.clone())
        .headers(headers)
        .timeout(timeout)
        .body(encode(body))
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(err) if err.is_connect() => {
            return Err(ModelCallError::Refused {
                url: shown.clone(),
                detail: scrub(&error_chain(&err.without_url()), api_key),
            })
        }
        Err(err) => return Err(no_answer(err)),
    };
    let status = response.status().as_u16();
    let retry_after_millis = retry_after_millis(response.headers());
    let mut reply = AnswerBody::new(MAX_REPLY_BYTES);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => reply.feed(&chunk),
            Ok(None) => break,
            Err(err) => return Err(no_answer(err)),
        }
        if reply.over() {
            // Dropping the response closes the connection: nothing more is read.
            break;
        }
    }
    let read = reply.finish();
    let too_large = read.body.is_none();
    let received = read.body.unwrap_or_default();
    let latency_ms = elapsed_ms();
    tracing::debug!(url = %shown, status, latency_ms, "model endpoint answered");
    Ok(ModelAnswer {
        status,
        body: Bytes::from(scrub_bytes(received, api_key)),
        too_large,
        retry_after_millis,
        latency_ms,
    })
}

/// `{baseURL}/chat/completions` (one `/` between them).
fn endpoint(base_url: &str) -> Result<Url, ModelCallError> {
    let joined = format!("{}/chat/completions", base_url.trim_end_matches('/'));
    let misconfigured = |detail: String| ModelCallError::Misconfigured {
        url: "spec.agent.openai.baseURL".to_string(),
        detail,
    };
    let url = Url::parse(&joined).map_err(|err| {
        misconfigured(format!("not a URL ({err}); e.g. https://api.openai.com/v1"))
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(misconfigured(
            "must be an http:// or https:// URL with a host".to_string(),
        ));
    }
    Ok(url)
}

/// The URL as shown in errors and logs: scheme, host, port and path (no user info or query).
fn shown_url(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{host}:{port}{}", url.scheme(), url.path()),
        None => format!("{}://{host}{}", url.scheme(), url.path()),
    }
}

/// Whether the URL's host is a loopback address: 127.0.0.0/8, ::1 (or ::ffff:127.x.y.z), or
/// the name `localhost`. The URL parser has already normalised the host (`127.1` is
/// `127.0.0.1`, IPv6 is bracketed).
fn is_loopback(url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// `text` with the key replaced by `***`, should a library ever echo it.
fn scrub(text: &str, api_key: Option<&ApiKey>) -> String {
    match api_key.map(ApiKey::expose).filter(|key| !key.is_empty()) {
        Some(key) => text.replace(key, "***"),
        None => text.to_string(),
    }
}

/// `body` with every occurrence of the key replaced by `***`: a server that echoes the
/// `Authorization` header (in an error body, say) must not get the key into the record.
fn scrub_bytes(body: Vec<u8>, api_key: Option<&ApiKey>) -> Vec<u8> {
    let Some(key) = api_key
        .map(|k| k.expose().as_bytes())
        .filter(|k| !k.is_empty())
    else {
        return body;
    };
    if !body.windows(key.len()).any(|window| window == key) {
        return body;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body.as_slice();
    while !rest.is_empty() {
        if rest.starts_with(key) {
            out.extend_from_slice(b"***");
            rest = &rest[key.len()..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// `retry-after-ms`, else `Retry-After` (delta-seconds or an HTTP date), in milliseconds. Also
/// the webhook agent's. A value too large to hold (`Retry-After: 99999999999999999999`) is
/// "longer than any budget", not unreadable: it saturates at [`RETRY_AFTER_SATURATED_MILLIS`],
/// so the engine stops early as for any Retry-After past the budget (docs/behaviours.md 48).
pub(super) fn retry_after_millis(headers: &HeaderMap) -> Option<u64> {
    retry_after_unbounded(headers).map(|ms| ms.min(RETRY_AFTER_SATURATED_MILLIS))
}

/// The most milliseconds a Retry-After is read as: `i64::MAX`, so the value recorded in an
/// event (`retryAfterMs`) is one the Kubernetes API stores exactly.
pub const RETRY_AFTER_SATURATED_MILLIS: u64 = i64::MAX as u64;

fn retry_after_unbounded(headers: &HeaderMap) -> Option<u64> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            // Saturating float-to-int conversion; rounded up so the wait is never shorter.
            return Some(ms.ceil() as u64);
        }
    }
    let value = text("retry-after")?;
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000));
    }
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Delta-seconds too large for u64: longer than any budget.
        return Some(u64::MAX);
    }
    let date = jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(value)
        .ok()?;
    let millis = date.as_millisecond() - jiff::Timestamp::now().as_millisecond();
    Some(u64::try_from(millis).unwrap_or(0))
}

#[cfg(test)]
mod tests;
