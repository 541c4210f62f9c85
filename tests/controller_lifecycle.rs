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
    let mut first =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("first"));
    let run = create_run(
        &client,
        &ns,
        // A LocalMutation tool: had the shutdown recorded a next call it never made, the next
        // replica would find it interrupted and pause on an approval instead of completing.
        &fixture("many-steps", &tools.base(), "drained")
            .replace("sideEffect: ReadOnly", "sideEffect: LocalMutation"),
    )
    .await;
    let uid = run.metadata.uid.clone().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tools.calls_for(&format!("{uid}/1")).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no second call:\n{}",
            first.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let _second =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("second"));
    let done = wait_phase(
        &client,
        &ns,
        "drained",
        "Completed",
        Duration::from_secs(30),
    )
    .await;
    assert_seq_contiguous(&done);
    assert!(
        events_of(&done, "step.interrupted").is_empty(),
        "a drained step was left for a takeover: {:?}",
        event_types(&done)
    );
    assert!(approvals(&client, &ns, "drained").await.is_empty(), "nobody was asked");
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
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&stdout)
        .unwrap_or_default()
        .contains("agentruns/in-process created")
    {
        assert!(
            Instant::now() < deadline,
            "agentrt dev did not apply the run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
