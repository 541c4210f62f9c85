//! A Kubernetes API for a test: [`TestCluster::start`] runs the real `agentrt dev` binary as a
//! child process on a free loopback port (killed when the cluster is dropped), or, when
//! `AGENTRT_TEST_KUBECONFIG` is set, uses that real cluster. Either way the test gets a
//! kubeconfig path, a `kube::Client`, a fresh namespace `agentrt-test-<random>` (created now,
//! deleted on drop) and [`TestCluster::kubectl`], and does not need to know which it talks to.
//! Tests of `agentrt dev` itself (restarts, tokens, history size) check
//! [`TestCluster::is_embedded`] and skip on a real cluster.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Whether `name` is a ConfigMap a real control plane publishes in every namespace
/// (`kube-root-ca.crt`, by kube-controller-manager's root-CA publisher). The embedded server
/// publishes none; tests that count a namespace's ConfigMaps leave these out.
pub fn published_by_the_control_plane(name: &str) -> bool {
    name == "kube-root-ca.crt"
}

/// The kubectl used by the tests.
pub const KUBECTL: &str = "/usr/bin/kubectl";

/// How the embedded server is started (ignored on a real cluster).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--crds-dir` (none: a directory that does not exist).
    pub crds_dir: Option<PathBuf>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--token`.
    pub token: Option<String>,
    /// `--watch-history`.
    pub watch_history: Option<usize>,
    /// Bookmark interval of watches (`AGENTRT_DEV_BOOKMARK_INTERVAL_MS`).
    pub bookmark_interval_ms: Option<u64>,
    /// Skip creating the per-test namespace.
    pub no_namespace: bool,
    /// `--audit-log` (the embedded server's request log).
    pub audit_log: Option<PathBuf>,
    /// Always the embedded server, even when `AGENTRT_TEST_KUBECONFIG` names a real cluster
    /// (the differential test talks to both).
    pub embedded_only: bool,
    /// Keep `agentrt dev`'s in-process admission webhook (its default). Off otherwise
    /// (`--no-webhook`), as on the real control plane, where no test registers the webhook
    /// but `admission_webhook.rs`: scenarios that apply a bad spec see it fail `invalid_spec`
    /// on both servers.
    pub webhook: bool,
}

/// A Kubernetes API for one test.
pub struct TestCluster {
    kubeconfig: PathBuf,
    client: kube::Client,
    namespace: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
    options: Options,
    embedded: bool,
    address: String,
}

fn random_suffix() -> String {
    format!("{:08x}", rand::random::<u32>())
}

/// Starts `agentrt dev` on `addr` (`127.0.0.1:0`: a free port) and waits for its address.
/// Returns the child and the address, or the child's stderr when it fails to start.
fn spawn_dev(
    dir: &Path,
    options: &Options,
    kubeconfig: &Path,
    addr: &str,
) -> Result<(Child, String), String> {
    let stdout_path = dir.join("dev.stdout");
    let stderr_path = dir.join("dev.stderr");
    let stdout = File::create(&stdout_path).map_err(|e| e.to_string())?;
    let stderr = File::create(&stderr_path).map_err(|e| e.to_string())?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentrt"));
    cmd.arg("dev")
        .arg("--addr")
        .arg(addr)
        .arg("--kubeconfig-out")
        .arg(kubeconfig)
        .arg("--crds-dir")
        .arg(
            options
                .crds_dir
                .clone()
                .unwrap_or_else(|| dir.join("no-crds")),
        )
        .env_remove("AGENTRT_DEV_TOKEN")
        .env_remove("AGENTRT_DEV_NO_WEBHOOK")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    if !options.webhook {
        cmd.arg("--no-webhook");
    }
    if let Some(d) = &options.data_dir {
        cmd.arg("--data-dir").arg(d);
    }
    if let Some(t) = &options.token {
        cmd.arg("--token").arg(t);
    }
    if let Some(path) = &options.audit_log {
        cmd.arg("--audit-log").arg(path);
    }
    if let Some(h) = options.watch_history {
        cmd.arg("--watch-history").arg(h.to_string());
    }
    if let Some(ms) = options.bookmark_interval_ms {
        cmd.env("AGENTRT_DEV_BOOKMARK_INTERVAL_MS", ms.to_string());
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start agentrt dev: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = std::fs::read_to_string(&stdout_path).unwrap_or_default();
        if let Some(line) = out.lines().find(|l| l.contains("listening on http://")) {
            if let Some(addr) = line.split("http://").nth(1) {
                return Ok((child, addr.trim().to_string()));
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return Err(format!("agentrt dev exited with {status}: {err}"));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("agentrt dev did not print its address within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn client_for(kubeconfig: &Path) -> kube::Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("kubeconfig readable");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig usable");
    kube::Client::try_from(config).expect("client")
}

impl Options {
    /// The default options but `--data-dir data`: a server whose state survives its restart
    /// or kill ([`TestCluster::restart`], [`TestCluster::kill_and_restart`]).
    pub fn data_dir(data: &Path) -> Options {
        Options {
            data_dir: Some(data.to_path_buf()),
            ..Options::default()
        }
    }
}

impl TestCluster {
    /// [`TestCluster::start_with`] `options` for a test of the embedded server alone (its
    /// `--data-dir`, `--token`, `--watch-history`, restarts, ...): `None` on a real cluster,
    /// after printing `skipped` on stderr (the test then returns: it is skipped). Panics as
    /// `start_with` does.
    pub async fn embedded_only(options: Options, skipped: &str) -> Option<TestCluster> {
        let cluster = Self::start_with(options).await;
        if !cluster.is_embedded() {
            eprintln!("{skipped}");
            return None;
        }
        Some(cluster)
    }

    /// [`TestCluster::start`], then `kubectl apply` of agentrt's CRDs (`crds/`) on either
    /// server (the embedded one starts without them): for the tests of the CRDs as an API
    /// server enforces them. Panics when either fails.
    pub async fn start_with_agentrt_crds() -> TestCluster {
        let cluster = Self::start().await;
        cluster.apply_agentrt_crds();
        cluster
    }

    /// [`TestCluster::start`], then the test CRDs (widgets and gizmos,
    /// [`TestCluster::apply_test_crds`]) applied and established. Panics when either fails.
    pub async fn start_with_test_crds() -> TestCluster {
        let cluster = Self::start().await;
        cluster.apply_test_crds();
        cluster
    }

    /// A cluster with a fresh namespace (default options).
    pub async fn start() -> TestCluster {
        Self::start_with(Options::default()).await
    }

    /// A cluster started with `options`.
    pub async fn start_with(options: Options) -> TestCluster {
        match Self::try_start_with(options).await {
            Ok(c) => c,
            Err(e) => panic!("test cluster: {e}"),
        }
    }

    /// Like [`TestCluster::start_with`], returning the server's error output when the
    /// embedded server refuses to start.
    pub async fn try_start_with(options: Options) -> Result<TestCluster, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (kubeconfig, child, embedded, address) = match std::env::var("AGENTRT_TEST_KUBECONFIG")
        {
            Ok(path) if !path.is_empty() && !options.embedded_only => {
                (PathBuf::from(path), None, false, String::new())
            }
            _ => {
                let kubeconfig = dir.path().join("kubeconfig");
                let (child, addr) = spawn_dev(dir.path(), &options, &kubeconfig, "127.0.0.1:0")?;
                (kubeconfig, Some(child), true, addr)
            }
        };
        let client = client_for(&kubeconfig).await;
        let namespace = format!("agentrt-test-{}", random_suffix());
        let cluster = TestCluster {
            kubeconfig,
            client,
            namespace,
            dir,
            child,
            options,
            embedded,
            address,
        };
        if !cluster.options.no_namespace {
            let ns: Namespace = serde_json::from_value(serde_json::json!({
                "metadata": {"name": cluster.namespace}
            }))
            .map_err(|e| e.to_string())?;
            Api::<Namespace>::all(cluster.client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .map_err(|e| format!("cannot create namespace {}: {e}", cluster.namespace))?;
            if !cluster.embedded {
                // A real control plane publishes kube-root-ca.crt into the new namespace a
                // moment later; wait for it (at most 5 s: a cluster without the publisher has
                // none), so that it is not a change a test's watch sees.
                let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
                    Api::namespaced(cluster.client.clone(), &cluster.namespace);
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if let Ok(Some(_)) = cms.get_opt("kube-root-ca.crt").await {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        Ok(cluster)
    }

    /// Whether this is the embedded `agentrt dev` (not a real cluster).
    pub fn is_embedded(&self) -> bool {
        self.embedded
    }

    /// `host:port` of the embedded server (empty on a real cluster).
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The kubeconfig path.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client (cheap clone).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The test's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A scratch directory living as long as the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's stderr so far (embedded only).
    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dev.stderr")).unwrap_or_default()
    }

    fn kubectl_command(&self, args: &[&str]) -> Command {
        self.kubectl_command_as(&self.kubeconfig, args)
    }

    fn kubectl_command_as(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .arg("-n")
            .arg(&self.namespace)
            .args(args);
        cmd
    }

    /// Runs `kubectl --kubeconfig <path> -n <namespace> <args>`.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args).output().expect("kubectl runs")
    }

    /// `kubectl apply -f -` of `manifest` (YAML or JSON, one object or several) in the test's
    /// namespace: what kubectl said and its exit status, unchecked (a test of a refusal reads
    /// it; one that needs it applied asserts success).
    pub fn apply(&self, manifest: &str) -> Output {
        self.kubectl_stdin(&["apply", "-f", "-"], manifest)
    }

    /// `kubectl patch KIND NAME --type merge -p PATCH` in the test's namespace: what kubectl
    /// said and its exit status, unchecked (for a patch the API server should refuse).
    pub fn merge_patch(&self, kind: &str, name: &str, patch: &str) -> Output {
        self.kubectl(&["patch", kind, name, "--type", "merge", "-p", patch])
    }

    /// [`TestCluster::merge_patch`] that must succeed: kubectl's standard output; panics with
    /// what kubectl said otherwise.
    pub fn merge_patch_ok(&self, kind: &str, name: &str, patch: &str) -> String {
        self.kubectl_ok(&["patch", kind, name, "--type", "merge", "-p", patch])
    }

    /// `kubectl patch KIND NAME --subresource status --type merge -p PATCH` that must succeed:
    /// kubectl's standard output; panics with what kubectl said otherwise.
    pub fn merge_patch_status_ok(&self, kind: &str, name: &str, patch: &str) -> String {
        self.kubectl_ok(&[
            "patch",
            kind,
            name,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            patch,
        ])
    }

    /// Runs kubectl with `stdin` as its standard input (e.g. `apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        self.kubectl_as(&self.kubeconfig, args, stdin)
    }

    /// Runs kubectl as the user of `kubeconfig` (e.g. a ServiceAccount's token), in the test's
    /// namespace, with `stdin` as its standard input.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .kubectl_command_as(kubeconfig, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        if let Some(mut input) = child.stdin.take() {
            input.write_all(stdin.as_bytes()).expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl finishes")
    }

    /// Runs kubectl and panics with its output unless it succeeds; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Starts a long-running kubectl (e.g. `get -w`) whose stdout lines are collected.
    pub fn kubectl_spawn(&self, args: &[&str]) -> Spawned {
        let mut child = self
            .kubectl_command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let sink = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    sink.lock().expect("lines").push(line);
                }
            });
        }
        Spawned { child, lines }
    }

    /// `kubectl apply -f path` for CRDs. Tests running side by side on one real cluster apply
    /// the same CRDs at once, so a create that lost the race (AlreadyExists) or an update that
    /// lost it (Conflict) is applied again, at most five times.
    pub fn apply_crds(&self, path: &Path) {
        let path = path.to_string_lossy();
        for attempt in 1..=5 {
            let out = self.kubectl(&["apply", "-f", &path]);
            if out.status.success() {
                return;
            }
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let raced = text.contains("AlreadyExists") || text.contains("has been modified");
            assert!(
                raced && attempt < 5,
                "kubectl apply -f {path} failed: {text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Applies agentrt's own CRDs (`crds/`) and waits until they are established.
    pub fn apply_agentrt_crds(&self) {
        self.apply_crds(&Path::new(env!("CARGO_MANIFEST_DIR")).join("crds"));
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/agentruns.agentrt.dev",
            "crd/approvals.agentrt.dev",
            "crd/agentrunsegments.agentrt.dev",
            "--timeout=30s",
        ]);
    }

    /// Applies the test CRDs (`tests/fixtures/devcluster/widgets-crd.yaml`) and waits until
    /// they are established.
    pub fn apply_test_crds(&self) {
        let crds = super::fixtures::devcluster("widgets-crd.yaml");
        self.apply_crds(&crds);
        self.kubectl_ok(&[
            "wait",
            "--for",
            "condition=Established",
            "--timeout=30s",
            "crd/widgets.example.dev",
            "crd/gizmos.example.dev",
        ]);
    }

    /// Stops the embedded server gracefully (SIGTERM, so it writes its state) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: sending a signal to our own child process by its pid.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the embedded server and starts it again with the same options (a new port, the
    /// same data directory); the client and kubeconfig follow.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.stop();
        let (child, addr) = spawn_dev(
            self.dir.path(),
            &self.options,
            &self.kubeconfig,
            "127.0.0.1:0",
        )?;
        self.child = Some(child);
        self.address = addr;
        self.client = client_for(&self.kubeconfig).await;
        Ok(())
    }

    /// Kills the embedded server with SIGKILL, as a crash would: no final snapshot, open
    /// connections cut. [`TestCluster::start_again`] brings it back on the same address.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the embedded server again after [`TestCluster::kill`] or
    /// [`TestCluster::stop`], with the same options on the same address (so clients holding
    /// the kubeconfig, such as a controller, reach it again); the client follows.
    pub async fn start_again(&mut self) -> Result<(), String> {
        let addr = self.address.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        let (child, addr) = loop {
            match spawn_dev(self.dir.path(), &self.options, &self.kubeconfig, &addr) {
                Ok(started) => break started,
                // The port may still be held for a moment by the killed process.
                Err(err) if Instant::now() < deadline && err.contains("cannot listen") => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(err) => return Err(err),
            }
        };
        self.child = Some(child);
        self.address = addr;
        self.client = client_for(&self.kubeconfig).await;
        Ok(())
    }

    /// [`TestCluster::kill`], `down` of nothing answering on the address, then
    /// [`TestCluster::start_again`]: a kill -9 and restart of `agentrt dev --data-dir`.
    pub async fn kill_and_restart(&mut self, down: Duration) -> Result<(), String> {
        self.kill();
        tokio::time::sleep(down).await;
        self.start_again().await
    }

    /// Starts another embedded server with `options` in this cluster's scratch directory and
    /// returns its stderr when it refuses to start (or `Ok` after stopping it if it started).
    pub fn try_spawn_other(&self, options: &Options) -> Result<(), String> {
        let dir = self.dir.path().join(format!("other-{}", random_suffix()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let (mut child, _) = spawn_dev(&dir, options, &dir.join("kubeconfig"), "127.0.0.1:0")?;
        let _ = child.kill();
        let _ = child.wait();
        Ok(())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        match self.child.take() {
            Some(mut child) => {
                let _ = child.kill();
                let _ = child.wait();
            }
            None if !self.embedded && !self.options.no_namespace => {
                let _ = self
                    .kubectl_command(&["delete", "namespace", &self.namespace, "--wait=false"])
                    .output();
            }
            None => {}
        }
    }
}

/// A long-running kubectl whose output lines are collected; killed on drop.
pub struct Spawned {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Spawned {
    /// The lines printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("lines").clone()
    }

    /// Waits until `pred` holds for the lines printed so far (or panics after `timeout`).
    pub async fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            let lines = self.lines();
            if pred(&lines) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; kubectl printed:\n{}",
                lines.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `done` every 20 ms until it holds; after `within`, panics naming `what` it waited for
/// and, when `context` gives one, what it says (a process log, say) at that moment.
pub async fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    wait_until_or(within, what, String::new, &mut done).await;
}

/// [`wait_until`], with `context()` (e.g. a controller's log) in the panic message.
pub async fn wait_until_or(
    within: Duration,
    what: &str,
    context: impl Fn() -> String,
    mut done: impl FnMut() -> bool,
) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `f` until it returns `Some` (or panics after `timeout` naming `what`).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
