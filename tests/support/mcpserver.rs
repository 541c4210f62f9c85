//! The Python MCP SDK's FastMCP server of tests/fixtures/mcp_server.py (installed by
//! scripts/install-mcp) as a child process, for the controller scenarios with MCP tools; its
//! `/control` routes say which calls it saw and change a definition mid-run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Python with the MCP SDK, installed once per test process.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| super::installed_by("scripts/install-mcp"))
        .clone()
}

/// The Python with the MCP SDK 2.3.0 (MCPServer, the 2026-07-28 revision), installed once per
/// test process.
pub fn python_modern() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| super::installed_by_with("scripts/install-mcp", &["2.3.0"]))
        .clone()
}

/// A client of `server` with no headers (agentrt's own MCP client).
pub fn client(server: &PyServer) -> agentrt::tools::mcp::McpClient {
    agentrt::tools::mcp::McpClient::new(
        agentrt::tools::http::client().expect("the http client"),
        &server.url(),
        vec![],
    )
}

/// A `tools/call` of `name` with `arguments` under idempotency key `key`: attempt 1 of run
/// `default/mcp-shop` by holder `replica-a`, 10 s timeout.
pub fn call(name: &str, arguments: Value, key: &str) -> agentrt::tools::mcp::ToolsCall {
    agentrt::tools::mcp::ToolsCall {
        name: name.into(),
        arguments,
        idempotency_key: key.into(),
        attempt: 1,
        run: "default/mcp-shop".into(),
        holder: "replica-a".into(),
        timeout: Duration::from_secs(10),
        task_ttl: None,
    }
}

/// The content of a call's result; panics on any other outcome.
pub fn result(outcome: agentrt::tools::mcp::CallOutcome) -> Value {
    match outcome {
        agentrt::tools::mcp::CallOutcome::Result { content, .. } => content,
        other => panic!("not a result: {other:?}"),
    }
}

/// One server process; killed when dropped.
pub struct PyServer {
    child: Child,
    base: String,
}

impl PyServer {
    /// Starts the server with `args` (`--json` for JSON answers, else SSE) and waits until it
    /// serves.
    pub fn start(args: &[&str]) -> PyServer {
        Self::start_script(python(), "mcp_server.py", args)
    }

    /// The SDK 2.3.0 server of tests/fixtures/mcp_server_modern.py with `args` (`--json`,
    /// `--stateless`): it speaks 2026-07-28 and the handshake revisions on one endpoint.
    pub fn start_modern(args: &[&str]) -> PyServer {
        Self::start_script(python_modern(), "mcp_server_modern.py", args)
    }

    /// The SDK 1.30 low-level server of tests/fixtures/mcp_task_server.py: its one tool,
    /// `big_report {bytes}`, runs as a task (2025-11-25, sessions, SSE answers).
    pub fn start_tasks() -> PyServer {
        Self::start_script(python(), "mcp_task_server.py", &[])
    }

    /// The OAuth resource server of tests/fixtures/mcp_oauth_server.py (SDK 1.30's FastMCP
    /// with bearer auth, and a client_credentials authorization server on the same origin)
    /// for the client `client_id` with `client_secret`; its tokens last `expires_in` seconds.
    pub fn start_oauth(client_id: &str, client_secret: &str, expires_in: u64) -> PyServer {
        let expires = expires_in.to_string();
        let args = [
            "--client-id",
            client_id,
            "--client-secret",
            client_secret,
            "--expires-in",
            expires.as_str(),
        ];
        Self::start_script(python(), "mcp_oauth_server.py", &args)
    }

    /// `GET /control/<what>` as JSON.
    pub async fn control_get(&self, what: &str) -> Value {
        reqwest::get(format!("{}/control/{what}", self.base))
            .await
            .expect("GET /control")
            .json()
            .await
            .expect("JSON")
    }

    fn start_script(python: PathBuf, script: &str, args: &[&str]) -> PyServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(script);
        let mut child = Command::new(python)
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the MCP server starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the PORT line");
        let port = line
            .trim()
            .strip_prefix("PORT=")
            .expect("PORT=<n>")
            .to_string();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(format!("127.0.0.1:{port}")).is_err() {
            assert!(Instant::now() < deadline, "the MCP server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        PyServer { child, base }
    }

    /// Its MCP endpoint.
    pub fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// The `tools/call`s it saw, in order: `{tool, headers, meta}` each.
    pub async fn calls(&self) -> Vec<Value> {
        let calls: Value = reqwest::get(format!("{}/control/calls", self.base))
            .await
            .expect("GET /control/calls")
            .json()
            .await
            .expect("JSON");
        calls.as_array().cloned().unwrap_or_default()
    }

    /// `POST /control/<what>` (`change-definition`, `forget-sessions`).
    pub async fn control(&self, what: &str) -> Value {
        reqwest::Client::new()
            .post(format!("{}/control/{what}", self.base))
            .send()
            .await
            .expect("POST /control")
            .json()
            .await
            .expect("JSON")
    }
}

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
