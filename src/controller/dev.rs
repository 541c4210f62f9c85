//! `agentrt dev` (issue 4): the entry point that wires the embedded API server
//! (`crate::devcluster`, which knows nothing of agentrt) to what runs around it: agentrt's CRDs
//! installed at start, the controller in-process against the server's client, the sample
//! tools, model, reconcile hook and MCP server on loopback (`--sample-tools`; `crate::tools::samples`), and
//! the controller's admission webhook called in process (`--no-webhook` turns it off), and
//! `--apply PATH`, which applies manifests (a file or a directory of YAML files,
//! multi-document) through the kube client after the CRDs are installed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use kube::api::{DynamicObject, GroupVersionKind, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use super::admin_policy::AdminPolicyView;
use super::ControllerOptions;
use crate::devcluster::{write_kubeconfig, DevServer, DevServerArgs, ValidatingWebhook};

/// Arguments of `agentrt dev`: the embedded server's, then the controller's.
#[derive(clap::Args, Debug, Clone)]
pub struct DevArgs {
    /// The embedded API server.
    #[command(flatten)]
    pub server: DevServerArgs,
    /// The controller, the sample tools and `--apply`.
    #[command(flatten)]
    pub controller: DevControllerArgs,
}

/// Runs `agentrt dev` until SIGINT or SIGTERM.
///
/// # Errors
/// When the address cannot be bound, the kubeconfig cannot be written, or `--data-dir` holds a
/// torn or corrupt state file.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // The binary's own CRDs, exactly what `agentrt crds` prints and `crds/` holds, so
    // `agentrt dev` works from any directory (unless --crds-dir says otherwise).
    let crds = match args.server.crds_dir {
        Some(_) => Vec::new(),
        None => crate::api::crd_files()?
            .into_iter()
            .map(|(_, yaml)| serde_yaml::from_str::<serde_json::Value>(&yaml))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let mut config = args.server.config(crds)?;
    // The admin policies the webhook checks ceilings against: watched once the server runs.
    let admin = std::sync::Arc::new(std::sync::OnceLock::<AdminPolicyView>::new());
    if !args.controller.no_webhook {
        // docs/behaviours.md 1: the same refusal the chart's ValidatingWebhookConfiguration
        // gets from the controller's webhook.
        let view = admin.clone();
        config.webhooks.push(ValidatingWebhook {
            name: super::admission::WEBHOOK_NAME.to_string(),
            check: std::sync::Arc::new(move |object, old| {
                let none = AdminPolicyView::none();
                super::admission::refusal_under(object, old, view.get().unwrap_or(&none))
            }),
        });
    }
    let server = DevServer::start(config).await?;
    // The controller in-process, the sample tools and --apply (issue 4) start before the
    // kubeconfig is written: if one of them cannot (a port in use by another `agentrt dev`),
    // this process exits without pointing an existing kubeconfig at a server about to stop.
    let stop = CancellationToken::new();
    if !args.controller.no_webhook {
        let client = server.client().await?;
        let _ = admin.set(AdminPolicyView::watch(&client, &[None], &stop));
    }
    let controller = start(server.client().await?, &args.controller, stop.clone()).await?;
    let out = &args.server.kubeconfig_out;
    let kubeconfig_path = std::path::absolute(out).unwrap_or_else(|_| out.clone());
    write_kubeconfig(&kubeconfig_path, &server.kubeconfig_yaml())?;
    println!(
        "agentrt dev: API server listening on http://{}",
        server.addr()
    );
    println!(
        "agentrt dev: kubeconfig written to {0}; export KUBECONFIG={0}",
        kubeconfig_path.display()
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    wait_for_signal().await?;
    stop.cancel();
    let _ = controller.await;
    server.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

/// The controller-related arguments of `agentrt dev`.
#[derive(clap::Args, Debug, Clone)]
pub struct DevControllerArgs {
    /// Create the objects in this file or directory (YAML, multi-document) once the CRDs are
    /// installed; an object that already exists (e.g. kept by --data-dir) is left as it is and
    /// reported "unchanged: exists" (use kubectl to change it). With it, the sample tools are
    /// served unless --sample-tools=false.
    #[arg(long)]
    pub apply: Option<PathBuf>,
    /// Serve the sample tools (lookup_order, issue_refund, slow_export), the sample model
    /// (/v1/chat/completions), the sample reconcile hook (/reconcile) and the sample MCP
    /// server (/mcp) on loopback [default: true with --apply, else false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub sample_tools: Option<bool>,
    /// Where the sample tools listen (the samples in config/samples name 127.0.0.1:8089).
    #[arg(long, default_value = crate::tools::samples::DEFAULT_ADDR)]
    pub sample_tools_addr: SocketAddr,
    /// How long the sample `slow_export` tool takes, in seconds.
    #[arg(long, default_value_t = 20)]
    pub sample_slow_seconds: u64,
    /// Do not refuse bad AgentRuns at admission (the controller's webhook, called in
    /// process); such a run then fails `invalid_spec` before any step, as on a cluster
    /// installed with `webhook.enabled=false`.
    #[arg(long, env = "AGENTRT_DEV_NO_WEBHOOK", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_webhook: bool,
    /// Do not run the controller in-process (run `agentrt controller` yourself).
    #[arg(long, env = "AGENTRT_DEV_NO_CONTROLLER", value_parser = clap::builder::FalseyValueParser::new())]
    pub no_controller: bool,
    #[command(flatten)]
    pub controller: ControllerOptions,
}

/// Starts the sample tools (when asked), the controller (unless `--no-controller`) and applies
/// `--apply`; returns once the manifests are applied. Everything stops when `shutdown` fires;
/// the returned handle ends when the controller has released its leases.
///
/// # Errors
/// When the sample tools' address is taken or a manifest cannot be read or applied.
pub async fn start(
    client: Client,
    args: &DevControllerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let sample_tools = args.sample_tools.unwrap_or(args.apply.is_some());
    if sample_tools {
        crate::tools::samples::serve(
            args.sample_tools_addr,
            Duration::from_secs(args.sample_slow_seconds),
            shutdown.clone(),
        )
        .await?;
    }
    let controller = if args.no_controller {
        tokio::spawn(async {})
    } else {
        let client = client.clone();
        let mut options = args.controller.clone();
        options.no_pods = true;
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            if let Err(err) = super::run_with_client(client, Vec::new(), options, shutdown).await {
                tracing::error!("the controller stopped: {err:#}");
            }
        })
    };
    if let Some(path) = &args.apply {
        let applied = apply_path(&client, path).await?;
        for line in applied {
            println!("{line}");
        }
    }
    Ok(controller)
}

/// Applies every manifest under `path` (a file, or the `.yaml`/`.yml`/`.json` files of a
/// directory in name order), creating what does not exist and leaving what exists alone: an
/// object already there (same kind, namespace and name) is not changed, whatever it holds
/// now. Returns one `resource/name created` or `resource/name unchanged: exists` line per
/// object.
///
/// # Errors
/// A sentence naming the file and the document that could not be read or applied.
pub async fn apply_path(client: &Client, path: &Path) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    if path.is_dir() {
        for entry in std::fs::read_dir(path)
            .with_context(|| format!("cannot read the directory {}", path.display()))?
        {
            let file = entry?.path();
            let manifest = matches!(
                file.extension().and_then(|ext| ext.to_str()),
                Some("yaml" | "yml" | "json")
            );
            if manifest && file.is_file() {
                files.push(file);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for (index, document) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document)
                .with_context(|| {
                    format!("{}: document {} is not YAML", file.display(), index + 1)
                })?;
            if value.is_null() {
                continue;
            }
            let object: DynamicObject = serde_yaml::from_value(value).with_context(|| {
                format!(
                    "{}: document {} is not a Kubernetes object",
                    file.display(),
                    index + 1
                )
            })?;
            let line = apply_object(client, object)
                .await
                .with_context(|| format!("{}: document {}", file.display(), index + 1))?;
            out.push(line);
        }
    }
    Ok(out)
}

async fn apply_object(client: &Client, mut object: DynamicObject) -> anyhow::Result<String> {
    let types = object
        .types
        .clone()
        .context("the object has no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(&types).context("cannot parse apiVersion")?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| {
            format!(
                "the API server does not serve {}/{}",
                types.api_version, types.kind
            )
        })?;
    let name = object
        .metadata
        .name
        .clone()
        .context("the object has no metadata.name")?;
    let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
        let namespace = object
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        object.metadata.namespace = Some(namespace.clone());
        Api::namespaced_with(client.clone(), &namespace, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    };
    let label = format!("{}/{name}", resource.plural);
    // Create only: an object that exists is left as it is, whatever changed since (a run
    // cancelled, a policy edited), so restarting `agentrt dev --apply` with `--data-dir` never
    // fights later edits nor replaces what a person or the controller wrote.
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(format!("{label} created")),
        Err(kube::Error::Api(status)) if status.code == 409 && status.reason == "AlreadyExists" => {
            Ok(format!("{label} unchanged: exists"))
        }
        Err(err) => Err(anyhow::anyhow!(
            "{label}: {}",
            super::cluster::server_message(&err)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::DevServerConfig;
    use kube::api::{Patch, PatchParams};

    /// Issue 14: restarting `agentrt dev --apply` with `--data-dir` after a sample run was
    /// cancelled left the process exiting on `spec.cancel may only change from false to true`.
    #[tokio::test]
    async fn apply_creates_what_is_missing_and_leaves_what_exists_alone() {
        let crds = crate::api::crd_files()
            .expect("crds")
            .into_iter()
            .map(|(_, yaml)| serde_yaml::from_str::<serde_json::Value>(&yaml).expect("yaml"))
            .collect();
        let server = DevServer::start(DevServerConfig {
            crds,
            ..Default::default()
        })
        .await
        .expect("starts");
        let client = server.client().await.expect("client");
        let sample =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/readonly-lookup.yaml");
        let first = apply_path(&client, &sample).await.expect("first apply");
        assert_eq!(first, vec!["agentruns/readonly-lookup created".to_string()]);
        let runs: Api<crate::api::AgentRun> = Api::namespaced(client.clone(), "default");
        runs.patch(
            "readonly-lookup",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"cancel": true}})),
        )
        .await
        .expect("cancel");
        let again = apply_path(&client, &sample)
            .await
            .expect("a second apply succeeds");
        assert_eq!(
            again,
            vec!["agentruns/readonly-lookup unchanged: exists".to_string()]
        );
        let run = runs.get("readonly-lookup").await.expect("run");
        assert!(run.spec.cancel, "the edit is kept");
        server.shutdown().await;
    }
}
