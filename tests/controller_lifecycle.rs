//! The controller process's lifecycle: a graceful shutdown (SIGTERM) lets the tool call in
//! flight finish, starts nothing new, releases the leases it holds and exits 0, so another
//! replica continues at once; and `agentrt dev --apply` runs the controller in-process.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_releases_the_leases_and_another_replica_continues() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("step", Behaviour::sleeping(600));
    let mut first = start_controller(&cluster, "first");
    let run = cluster
        .create_run(
            // A LocalMutation tool: had the shutdown recorded a next call it never made, the next
            // replica would find it interrupted and pause on an approval instead of completing.
            &fixture("many-steps", &tools.base(), "drained")
                .replace("sideEffect: ReadOnly", "sideEffect: LocalMutation"),
        )
        .await;
    let uid = run.metadata.uid.clone().unwrap();
    tools
        .wait_for_call(&format!("{uid}/1"), Duration::from_secs(30), || first.log())
        .await;
    first.signal(libc::SIGTERM);
    let exit = first
        .wait_exit(Duration::from_secs(15))
        .expect("the controller exits");
    assert!(exit.success(), "exit {exit:?}:\n{}", first.log());
    // The call in flight finished before the exit.
    assert!(
        tools.calls().iter().all(|c| c.ended.is_some()),
        "a call was cut off"
    );
    let lease = Api::<Lease>::namespaced(client.clone(), &ns)
        .get("drained")
        .await
        .expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the lease was released on shutdown"
    );
    let before = tools.calls().len();
    // Another replica continues without waiting for an expiry.
    let _second = start_controller(&cluster, "second");
    let done = cluster
        .wait_phase("drained", "Completed", Duration::from_secs(30))
        .await;
    assert_seq_contiguous(&done);
    assert!(
        events_of(&done, "step.interrupted").is_empty(),
        "a drained step was left for a takeover: {:?}",
        event_types(&done)
    );
    assert!(
        cluster.approvals_of("drained").await.is_empty(),
        "nobody was asked"
    );
    for (key, count) in tools.counts() {
        assert_eq!(count, 1, "{key} was called {count} times");
    }
    assert!(tools.calls().len() >= before);
    for call in tools.calls() {
        let step: i64 = call.key.rsplit('/').next().unwrap().parse().unwrap();
        let starts = events_of(&done, "step.tool_started")
            .into_iter()
            .filter(|e| e["step"] == step)
            .count();
        assert!(
            tools.calls_for(&call.key).len() <= starts,
            "step {step}: more calls than starts"
        );
    }
    assert!(tools.calls().iter().any(|c| c.holder.starts_with("second")));
    // A finished run keeps no Lease: the replica that ended it deleted it (issue 35).
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    while leases
        .get_opt("drained")
        .await
        .expect("read the Lease")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the Lease of the finished run was not deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentrt_dev_apply_runs_the_controller_in_process() {
    let tools = ToolServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("run.yaml"),
        fixture("two-steps", &tools.base(), "in-process"),
    )
    .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let stdout = dir.path().join("stdout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["dev", "--addr", "127.0.0.1:0", "--sample-tools=false"])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .arg("--crds-dir")
        .arg(&crds)
        .arg("--apply")
        .arg(dir.path().join("run.yaml"))
        .env_remove("AGENTRT_DEV_NO_CONTROLLER")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("agentrt dev starts");
    wait_until(
        Duration::from_secs(20),
        "agentrt dev to apply the run",
        || {
            std::fs::read_to_string(&stdout)
                .unwrap_or_default()
                .contains("agentruns/in-process created")
        },
    )
    .await;
    // `agentrt dev` applies the samples before it writes the kubeconfig.
    wait_until(
        Duration::from_secs(20),
        "agentrt dev to write its kubeconfig",
        || kubeconfig.exists(),
    )
    .await;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let done = wait_phase(
        &client,
        "default",
        "in-process",
        "Completed",
        Duration::from_secs(30),
    )
    .await;
    assert_seq_contiguous(&done);
    assert_eq!(tools.calls().len(), 2);
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_controller_watches_every_namespace_it_is_given() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let first = cluster.namespace().to_string();
    let second = format!("{first}-b");
    create_namespace(&client, &second).await;
    let tools = ToolServer::start().await;
    let _controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &first,
        ControllerSpec {
            prefix: "both".into(),
            extra: vec!["--namespace".into(), second.clone()],
            ..ControllerSpec::default()
        },
    );
    for ns in [&first, &second] {
        create_run(&client, ns, &fixture("two-steps", &tools.base(), "here")).await;
    }
    for ns in [&first, &second] {
        wait_phase(&client, ns, "here", "Completed", Duration::from_secs(30)).await;
    }
    assert_eq!(tools.calls().len(), 4);
    if !cluster.is_embedded() {
        let _ = cluster.kubectl(&["delete", "namespace", &second, "--wait=false"]);
    }
}

/// Starts `agentrt dev` with `args`, returning the child once it printed its address (or
/// exited), and its stdout path.
fn spawn_dev(
    dir: &std::path::Path,
    name: &str,
    args: &[&str],
) -> (std::process::Child, std::path::PathBuf) {
    let stdout = dir.join(format!("{name}.stdout"));
    let child = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["dev", "--addr", "127.0.0.1:0"])
        .args(args)
        .env_remove("AGENTRT_DEV_NO_CONTROLLER")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{name}.stderr"))).unwrap())
        .spawn()
        .expect("agentrt dev starts");
    (child, stdout)
}

fn wait_listening(child: &mut std::process::Child, stdout: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(stdout)
        .unwrap_or_default()
        .contains("listening on")
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "agentrt dev exited early"
        );
        assert!(Instant::now() < deadline, "agentrt dev did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_exit(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn agentrt_dev_stops_on_sigterm_even_when_its_controller_finds_no_crds() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let (mut child, stdout) = spawn_dev(
        dir.path(),
        "dev",
        &[
            "--crds-dir",
            &dir.path().join("none").to_string_lossy(),
            "--kubeconfig-out",
            &kubeconfig.to_string_lossy(),
            "--sample-tools=false",
        ],
    );
    wait_listening(&mut child, &stdout);
    std::thread::sleep(Duration::from_secs(1));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status =
        wait_exit(&mut child, Duration::from_secs(20)).expect("agentrt dev exits on SIGTERM");
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_second_agentrt_dev_that_cannot_start_leaves_the_first_ones_kubeconfig_alone() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tools_addr = format!("127.0.0.1:{port}");
    let common = [
        "--kubeconfig-out",
        &kubeconfig.to_string_lossy(),
        "--sample-tools",
        "--sample-tools-addr",
        &tools_addr,
        "--no-controller",
    ]
    .map(str::to_string);
    let common: Vec<&str> = common.iter().map(String::as_str).collect();
    let (mut first, stdout) = spawn_dev(dir.path(), "first", &common);
    wait_listening(&mut first, &stdout);
    let before = std::fs::read_to_string(&kubeconfig).unwrap();
    let (mut second, _) = spawn_dev(dir.path(), "second", &common);
    let status = wait_exit(&mut second, Duration::from_secs(30)).expect("the second exits");
    assert_eq!(status.code(), Some(1), "the sample tools' port is taken");
    assert_eq!(
        std::fs::read_to_string(&kubeconfig).unwrap(),
        before,
        "the kubeconfig still names the first server"
    );
    unsafe { libc::kill(first.id() as i32, libc::SIGTERM) };
    assert!(wait_exit(&mut first, Duration::from_secs(20)).is_some());
}

/// docs/behaviours.md 1: a run whose spec slipped past admission (no webhook) fails
/// `invalid_spec` before `run.started`, naming every field, with `Ready=False` and a Warning
/// Event; no tool is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_slipped_past_admission_fails_invalid_spec_before_it_starts() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "lint");
    let yaml = RunFixture::new("one-tool", &tools.base(), "slipped")
        .class("ReadOnly")
        .yaml()
        .replace("name: work", "name: do work!")
        .replace(
            "  policy:\n",
            "  policy:\n    rules:\n    - {name: broken, when: 'args.item <=> 1 &&', outcome: Allow}\n",
        );
    cluster.create_run(&yaml).await;
    let run = cluster
        .wait_phase("slipped", "Failed", Duration::from_secs(30))
        .await;
    assert_eq!(run["reason"], "invalid_spec");
    let detail = run["reasonDetail"].as_str().unwrap_or_default().to_string();
    assert!(
        detail.starts_with(&format!(
            "AgentRun {ns}/slipped: spec.tools[0].name: \"do work!\" is not a valid function name"
        )),
        "{detail}"
    );
    assert!(detail.contains("; spec.policy.rules[0].when: "), "{detail}");
    assert_eq!(event_types(&run), vec!["run.finished"], "nothing started");
    let ready = run["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "InvalidSpec");
    assert_eq!(ready["message"], detail.as_str());
    assert!(tools.calls().is_empty(), "no tool was called");
    let warning = support::cluster::eventually(
        "a Warning Event naming the field",
        Duration::from_secs(30),
        || {
            let out = cluster.kubectl(&["get", "events", "-o", "json"]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let found = text.contains("\"Warning\"") && text.contains("spec.tools[0].name");
            async move { found.then_some(text) }
        },
    )
    .await;
    assert!(warning.contains("invalid_spec"), "{warning}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_carry_no_colours_when_stderr_is_not_a_terminal() {
    let cluster = agentrt_cluster().await;
    let tools = ToolServer::start().await;
    let controller = start_controller(&cluster, "plain");
    let yaml = RunFixture::new("one-call", &tools.base(), "logged")
        .class("ReadOnly")
        .yaml();
    cluster.create_run(&yaml).await;
    cluster
        .wait_phase("logged", "Completed", Duration::from_secs(30))
        .await;
    let log = controller.log();
    assert!(log.contains("INFO"), "the controller logged: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "an escape sequence in a log file: {log}"
    );
}
