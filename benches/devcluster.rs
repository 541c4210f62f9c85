//! Throughput of the embedded API server (not a timed test): creates/s, compare-and-set
//! updates/s and watch events delivered/s for 1, 10 and 100 concurrent kube-rs clients against
//! an in-process `DevServer`.
//!
//! `cargo bench --bench devcluster`; `AGENTRT_BENCH_SECS` (default 0.5) sets how long each
//! create and update measurement runs, `AGENTRT_BENCH_WATCH_WRITES` (default 1000) how many
//! writes each watch measurement delivers to every watcher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt::devcluster::{DevServer, DevServerConfig};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn object<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> BenchResult<T> {
    Ok(serde_json::from_value(v)?)
}

async fn namespace(client: &kube::Client, name: &str) -> BenchResult<()> {
    let ns: Namespace = object(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

async fn creates(client: &kube::Client, clients: usize, run: Duration) -> BenchResult<f64> {
    let ns = format!("creates-{clients}");
    namespace(client, &ns).await?;
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..clients {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while start.elapsed() < run {
                let cm: ConfigMap = object(json!({
                    "metadata": {"name": format!("cm-{worker}-{i}")},
                    "data": {"k": "v"}
                }))?;
                api.create(&PostParams::default(), &cm).await?;
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            BenchResult::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn cas_updates(client: &kube::Client, clients: usize, run: Duration) -> BenchResult<f64> {
    let ns = format!("cas-{clients}");
    namespace(client, &ns).await?;
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for worker in 0..clients {
        let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let lease: Lease = object(json!({
                "metadata": {"name": format!("lease-{worker}")},
                "spec": {"holderIdentity": "bench", "leaseDurationSeconds": 30, "leaseTransitions": 0}
            }))?;
            let mut current = api.create(&PostParams::default(), &lease).await?;
            let name = format!("lease-{worker}");
            while start.elapsed() < run {
                // Replace with the resourceVersion of the last write (compare-and-set).
                if let Some(spec) = current.spec.as_mut() {
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                current = api.replace(&name, &PostParams::default(), &current).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            BenchResult::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

async fn watch_delivery(client: &kube::Client, watchers: usize, writes: u64) -> BenchResult<f64> {
    let ns = format!("watch-{watchers}");
    namespace(client, &ns).await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let from = api
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let delivered = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let mut stream = api
            .watch(&WatchParams::default().disable_bookmarks(), &from)
            .await?
            .boxed();
        let delivered = delivered.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < writes {
                match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(_)))) => {
                        seen += 1;
                        delivered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Some(Ok(_))) => {}
                    other => return Err(format!("watch ended early: {other:?}").into()),
                }
            }
            BenchResult::Ok(())
        }));
    }
    let start = Instant::now();
    for i in 0..writes {
        let cm: ConfigMap = object(json!({"metadata": {"name": format!("w-{i}")}}))?;
        api.create(&PostParams::default(), &cm).await?;
    }
    for t in tasks {
        t.await??;
    }
    Ok(delivered.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64())
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn bench() -> BenchResult<()> {
    let run = Duration::from_secs_f64(env_f64("AGENTRT_BENCH_SECS", 0.5));
    let writes = env_f64("AGENTRT_BENCH_WATCH_WRITES", 1000.0) as u64;
    let server = DevServer::start(DevServerConfig {
        watch_history: 100_000,
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    println!("agentrt dev API server at {} (in-process)", server.addr());
    println!(
        "{:>8} {:>12} {:>14} {:>18}",
        "clients", "creates/s", "CAS updates/s", "watch events/s"
    );
    for clients in [1usize, 10, 100] {
        let c = creates(&client, clients, run).await?;
        let u = cas_updates(&client, clients, run).await?;
        let w = watch_delivery(&client, clients, writes).await?;
        println!("{clients:>8} {c:>12.0} {u:>14.0} {w:>18.0}");
    }
    server.shutdown().await;
    Ok(())
}

fn main() {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(bench()) {
        eprintln!("benchmark failed: {e}");
        std::process::exit(1);
    }
}
