//! The takeover workload: one run of slow `ReadOnly` steps, an active controller and a standby
//! (real child processes). Repeatedly: while a tool call of the active one is in flight, at a
//! random moment of it, SIGKILL the active controller; the latency is the time from the kill
//! to the `lease.taken_over` entry the standby writes (its time, same host clock). A fresh
//! standby is started after each takeover. With `busy` runs, that many more runs of the same
//! tool are created after each standby starts, so the spread leaves some of them to it and the
//! replica taking over is executing runs (writing statuses, its watch's lag measured) when the
//! kill comes.

use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use serde_json::Value;

use super::controllers::metric_value;
use super::report::Row;
use super::target::{create_runs, runs_api};
use super::{manifests, Bench};

/// Runs `kills` takeovers of a run whose lease lasts `lease_seconds`, with `busy` more runs
/// created after each standby starts.
///
/// # Errors
/// When a controller does not start, a run cannot be created, the run does not start, or a
/// takeover does not happen within three lease durations and 30 s.
pub async fn run(
    bench: &Bench,
    kills: usize,
    lease_seconds: i64,
    busy: usize,
) -> anyhow::Result<Row> {
    let ns = bench.fresh_namespace("takeover").await?;
    let name = "run-00000";
    let steps = kills * 3 + 4;
    let mut active = bench.start_controllers(&ns, 1, &["t0"]).await?.remove(0);
    create_runs(
        &bench.target.client,
        &ns,
        vec![manifests::tool_loop(
            name,
            &bench.tools.base(),
            "slow",
            steps,
            lease_seconds,
        )],
        1,
    )
    .await?;
    let mut standby = bench.start_controllers(&ns, 1, &["t1"]).await?.remove(0);
    let mut busy_created = 0;
    busy_created += create_busy(bench, &ns, busy, busy_created, steps, lease_seconds).await?;
    let mut latencies = Vec::new();
    let mut standby_lags: Vec<f64> = Vec::new();
    let api = runs_api(&bench.target.client, &ns);
    let limit = Duration::from_secs(u64::try_from(lease_seconds.max(1)).unwrap_or(1) * 3 + 30);
    for kill in 0..kills {
        // A call by the active controller in flight.
        let prefix = format!("{}-", active.name);
        let deadline = Instant::now() + limit;
        let holder = loop {
            let calls = bench.tools.calls_of(&ns, name);
            if let Some(call) = calls
                .iter()
                .rev()
                .find(|c| c.answered.is_none() && c.holder.starts_with(&prefix))
            {
                break call.holder.clone();
            }
            if Instant::now() > deadline {
                let run = api.get(name).await?;
                anyhow::bail!(
                    "takeover: no tool call by {} within {limit:?}; see {}; the run's record ends {}",
                    active.name,
                    active.log_path().display(),
                    tail_of(&run.data["status"])
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let pause = rand::rng().random_range(0..bench.slow.as_millis().max(2) as u64 * 8 / 10);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        // What the standby's watch lag was when the kill came (its gauge).
        if let Ok(text) = standby.metrics(&bench.http).await {
            standby_lags.push(metric_value(&text, "agentrt_watch_lag_seconds"));
        }
        active.kill();
        let killed_at = SystemTime::now();
        // The standby's lease.taken_over naming the killed holder.
        let deadline = Instant::now() + limit;
        let (at, new_holder) = loop {
            let run = api.get(name).await?;
            if let Some(found) = taken_over(&run.data["status"], &holder) {
                break found;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "takeover: nobody took the run over from {holder} within {limit:?}; see {}",
                standby.log_path().display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let latency = at.duration_since(killed_at).unwrap_or(Duration::ZERO);
        latencies.push(latency);
        anyhow::ensure!(
            new_holder.starts_with(&format!("{}-", standby.name)),
            "takeover: {new_holder} took the run over, not the standby {}",
            standby.name
        );
        active = standby;
        standby = bench
            .start_controllers(&ns, 1, &[&format!("t{}", kill + 2)])
            .await?
            .remove(0);
        busy_created += create_busy(bench, &ns, busy, busy_created, steps, lease_seconds).await?;
    }
    active.stop(Duration::from_secs(5));
    standby.stop(Duration::from_secs(5));
    let mut row = Row {
        workload: "takeover".into(),
        runs: 1,
        steps_per_run: steps,
        controllers: 2,
        takeovers: latencies.clone(),
        lease_seconds: Some(lease_seconds),
        outcome: format!("{} takeovers", latencies.len()),
        ..Row::default()
    };
    let listed: Vec<String> = latencies
        .iter()
        .map(|d| format!("{:.2}", d.as_secs_f64()))
        .collect();
    row.notes.push(format!(
        "lease {lease_seconds} s, tool calls of {:.1} s killed at a random moment, {}; latencies (s): {}",
        bench.slow.as_secs_f64(),
        if busy == 0 {
            "the standby executing nothing before".to_string()
        } else {
            format!("{busy} more runs created after each standby started ({busy_created} in all)")
        },
        listed.join(", ")
    ));
    let lags: Vec<String> = standby_lags.iter().map(|s| format!("{s:.3}")).collect();
    row.notes.push(format!(
        "the standby's agentrt_watch_lag_seconds at each kill: {}",
        if lags.is_empty() {
            "not scraped".to_string()
        } else {
            lags.join(", ")
        }
    ));
    Ok(row)
}

/// Creates `busy` runs of the slow tool, named from `busy-<first>` on; returns how many.
///
/// # Errors
/// When a run cannot be created.
async fn create_busy(
    bench: &Bench,
    ns: &str,
    busy: usize,
    first: usize,
    steps: usize,
    lease_seconds: i64,
) -> anyhow::Result<usize> {
    if busy == 0 {
        return Ok(0);
    }
    let runs: Vec<Value> = (first..first + busy)
        .map(|i| {
            manifests::tool_loop(
                &format!("busy-{i:05}"),
                &bench.tools.base(),
                "slow",
                steps,
                lease_seconds,
            )
        })
        .collect();
    create_runs(&bench.target.client, ns, runs, busy).await?;
    Ok(busy)
}

/// The phase and the last journal entries of a record, for an error message.
fn tail_of(status: &Value) -> String {
    let events = status["events"].as_array().map_or(&[][..], Vec::as_slice);
    let tail: Vec<String> = events
        .iter()
        .skip(events.len().saturating_sub(8))
        .map(|e| format!("{} {} {}", e["seq"], e["type"], e["data"]))
        .collect();
    format!(
        "phase {} reason {}: {}",
        status["phase"],
        status["reason"],
        tail.join("; ")
    )
}

/// The time and new holder of the `lease.taken_over` entry naming `previous`.
fn taken_over(status: &Value, previous: &str) -> Option<(SystemTime, String)> {
    status["events"].as_array()?.iter().find_map(|event| {
        if event["type"] != "lease.taken_over" || event["data"]["previousHolder"] != previous {
            return None;
        }
        let time: jiff::Timestamp = event["time"].as_str()?.parse().ok()?;
        let holder = event["data"]["holder"].as_str()?.to_string();
        Some((SystemTime::from(time), holder))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_takeover_entry_naming_the_killed_holder_is_found() {
        let status = json!({"events": [
            {"seq": 1, "type": "run.started", "time": "2025-01-01T00:00:00Z"},
            {"seq": 2, "type": "lease.taken_over", "time": "2025-01-01T00:00:05.250Z",
             "data": {"previousHolder": "t0-1", "holder": "t1-2"}},
        ]});
        let (at, holder) = taken_over(&status, "t0-1").expect("found");
        assert_eq!(holder, "t1-2");
        let expected: jiff::Timestamp = "2025-01-01T00:00:05.250Z".parse().unwrap();
        assert_eq!(at, SystemTime::from(expected));
        assert!(taken_over(&status, "t9-9").is_none());
    }
}
