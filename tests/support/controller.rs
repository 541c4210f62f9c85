//! Helpers for the controller scenarios (tests/controller_*.rs): controller child processes (the
//! real binary, built with `--features fault-injection`), manifests from
//! `tests/fixtures/controller/`, waiting for a run's phase, approving, and reading the record.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};

#[allow(unused_imports)]
pub use super::cluster::{eventually, wait_until, wait_until_or};

/// A controller child process; killed when dropped.
pub struct ControllerProcess {
    child: Child,
    /// Its `--holder-id` prefix.
    pub prefix: String,
    log: PathBuf,
}

/// What to start a controller with.
#[derive(Debug, Clone, Default)]
pub struct ControllerSpec {
    /// `--holder-id`.
    pub prefix: String,
    /// `AGENTRT_FAULT`.
    pub fault: Option<String>,
    /// `--clock-offset-ms` (milliseconds the controller's wall clock is shifted; passed only
    /// when not 0).
    pub clock_offset_ms: i64,
    /// More arguments.
    pub extra: Vec<String>,
    /// `AGENTRT_LOG` (default: info, with kube, hyper and tower at warn).
    pub log: Option<String>,
}

impl ControllerSpec {
    /// A controller with holder prefix `prefix`.
    pub fn named(prefix: &str) -> ControllerSpec {
        ControllerSpec {
            prefix: prefix.to_string(),
            ..ControllerSpec::default()
        }
    }

    /// With `AGENTRT_FAULT=fault`.
    pub fn fault(mut self, fault: &str) -> ControllerSpec {
        self.fault = Some(fault.to_string());
        self
    }

    /// Sealing constantly (docs/design.md section 4a): `--seal-steps 4 --keep-steps 1`, so
    /// every run longer than a few steps moves its settled history into segments as it goes.
    pub fn sealing(mut self) -> ControllerSpec {
        self.extra
            .extend(["--seal-steps", "4", "--keep-steps", "1"].map(String::from));
        self
    }

    /// Serving its metrics and probes on `127.0.0.1:port` (`--metrics-addr`; see
    /// [`super::free_port`]).
    pub fn metrics_on(mut self, port: u16) -> ControllerSpec {
        self.extra
            .extend(["--metrics-addr".to_string(), format!("127.0.0.1:{port}")]);
        self
    }

    /// With `AGENTRT_LOG=filter` (e.g. `trace`).
    pub fn log(mut self, filter: &str) -> ControllerSpec {
        self.log = Some(filter.to_string());
        self
    }
}

impl ControllerProcess {
    /// Starts `agentrt controller` against `kubeconfig`, watching `namespace`.
    pub fn spawn(kubeconfig: &Path, namespace: &str, spec: ControllerSpec) -> ControllerProcess {
        let dir = std::env::temp_dir().join("agentrt-controller-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        static STARTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let serial = STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let log = dir.join(format!(
            "{namespace}-{}-{}-{serial}.log",
            spec.prefix,
            std::process::id()
        ));
        let file = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_agentrt"));
        command
            .arg("controller")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--namespace")
            .arg(namespace)
            .arg("--holder-id")
            .arg(&spec.prefix)
            .arg("--lease-skew-margin-ms")
            .arg("300")
            .args(&spec.extra)
            .env(
                "AGENTRT_LOG",
                spec.log
                    .as_deref()
                    .unwrap_or("info,kube=warn,hyper=warn,tower=warn"),
            )
            .env_remove("AGENTRT_FAULT")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file);
        if let Some(fault) = &spec.fault {
            command.env("AGENTRT_FAULT", fault);
        }
        if spec.clock_offset_ms != 0 {
            // Hidden, and compiled only with the `fault-injection` feature.
            command.arg(format!("--clock-offset-ms={}", spec.clock_offset_ms));
        }
        let child = command.spawn().expect("agentrt controller starts");
        ControllerProcess {
            child,
            prefix: spec.prefix,
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    /// Sends `signal` (libc::SIGKILL, SIGSTOP, SIGCONT, SIGTERM).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child we started.
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    /// Waits up to `timeout` for the process to exit; its status when it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// True when the process exited after SIGKILL (a fault point fired).
    pub fn was_killed(&mut self, timeout: Duration) -> bool {
        use std::os::unix::process::ExitStatusExt;
        self.wait_exit(timeout)
            .is_some_and(|status| status.signal() == Some(libc::SIGKILL))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where its log is.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The AgentRun resource.
pub fn runs_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<agentrt::api::AgentRun>(&()),
    )
}

/// The Approval resource.
pub fn approvals_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::erase::<agentrt::api::Approval>(&()),
    )
}

/// A run manifest built from a YAML fixture under `tests/fixtures/`, with its `${VAR}`s filled
/// in: `${TOOLS}` (the tool server's base URL), `${NAME}` (the run's name), and whatever the
/// fixture asks for (`${AGENT}`, `${HOOK}`, `${MODEL}`, `${CLASS}`, ...).
#[derive(Debug, Clone)]
pub struct RunFixture {
    path: PathBuf,
    vars: Vec<(String, String)>,
}

impl RunFixture {
    /// `tests/fixtures/controller/{fixture}.yaml` for the run `run`, its tools at `tools`.
    pub fn new(fixture: &str, tools: &str, run: &str) -> RunFixture {
        RunFixture::at(&format!("controller/{fixture}.yaml"))
            .set("TOOLS", tools)
            .set("NAME", run)
    }

    /// `tests/fixtures/{relative}`, with nothing filled in yet.
    pub fn at(relative: &str) -> RunFixture {
        RunFixture {
            path: super::fixtures::path(relative),
            vars: Vec::new(),
        }
    }

    /// With `${var}` replaced by `value`.
    pub fn set(mut self, var: &str, value: impl ToString) -> RunFixture {
        self.vars.push((var.to_string(), value.to_string()));
        self
    }

    /// `${AGENT}`: the webhook agent's URL.
    pub fn agent(self, url: &str) -> RunFixture {
        self.set("AGENT", url)
    }

    /// `${HOOK}`: the reconcile hook's URL.
    pub fn hook(self, url: &str) -> RunFixture {
        self.set("HOOK", url)
    }

    /// `${MODEL}`: the model's base URL.
    pub fn model(self, url: &str) -> RunFixture {
        self.set("MODEL", url)
    }

    /// `${CLASS}`: the tool's side-effect class.
    pub fn class(self, class: &str) -> RunFixture {
        self.set("CLASS", class)
    }

    /// The manifest. Panics naming the fixture when it cannot be read or a `${VAR}` is left.
    pub fn yaml(&self) -> String {
        let mut text = std::fs::read_to_string(&self.path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", self.path.display()));
        for (var, value) in &self.vars {
            text = text.replace(&format!("${{{var}}}"), value);
        }
        if let Some(at) = text.find("${") {
            let left: String = text[at..].chars().take_while(|c| *c != '}').collect();
            assert!(
                !left[2..]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_'),
                "{}: {left}}} is not filled in",
                self.path.display()
            );
        }
        text
    }

    /// Creates the run in `cluster`'s namespace ([`create_run`]); panics when the API server
    /// refuses it.
    pub async fn create_in(&self, cluster: &super::cluster::TestCluster) -> DynamicObject {
        cluster.create_run(&self.yaml()).await
    }

    /// Creates the run in `namespace` ([`create_run`]).
    pub async fn create(&self, client: &Client, namespace: &str) -> DynamicObject {
        create_run(client, namespace, &self.yaml()).await
    }
}

/// The fixture `tests/fixtures/controller/{name}.yaml` with `${TOOLS}` replaced by the tool
/// server's base URL and `${NAME}` by `run` ([`RunFixture::new`]).
pub fn fixture(name: &str, tools: &str, run: &str) -> String {
    RunFixture::new(name, tools, run).yaml()
}

/// Starts a controller with holder prefix `prefix` watching the cluster's namespace.
pub fn start_controller(cluster: &super::cluster::TestCluster, prefix: &str) -> ControllerProcess {
    ControllerProcess::spawn(
        cluster.kubeconfig(),
        cluster.namespace(),
        ControllerSpec::named(prefix),
    )
}

/// [`start_controller`], sealing constantly ([`ControllerSpec::sealing`]).
pub fn start_sealing_controller(
    cluster: &super::cluster::TestCluster,
    prefix: &str,
) -> ControllerProcess {
    ControllerProcess::spawn(
        cluster.kubeconfig(),
        cluster.namespace(),
        ControllerSpec::named(prefix).sealing(),
    )
}

/// Whether the crash points are compiled in (`cargo test --features fault-injection`); says on
/// stderr that the test is skipped when they are not.
pub fn crash_points() -> bool {
    if !cfg!(feature = "fault-injection") {
        eprintln!("skipped: the crash points need `cargo test --features fault-injection`");
    }
    cfg!(feature = "fault-injection")
}

/// Starts a controller (holder prefix `first`, sealing constantly) that kills itself at the
/// crash point `fault` (`AGENTRT_FAULT`), and waits up to `within` for it to die; panics with its log when the
/// fault did not fire. The dead process is returned for its log.
pub fn crash_at(
    kubeconfig: &Path,
    namespace: &str,
    fault: &str,
    within: Duration,
) -> ControllerProcess {
    let mut first = ControllerProcess::spawn(
        kubeconfig,
        namespace,
        ControllerSpec::named("first").fault(fault).sealing(),
    );
    assert!(
        first.was_killed(within),
        "the fault fired:\n{}",
        first.log()
    );
    first
}

/// The crash-then-takeover sequence: [`crash_at`] `fault`, then a second controller (holder
/// prefix `second`, sealing constantly) that takes the run over once the dead one's lease expires. Returns both
/// (the second keeps running until dropped).
pub fn crash_then_take_over(
    kubeconfig: &Path,
    namespace: &str,
    fault: &str,
    within: Duration,
) -> (ControllerProcess, ControllerProcess) {
    let first = crash_at(kubeconfig, namespace, fault, within);
    let second = ControllerProcess::spawn(
        kubeconfig,
        namespace,
        ControllerSpec::named("second").sealing(),
    );
    (first, second)
}

/// [`crash_then_take_over`] in `cluster`'s namespace, the controllers on its kubeconfig: the
/// first dies at crash point `fault` (panics with its log unless it does within `within`), the
/// second takes the run over once the lease expires. Returns both (the second keeps running
/// until dropped).
pub fn crash_then_take_over_in(
    cluster: &super::cluster::TestCluster,
    fault: &str,
    within: Duration,
) -> (ControllerProcess, ControllerProcess) {
    crash_then_take_over(cluster.kubeconfig(), cluster.namespace(), fault, within)
}

/// Creates the AgentRun in `yaml` in `namespace`.
pub async fn create_run(client: &Client, namespace: &str, yaml: &str) -> DynamicObject {
    let mut object: DynamicObject = serde_yaml::from_str(yaml).expect("the fixture is an object");
    object.metadata.namespace = Some(namespace.to_string());
    runs_api(client, namespace)
        .create(&PostParams::default(), &object)
        .await
        .expect("the AgentRun is created")
}

/// The run's status (`null` while absent).
pub async fn status(client: &Client, namespace: &str, name: &str) -> Value {
    let run = runs_api(client, namespace)
        .get(name)
        .await
        .expect("get run");
    run.data.get("status").cloned().unwrap_or(Value::Null)
}

/// Waits until the run's status satisfies `done`; panics with the status after `timeout`.
pub async fn wait_status(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let status = status(client, namespace, name).await;
        if done(&status) {
            return status;
        }
        if Instant::now() > deadline {
            panic!(
                "{namespace}/{name}: {what} not reached within {timeout:?}; status: {}",
                serde_json::to_string_pretty(&status).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the run's phase to be `phase`.
pub async fn wait_phase(
    client: &Client,
    namespace: &str,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> Value {
    wait_status(
        client,
        namespace,
        name,
        timeout,
        &format!("phase {phase}"),
        |s| s["phase"] == phase,
    )
    .await
}

/// The event types of a record, in order.
pub fn event_types(status: &Value) -> Vec<String> {
    status["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| e["type"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Events of `kind` in the record.
pub fn events_of<'a>(status: &'a Value, kind: &str) -> Vec<&'a Value> {
    status["events"]
        .as_array()
        .map(|events| events.iter().filter(|e| e["type"] == kind).collect())
        .unwrap_or_default()
}

/// Asserts the journal is numbered 1, 2, 3… without gaps.
pub fn assert_seq_contiguous(status: &Value) {
    let seqs: Vec<i64> = status["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .map(|e| e["seq"].as_i64().unwrap_or(-1))
                .collect()
        })
        .unwrap_or_default();
    let expected: Vec<i64> = (1..=i64::try_from(seqs.len()).unwrap_or(0)).collect();
    assert_eq!(seqs, expected, "events are numbered without gaps");
}

/// The step statuses, in order.
pub fn step_statuses(status: &Value) -> Vec<String> {
    status["steps"]
        .as_array()
        .map(|steps| {
            steps
                .iter()
                .map(|s| s["status"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The run's Approvals.
pub async fn approvals(client: &Client, namespace: &str, run: &str) -> Vec<DynamicObject> {
    let mut items = approvals_api(client, namespace)
        .list(&ListParams::default())
        .await
        .expect("list approvals")
        .items;
    items.retain(|a| a.data["spec"]["runName"] == run);
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    items
}

/// Waits for an Approval of `run` whose kind is `kind`.
pub async fn wait_approval(
    client: &Client,
    namespace: &str,
    run: &str,
    kind: &str,
    timeout: Duration,
) -> DynamicObject {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = approvals(client, namespace, run)
            .await
            .into_iter()
            .find(|a| a.data["spec"]["kind"] == kind)
        {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{namespace}/{run}: no {kind} Approval within {timeout:?}; status: {}",
            status(client, namespace, run).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Decides `approval` with its own hash.
pub async fn decide(client: &Client, namespace: &str, approval: &DynamicObject, verdict: &str) {
    let name = approval.metadata.name.clone().expect("name");
    let hash = approval.data["spec"]["hash"].clone();
    approvals_api(client, namespace)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"decision": {"verdict": verdict, "hash": hash, "approver": "test"}}})),
        )
        .await
        .expect("the decision is accepted");
}

/// A test cluster with the agentrt CRDs installed and no in-process controller (each scenario
/// starts the controllers it needs as child processes).
pub async fn agentrt_cluster() -> super::cluster::TestCluster {
    agentrt_cluster_with(super::cluster::Options::default()).await
}

/// [`agentrt_cluster`] with more options for the embedded server (e.g. `--data-dir`, for
/// scenarios that restart it); `crds_dir` is always agentrt's own CRDs.
pub async fn agentrt_cluster_with(options: super::cluster::Options) -> super::cluster::TestCluster {
    // `agentrt dev` runs a controller in-process unless told not to; the scenarios run their
    // own. Every test sets the same value, so concurrent tests agree.
    std::env::set_var("AGENTRT_DEV_NO_CONTROLLER", "1");
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let cluster = super::cluster::TestCluster::start_with(super::cluster::Options {
        crds_dir: Some(crds.clone()),
        ..options
    })
    .await;
    if !cluster.is_embedded() {
        cluster.apply_agentrt_crds();
    }
    cluster
}

/// [`agentrt_cluster_with`] `--data-dir data`, for a scenario that restarts or kills the
/// embedded server under its controllers: `None` on a real cluster, after printing
/// `{test}: not on a real cluster: it restarts agentrt dev` on stderr (the test is skipped).
pub async fn restartable_agentrt_cluster(
    data: &Path,
    test: &str,
) -> Option<super::cluster::TestCluster> {
    let cluster = agentrt_cluster_with(super::cluster::Options::data_dir(data)).await;
    if !cluster.is_embedded() {
        eprintln!("{test}: not on a real cluster: it restarts agentrt dev");
        return None;
    }
    Some(cluster)
}

/// Creates namespace `name` (for scenarios that need one controller set per namespace).
pub async fn create_namespace(client: &Client, name: &str) {
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|err| panic!("cannot create namespace {name}: {err}"));
}

/// Creates Secret `name` in `namespace` holding `key: value`, usable by every run of its
/// namespace (labelled `agentrt.dev/usable-by-runs: "true"`, docs/design.md section 6).
pub async fn create_secret(client: &Client, namespace: &str, name: &str, key: &str, value: &str) {
    let metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": {"agentrt.dev/usable-by-runs": "true"},
    });
    create_secret_with(client, metadata, key, value).await;
}

/// Creates the Secret with `metadata` (name, namespace, labels, annotations as given) holding
/// `key: value`.
pub async fn create_secret_with(client: &Client, metadata: Value, key: &str, value: &str) {
    let namespace = metadata["namespace"]
        .as_str()
        .unwrap_or("default")
        .to_string();
    let name = metadata["name"].as_str().unwrap_or("-").to_string();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": metadata,
        "stringData": {key: value},
    }))
    .expect("secret");
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|err| panic!("cannot create Secret {name}: {err}"));
}

/// Drives the runs of `tests/fixtures/rbac/runs.yaml` (`manifests`, its `${TOOLS}` filled in)
/// to their ends, with kubectl only (so that an audit log tells the controller's calls from the
/// test's by user agent): `lookup` completes, `refund` is approved and completes, `cancelled` is
/// cancelled while it waits for a person, then `lookup` is deleted with its dependents orphaned
/// and created again (its Lease is replaced).
pub async fn drive_rbac_runs(cluster: &super::cluster::TestCluster, manifests: &str) {
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    cluster.kubectl_stdin(&["apply", "-f", "-"], manifests);
    wait_phase(&client, &ns, "lookup", "Completed", Duration::from_secs(60)).await;
    let lookups = wait_phase(
        &client,
        &ns,
        "lookups",
        "Completed",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        lookups["archive"]["segments"]
            .as_array()
            .is_some_and(|s| !s.is_empty()),
        "the long run sealed (the controller runs with --seal-steps 4 --keep-steps 1): {lookups}"
    );
    let refund = wait_approval(&client, &ns, "refund", "policy", Duration::from_secs(60)).await;
    let hash = refund.data["spec"]["hash"]
        .as_str()
        .expect("hash")
        .to_string();
    let name = refund.metadata.name.clone().expect("name");
    let decision = format!(r#"{{"spec":{{"decision":{{"verdict":"Approved","hash":"{hash}"}}}}}}"#);
    cluster.merge_patch_ok("approval", &name, &decision);
    wait_phase(&client, &ns, "refund", "Completed", Duration::from_secs(60)).await;
    wait_approval(&client, &ns, "cancelled", "policy", Duration::from_secs(60)).await;
    let cancel = r#"{"spec":{"cancel":true}}"#;
    cluster.merge_patch_ok("agentrun", "cancelled", cancel);
    wait_phase(
        &client,
        &ns,
        "cancelled",
        "Cancelled",
        Duration::from_secs(60),
    )
    .await;
    // A run deleted with its dependents orphaned and created again under its name: the Lease
    // left behind is not the new run's, so the controller replaces it (delete, then create;
    // docs/behaviours.md 79).
    cluster.kubectl_ok(&["delete", "agentrun", "lookup", "--cascade=orphan"]);
    let lookup = manifests
        .split("\n---\n")
        .find(|doc| doc.contains("metadata: {name: lookup}"))
        .expect("the lookup run in the manifests");
    let created = cluster.kubectl_stdin(&["create", "-f", "-"], lookup);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let again = wait_phase(&client, &ns, "lookup", "Completed", Duration::from_secs(60)).await;
    assert_eq!(
        again["lease"]["epoch"], 1,
        "a new run under a new Lease: {again}"
    );
}
