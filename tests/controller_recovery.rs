//! Recovery after the API server comes back (issue 16, part 2): `agentrt dev --data-dir` is
//! killed with SIGKILL under a running controller and started again on the same address a
//! moment later. Every watch the controller had comes back with a resourceVersion from before
//! the restart, which the restarted server answers with 410; the controller relists at once
//! and a run created right after the restart is picked up and completes within 10 s. While the
//! API server is down the controller's `/readyz` answers 503 and `agentrt_watches_synced`
//! reads 0; once the watches have relisted, 200 and 1 again.
//!
//! Through a proxy in front of either server, connection cuts and a 3-second outage (the proxy
//! refuses connections) leave the controller as quick: a run created right after each is
//! picked up and completes within 10 s, and `/readyz` fails during the outage.
//!
//! The restarts are of the embedded server, so those tests are skipped on a real cluster.

mod support;

use std::time::{Duration, Instant};

use support::cluster::TestCluster;
use support::controller::*;
use support::free_port;
use support::metrics::scrape;
use support::proxy::{upstream_of, Proxy};
use support::toolserver::ToolServer;

/// The status code of `GET url`, or `None` when nothing answers.
async fn status_of(url: &str) -> Option<u16> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .expect("client");
    let response = client.get(url).send().await.ok()?;
    Some(response.status().as_u16())
}

/// The `agentrt_watches_synced` samples: one line per watch, with its value.
fn synced_samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| line.starts_with("agentrt_watches_synced{"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Waits (at most `timeout`) for run `name` to reach `Completed`; how long it took.
async fn time_to_complete(
    cluster: &TestCluster,
    name: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    let runs = runs_api(&cluster.client(), cluster.namespace());
    while started.elapsed() < timeout {
        if let Ok(run) = runs.get(name).await {
            if run.data["status"]["phase"] == "Completed" {
                return Ok(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = runs.get(name).await.map(|r| r.data["status"].clone());
    Err(format!("not Completed within {timeout:?}: {run:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_created_after_the_api_server_restarts_completes_within_10_s() {
    let data = tempfile::tempdir().expect("tempdir");
    let test = "a_run_created_after_the_api_server_restarts_completes_within_10_s";
    let Some(mut cluster) = restartable_agentrt_cluster(data.path(), test).await else {
        return;
    };
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let run = |name: &str| {
        RunFixture::new("one-tool", &tools.base(), name)
            .class("ReadOnly")
            .yaml()
    };
    let controller = start_controller(&cluster, "steady");
    cluster.create_run(&run("before")).await;
    let before = time_to_complete(&cluster, "before", Duration::from_secs(30)).await;
    assert!(before.is_ok(), "{before:?}\n{}", controller.log());
    // Let the snapshot of the finished run land before the crash.
    tokio::time::sleep(Duration::from_millis(500)).await;

    cluster
        .kill_and_restart(Duration::from_secs(3))
        .await
        .expect("agentrt dev starts again on its address");
    cluster.create_run(&run("after")).await;
    // Measured up to a minute, so a failure says how long it took; the bound is 10 s.
    let after = time_to_complete(&cluster, "after", Duration::from_secs(60)).await;
    eprintln!("{test}: the run created after the restart completed after {after:?}");
    match after {
        Ok(took) => assert!(
            took <= Duration::from_secs(10),
            "the run created after the restart took {took:?} (over 10 s)\n{}",
            controller.log()
        ),
        Err(err) => panic!("{err}\n{}", controller.log()),
    }
    assert_eq!(
        tools.calls_of_run(&format!("{ns}/after")).len(),
        1,
        "its one tool call, once"
    );
}

/// Polls `/readyz` until it answers 200 (`want_ok`) or another status; panics naming `what`
/// after 10 s.
async fn wait_ready(base: &str, what: &str, want_ok: bool) -> u16 {
    let url = format!("{base}/readyz");
    eventually(
        &format!("/readyz: {what}"),
        Duration::from_secs(10),
        || async {
            status_of(&url)
                .await
                .filter(|status| (*status == 200) == want_ok)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_the_api_server_is_down_and_recovers_after() {
    let data = tempfile::tempdir().expect("tempdir");
    let test = "readyz_fails_while_the_api_server_is_down_and_recovers_after";
    let Some(mut cluster) = restartable_agentrt_cluster(data.path(), test).await else {
        return;
    };
    let ns = cluster.namespace().to_string();
    let port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("ready").metrics_on(port),
    );
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(
        wait_ready(&base, "200 after start", true).await,
        200,
        "{}",
        controller.log()
    );

    cluster.kill();
    let down = wait_ready(&base, "non-200 while the API server is down", false).await;
    assert_eq!(down, 503);
    let synced = synced_samples(&scrape(port).await);
    assert!(synced.iter().any(|(_, v)| *v == 0.0), "{synced:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        status_of(&format!("{base}/readyz")).await,
        Some(503),
        "still not ready while the server is down"
    );

    cluster
        .start_again()
        .await
        .expect("agentrt dev starts again on its address");
    assert_eq!(
        wait_ready(&base, "200 after the API server is back", true).await,
        200,
        "{}",
        controller.log()
    );
    let synced = synced_samples(&scrape(port).await);
    assert_eq!(synced.len(), 3, "one sample per watch: {synced:?}");
    assert!(synced.iter().all(|(_, v)| *v == 1.0), "{synced:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_picked_up_within_10_s_after_connection_cuts_and_an_outage() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let run = |name: &str| {
        RunFixture::new("one-tool", &tools.base(), name)
            .class("ReadOnly")
            .yaml()
    };
    let proxy = Proxy::start(upstream_of(cluster.kubeconfig())).await;
    let kubeconfig = cluster.dir().join("kubeconfig-through-proxy");
    Proxy::kubeconfig_through(cluster.kubeconfig(), &kubeconfig, proxy.addr());
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let controller = ControllerProcess::spawn(
        &kubeconfig,
        &ns,
        ControllerSpec::named("proxied").metrics_on(port),
    );
    cluster.create_run(&run("before")).await;
    let before = time_to_complete(&cluster, "before", Duration::from_secs(30)).await;
    assert!(before.is_ok(), "{before:?}\n{}", controller.log());
    wait_ready(&base, "200 after start", true).await;

    // Connections reset again and again for about 3 s (the API server itself stays up).
    for _ in 0..10 {
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cluster.create_run(&run("after-cuts")).await;
    let after_cuts = time_to_complete(&cluster, "after-cuts", Duration::from_secs(60)).await;
    eprintln!("the run created after the cuts completed after {after_cuts:?}");

    // An outage: nothing answers through the proxy for 3 s; /readyz is read meanwhile.
    proxy.refuse();
    let outage_ends = Instant::now() + Duration::from_secs(3);
    let mut readyz_during_outage = Vec::new();
    while Instant::now() < outage_ends {
        readyz_during_outage.push(status_of(&format!("{base}/readyz")).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.accept();
    cluster.create_run(&run("after-outage")).await;
    let after_outage = time_to_complete(&cluster, "after-outage", Duration::from_secs(60)).await;
    eprintln!("the run created after the outage completed after {after_outage:?}");

    for (what, took) in [("cuts", after_cuts), ("outage", after_outage)] {
        match took {
            Ok(took) => assert!(
                took <= Duration::from_secs(10),
                "the run created after the {what} took {took:?} (over 10 s)\n{}",
                controller.log()
            ),
            Err(err) => panic!("after the {what}: {err}\n{}", controller.log()),
        }
    }
    assert!(
        readyz_during_outage.contains(&Some(503)),
        "/readyz answered 503 during the outage: {readyz_during_outage:?}"
    );
    // Each watch relists after its error, its backoff bounded by 4 s; 15 s leaves room for
    // a relist on a loaded machine. On failure, the synced gauges and the log say which.
    let deadline = Instant::now() + Duration::from_secs(15);
    while status_of(&format!("{base}/readyz")).await != Some(200) {
        if Instant::now() >= deadline {
            let synced = match reqwest::get(format!("{base}/metrics")).await {
                Ok(answer) => answer.text().await.unwrap_or_default(),
                Err(e) => format!("/metrics: {e}"),
            };
            panic!(
                "/readyz not 200 within 15 s after the outage; watches:\n{}\n{}",
                synced
                    .lines()
                    .filter(|l| l.starts_with("agentrt_watches_synced"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                controller.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
