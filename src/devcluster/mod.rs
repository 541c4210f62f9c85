//! The embedded Kubernetes-API-compatible server behind `agentrt dev` and the tests
//! (DESIGN.md section 8). Loopback only, no TLS. It is for trying agentrt and for tests, not a
//! Kubernetes distribution. It must answer like kube-apiserver 1.32 would, because the operator
//! will meet a real one.

pub mod schema;

use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `agentrt dev`.
#[derive(clap::Args, Debug, Clone)]
pub struct DevArgs {
    /// Address to listen on (loopback only). Port 0 picks a free port; the bound address is printed.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub addr: SocketAddr,
    /// Where to write a kubeconfig pointing at this server.
    #[arg(long, default_value = ".agentrt/kubeconfig")]
    pub kubeconfig_out: PathBuf,
    /// Require this bearer token on every request (requests without it get 401).
    #[arg(long, env = "AGENTRT_DEV_TOKEN")]
    pub token: Option<String>,
    /// Keep the server's objects in this directory so they survive a restart.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Directory of CRD YAML files installed at start, when it exists.
    #[arg(long, default_value = "crds")]
    pub crds_dir: PathBuf,
}

/// Runs `agentrt dev` until SIGINT or SIGTERM.
///
/// # Errors
/// When the address cannot be bound, the kubeconfig cannot be written, or `--data-dir` holds a
/// torn or corrupt state file.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("agentrt dev: not built yet")
}
