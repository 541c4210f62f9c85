//! The embedded Kubernetes-API-compatible server behind `agentrt dev` and the tests
//! (docs/design.md section 8). Loopback only, no TLS. It is for trying agentrt and for tests, not a
//! Kubernetes distribution. It must answer like kube-apiserver 1.32 would, because the operator
//! will meet a real one.
//!
//! Map of the rooms:
//! - `server`: [`DevServer`] (start/shutdown, background GC and snapshots) and its config.
//! - `http`, `route`: the HTTP layer and path routing.
//! - `store`: objects, the global resourceVersion, the change history.
//! - `apply`, `managed`: server-side apply and the `managedFields` every write keeps.
//! - `write`, `delete`: the verbs' rules (metadata, preconditions, status subresource,
//!   finalizers, garbage collection, namespace and CRD cleanup); `intake`: what a written body
//!   must be before them.
//! - `watch`: watch streams. `discovery`: discovery documents. `openapi`: OpenAPI v3 (CRD
//!   schemas for `kubectl explain`). `table`: server-side printing. `paging`:
//!   `limit`/`continue`. `selectors`, `patch`, `convert`, `meta`: their namesakes.
//! - `registry`, `crd`: the served types. `review`: access reviews (`kubectl auth can-i`). `persist`: `--data-dir`. `kubeconfig`.
//! - [`schema`]: structural-schema admission of custom resources (owned separately).
//!
//! It knows nothing about agentrt's own types.
//!
//! Deliberate simplifications (each documented where it lives): only the legacy discovery
//! format (kubectl falls back from the aggregated one); OpenAPI v3 schemas for custom resources
//! only (no `kubectl explain` of built-ins); strategic merge patch applied as a merge patch on
//! built-ins (and server-side apply on built-ins knows only ObjectMeta and a few of their
//! fields, see `managed`); `propagationPolicy: Foreground` behaves as `Background`; CRD
//! conversion `None` only and names never conflict; protobuf accepted only for the built-ins
//! kubectl's generators send; one global lock (fine for a dev server); the `--data-dir`
//! snapshot is the whole state, written shortly after each burst of changes and at shutdown,
//! with every change journaled before it is answered (a SIGKILL loses no answered write, and
//! never the resourceVersion sequence: a restart continues above every resourceVersion handed
//! out, and older watches get 410; a power loss can lose the last writes: no fsync per change).

mod apply;
mod audit;
mod convert;
mod crd;
mod delete;
mod depth;
mod discovery;
mod error;
mod fields;
mod http;
mod intake;
mod kubeconfig;
mod managed;
mod meta;
mod openapi;
mod paging;
mod patch;
mod persist;
mod protobuf;
mod registry;
mod review;
mod route;
pub mod schema;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod watch;
mod webhook;
mod write;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use error::DevClusterError;
pub use server::{DevServer, DevServerConfig};
pub use webhook::{Check, ValidatingWebhook};

/// The server's arguments of `agentrt dev` (the rest of the command, the controller and the
/// sample tools, is `controller::dev`'s, which wires the two together).
#[derive(clap::Args, Debug, Clone)]
pub struct DevServerArgs {
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
    /// Directory of CRD YAML files installed at start (a missing directory installs none).
    /// Without it, the CRDs built into this binary (what `agentrt crds` prints) are installed.
    #[arg(long)]
    pub crds_dir: Option<PathBuf>,
    /// How many recent changes are kept for watches; watching from an older resourceVersion
    /// gets 410 Gone and clients re-list.
    #[arg(long, default_value_t = 1000)]
    pub watch_history: usize,
    /// Append one JSON line per resource request (verb, group, resource, subresource,
    /// namespace, name, code) to this file, like an API server's audit log.
    #[arg(long)]
    pub audit_log: Option<PathBuf>,
}

impl DevServerArgs {
    /// The server's configuration: these arguments, and the CRDs from `--crds-dir` when it is
    /// given, else `default_crds` (the caller's: this server knows no types of its own).
    ///
    /// # Errors
    /// What [`read_crds_dir`] returns for `--crds-dir`.
    pub fn config(
        &self,
        default_crds: Vec<serde_json::Value>,
    ) -> Result<DevServerConfig, DevClusterError> {
        let crds = match &self.crds_dir {
            Some(dir) => read_crds_dir(dir)?,
            None => default_crds,
        };
        Ok(DevServerConfig {
            addr: self.addr,
            token: self.token.clone(),
            data_dir: self.data_dir.clone(),
            watch_history: self.watch_history,
            crds,
            audit_log: self.audit_log.clone(),
            webhooks: Vec::new(),
        })
    }
}

/// Reads every `*.yaml`/`*.yml` file of `dir` (multi-document), in name order, and returns
/// the CustomResourceDefinitions among the documents. A directory that does not exist holds
/// none.
///
/// # Errors
/// [`DevClusterError::Io`] for an unreadable file; [`DevClusterError::Crd`] naming a file that
/// is not valid YAML.
pub fn read_crds_dir(dir: &Path) -> Result<Vec<serde_json::Value>, DevClusterError> {
    use serde::Deserialize;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DevClusterError::Io { path, source }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(dir)(e)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(io(&file))?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)
                .and_then(|v| serde_json::to_value(v).map_err(serde::de::Error::custom))
                .map_err(|e| DevClusterError::Crd {
                    name: file.display().to_string(),
                    reason: format!("not valid YAML: {e}"),
                })?;
            if value["kind"] == "CustomResourceDefinition" {
                crds.push(value);
            }
        }
    }
    Ok(crds)
}

/// Writes `yaml` (a [`DevServer::kubeconfig_yaml`]) to `path` atomically, readable only by the
/// owner since it may hold the token; creates the parent directory.
///
/// # Errors
/// [`DevClusterError::Io`] when the file or its directory cannot be written.
pub fn write_kubeconfig(path: &Path, yaml: &str) -> Result<(), DevClusterError> {
    kubeconfig::write(path, yaml)
}
