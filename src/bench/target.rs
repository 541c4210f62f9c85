//! The API server a benchmark runs against: the embedded one (`DevServer`, in this process, with
//! its request audit log on) or a cluster given by `--kubeconfig`. Creating runs and counting
//! API writes from the audit log.

use std::collections::BTreeMap;
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::api::{AgentRun, AgentRunSegment};
use crate::devcluster::{DevServer, DevServerConfig};

/// The API server under test.
pub struct Target {
    server: Option<DevServer>,
    /// A client for it.
    pub client: Client,
    /// A kubeconfig file the controllers use.
    pub kubeconfig: PathBuf,
    audit: Option<PathBuf>,
}

impl Target {
    /// Starts the embedded API server (CRDs installed, audit log in `dir`), writing its
    /// kubeconfig to `dir`.
    ///
    /// # Errors
    /// When the server cannot start or the files cannot be written.
    pub async fn embedded(dir: &Path) -> anyhow::Result<Target> {
        let crds = crate::api::crds_yaml()?;
        let crds = serde_yaml::Deserializer::from_str(&crds)
            .map(|doc| {
                let value = <serde_yaml::Value as serde::Deserialize>::deserialize(doc)?;
                Ok(serde_json::to_value(value)?)
            })
            .collect::<anyhow::Result<Vec<Value>>>()?;
        let audit = dir.join("audit.jsonl");
        let server = DevServer::start(DevServerConfig {
            crds,
            audit_log: Some(audit.clone()),
            // 10,000 runs arriving at once must not push watchers past the history window.
            watch_history: 20_000,
            ..DevServerConfig::default()
        })
        .await?;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, server.kubeconfig_yaml())?;
        let client = server.client().await?;
        Ok(Target {
            server: Some(server),
            client,
            kubeconfig,
            audit: Some(audit),
        })
    }

    /// A cluster named by a kubeconfig (the CRDs must be installed); its API server's audit log
    /// (JSON lines, e.g. `../envtest` with `AUDIT=1`: `DIR/run/audit.log`) counts requests when
    /// `audit_log` names it, else status writes come from the controllers' metrics.
    ///
    /// # Errors
    /// When the kubeconfig cannot be used or the cluster does not serve AgentRuns.
    pub async fn external(kubeconfig: &Path, audit_log: Option<&Path>) -> anyhow::Result<Target> {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig)
                .with_context(|| format!("cannot read {}", kubeconfig.display()))?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = Client::try_from(config)?;
        runs_api(&client, "default")
            .list(&kube::api::ListParams::default().limit(1))
            .await
            .context("the cluster does not serve AgentRuns: apply crds/ first")?;
        Ok(Target {
            server: None,
            client,
            kubeconfig: std::path::absolute(kubeconfig)?,
            audit: audit_log.map(Path::to_path_buf),
        })
    }

    /// True when an audit log counts requests (the embedded server's, or `--audit-log`).
    pub fn has_audit_log(&self) -> bool {
        self.audit.is_some()
    }

    /// True for the embedded server.
    pub fn is_embedded(&self) -> bool {
        self.server.is_some()
    }

    /// Creates namespace `name`.
    ///
    /// # Errors
    /// When the API server refuses.
    pub async fn namespace(&self, name: &str) -> anyhow::Result<()> {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("cannot create namespace {name}"))?;
        Ok(())
    }

    /// Where the audit log is now (to count only what follows).
    pub fn audit_mark(&self) -> AuditMark {
        let meta = self
            .audit
            .as_ref()
            .and_then(|path| std::fs::metadata(path).ok());
        AuditMark {
            file: meta.as_ref().map(file_id),
            offset: meta.map_or(0, |m| m.len()),
        }
    }

    /// Every request in `namespace` since `mark`, by (verb, `resource[/subresource]`); `None`
    /// without an audit log. Reads the embedded server's lines (`verb`, `resource`,
    /// `subresource`, `namespace`) and kube-apiserver's audit events (`objectRef`, counted at
    /// their `ResponseComplete` stage only, so a request is counted once).
    ///
    /// kube-apiserver rotates its audit log (`--audit-log-maxsize`, 100 MB in
    /// `../shared/envtest`): the file marked is then renamed beside it (`audit-<time>.log`) and
    /// read from the mark on, followed by the backups after it and the current file.
    ///
    /// # Errors
    /// A line saying so when the file marked is gone (rotated out of the backups kept): the
    /// counts would be short.
    pub fn requests_since(
        &self,
        mark: &AuditMark,
        namespace: &str,
    ) -> Option<Result<Requests, String>> {
        let path = self.audit.as_ref()?;
        let files = match audit_files_since(path, mark) {
            Ok(files) => files,
            Err(why) => return Some(Err(why)),
        };
        let mut out = BTreeMap::new();
        for (file, offset) in files {
            let Ok(mut file) = std::fs::File::open(&file) else {
                continue;
            };
            if file.seek(std::io::SeekFrom::Start(offset)).is_err() {
                continue;
            }
            for line in std::io::BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                let Ok(entry) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some((verb, what)) = audit_request(&entry, namespace) {
                    *out.entry((verb, what)).or_insert(0) += 1;
                }
            }
        }
        Some(Ok(out))
    }

    /// Stops the embedded server.
    pub async fn shutdown(self) {
        if let Some(server) = self.server {
            server.shutdown().await;
        }
    }
}

/// Requests counted by (verb, `resource[/subresource]`) ([`Target::requests_since`]).
pub type Requests = BTreeMap<(String, String), u64>;

/// Where an audit log stood ([`Target::audit_mark`]): its file, by device and inode (a rename
/// keeps them, so the file is found again after the API server rotated the log), and the length
/// it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditMark {
    file: Option<(u64, u64)>,
    offset: u64,
}

fn file_id(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// The files holding what `path` logged since `mark`, each with the offset to read it from:
/// `path` itself from the mark when it is still the file marked; after a rotation, the file
/// marked (renamed `<stem>-<time>.<ext>` beside it) from the mark, then every later backup and
/// `path`, whole, oldest first.
fn audit_files_since(path: &Path, mark: &AuditMark) -> Result<Vec<(PathBuf, u64)>, String> {
    let current = std::fs::metadata(path).ok();
    if mark.file.is_none() || current.as_ref().map(file_id) == mark.file {
        return Ok(vec![(path.to_path_buf(), mark.offset)]);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("audit");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("log");
    let mut backups: Vec<(std::time::SystemTime, PathBuf, (u64, u64))> = std::fs::read_dir(dir)
        .map_err(|err| format!("cannot list {}: {err}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with(&format!("{stem}-")) && name.ends_with(&format!(".{ext}"))
        })
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            Some((meta.modified().ok()?, entry.path(), file_id(&meta)))
        })
        .collect();
    backups.sort();
    let Some(first) = backups.iter().position(|(_, _, id)| Some(*id) == mark.file) else {
        return Err(format!(
            "the audit log {} was rotated more often than its backups are kept while the \
             workload ran, so its request counts would be short (none are given): raise \
             kube-apiserver's --audit-log-maxsize or --audit-log-maxbackup",
            path.display()
        ));
    };
    let mut files: Vec<(PathBuf, u64)> = vec![(backups[first].1.clone(), mark.offset)];
    files.extend(
        backups[first + 1..]
            .iter()
            .map(|(_, file, _)| (file.clone(), 0)),
    );
    if current.is_some() {
        files.push((path.to_path_buf(), 0));
    }
    Ok(files)
}

/// The write requests (create, update, patch, delete) among `requests`
/// ([`Target::requests_since`]), by `resource[/subresource]`.
pub fn writes_of(requests: &Requests) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for ((verb, what), n) in requests {
        if matches!(verb.as_str(), "create" | "update" | "patch" | "delete") {
            *out.entry(what.clone()).or_insert(0) += n;
        }
    }
    out
}

/// One audit line's request in `namespace` as (verb, `resource[/subresource]`), in either the
/// embedded server's shape or kube-apiserver's (`objectRef`, `stage`); `None` for another
/// namespace, another stage, or a line that is not a request. A request of the cluster's own
/// components (user agent `kube-controller-manager/…` or `kube-apiserver/…`: the garbage
/// collector reading the owner of each new Lease, for one) has its component after the
/// resource, in parentheses: `agentruns (kube-controller-manager)` ([`is_cluster_own`]).
fn audit_request(entry: &Value, namespace: &str) -> Option<(String, String)> {
    let (object, stage_ok) = match entry.get("objectRef") {
        Some(object) => (
            object,
            matches!(
                entry["stage"].as_str(),
                Some("ResponseComplete" | "Panic") | None
            ),
        ),
        None => (entry, true),
    };
    if !stage_ok || object["namespace"] != namespace {
        return None;
    }
    let verb = entry["verb"].as_str()?.to_string();
    let mut what = object["resource"].as_str().unwrap_or("?").to_string();
    if let Some(sub) = object["subresource"].as_str() {
        what = format!("{what}/{sub}");
    }
    let agent = entry["userAgent"].as_str().unwrap_or_default();
    for component in CLUSTER_COMPONENTS {
        if agent
            .strip_prefix(component)
            .is_some_and(|rest| rest.starts_with('/'))
        {
            what = format!("{what} ({component})");
        }
    }
    Some((verb, what))
}

/// The cluster's own components, by the user agent they send, whose requests in the bench's
/// namespace are not agentrt's.
const CLUSTER_COMPONENTS: [&str; 2] = ["kube-controller-manager", "kube-apiserver"];

/// Whether a `resource[/subresource]` of [`Target::requests_since`] was requested by one of the
/// cluster's own components.
pub fn is_cluster_own(what: &str) -> bool {
    what.ends_with(')')
}

/// The AgentRun resource in `namespace`.
pub fn runs_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<AgentRun>(&()),
    )
}

/// The AgentRunSegment API of `namespace` (the sealed history the runs leave).
pub fn segments_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<AgentRunSegment>(&()),
    )
}

/// Creates `runs` (whole AgentRun objects) in `namespace`, `parallel` at a time; returns when
/// each create was answered (this host's wall clock, which the controllers' `finishedAt` on the
/// same host is compared with), by run name.
///
/// # Errors
/// The first create the API server refuses.
pub async fn create_runs(
    client: &Client,
    namespace: &str,
    runs: Vec<Value>,
    parallel: usize,
) -> anyhow::Result<BTreeMap<String, jiff::Timestamp>> {
    let api = runs_api(client, namespace);
    futures::stream::iter(runs.into_iter().map(|run| {
        let api = api.clone();
        async move {
            let object: DynamicObject = serde_json::from_value(run)?;
            api.create(&PostParams::default(), &object)
                .await
                .with_context(|| {
                    format!(
                        "cannot create AgentRun {namespace}/{}",
                        object.metadata.name.clone().unwrap_or_default()
                    )
                })?;
            anyhow::Ok((
                object.metadata.name.clone().unwrap_or_default(),
                jiff::Timestamp::now(),
            ))
        }
    }))
    .buffer_unordered(parallel.max(1))
    .try_collect::<BTreeMap<String, jiff::Timestamp>>()
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_log_rotated_after_the_mark_is_read_from_the_mark_through_the_backups() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mark_of = |path: &Path| {
            let meta = std::fs::metadata(path).unwrap();
            AuditMark {
                file: Some(file_id(&meta)),
                offset: meta.len(),
            }
        };
        let read = |files: Vec<(PathBuf, u64)>| -> String {
            files
                .into_iter()
                .map(|(file, offset)| {
                    std::fs::read_to_string(file).unwrap()[offset as usize..].to_string()
                })
                .collect()
        };
        std::fs::write(&path, "before\n").unwrap();
        let mark = mark_of(&path);
        std::fs::write(&path, "before\nafter-1\n").unwrap();
        assert_eq!(read(audit_files_since(&path, &mark).unwrap()), "after-1\n");
        // kube-apiserver renames the full file beside it and starts a new one, twice.
        let first = dir.path().join("audit-2026-12-04T19-44-19.376.log");
        std::fs::rename(&path, &first).unwrap();
        std::fs::write(&path, "after-2\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = dir.path().join("audit-2026-12-04T19-50-00.000.log");
        std::fs::rename(&path, &second).unwrap();
        std::fs::write(&path, "after-3\n").unwrap();
        assert_eq!(
            read(audit_files_since(&path, &mark).unwrap()),
            "after-1\nafter-2\nafter-3\n"
        );
        // The file marked rotated out of the backups kept: no counts, and why.
        std::fs::remove_file(&first).unwrap();
        let why = audit_files_since(&path, &mark).unwrap_err();
        assert!(why.contains("--audit-log-maxsize"), "{why}");
    }

    #[test]
    fn audit_lines_are_counted_once_by_verb_and_resource_and_the_clusters_own_are_named() {
        let line = |stage: &str, agent: &str| {
            json!({"stage": stage, "verb": "get", "userAgent": agent,
                   "objectRef": {"resource": "agentruns", "namespace": "bench", "name": "r"}})
        };
        let gc = "kube-controller-manager/v1.34.9 (linux/amd64) kubernetes/abc/generic-garbage-collector";
        assert_eq!(audit_request(&line("RequestReceived", gc), "bench"), None);
        assert_eq!(
            audit_request(&line("ResponseComplete", gc), "bench"),
            Some(("get".into(), "agentruns (kube-controller-manager)".into()))
        );
        assert!(is_cluster_own("agentruns (kube-controller-manager)"));
        let ours = audit_request(&line("ResponseComplete", "agentrt/0.1"), "bench").unwrap();
        assert_eq!(ours, ("get".into(), "agentruns".into()));
        assert!(!is_cluster_own(&ours.1));
        assert_eq!(audit_request(&line("ResponseComplete", ""), "other"), None);
        // The embedded server's own lines: no stage, no objectRef.
        let embedded = json!({"verb": "update", "resource": "agentruns", "subresource": "status",
                              "namespace": "bench"});
        assert_eq!(
            audit_request(&embedded, "bench"),
            Some(("update".into(), "agentruns/status".into()))
        );
    }
}
