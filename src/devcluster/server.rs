//! The running server: [`DevServer`] (start, address, kubeconfig, client, shutdown), the
//! state its request handlers share, bootstrap (the built-in namespaces, CRDs given at
//! start), and the background tasks: garbage collection and namespace/CRD cleanup (see
//! `delete.rs`) and the debounced state snapshot under `--data-dir` (see `persist.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::error::DevClusterError;
use super::meta::meta_str;
use super::persist::{self, DirLock};
use super::route::{self, Route, Target};
use super::store::{ObjKey, Store};
use super::write::{self, WriteOpts};
use super::{delete, http, kubeconfig};

/// How a [`DevServer`] is started.
#[derive(Debug, Clone)]
pub struct DevServerConfig {
    /// Loopback address to listen on; port 0 picks a free port.
    pub addr: SocketAddr,
    /// When set, every request must carry `Authorization: Bearer <token>` (else 401).
    pub token: Option<String>,
    /// Directory keeping the objects across restarts (none = in memory only).
    pub data_dir: Option<PathBuf>,
    /// How many recent changes are kept for watches; a watch from an older resourceVersion
    /// gets 410 Gone. At least 1.
    pub watch_history: usize,
    /// CustomResourceDefinitions (JSON objects) installed at start, created or replaced.
    pub crds: Vec<Value>,
    /// When set, one JSON line per resource request is appended here (see `audit.rs`).
    pub audit_log: Option<PathBuf>,
    /// Validating admission webhooks asked on every create and update (`webhook.rs`).
    pub webhooks: Vec<super::webhook::ValidatingWebhook>,
}

impl Default for DevServerConfig {
    fn default() -> Self {
        DevServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: None,
            data_dir: None,
            watch_history: 1000,
            crds: Vec::new(),
            audit_log: None,
            webhooks: Vec::new(),
        }
    }
}

/// What the request handlers and background tasks share.
pub struct Shared {
    /// The objects, under the one lock every verb takes.
    pub store: Mutex<Store>,
    /// The bearer token required, if any.
    pub token: Option<String>,
    /// Cancelled at shutdown: watches end, tasks stop.
    pub shutdown: CancellationToken,
    /// Wakes the garbage collector (after deletes).
    pub gc: Notify,
    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK.
    pub bookmark_interval: Duration,
    /// The bound address (for `/api`'s serverAddressByClientCIDRs).
    pub addr: SocketAddr,
    /// The request audit log, when asked for.
    pub audit: Option<super::audit::AuditLog>,
}

impl Shared {
    /// Locks the store (a poisoned lock is taken over: every write is all-or-nothing).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running embedded API server.
pub struct DevServer {
    addr: SocketAddr,
    token: Option<String>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    _lock: Option<DirLock>,
}

const BUILTIN_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
const GC_PERIOD: Duration = Duration::from_secs(1);
const SNAPSHOT_DEBOUNCE: Duration = Duration::from_millis(50);

/// How often watches get a BOOKMARK: 5 s, or `AGENTRT_DEV_BOOKMARK_INTERVAL_MS` (tests).
fn bookmark_interval() -> Duration {
    std::env::var("AGENTRT_DEV_BOOKMARK_INTERVAL_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map_or(Duration::from_secs(5), Duration::from_millis)
}

/// Where a fresh server's resourceVersions start: the current Unix time in milliseconds, so a
/// server started afresh always counts above any earlier one and clients still holding an
/// earlier server's resourceVersion get 410 and re-list rather than skip changes.
fn initial_resource_version() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_millis() as u64)
}

/// Resolves the target of a built-in or custom type by its API path pieces.
fn target(
    store: &Store,
    group: &str,
    version: &str,
    plural: &str,
    ns: Option<&str>,
) -> Option<Target> {
    let path = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let path = match ns {
        Some(ns) => format!("{path}/namespaces/{ns}/{plural}"),
        None => format!("{path}/{plural}"),
    };
    match route::parse(&path) {
        Route::Resource(p) => route::resolve(&store.registry(), &p).ok(),
        _ => None,
    }
}

/// Creates `crd`, or replaces the spec of the stored one with the same name.
fn install_crd(store: &mut Store, crd: &Value) -> Result<(), DevClusterError> {
    let name = meta_str(crd, "name").to_string();
    let err = |reason: String| DevClusterError::Crd {
        name: name.clone(),
        reason,
    };
    let Some(mut t) = target(
        store,
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        None,
    ) else {
        return Err(err("the CRD API is not served".into()));
    };
    let stored_rv = store
        .get(&t.key(&name))
        .map(|old| meta_str(old, "resourceVersion").to_string());
    let opts = WriteOpts::default();
    let result = if let Some(rv) = stored_rv {
        // A CRD update must name the version it replaces (kube-apiserver allows no
        // unconditional update of a CRD); this one replaces what is stored.
        t.name = Some(name.clone());
        let mut body = crd.clone();
        if let Some(m) = body["metadata"].as_object_mut() {
            m.insert("resourceVersion".into(), Value::String(rv));
        }
        write::update(store, &t, body, &opts)
    } else {
        write::create(store, &t, crd.clone(), &opts)
    };
    result.map(|_| ()).map_err(|e| err(e.to_string()))
}

impl DevServer {
    /// Starts the server: loads `data_dir` (or creates the built-in namespaces), installs the
    /// CRDs, binds the address and serves until [`DevServer::shutdown`].
    ///
    /// # Errors
    /// A non-loopback address, an address that cannot be bound, a data directory in use or
    /// holding a corrupt state file, or a CRD the server refuses.
    pub async fn start(config: DevServerConfig) -> Result<DevServer, DevClusterError> {
        if !config.addr.ip().is_loopback() {
            return Err(DevClusterError::NotLoopback(config.addr));
        }
        let dir_lock = match &config.data_dir {
            Some(dir) => Some(persist::lock(dir)?),
            None => None,
        };
        let (restored, reserved) = match &config.data_dir {
            Some(dir) => {
                // The snapshot, then every change journaled after it (a kill -9 loses no
                // answered write).
                let snapshot = persist::load(dir)?;
                let had_snapshot = snapshot.is_some();
                let (rv, mut objects) = snapshot.unwrap_or((0, Vec::new()));
                let highest = persist::replay(dir, rv, &mut objects)?;
                let restored = (had_snapshot || highest > rv).then_some((highest, objects));
                (restored, persist::reserved(dir)?)
            }
            None => (None, None),
        };
        // Above every resourceVersion an earlier server on this directory handed out (its
        // reservation, its snapshot) and, for directories from before reservations, above
        // the clock a fresh server starts from.
        let start = [
            restored.as_ref().map_or(0, |(rv, _)| *rv),
            reserved.unwrap_or(0),
            initial_resource_version(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + u64::from(restored.is_some() || reserved.is_some());
        let mut store = Store::new(config.watch_history, start);
        store.set_webhooks(config.webhooks.clone());
        if let Some(dir) = &config.data_dir {
            let dir = dir.clone();
            store
                .reserve_with(Box::new(move |ceiling| persist::reserve(&dir, ceiling)))
                .map_err(|reason| DevClusterError::Reserve(Box::new(reason)))?;
        }
        if let Some(dir) = &config.data_dir {
            store.journal_to(persist::Journal::open(dir)?);
        }
        match restored {
            Some((_, objects)) => store.restore(start, objects),
            None => {
                let Some(t) = target(&store, "", "v1", "namespaces", None) else {
                    return Err(DevClusterError::Bootstrap(
                        "namespaces are not served".into(),
                    ));
                };
                for ns in BUILTIN_NAMESPACES {
                    let body = json!({"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": ns}});
                    write::create(&mut store, &t, body, &WriteOpts::default())
                        .map_err(|e| DevClusterError::Bootstrap(e.to_string()))?;
                }
            }
        }
        for crd in &config.crds {
            install_crd(&mut store, crd)?;
        }
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| DevClusterError::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| DevClusterError::Bind {
                addr: config.addr,
                source,
            })?;
        let audit = match &config.audit_log {
            Some(path) => Some(super::audit::AuditLog::create(path).map_err(|source| {
                DevClusterError::Io {
                    path: path.clone(),
                    source,
                }
            })?),
            None => None,
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            token: config.token.clone(),
            shutdown: CancellationToken::new(),
            gc: Notify::new(),
            bookmark_interval: bookmark_interval(),
            addr,
            audit,
        });
        let mut tasks = Vec::new();
        if let Some(dir) = config.data_dir.clone() {
            save(&shared, &dir).await?;
            tasks.push(tokio::spawn(snapshot_task(shared.clone(), dir)));
        }
        tasks.push(tokio::spawn(gc_task(shared.clone())));
        let app = http::router(shared.clone());
        let stop = shared.shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await });
            if let Err(e) = serve.await {
                tracing::error!("agentrt dev: the API server stopped: {e}");
            }
        }));
        tracing::info!(%addr, "embedded API server listening");
        Ok(DevServer {
            addr,
            token: config.token,
            shared,
            tasks,
            _lock: dir_lock,
        })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kubeconfig pointing at this server (context `agentrt-dev`, with the token if any).
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::render(self.addr, self.token.as_deref())
    }

    /// A `kube::Client` for this server.
    ///
    /// # Errors
    /// [`DevClusterError::Client`] when kube cannot build a client from the kubeconfig.
    pub async fn client(&self) -> Result<kube::Client, DevClusterError> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())
            .map_err(|e| DevClusterError::Client(e.to_string()))?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| DevClusterError::Client(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| DevClusterError::Client(e.to_string()))
    }

    /// Stops serving (ending open watches), writes the final snapshot and returns when every
    /// task has finished.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

async fn save(shared: &Arc<Shared>, dir: &std::path::Path) -> Result<(), DevClusterError> {
    let (rv, objects) = {
        let mut store = shared.lock();
        let objects: Vec<(ObjKey, Arc<Value>)> =
            store.all().map(|(k, v)| (k.clone(), v.clone())).collect();
        // The journal up to here is covered by this snapshot once it is on disk.
        if let Err(e) = store.rotate_journal() {
            tracing::error!("agentrt dev: cannot set the journal aside: {e}");
        }
        (store.rv(), objects)
    };
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        persist::save(&dir, rv, &objects)?;
        persist::drop_journals_up_to(&dir, rv)
    })
    .await
    .map_err(|e| DevClusterError::Bootstrap(format!("the snapshot task failed: {e}")))?
}

async fn snapshot_task(shared: Arc<Shared>, dir: PathBuf) {
    let mut changes = shared.lock().subscribe();
    let mut saved = *changes.borrow_and_update();
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            _ = shared.shutdown.cancelled() => break,
        }
        tokio::time::sleep(SNAPSHOT_DEBOUNCE).await;
        let now = *changes.borrow_and_update();
        if now == saved {
            continue;
        }
        match save(&shared, &dir).await {
            Ok(()) => saved = now,
            Err(e) => tracing::error!("agentrt dev: cannot save the state: {e}"),
        }
    }
    if let Err(e) = save(&shared, &dir).await {
        tracing::error!("agentrt dev: cannot save the state at shutdown: {e}");
    }
}

async fn gc_task(shared: Arc<Shared>) {
    let mut last_pass = 0;
    loop {
        let forced = tokio::select! {
            _ = shared.gc.notified() => true,
            _ = tokio::time::sleep(GC_PERIOD) => false,
            _ = shared.shutdown.cancelled() => return,
        };
        let mut store = shared.lock();
        // The periodic pass is skipped when nothing changed since the last one.
        if forced || store.rv() != last_pass {
            delete::collect_garbage(&mut store);
            last_pass = store.rv();
        }
    }
}
