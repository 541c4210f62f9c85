//! The MCP client (docs/design.md section 6, the `mcp` tool; docs/behaviours.md 60-63): one
//! server over the Streamable HTTP transport, protocol revisions 2026-07-28, 2025-11-25,
//! 2025-06-18 and 2025-03-26, the highest the server speaks.
//!
//! What it does: `server/discover` at 2026-07-28 first; when the server lists that revision,
//! every request is stateless (no session; the `_meta` envelope and the `MCP-Protocol-Version`,
//! `Mcp-Method` and `Mcp-Name` headers on each). Anything but positive evidence of a modern
//! server (an HTTP 4xx, a JSON-RPC error, a result that does not list 2026-07-28) falls back
//! to `initialize` proposing 2025-11-25, then `notifications/initialized`; it keeps the
//! `Mcp-Session-Id` the server gives and sends `MCP-Protocol-Version` from 2025-06-18 on.
//! Then `tools/list` through every page (`nextCursor`); `tools/call`. A `tools/call` result
//! whose `resultType` is `input_required` (the server asks the client for input first) is
//! not a result: it is recorded as an answer agentrt cannot use (`invalid_content`). Answers are read as `application/json`
//! or as `text/event-stream` (events until the response with the request's id; notifications
//! and requests from the server are ignored), bounded as `answer` says. Redirects are never
//! followed (the caller's client is [`crate::tools::http::client`]).
//!
//! Never re-sending a call: a 404 for a known session means the server forgot it, and per the
//! transport it answers so before handling the message. For `initialize` and `tools/list` a
//! new session is opened and the request sent again; for `tools/call` too, once: a fresh
//! session, then a single send. Anything else after a `tools/call` was sent (a timeout, a
//! connection lost, a 5xx, a 2xx without the response) is [`CallOutcome::Unknown`], never
//! sent again here.
//!
//! Outcomes of a call ([`CallOutcome`]), as `controller::calls::mcp` maps them onto the
//! engine's tool outcomes:
//! - a result → `tool_result` (`structuredContent` when given, else the content blocks);
//! - `isError: true` → `tool_error` `tool_reported_error`;
//! - a JSON-RPC error → `tool_error` `mcp_error` {code, message};
//! - nothing sent (connection refused, initialize failed, a redirect or a 4xx refusing the
//!   message) →
//!   `tool_error`, the tool did not run;
//! - a timeout or a lost connection after the call was sent → unknown, an interruption.
//!
//! Secrets: the server's headers (an `Authorization` token) are sent and never shown: `Debug`
//! prints their names only, and every error text has their values replaced by `<redacted>`.
//!
//! Why not the official Rust SDK (`rmcp` 3.11, its streamable HTTP client): it bounds an
//! answer by refusing it, so the size and SHA-256 of a cut answer that the record keeps are
//! not to be had; it resumes a broken SSE stream and re-initializes and re-posts after an
//! expired session on its own (configurable, but inside a worker task whose sends are not
//! ours to see); and its headers are per transport, while `Idempotency-Key` and
//! `Agentrt-Attempt` change with every call. The transport is small, so it is written here on
//! the reqwest client the http tool already uses.
//!
//! Must not: decide anything about a run (pins are compared in `engine::pins`), or retry.

mod answer;
mod client;
pub mod oauth;
mod sse;

use std::time::Duration;

use serde_json::Value;

pub use answer::AnswerStats;
pub use client::{InputRequest, McpClient, Task, TaskAnswer, TaskStatus};

/// The session header of the Streamable HTTP transport.
pub const SESSION_ID: &str = "Mcp-Session-Id";
/// The protocol-version header (from 2025-06-18 on).
pub const PROTOCOL_VERSION: &str = "MCP-Protocol-Version";
/// The `_meta` key carrying the idempotency key in `tools/call` params.
pub const META_IDEMPOTENCY_KEY: &str = "agentrt.dev/idempotencyKey";
/// The `_meta` key carrying the attempt in `tools/call` params.
pub const META_ATTEMPT: &str = "agentrt.dev/attempt";

/// Most bytes of one answer kept by default: the engine cuts recorded content far below this.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;
/// Most bytes of one answer read at all by default (counted and hashed, then dropped).
pub const DEFAULT_MAX_STREAM_BYTES: u64 = 64 * 1024 * 1024;
/// Most `tools/list` pages followed.
pub const MAX_PAGES: usize = 100;

/// A protocol revision this client speaks (docs/design.md section 6, "MCP revisions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProtocolVersion {
    /// `2025-03-26`: the first Streamable HTTP revision.
    V2025_03_26,
    /// `2025-06-18`: sends `MCP-Protocol-Version` after initialize.
    V2025_06_18,
    /// `2025-11-25`: as 2025-06-18, with tool `execution` and `outputSchema` in listings.
    V2025_11_25,
    /// `2026-07-28`: stateless. No `initialize` and no session: `server/discover` first, and
    /// every request carries the `_meta` envelope ([`META_PROTOCOL_VERSION`],
    /// [`META_CLIENT_CAPABILITIES`], [`META_CLIENT_INFO`]) and the routing headers
    /// ([`PROTOCOL_VERSION`], [`METHOD`], and [`NAME`] for `tools/call`); results say
    /// `resultType`.
    V2026_07_28,
}

impl ProtocolVersion {
    /// Every revision this client speaks, highest first (the order it tries them in).
    pub const ALL: [ProtocolVersion; 4] = [
        ProtocolVersion::V2026_07_28,
        ProtocolVersion::V2025_11_25,
        ProtocolVersion::V2025_06_18,
        ProtocolVersion::V2025_03_26,
    ];

    /// The revision's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolVersion::V2026_07_28 => "2026-07-28",
            ProtocolVersion::V2025_11_25 => "2025-11-25",
            ProtocolVersion::V2025_06_18 => "2025-06-18",
            ProtocolVersion::V2025_03_26 => "2025-03-26",
        }
    }

    /// The revision spelled `word`, if this client speaks it.
    pub fn parse(word: &str) -> Option<ProtocolVersion> {
        ProtocolVersion::ALL
            .into_iter()
            .find(|v| v.as_str() == word)
    }

    /// Whether the revision is stateless (found by `server/discover`, no `initialize`).
    pub fn is_stateless(self) -> bool {
        self >= ProtocolVersion::V2026_07_28
    }

    /// Whether requests after the handshake carry `MCP-Protocol-Version` (2025-06-18 on).
    pub fn sends_version_header(self) -> bool {
        self >= ProtocolVersion::V2025_06_18
    }
}

/// The routing header naming the JSON-RPC method (2026-07-28).
pub const METHOD: &str = "Mcp-Method";
/// The routing header naming the tool of a `tools/call` (2026-07-28).
pub const NAME: &str = "Mcp-Name";
/// The `_meta` key of the revision a stateless request speaks.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// The `_meta` key of the client's capabilities on a stateless request.
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// The `_meta` key of the client's name and version on a stateless request.
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// The `_meta` key of a stateless server's name and version in its results.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// The JSON-RPC error code of a revision the server does not speak (its `data.supported`
/// lists those it does).
pub const UNSUPPORTED_PROTOCOL_VERSION_CODE: i64 = -32022;

/// An open session.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// The `Mcp-Session-Id` the server gave, if it gave one (a stateless server gives none,
    /// and 2026-07-28 has no sessions at all).
    pub id: Option<String>,
    /// The revision agreed: the one `server/discover` listed, else the one `initialize`
    /// answered.
    pub protocol: ProtocolVersion,
    /// The server's name and version: `serverInfo` of `initialize`, or the
    /// [`META_SERVER_INFO`] of `server/discover`'s result (`null` when it gave none).
    pub server_info: Value,
    /// Whether the server offers task-augmented `tools/call` (its capabilities hold
    /// `tasks.requests.tools.call`; docs/design.md section 6, "MCP tasks").
    pub tasks: bool,
}

/// Why `initialize` or `tools/list` failed. Texts name the server and never a header's value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpError {
    /// Nothing was sent: the connection could not be made, or the request not built.
    #[error("cannot reach the MCP server {url}: {detail}")]
    NotSent {
        /// The server.
        url: String,
        /// Why.
        detail: String,
    },
    /// Sent, and no (whole) answer came in time or the connection broke.
    #[error("the MCP server {url} did not answer {method}: {detail}")]
    NoAnswer {
        /// The server.
        url: String,
        /// The JSON-RPC method.
        method: String,
        /// What happened.
        detail: String,
    },
    /// A non-2xx HTTP answer.
    #[error("the MCP server {url} answered {method} with HTTP {status}: {body}")]
    HttpStatus {
        /// The server.
        url: String,
        /// The JSON-RPC method.
        method: String,
        /// The status.
        status: u16,
        /// The start of the body, bounded.
        body: String,
    },
    /// A JSON-RPC error.
    #[error("the MCP server {url} answered {method} with error {code}: {message}")]
    Rpc {
        /// The server.
        url: String,
        /// The JSON-RPC method.
        method: String,
        /// The error code.
        code: i64,
        /// The error message.
        message: String,
    },
    /// An answer that is not what the protocol says.
    #[error("the MCP server {url} answered {method} with something unusable: {detail}")]
    InvalidAnswer {
        /// The server.
        url: String,
        /// The JSON-RPC method.
        method: String,
        /// What is wrong.
        detail: String,
    },
    /// An answer over the bound.
    #[error("the MCP server {url} answered {method} with more than {max} bytes ({} read, {})", stats.bytes, stats.sha256)]
    TooLarge {
        /// The server.
        url: String,
        /// The JSON-RPC method.
        method: String,
        /// The bound.
        max: usize,
        /// What was read.
        stats: AnswerStats,
    },
    /// The server answered a protocol revision this client does not speak.
    #[error("the MCP server {url} speaks protocol {version:?}; agentrt speaks 2026-07-28, 2025-11-25, 2025-06-18 and 2025-03-26")]
    UnsupportedVersion {
        /// The server.
        url: String,
        /// What it answered.
        version: String,
    },
}

/// One `tools/call`, as the controller asks for it.
#[derive(Debug, Clone)]
pub struct ToolsCall {
    /// The server's name of the tool.
    pub name: String,
    /// The args.
    pub arguments: Value,
    /// `<run uid>/<step>`: the `Idempotency-Key` header and `_meta`.
    pub idempotency_key: String,
    /// 1 for the step's first start, 2 after a granted re-run, ...
    pub attempt: i64,
    /// `<namespace>/<name>` of the run.
    pub run: String,
    /// The holder identity of the replica calling.
    pub holder: String,
    /// The tool's `timeoutSeconds`.
    pub timeout: Duration,
    /// Sends the call as a task (`params.task` {ttl}, milliseconds the server keeps the task
    /// after it ends): the answer is then [`CallOutcome::TaskCreated`]. `None`: a plain call.
    pub task_ttl: Option<Duration>,
}

/// How one `tools/call` ended (see the module doc for what the engine makes of each).
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    /// A result: `structuredContent` when the server gave it (`structured`), else the content
    /// blocks.
    Result {
        /// The content.
        content: Value,
        /// Whether it is `structuredContent`.
        structured: bool,
        /// The answer's size and hash.
        answer: AnswerStats,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// `isError: true`: the tool ran and says it failed (`tool_reported_error`).
    ToolReportedError {
        /// As for a result.
        content: Value,
        /// The answer's size and hash.
        answer: AnswerStats,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// A JSON-RPC error (`mcp_error`).
    RpcError {
        /// The code.
        code: i64,
        /// The message.
        message: String,
        /// The error's data, if any.
        data: Option<Value>,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The call was not sent, or was refused before it reached the tool: the tool did not run.
    NotSent {
        /// Why (no header value in it).
        detail: String,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The call was sent and its outcome is unknown: an interruption. Never sent again here.
    Unknown {
        /// What happened.
        detail: String,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The answer passed the bound: the tool ran, its answer was not kept.
    TooLarge {
        /// The bound.
        max: usize,
        /// The answer's size and hash (of all of it when `complete`).
        answer: AnswerStats,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The server created a task for the call (it was sent with [`ToolsCall::task_ttl`]): the
    /// outcome is the task's, followed with [`McpClient::get_task`] and
    /// [`McpClient::task_result`] in the session the client holds.
    TaskCreated {
        /// The task as the server described it.
        task: Task,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// A 2xx answer that is not a usable JSON-RPC response.
    InvalidAnswer {
        /// What is wrong.
        detail: String,
        /// The answer's size and hash.
        answer: AnswerStats,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
}

#[cfg(test)]
mod tests;
