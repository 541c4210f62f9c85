//! kube-runtime wiring, per-run executor tasks, leases, compare-and-set writes, Kubernetes
//! Events and metrics (DESIGN.md sections 4 and 7). The controller performs the effects the
//! engine asks for and feeds their outcomes back; it decides nothing about a run itself.

/// Arguments of `agentrt controller`.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Path to a kubeconfig; without it, in-cluster config or $KUBECONFIG is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// Runs the controller until SIGINT or SIGTERM, then releases the leases it holds.
///
/// # Errors
/// When no Kubernetes configuration can be loaded or the API server refuses the watches.
pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("agentrt controller: not built yet")
}
