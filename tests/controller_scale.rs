//! Several controllers share many runs (docs/design.md section 4): two and three replicas on 200 runs
//! whose tools sleep briefly. Every tool call is executed exactly once, every run finishes, and
//! no run is executed by two holders at once (checked from the tool server's log of the holder
//! of each call and from the record's journal).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

const RUNS: usize = 200;

/// The two scenarios run one after the other: each is meant to load the machine alone.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn many_runs_with(replicas: usize) {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("quick", Behaviour::sleeping(20));
    let controllers: Vec<_> = (0..replicas)
        .map(|i| {
            ControllerProcess::spawn(
                cluster.kubeconfig(),
                &ns,
                ControllerSpec::named(&format!("r{i}")).sealing(),
            )
        })
        .collect();
    let started = Instant::now();
    let creates = (0..RUNS).map(|i| {
        let client = client.clone();
        let ns = ns.clone();
        let yaml = fixture("two-steps", &tools.base(), &format!("run-{i:03}"));
        async move { create_run(&client, &ns, &yaml).await }
    });
    let mut uids = BTreeMap::new();
    for created in futures::future::join_all(creates).await {
        uids.insert(
            created.metadata.name.clone().unwrap(),
            created.metadata.uid.clone().unwrap(),
        );
    }
    // Every run finishes.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut statuses = BTreeMap::new();
    loop {
        let list = runs_api(&client, &ns)
            .list(&Default::default())
            .await
            .expect("list runs");
        let done = list
            .items
            .iter()
            .filter(|r| r.data["status"]["phase"] == "Completed")
            .count();
        if done == RUNS {
            for run in list.items {
                statuses.insert(
                    run.metadata.name.clone().unwrap(),
                    run.data["status"].clone(),
                );
            }
            break;
        }
        if Instant::now() > deadline {
            let stuck: Vec<String> = list
                .items
                .iter()
                .filter(|r| r.data["status"]["phase"] != "Completed")
                .take(5)
                .map(|r| {
                    let status = &r.data["status"];
                    format!(
                        "{} phase={} holder={} events={:?}",
                        r.metadata.name.clone().unwrap_or_default(),
                        status["phase"],
                        status["lease"]["holder"],
                        event_types(status)
                    )
                })
                .collect();
            let logs: Vec<String> = controllers
                .iter()
                .map(|c| c.log_path().display().to_string())
                .collect();
            panic!("{done}/{RUNS} runs completed within 120 s; stuck: {stuck:#?}; logs: {logs:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = started.elapsed();
    eprintln!("{replicas} controllers finished {RUNS} runs in {elapsed:?}");

    // Every tool call executed exactly once.
    let counts = tools.counts();
    for (name, uid) in &uids {
        for step in 0..2 {
            let key = format!("{uid}/{step}");
            assert_eq!(
                counts.get(&key),
                Some(&1),
                "{name}: step {step} was called {:?} times",
                counts.get(&key)
            );
        }
    }
    assert_eq!(counts.len(), RUNS * 2);

    // No run executed by two holders at once: calls of one run never overlap in time, and a run
    // whose calls come from two holders has a takeover between them in its journal.
    let mut holders_used = std::collections::BTreeSet::new();
    for (name, status) in &statuses {
        assert_seq_contiguous(status);
        let mut calls = tools.calls_of_run(&format!("{ns}/{name}"));
        calls.sort_by_key(|c| c.started);
        for pair in calls.windows(2) {
            let first_end = pair[0].ended.expect("answered");
            assert!(
                first_end <= pair[1].started,
                "{name}: two calls overlap: {pair:?}"
            );
        }
        let holders: std::collections::BTreeSet<_> =
            calls.iter().map(|c| c.holder.clone()).collect();
        if holders.len() > 1 {
            assert!(
                !events_of(status, "lease.taken_over").is_empty(),
                "{name}: calls by {holders:?} without a takeover"
            );
        }
        holders_used.extend(holders);
    }
    // The runs were shared: more than one replica executed something.
    assert!(
        holders_used.len() > 1,
        "only {holders_used:?} executed runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_share_200_runs_executing_each_call_once() {
    many_runs_with(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_controllers_share_200_runs_executing_each_call_once() {
    many_runs_with(3).await;
}
