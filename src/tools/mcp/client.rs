//! The client of one MCP server (the module doc of `tools::mcp` says what it does): its
//! session, the exchanges of JSON-RPC messages over HTTP POST, and what each failure means for
//! `initialize`, `tools/list` and `tools/call`.
//!
//! Owns: the one place a request is sent, and the rule that a `tools/call` is sent again only
//! after a 404 for its session (docs/design.md section 6). Must not: retry anything else.

use std::fmt;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::answer::{self, body_snippet, outcome_of, AnswerStats, Bounds, Read};
use super::{
    CallOutcome, McpError, ProtocolVersion, Session, ToolsCall, DEFAULT_MAX_ANSWER_BYTES,
    DEFAULT_MAX_STREAM_BYTES, MAX_PAGES, META_ATTEMPT, META_CLIENT_CAPABILITIES, META_CLIENT_INFO,
    META_IDEMPOTENCY_KEY, META_PROTOCOL_VERSION, META_SERVER_INFO, METHOD, NAME, PROTOCOL_VERSION,
    SESSION_ID, UNSUPPORTED_PROTOCOL_VERSION_CODE,
};
use crate::tools::http::{error_chain, millis};
use crate::tools::http::{ATTEMPT, HOLDER, IDEMPOTENCY_KEY, RUN};

mod tasks;

pub use tasks::{InputRequest, Task, TaskAnswer, TaskStatus};

/// One MCP server's client: its URL, headers and session.
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    pub(super) headers: Vec<(String, String)>,
    preferred: Option<ProtocolVersion>,
    bounds: Bounds,
    handshake_timeout: Duration,
    session: Option<Session>,
    next_id: i64,
    /// Declares the `elicitation` capability at `initialize` ([`McpClient::answering_input`]).
    elicitation: bool,
}

impl fmt::Debug for McpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("McpClient")
            .field("url", &self.url)
            .field("headers", &names)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// How one exchange failed, before the callers say what it means for them.
enum Failure {
    NotSent(String),
    SessionNotFound,
    Status(u16, String),
    Lost(String),
    TooLarge(AnswerStats),
    NoResponse(AnswerStats),
    Invalid(String, AnswerStats),
}

impl McpClient {
    /// A client of the server at `url`, sending `headers` (Secret values already read) with
    /// every request. `http` must not follow redirects ([`crate::tools::http::client`]).
    pub fn new(http: reqwest::Client, url: &str, headers: Vec<(String, String)>) -> McpClient {
        McpClient {
            http,
            url: url.to_string(),
            headers,
            preferred: None,
            bounds: Bounds {
                max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
                max_stream_bytes: DEFAULT_MAX_STREAM_BYTES,
            },
            handshake_timeout: Duration::from_secs(10),
            session: None,
            next_id: 1,
            elicitation: false,
        }
    }

    /// Speaks `version` only: 2026-07-28 by `server/discover` alone, an earlier revision by
    /// proposing it at `initialize` (no discover). Without it the client negotiates: discover,
    /// else initialize proposing 2025-11-25, taking the revision the server answers.
    pub fn with_protocol(mut self, version: ProtocolVersion) -> McpClient {
        self.preferred = Some(version);
        self
    }

    /// Keeps at most `max_answer_bytes` of an answer, and reads at most `max_stream_bytes`.
    pub fn with_bounds(mut self, max_answer_bytes: usize, max_stream_bytes: u64) -> McpClient {
        self.bounds = Bounds {
            max_answer_bytes,
            max_stream_bytes,
        };
        self
    }

    /// How long `initialize` and each `tools/list` page may take (default 10 s).
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> McpClient {
        self.handshake_timeout = timeout;
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The open session, if any.
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Opens a new session: `server/discover` at 2026-07-28 (no session: each request then
    /// stands alone), else `initialize` then `notifications/initialized` (see the module doc for
    /// when it falls back, and [`McpClient::with_protocol`]).
    ///
    /// # Errors
    /// [`McpError`] for anything but a usable answer in a revision this client speaks; a server
    /// that cannot be reached at all is not asked again with `initialize`.
    pub async fn initialize(&mut self) -> Result<&Session, McpError> {
        self.session = None;
        let discover = self.preferred.is_none_or(ProtocolVersion::is_stateless);
        if discover {
            if let Some(session) = self.discover().await? {
                tracing::debug!(url = %self.url, protocol = session.protocol.as_str(), "MCP server discovered");
                return Ok(self.session.insert(session));
            }
            if self.preferred.is_some() {
                return Err(McpError::UnsupportedVersion {
                    url: self.url.clone(),
                    version: "one without 2026-07-28 (server/discover did not list it)".into(),
                });
            }
        }
        let proposed = self
            .preferred
            .filter(|p| !p.is_stateless())
            .unwrap_or(ProtocolVersion::V2025_11_25);
        self.handshake(proposed).await
    }

    /// `server/discover` at 2026-07-28: the session when the server lists that revision,
    /// `None` when it gave no positive evidence of speaking it (a legacy server: fall back).
    ///
    /// # Errors
    /// A server that could not be reached or did not answer in time; one that speaks only
    /// modern revisions none of which is 2026-07-28.
    async fn discover(&mut self) -> Result<Option<Session>, McpError> {
        let method = "server/discover";
        let version = ProtocolVersion::V2026_07_28;
        let timeout = self.handshake_timeout;
        let params = json!({"_meta": envelope(version)});
        let extra = [(PROTOCOL_VERSION, version.as_str()), (METHOD, method)];
        let response = match self.exchange(method, params, &extra, timeout).await {
            Ok((response, _, _)) => response,
            Err(failure @ (Failure::NotSent(_) | Failure::Lost(_) | Failure::TooLarge(_))) => {
                return Err(self.error(method, failure))
            }
            // An HTTP refusal or an answer that is not a JSON-RPC response: a legacy server.
            Err(failure) => {
                tracing::debug!(url = %self.url, detail = %self.error(method, failure), "no server/discover: falling back to initialize");
                return Ok(None);
            }
        };
        if let Some(error) = response.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let supported: Vec<&str> = error
                .pointer("/data/supported")
                .and_then(Value::as_array)
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let handshake_listed = supported
                .iter()
                .any(|v| ProtocolVersion::parse(v).is_some_and(|p| !p.is_stateless()));
            if code == UNSUPPORTED_PROTOCOL_VERSION_CODE
                && !supported.is_empty()
                && !handshake_listed
            {
                return Err(McpError::UnsupportedVersion {
                    url: self.url.clone(),
                    version: supported.join(", "),
                });
            }
            return Ok(None);
        }
        let Some(result) = response.get("result").filter(|r| r.is_object()) else {
            return Ok(None);
        };
        let listed = result
            .get("supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(version.as_str())));
        if !listed {
            return Ok(None);
        }
        let server_info = result
            .pointer(&format!("/_meta/{}", META_SERVER_INFO.replace('/', "~1")))
            .or_else(|| result.get("serverInfo"))
            .cloned()
            .unwrap_or(Value::Null);
        Ok(Some(Session {
            id: None,
            protocol: version,
            server_info,
            tasks: tasks::offered(result),
        }))
    }

    /// `initialize` proposing `proposed`, then `notifications/initialized`.
    async fn handshake(&mut self, proposed: ProtocolVersion) -> Result<&Session, McpError> {
        let method = "initialize";
        let capabilities = if self.elicitation {
            json!({"elicitation": {}})
        } else {
            json!({})
        };
        let params = json!({
            "protocolVersion": proposed.as_str(),
            "capabilities": capabilities,
            "clientInfo": client_info()
        });
        let timeout = self.handshake_timeout;
        let (response, session_id, _) = match self.exchange(method, params, &[], timeout).await {
            Ok(found) => found,
            Err(failure) => return Err(self.error(method, failure)),
        };
        let result = self.result_of(method, response)?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let protocol = ProtocolVersion::parse(version)
            .filter(|p| !p.is_stateless())
            .ok_or_else(|| McpError::UnsupportedVersion {
                url: self.url.clone(),
                version: version.to_string(),
            })?;
        self.session = Some(Session {
            id: session_id,
            protocol,
            server_info: result.get("serverInfo").cloned().unwrap_or(Value::Null),
            tasks: tasks::offered(&result),
        });
        let notified = self
            .notify("notifications/initialized", timeout)
            .await
            .map_err(|failure| self.error("notifications/initialized", failure));
        if let Err(err) = notified {
            self.session = None;
            return Err(err);
        }
        tracing::debug!(url = %self.url, protocol = protocol.as_str(), "MCP session opened");
        self.session
            .as_ref()
            .ok_or_else(|| McpError::InvalidAnswer {
                url: self.url.clone(),
                method: method.to_string(),
                detail: "no session".to_string(),
            })
    }

    /// Every tool the server lists, all pages in order, as the raw `tools` entries
    /// (`engine::pins::definitions` reads them). Opens a session if none is open, and a new one
    /// when the server answers 404 for the old one.
    ///
    /// # Errors
    /// [`McpError`]; `InvalidAnswer` also for a repeated cursor or more than [`MAX_PAGES`].
    pub async fn list_tools(&mut self) -> Result<Vec<Value>, McpError> {
        let method = "tools/list";
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..MAX_PAGES {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let response = self.request_with_new_session(method, params).await?;
            let result = self.result_of(method, response)?;
            let Some(page) = result.get("tools").and_then(Value::as_array) else {
                return Err(self.invalid(method, "result.tools is not an array"));
            };
            tools.extend(page.iter().cloned());
            match result.get("nextCursor") {
                None | Some(Value::Null) => return Ok(tools),
                Some(Value::String(next)) => {
                    if !seen.insert(next.clone()) {
                        return Err(self.invalid(method, "the server repeated a cursor"));
                    }
                    cursor = Some(next.clone());
                }
                Some(_) => return Err(self.invalid(method, "nextCursor is not a string")),
            }
        }
        Err(self.invalid(method, &format!("more than {MAX_PAGES} pages")))
    }

    /// Calls a tool. Opens a session first if none is open (a failure there: nothing sent). A
    /// 404 for the session opens a new one and sends the call once more; nothing else is ever
    /// sent again.
    pub async fn call_tool(&mut self, call: &ToolsCall) -> CallOutcome {
        let started = Instant::now();
        let not_sent = |detail: String| CallOutcome::NotSent {
            detail,
            duration_ms: millis(started),
        };
        if self.session.is_none() {
            if let Err(err) = self.initialize().await {
                return not_sent(format!("initialize failed, the call was not sent: {err}"));
            }
        }
        let mut params = json!({
            "name": call.name,
            "arguments": call.arguments,
            "_meta": {META_IDEMPOTENCY_KEY: call.idempotency_key, META_ATTEMPT: call.attempt}
        });
        if let Some(ttl) = call.task_ttl {
            params["task"] = json!({"ttl": u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)});
        }
        let attempt = call.attempt.to_string();
        let extra = [
            (IDEMPOTENCY_KEY, call.idempotency_key.as_str()),
            (ATTEMPT, attempt.as_str()),
            (RUN, call.run.as_str()),
            (HOLDER, call.holder.as_str()),
        ];
        let mut renewed = false;
        let failure = loop {
            match self
                .exchange("tools/call", params.clone(), &extra, call.timeout)
                .await
            {
                Ok((response, _, stats)) => {
                    if call.task_ttl.is_some() {
                        if let Some(task) = tasks::created(&response) {
                            return CallOutcome::TaskCreated {
                                task,
                                duration_ms: millis(started),
                            };
                        }
                    }
                    return self.answered(response, stats, started);
                }
                Err(Failure::SessionNotFound) if !renewed => {
                    // The server forgot the session before it handled the call: the call did
                    // not run, so one send in a fresh session is the first that counts.
                    renewed = true;
                    tracing::debug!(url = %self.url, "the MCP server forgot the session; opening a new one");
                    if let Err(err) = self.initialize().await {
                        return not_sent(format!(
                            "the server forgot the session and a new one could not be opened: {err}"
                        ));
                    }
                }
                Err(failure) => break failure,
            }
        };
        self.failed_call(failure, started)
    }

    /// What the response to a `tools/call` (or `tasks/result`) says, an error's message
    /// redacted.
    fn answered(&self, response: Value, stats: AnswerStats, started: Instant) -> CallOutcome {
        match outcome_of(response, stats, started) {
            CallOutcome::RpcError {
                code,
                message,
                data,
                duration_ms,
            } => CallOutcome::RpcError {
                code,
                message: self.redact(&message),
                data,
                duration_ms,
            },
            outcome => outcome,
        }
    }

    /// What a failed exchange of a `tools/call` (or `tasks/result`) means for the call.
    fn failed_call(&self, failure: Failure, started: Instant) -> CallOutcome {
        let duration_ms = millis(started);
        let not_sent = |detail: String| CallOutcome::NotSent {
            detail,
            duration_ms,
        };
        let url = &self.url;
        match failure {
            Failure::NotSent(detail) => not_sent(detail),
            Failure::SessionNotFound => {
                not_sent(format!("{url} answered 404 for a fresh session too"))
            }
            // A redirect (never followed) or a 4xx: the transport refused the message before
            // any tool saw it.
            Failure::Status(status, body) if (300..500).contains(&status) => not_sent(format!(
                "{url} refused the call with HTTP {status} (redirects are not followed): {body}"
            )),
            Failure::Status(status, body) => CallOutcome::Unknown {
                detail: format!("{url} answered HTTP {status} after the call was sent: {body}"),
                duration_ms,
            },
            Failure::Lost(detail) => CallOutcome::Unknown {
                detail,
                duration_ms,
            },
            Failure::NoResponse(answer) => CallOutcome::Unknown {
                detail: format!(
                    "{url} accepted the call and its answer ended without the response ({} bytes)",
                    answer.bytes
                ),
                duration_ms,
            },
            Failure::TooLarge(answer) => CallOutcome::TooLarge {
                max: self.bounds.max_answer_bytes,
                answer,
                duration_ms,
            },
            Failure::Invalid(detail, answer) => CallOutcome::InvalidAnswer {
                detail,
                answer,
                duration_ms,
            },
        }
    }

    /// A request that opens a session first if none is open, and a new one (then sends again)
    /// when the server answers 404 for it. Only for requests safe to send twice.
    async fn request_with_new_session(
        &mut self,
        method: &str,
        params: Value,
    ) -> Result<Value, McpError> {
        if self.session.is_none() {
            self.initialize().await?;
        }
        let timeout = self.handshake_timeout;
        match self.exchange(method, params.clone(), &[], timeout).await {
            Ok((response, _, _)) => Ok(response),
            Err(Failure::SessionNotFound) => {
                self.initialize().await?;
                self.exchange(method, params, &[], timeout)
                    .await
                    .map(|(response, _, _)| response)
                    .map_err(|failure| self.error(method, failure))
            }
            Err(failure) => Err(self.error(method, failure)),
        }
    }

    fn request(
        &self,
        body: &Value,
        extra: &[(&str, &str)],
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(&self.url)
            .timeout(timeout)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json, text/event-stream")
            .json(body);
        if let Some(session) = &self.session {
            if let Some(id) = &session.id {
                request = request.header(SESSION_ID, id);
            }
            if session.protocol.sends_version_header() {
                request = request.header(PROTOCOL_VERSION, session.protocol.as_str());
            }
        }
        for (name, value) in &self.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        for (name, value) in extra {
            request = request.header(*name, *value);
        }
        request
    }

    /// Sends one request and reads the response to it; returns it and the session id header.
    async fn exchange(
        &mut self,
        method: &str,
        params: Value,
        extra: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<(Value, Option<String>, AnswerStats), Failure> {
        self.exchange_until(method, params, extra, timeout, None)
            .await
    }

    /// As [`McpClient::exchange`], and returns instead the first request of the server whose
    /// method is `stop_at` when one comes before the response (the message has `method`).
    async fn exchange_until(
        &mut self,
        method: &str,
        params: Value,
        extra: &[(&str, &str)],
        timeout: Duration,
        stop_at: Option<&str>,
    ) -> Result<(Value, Option<String>, AnswerStats), Failure> {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = params;
        let mut routing: Vec<(&str, String)> = Vec::new();
        if let Some(version) = self
            .session
            .as_ref()
            .map(|s| s.protocol)
            .filter(|p| p.is_stateless())
        {
            // 2026-07-28: each request stands alone (docs/design.md section 6).
            if let Some(object) = params.as_object_mut() {
                let meta = object.entry("_meta").or_insert_with(|| json!({}));
                if let (Some(meta), Value::Object(envelope)) =
                    (meta.as_object_mut(), envelope(version))
                {
                    meta.extend(envelope);
                }
            }
            routing.push((METHOD, method.to_string()));
            if method == "tools/call" {
                if let Some(name) = params.get("name").and_then(Value::as_str) {
                    routing.push((NAME, name.to_string()));
                }
            }
        }
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        headers.extend(routing.iter().map(|(n, v)| (*n, v.as_str())));
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        tracing::debug!(url = %self.url, method, id, "MCP request");
        let response = self.send(self.request(&body, &headers, timeout)).await?;
        let session_id = response
            .headers()
            .get(SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match answer::read_until_request(response, id, self.bounds, stop_at).await {
            Read::Response(message, stats) | Read::Request(message, stats) => {
                Ok((message, session_id, stats))
            }
            Read::NoResponse(stats) => Err(Failure::NoResponse(stats)),
            Read::TooLarge(stats) => Err(Failure::TooLarge(stats)),
            Read::Invalid(detail, stats) => Err(Failure::Invalid(detail, stats)),
            Read::Lost(err, stats) => Err(Failure::Lost(self.redact(&format!(
                "{} after {} bytes of the answer from {}: {}",
                if err.is_timeout() {
                    "no whole answer within the timeout"
                } else {
                    "the connection was lost"
                },
                stats.bytes,
                self.url,
                error_chain(&err)
            )))),
        }
    }

    /// Posts a notification (no id, no response expected: 202 or another 2xx).
    async fn notify(&self, method: &str, timeout: Duration) -> Result<(), Failure> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        self.send(self.request(&body, &[], timeout)).await.map(drop)
    }

    /// Sends and sorts the HTTP status; a 2xx response is returned with its body unread.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) if err.is_connect() || err.is_builder() => {
                return Err(Failure::NotSent(self.redact(&format!(
                    "cannot send to {}: {}",
                    self.url,
                    error_chain(&err)
                ))))
            }
            Err(err) => {
                return Err(Failure::Lost(self.redact(&format!(
                    "{} ({}): {}",
                    if err.is_timeout() {
                        "no answer within the timeout"
                    } else {
                        "the connection was lost after the request was sent"
                    },
                    self.url,
                    error_chain(&err)
                ))))
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let session_sent = self.session.as_ref().is_some_and(|s| s.id.is_some());
        if status == http::StatusCode::NOT_FOUND && session_sent {
            return Err(Failure::SessionNotFound);
        }
        let body = body_snippet(response).await;
        Err(Failure::Status(status.as_u16(), self.redact(&body)))
    }

    fn result_of(&self, method: &str, response: Value) -> Result<Value, McpError> {
        if let Some(error) = response.get("error") {
            return Err(McpError::Rpc {
                url: self.url.clone(),
                method: method.to_string(),
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: self.redact(error.get("message").and_then(Value::as_str).unwrap_or("")),
            });
        }
        match response.get("result") {
            Some(result @ Value::Object(_)) => Ok(result.clone()),
            _ => Err(self.invalid(method, "result is not an object")),
        }
    }

    fn invalid(&self, method: &str, detail: &str) -> McpError {
        McpError::InvalidAnswer {
            url: self.url.clone(),
            method: method.to_string(),
            detail: detail.to_string(),
        }
    }

    fn error(&self, method: &str, failure: Failure) -> McpError {
        let (url, method) = (self.url.clone(), method.to_string());
        match failure {
            Failure::NotSent(detail) => McpError::NotSent { url, detail },
            Failure::SessionNotFound => McpError::HttpStatus {
                url,
                method,
                status: 404,
                body: "the server does not know the session".to_string(),
            },
            Failure::Status(status, body) => McpError::HttpStatus {
                url,
                method,
                status,
                body,
            },
            Failure::Lost(detail) => McpError::NoAnswer {
                url,
                method,
                detail,
            },
            Failure::NoResponse(stats) => McpError::NoAnswer {
                url,
                method,
                detail: format!(
                    "the answer ended without the response ({} bytes)",
                    stats.bytes
                ),
            },
            Failure::TooLarge(stats) => McpError::TooLarge {
                url,
                method,
                max: self.bounds.max_answer_bytes,
                stats,
            },
            Failure::Invalid(detail, _) => McpError::InvalidAnswer {
                url,
                method,
                detail,
            },
        }
    }

    /// `text` with every header value this client sends replaced by `<redacted>` (a value, and
    /// the credential after an `Authorization` scheme such as `Bearer `).
    fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (_, value) in &self.headers {
            let credential = value.split_once(' ').map(|(_, c)| c.trim());
            for secret in [Some(value.as_str()), credential].into_iter().flatten() {
                if secret.len() >= 4 {
                    out = out.replace(secret, "<redacted>");
                }
            }
        }
        out
    }
}

/// Who this client is (`clientInfo`).
fn client_info() -> Value {
    json!({"name": "agentrt", "version": env!("CARGO_PKG_VERSION")})
}

/// The `_meta` envelope of a stateless request at `version`: the revision, the client's
/// capabilities (none: agentrt answers no server request) and who it is.
fn envelope(version: ProtocolVersion) -> Value {
    json!({
        META_PROTOCOL_VERSION: version.as_str(),
        META_CLIENT_CAPABILITIES: {},
        META_CLIENT_INFO: client_info(),
    })
}
