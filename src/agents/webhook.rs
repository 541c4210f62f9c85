//! HTTP deciders: the `webhook` agent (POST the engine's request JSON, the answer is the
//! decision JSON) and the reconcile hook (POST a RunView, the answer is a Reconciliation;
//! DESIGN.md section 5). Redirects are never followed.

use std::time::Duration;

use serde_json::Value;

/// How many times the reconcile hook is asked before the answer is a failure.
pub const RECONCILE_HOOK_ATTEMPTS: u32 = 3;

/// POSTs `body` to `url` and returns the JSON answer of a 2xx, or why there is none.
///
/// # Errors
/// A sentence naming the URL: no connection, a timeout, a non-2xx status (with the start of the
/// body), or an answer that is not JSON.
pub async fn post_json(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    body: &Value,
) -> Result<Value, String> {
    let response = client
        .post(url)
        .timeout(timeout)
        .json(body)
        .send()
        .await
        .map_err(|err| format!("POST {url}: {err}"))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|err| format!("POST {url}: the answer was cut off: {err}"))?;
    if !status.is_success() {
        let head: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
        return Err(format!("POST {url}: HTTP {status}: {head}"));
    }
    serde_json::from_slice(&bytes)
        .map_err(|err| format!("POST {url}: the answer is not JSON: {err}"))
}

/// Asks the webhook agent for a decision: one attempt (the engine records an agent error).
///
/// # Errors
/// As [`post_json`].
pub async fn call_agent(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    request: &Value,
) -> Result<Value, String> {
    post_json(client, url, timeout, request).await
}

/// Asks the reconcile hook what to do with an interrupted run, retrying a failed attempt with
/// backoff ([`RECONCILE_HOOK_ATTEMPTS`] in all).
///
/// # Errors
/// The last attempt's failure.
pub async fn call_reconcile_hook(
    client: &reqwest::Client,
    url: &str,
    timeout: Duration,
    view: &Value,
) -> Result<Value, String> {
    let mut last = String::new();
    for attempt in 0..RECONCILE_HOOK_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(250 << attempt)).await;
        }
        match post_json(client, url, timeout, view).await {
            Ok(answer) => return Ok(answer),
            Err(err) => {
                tracing::info!(%err, attempt, "the reconcile hook failed");
                last = err;
            }
        }
    }
    Err(format!(
        "the reconcile hook failed {RECONCILE_HOOK_ATTEMPTS} times; last: {last}"
    ))
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
        assert!(err.contains("404"), "{err}");
    }
}
