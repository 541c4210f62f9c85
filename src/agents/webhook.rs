//! HTTP deciders: the `webhook` agent (POST the engine's request JSON, the answer is the
//! decision JSON) and the reconcile hook (POST a RunView, the answer is a Reconciliation;
//! docs/design.md section 5). Redirects are never followed.
//!
//! The agent is asked once per attempt ([`call_agent`]); whether and when to ask again is the
//! engine's (`crate::engine::agent_calls`: transient failures are retried within
//! `spec.agent.webhook.timeoutSeconds`, each attempt in the journal). The hook is
//! asked until it answers, for at most `spec.reconcile.webhook.timeoutSeconds` in all: a
//! connection that fails, a timeout, 408, 425, 429 and 5xx are tried again with backoff; any
//! other status, or a 2xx whose body is not JSON, is the answer at once (the engine fails the
//! run `internal_error`, naming the hook).
//!
//! An answer is read within [`MAX_ANSWER_BYTES`] (`engine::content::answer`): past it reading
//! stops and the connection is dropped; the agent's answer is then an invalid decision
//! (`unparseable`), the hook's a failure that is not transient.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::api::DeciderFailure;
use crate::engine::content::answer::{AnswerBody, MAX_ANSWER_BYTES};
use crate::engine::AgentFailure;

/// The wait before the reconcile hook's second attempt; it doubles up to
/// [`HOOK_BACKOFF_CAP`].
pub const HOOK_BACKOFF_START: Duration = Duration::from_millis(250);
/// The longest wait between two attempts of the reconcile hook.
pub const HOOK_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// What kind of failure a POST met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostFailureKind {
    /// No answer: no connection, a timeout, or the answer was cut off.
    NoAnswer,
    /// A non-2xx status.
    Status(u16),
    /// The answer is not JSON.
    NotJson,
    /// The answer is JSON the Kubernetes API cannot store exactly (docs/design.md section 6).
    Unstorable,
    /// The answer passed [`MAX_ANSWER_BYTES`]; reading stopped there.
    TooLarge,
}

/// Why a POST has no usable answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostFailure {
    /// What kind of failure it was.
    pub kind: PostFailureKind,
    /// A sentence naming the URL.
    pub detail: String,
    /// Whether asking again may help: no connection, a timeout, a lost connection, 408, 425,
    /// 429 or 5xx.
    pub transient: bool,
    /// The answer's `Retry-After` (or `retry-after-ms`), in milliseconds.
    pub retry_after_millis: Option<u64>,
}

/// POSTs `body` to `url` and returns the JSON answer of a 2xx, or why there is none.
///
/// # Errors
/// A [`PostFailure`] naming the URL: no connection, a timeout, a non-2xx status (with the start
/// of the body), or an answer that is not JSON.
pub async fn post(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    body: &Value,
) -> Result<Value, PostFailure> {
    let transient = |detail: String| PostFailure {
        kind: PostFailureKind::NoAnswer,
        detail,
        transient: true,
        retry_after_millis: None,
    };
    let mut response = client
        .post(url)
        .timeout(timeout)
        .json(body)
        .send()
        .await
        .map_err(|err| transient(format!("POST {url}: {}", error_chain(&err))))?;
    let status = response.status();
    let retry_after_millis = super::openai::retry_after_millis(response.headers());
    let mut answer = AnswerBody::new(MAX_ANSWER_BYTES);
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => answer.feed(&chunk),
            Ok(None) => break,
            Err(err) => {
                return Err(transient(format!(
                    "POST {url}: the answer was cut off: {}",
                    error_chain(&err)
                )))
            }
        }
        if answer.over() {
            // Dropping the response closes the connection: nothing more is read.
            break;
        }
    }
    let read = answer.finish();
    let Some(bytes) = read.body else {
        return Err(PostFailure {
            kind: PostFailureKind::TooLarge,
            detail: format!(
                "POST {url}: HTTP {status}: the answer is over {MAX_ANSWER_BYTES} bytes (reading stopped there)"
            ),
            transient: false,
            retry_after_millis: None,
        });
    };
    if !status.is_success() {
        let head: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
        let code = status.as_u16();
        return Err(PostFailure {
            kind: PostFailureKind::Status(code),
            detail: format!("POST {url}: HTTP {status}: {head}"),
            transient: matches!(code, 408 | 425 | 429) || status.is_server_error(),
            retry_after_millis,
        });
    }
    super::exact_json::read_exact(&bytes).map_err(|err| match err {
        // The sentence keeps the words records already hold ("[unstorable]"); nothing matches
        // on them, the kind says it.
        super::exact_json::ExactJsonError::Unstorable(why) => PostFailure {
            kind: PostFailureKind::Unstorable,
            detail: format!(
                "POST {url}: the answer is JSON the record cannot store exactly [unstorable]: {why}"
            ),
            transient: false,
            retry_after_millis: None,
        },
        super::exact_json::ExactJsonError::NotJson(why) => PostFailure {
            kind: PostFailureKind::NotJson,
            detail: format!("POST {url}: the answer is not JSON: {why}"),
            transient: false,
            retry_after_millis: None,
        },
    })
}

/// [`post`], the failure as its sentence.
///
/// # Errors
/// As [`post`].
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    body: &Value,
) -> Result<Value, String> {
    post(client, url, timeout, body)
        .await
        .map_err(|failure| failure.detail)
}

/// Asks the webhook agent for a decision: one attempt of at most `timeout` (the engine records
/// a failed one as `agent.failed` and decides whether to ask again).
///
/// # Errors
/// As [`post`], as the engine's [`AgentFailure`] (status, whether transient, Retry-After).
pub async fn call_agent(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    request: &Value,
) -> Result<Value, AgentFailure> {
    match post(client, url, timeout, request).await {
        Ok(decision) => Ok(decision),
        // JSON the Kubernetes API would not store exactly is the agent's invalid decision (the
        // step fails, the run goes on), kept verbatim as far as the record allows, never
        // silently rounded (docs/design.md section 6).
        Err(failure) if failure.kind == PostFailureKind::Unstorable => Ok(serde_json::json!({
            "kind": "invalid",
            "failure": DeciderFailure::Unstorable,
            "detail": failure.detail,
        })),
        // An answer over the bound is the agent's invalid decision too: it was not read to its
        // end, so there is no decision in it (docs/design.md section 6, "Answers").
        Err(failure) if failure.kind == PostFailureKind::TooLarge => Ok(serde_json::json!({
            "kind": "invalid",
            "failure": DeciderFailure::Unparseable,
            "detail": failure.detail,
        })),
        Err(failure) => Err(AgentFailure {
            status: match failure.kind {
                PostFailureKind::Status(code) => Some(code),
                _ => None,
            },
            detail: failure.detail,
            transient: failure.transient,
            retry_after_millis: failure.retry_after_millis,
        }),
    }
}

/// Asks the reconcile hook what to do with an interrupted run, trying again after a transient
/// failure with backoff ([`HOOK_BACKOFF_START`] doubling to [`HOOK_BACKOFF_CAP`]) for at most
/// `budget` in all (`spec.reconcile.webhook.timeoutSeconds`); each attempt may use what is left
/// of it.
///
/// # Errors
/// A sentence naming the hook: the failure that is not transient, or, once the budget is
/// spent, how many attempts were made and the last failure.
pub async fn call_reconcile_hook(
    client: &reqwest::Client,
    url: &str,
    budget: Duration,
    view: &Value,
) -> Result<Value, String> {
    let deadline = Instant::now() + budget;
    let mut wait = HOOK_BACKOFF_START;
    let mut attempts = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        attempts += 1;
        let failure = match post(client, url, left.max(Duration::from_millis(1)), view).await {
            Ok(answer) => return Ok(answer),
            Err(failure) => failure,
        };
        tracing::info!(detail = %failure.detail, attempts, "the reconcile hook failed");
        if !failure.transient {
            return Err(format!("spec.reconcile.webhook {url}: {}", failure.detail));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left <= wait {
            return Err(format!(
                "spec.reconcile.webhook {url} gave no usable answer within its timeoutSeconds ({} s, {attempts} attempts); the last: {}",
                budget.as_secs(),
                failure.detail
            ));
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(HOOK_BACKOFF_CAP);
    }
}

/// The error and its sources, joined with `: ` (reqwest's own message alone says little, e.g.
/// "error sending request"). Also the openai agent's.
pub(super) fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::json;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn the_reconcile_hook_is_retried_then_answers() {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let app = Router::new().route(
            "/hook",
            post(move |Json(view): Json<Value>| {
                let seen = seen.clone();
                async move {
                    if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        Err(axum::http::StatusCode::SERVICE_UNAVAILABLE)
                    } else {
                        Ok(Json(json!({"outcome": "continue", "saw": view["run"]})))
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let answer = call_reconcile_hook(
            &client,
            &format!("http://{addr}/hook"),
            Duration::from_secs(2),
            &json!({"run": "r"}),
        )
        .await
        .unwrap();
        assert_eq!(answer, json!({"outcome": "continue", "saw": "r"}));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let err = call_agent(
            &client,
            &format!("http://{addr}/missing"),
            Duration::from_secs(2),
            &json!({}),
        )
        .await
        .unwrap_err();
        assert!(err.detail.contains("404"), "{err:?}");
        assert_eq!((err.status, err.transient), (Some(404), false));
    }

    async fn hook(status: u16, body: &'static str) -> (String, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let seen = calls.clone();
        let app = Router::new().route(
            "/hook",
            post(move || {
                let seen = seen.clone();
                async move {
                    seen.fetch_add(1, Ordering::SeqCst);
                    if status == 0 {
                        std::future::pending::<()>().await;
                    }
                    (axum::http::StatusCode::from_u16(status).unwrap(), body)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/hook"), calls)
    }

    #[tokio::test]
    async fn a_hook_answer_that_is_not_transient_fails_at_once_naming_the_hook() {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for (status, body, what) in [(400, "no", "400"), (200, "not json", "not JSON")] {
            let (url, calls) = hook(status, body).await;
            let err = call_reconcile_hook(&client, &url, Duration::from_secs(20), &json!({}))
                .await
                .unwrap_err();
            assert!(err.contains(&url) && err.contains(what), "{err}");
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{err}");
        }
    }

    #[tokio::test]
    async fn a_hook_that_is_down_or_never_answers_is_given_its_timeout_in_all() {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let (url, calls) = hook(503, "busy").await;
        let err = call_reconcile_hook(&client, &url, Duration::from_secs(1), &json!({}))
            .await
            .unwrap_err();
        assert!(
            err.contains("timeoutSeconds") && err.contains("503"),
            "{err}"
        );
        assert!(calls.load(Ordering::SeqCst) >= 2, "{err}");

        let (url, calls) = hook(0, "").await;
        let err = call_reconcile_hook(&client, &url, Duration::from_secs(1), &json!({}))
            .await
            .unwrap_err();
        assert!(
            err.contains(&url) && err.contains("timeoutSeconds"),
            "{err}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{err}");

        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/hook");
        let err = call_reconcile_hook(&client, &url, Duration::from_secs(1), &json!({}))
            .await
            .unwrap_err();
        assert!(err.contains(&url) && err.contains("attempts"), "{err}");
    }
}
