//! The MCP reference server `@modelcontextprotocol/server-everything` (npm, installed by
//! scripts/install-mcp-everything) as a child process: `node dist/index.js streamableHttp`, a
//! real third-party server speaking MCP 2025-11-25 over Streamable HTTP with sessions, with the
//! experimental Tasks of SEP-1686 (its tool `simulate-research-query` requires a `task` in
//! `tools/call`). What it does on the wire: every answer to a POST is an SSE stream (it refuses a
//! client that does not accept both JSON and SSE); the tasks of a session are that session's
//! only; the `elicitation/create` of an `input_required` task arrives on the `tasks/result`
//! stream, and the client answers it with a JSON-RPC response POSTed in the same session.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The server's `dist/index.js`, installed once per test process.
pub fn index_js() -> PathBuf {
    static INDEX: OnceLock<PathBuf> = OnceLock::new();
    INDEX
        .get_or_init(|| super::installed_by("scripts/install-mcp-everything"))
        .clone()
}

/// One server process on its own port; killed when dropped. Its standard output and error go
/// to one file in a temporary directory ([`EverythingServer::log`]).
pub struct EverythingServer {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl EverythingServer {
    /// Starts the server on a free port (it takes the port from `PORT`) and waits until it
    /// answers HTTP, up to 30 s; panics with its output otherwise. A port taken between asking
    /// and binding (the server then exits with EADDRINUSE) is retried with another.
    pub fn start() -> EverythingServer {
        let index = index_js();
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("everything.log");
        for attempt in 1..=3 {
            let port = super::free_port();
            let out = std::fs::File::create(&log).expect("the log file");
            let err = out.try_clone().expect("the log file, again");
            let mut child = Command::new("node")
                .arg(&index)
                .arg("streamableHttp")
                .env("PORT", port.to_string())
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .unwrap_or_else(|e| panic!("node {} starts: {e}", index.display()));
            match wait_ready(&mut child, port, &log, Duration::from_secs(30)) {
                Ok(()) => {
                    return EverythingServer {
                        child,
                        port,
                        log,
                        _dir: dir,
                    }
                }
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let output = read_log(&log);
                    if attempt < 3 && output.contains("already in use") {
                        continue;
                    }
                    panic!("the MCP everything server on port {port} {why}; its output:\n{output}");
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// Its MCP endpoint, `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything it printed so far (standard output and error, interleaved): a line per
    /// request (`Received MCP POST request`), `Session initialized with ID: ...`, failures of
    /// its background tasks.
    pub fn log(&self) -> String {
        read_log(&self.log)
    }
}

impl Drop for EverythingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for the line the server prints once listening, then for an HTTP answer on its port
/// (a `GET /mcp` without session: 400), so the port is known to be this process's.
fn wait_ready(child: &mut Child, port: u16, log: &Path, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Err(format!("exited ({status}) before it served"));
        }
        if read_log(log).contains("listening on port") && answers_http(port) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("did not answer within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn answers_http(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request =
        format!("GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).is_ok() && &head == b"HTTP/1.1 "
}

fn read_log(log: &Path) -> String {
    std::fs::read(log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}
