//! The workloads that create runs and wait for them to settle: long runs (one run, many
//! steps, small or large answers), many concurrent runs, and many runs parked waiting for
//! approval. Each runs in a fresh namespace with fresh controller processes, so its CPU time,
//! memory and API writes are its own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::controllers::{expositions, metric_value, summed, Controller};
use super::recorder::StatusRecorder;
use super::report::{quantile, Row};
use super::target::{create_runs, runs_api, segments_api};
use super::{floor, manifests, tools, Bench};

/// What one throughput workload does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its name (and namespace prefix).
    pub name: String,
    /// Runs to create.
    pub runs: usize,
    /// Tool steps per run (ignored when `waiting`).
    pub steps: usize,
    /// The tool each step calls (`small`, `large`).
    pub tool: &'static str,
    /// Controller processes.
    pub controllers: usize,
    /// Runs that park on an Approval at their first step instead of looping.
    pub waiting: bool,
}

/// Every object of `api`, listed 500 at a time (one unpaged LIST of 10,000 finished runs is
/// more than a loaded kube-apiserver answers within its 60 s).
///
/// # Errors
/// When a page is refused.
async fn list_paged(
    api: &kube::Api<kube::api::DynamicObject>,
) -> anyhow::Result<Vec<kube::api::DynamicObject>> {
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = kube::api::ListParams::default().limit(500);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(items),
        }
    }
}

/// Runs `plan` and measures it.
///
/// # Errors
/// When the API server, a controller or the tool server fails, or the runs do not settle in
/// time.
pub async fn run(bench: &Bench, plan: &Plan) -> anyhow::Result<Row> {
    let ns = bench.fresh_namespace(&plan.name).await?;
    let mut controllers = bench.start_controllers(&ns, plan.controllers, &[]).await?;
    let base = bench.tools.base();
    let manifests: Vec<_> = (0..plan.runs)
        .map(|i| {
            let name = format!("run-{i:05}");
            if plan.waiting {
                manifests::waiting(&name, &base)
            } else {
                manifests::tool_loop(&name, &base, plan.tool, plan.steps, 30)
            }
        })
        .collect();
    // Each controller's resident memory with its watches listed and nothing to watch yet: the
    // baseline the `idle` workload's memory per waiting run is measured above.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_empty: Vec<u64> = controllers.iter().map(|c| c.rss().0).collect();
    let cpu_each: Vec<f64> = controllers.iter().map(|c| c.cpu_seconds()).collect();
    let cpu_before: f64 = cpu_each.iter().sum();
    let bench_before = super::own_cpu_seconds();
    let mark = bench.target.audit_mark();
    // Whether the floor runs after the workload (it replays the statuses the recorder keeps).
    let floor_runs = !plan.waiting && bench.floor;
    let recorder = StatusRecorder::start(&bench.target.client, &ns, floor_runs).await;
    let started = Instant::now();
    let created = create_runs(&bench.target.client, &ns, manifests, 32).await?;
    let elapsed = wait_settled(bench, &controllers, plan, started).await?;
    let mut row = Row {
        workload: plan.name.clone(),
        runs: plan.runs,
        steps_per_run: if plan.waiting { 1 } else { plan.steps },
        controllers: plan.controllers,
        elapsed: Some(elapsed),
        ..Row::default()
    };
    if plan.waiting {
        // Let the executors that parked the last runs wind down, then read the memory.
        tokio::time::sleep(Duration::from_secs(3)).await;
        // AGENTRT_BENCH_HOLD_SECONDS holds the controllers this long with every run waiting,
        // for a heap profiler to be read (docs/performance.md, "Profiling memory").
        if let Some(hold) = std::env::var("AGENTRT_BENCH_HOLD_SECONDS")
            .ok()
            .and_then(|seconds| seconds.parse::<u64>().ok())
        {
            eprintln!(
                "agentrt bench: every run waits; holding the controllers for {hold} s ({})",
                controllers
                    .iter()
                    .map(|c| format!("pid {}", c.pid()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            tokio::time::sleep(Duration::from_secs(hold)).await;
        }
        let mut now_rss = 0;
        let mut peak = 0;
        let mut per_run = Vec::new();
        for (controller, empty) in controllers.iter().zip(&rss_empty) {
            let (now, high) = controller.rss();
            now_rss = now_rss.max(now);
            peak = peak.max(high);
            per_run.push(now.saturating_sub(*empty) as f64 / plan.runs.max(1) as f64);
        }
        row.peak_rss = Some(peak);
        row.notes.push(format!(
            "{} runs parked on an Approval in {:.1} s ({:.0} runs/s); controller RSS now {:.1} MiB, peak {:.1} MiB; above the empty baseline ({}) per waiting run: {}",
            plan.runs,
            elapsed.as_secs_f64(),
            plan.runs as f64 / elapsed.as_secs_f64().max(1e-9),
            now_rss as f64 / 1048576.0,
            peak as f64 / 1048576.0,
            rss_empty
                .iter()
                .map(|bytes| format!("{:.1} MiB", *bytes as f64 / 1048576.0))
                .collect::<Vec<_>>()
                .join(", "),
            per_run
                .iter()
                .map(|bytes| format!("{:.2} KiB", bytes / 1024.0))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    row.controller_cpu = controllers.iter().map(|c| c.cpu_seconds()).sum::<f64>() - cpu_before;
    let each: Vec<String> = controllers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (_, peak) = c.rss();
            format!(
                "c{i} peak RSS {:.1} MiB, CPU {:.1} s",
                peak as f64 / 1048576.0,
                c.cpu_seconds() - cpu_each[i]
            )
        })
        .collect();
    row.notes.push(format!("controllers: {}", each.join("; ")));
    row.bench_cpu = super::own_cpu_seconds() - bench_before;
    // Kubernetes Events wait behind each controller's --event-qps: let the queues drain (at
    // most 60 s) so the requests counted below include every Event the workload made.
    let drained = Instant::now();
    loop {
        let queued = summed(
            &expositions(&controllers, &bench.http).await,
            "agentrt_kube_events_queued",
        );
        if queued <= 0.0 || drained.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let texts = expositions(&controllers, &bench.http).await;
    let metric_writes = summed(&texts, "agentrt_status_writes_total");
    let write_time = (
        summed(&texts, "agentrt_status_write_duration_seconds_sum"),
        summed(&texts, "agentrt_status_write_duration_seconds_count"),
    );
    let events = ["published", "failed", "folded", "dropped"].map(|outcome| {
        let series = format!("agentrt_kube_events_total{{outcome=\"{outcome}\"}}");
        texts
            .iter()
            .map(|text| metric_value(text, &series))
            .sum::<f64>()
    });
    row.notes.push(format!(
        "Kubernetes Events: {} published, {} refused, {} folded into another of the same run while waiting, {} dropped (queue full); {:.1} s waited after the last run for the queues behind --event-qps to drain",
        events[0],
        events[1],
        events[2],
        events[3],
        drained.elapsed().as_secs_f64()
    ));
    for controller in &mut controllers {
        controller.stop(Duration::from_secs(10));
    }
    drop(controllers);

    let calls = bench.tools.calls_in(&ns);
    row.tool_steps = calls.values().map(|c| c.len() as u64).sum();
    let mut first = Vec::new();
    let mut last = Vec::new();
    for run_calls in calls.values() {
        let overheads = tools::overheads(run_calls);
        let tenth = (overheads.len() / 10).max(1).min(overheads.len());
        first.extend_from_slice(&overheads[..tenth]);
        last.extend_from_slice(&overheads[overheads.len() - tenth..]);
        row.overheads.extend(overheads);
    }
    if !row.overheads.is_empty() {
        let p50 = |v: &[Duration]| quantile(v, 0.5).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let (first, last) = (p50(&first), p50(&last));
        row.notes.push(format!(
            "step overhead p50 over each run's first tenth of steps {first:.1} ms, last tenth \
             {last:.1} ms (last/first {:.2})",
            last / first.max(1e-9)
        ));
    }
    let segments = segments_api(&bench.target.client, &ns)
        .list_metadata(&Default::default())
        .await
        .map(|list| list.items.len() as u64)
        .ok();
    row.segments = segments;
    let requests = match bench.target.requests_since(&mark, &ns) {
        Some(Ok(requests)) => Some(requests),
        Some(Err(why)) => {
            row.notes.push(why);
            None
        }
        None => None,
    };
    match requests {
        Some(requests) => {
            let writes = super::target::writes_of(&requests);
            row.requests = requests;
            row.status_writes = Some(writes.get("agentruns/status").copied().unwrap_or(0));
            row.segment_creates = Some(writes.get("agentrunsegments").copied().unwrap_or(0));
            row.writes_by_resource = writes;
        }
        None => {
            row.status_writes = Some(metric_writes as u64);
            row.segment_creates = segments;
        }
    }
    if plan.waiting && plan.runs > 0 {
        row.notes.push(format!(
            "controller CPU {:.2} s per 1000 runs parked",
            row.controller_cpu * 1000.0 / plan.runs as f64
        ));
    }

    // Listed, and the recording finished, after the workload's CPU and requests were read.
    // The recording ends once its watch has caught up with the runs as they ended (a loaded
    // kube-apiserver's watch runs seconds behind).
    let finished = list_paged(&runs_api(&bench.target.client, &ns)).await?;
    let recorded = recorder
        .finish(floor_runs.then_some(finished.as_slice()))
        .await;
    row.largest_object_bytes = recorded.largest_object_bytes;
    if let Some(why) = &recorded.incomplete {
        eprintln!("agentrt bench: the watch of the runs' statuses is not whole: {why}");
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for run in &finished {
        let status = &run.data["status"];
        let mut word = status["phase"].as_str().unwrap_or("-").to_string();
        if let Some(reason) = status["reason"].as_str().filter(|r| *r != "goal_completed") {
            word = format!("{word} {reason}");
        }
        *outcomes.entry(word).or_default() += 1;
    }
    if !plan.waiting {
        let mut latencies: Vec<Duration> = finished
            .iter()
            .filter_map(|run| {
                let name = run.metadata.name.as_deref()?;
                let finished_at: jiff::Timestamp =
                    run.data["status"]["finishedAt"].as_str()?.parse().ok()?;
                let since = finished_at.duration_since(*created.get(name)?);
                Duration::try_from(since).ok()
            })
            .collect();
        latencies.sort();
        let ms = |q: f64| quantile(&latencies, q).map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        if !latencies.is_empty() {
            row.notes.push(format!(
                "time from create to finishedAt, p50 {:.0} ms, p99 {:.0} ms ({} runs)",
                ms(0.5),
                ms(0.99),
                latencies.len()
            ));
        }
        let duplicates: usize = calls.values().map(|c| tools::duplicate_keys(c)).sum();
        row.notes.push(format!(
            "duplicate tool calls (a repeated Idempotency-Key): {duplicates}"
        ));
    }
    row.outcome = outcomes
        .iter()
        .map(|(word, n)| format!("{n} {word}"))
        .collect::<Vec<_>>()
        .join(", ");
    if plan.runs == 1 {
        if let Some(run) = finished.first() {
            let bytes = serde_json::to_vec(&run.data["status"]).map_or(0, |b| b.len());
            row.notes.push(format!(
                "final record {:.0} KiB after {} steps",
                bytes as f64 / 1024.0,
                run.data["status"]["stepCount"]
            ));
        }
    }
    // The status writes' mean answer time as the controllers saw it (every outcome: landed,
    // conflict, run gone, failed), next to the floor's when it ran.
    let controllers_mean = if write_time.1 > 0.0 {
        format!(
            "{:.1} ms over {} writes",
            write_time.0 * 1000.0 / write_time.1,
            write_time.1
        )
    } else {
        "unknown".to_string()
    };
    if !floor_runs && write_time.1 > 0.0 {
        row.notes.push(format!(
            "status write answer time, mean: {controllers_mean} as the controllers saw it (request sent to answer decoded, every outcome)"
        ));
    }
    if floor_runs {
        // Twice, keeping the faster: on a shared machine the floor is what the server can do
        // at best, and a lower floor would flatter the ratio.
        let parallel = plan.runs.min(plan.controllers * 256);
        let mut best = floor::Replay::default();
        for attempt in 1..=2 {
            let floor_ns = bench
                .fresh_namespace(&format!("floor{attempt}-{}", plan.name))
                .await?;
            let replay = floor::replay(
                &bench.target.client,
                &floor_ns,
                &finished,
                &recorded.statuses,
                parallel,
            )
            .await?;
            if replay.writes_per_sec > best.writes_per_sec {
                best = replay;
            }
        }
        row.notes.push(format!(
            "floor: {} status writes replayed ({} settled by reading the run back after a lost answer), {} runs as the watch recorded their statuses ({} recorded), {} from their final record (the watch saw none, or not their last){}",
            best.writes,
            best.settled_writes,
            best.recorded_runs,
            recorded.status_count(),
            best.rebuilt_runs,
            recorded
                .incomplete
                .as_deref()
                .map_or_else(String::new, |why| format!(" ({why})"))
        ));
        row.notes.push(format!(
            "status write answer time, mean: {controllers_mean} as the controllers saw it (request sent to answer decoded, every outcome), {:.1} ms in the floor (landed writes)",
            best.mean_write_ms()
        ));
        row.floor_writes_per_sec = Some(best.writes_per_sec);
    }
    Ok(row)
}

/// Waits until every run of `plan` settled (finished; or, for waiting runs, parked on an
/// Approval), as the controllers' metrics tell (`agentrt_runs_finished_total`, recorded by the
/// replica whose write ended the run; `agentrt_runs` by phase, from their watches): the
/// benchmark adds no load of its own to the API server while it measures. Returns the time
/// since `started`.
async fn wait_settled(
    bench: &Bench,
    controllers: &[Controller],
    plan: &Plan,
    started: Instant,
) -> anyhow::Result<Duration> {
    let target = plan.runs as f64;
    loop {
        let texts = expositions(controllers, &bench.http).await;
        let finished = summed(&texts, "agentrt_runs_finished_total");
        let mut settled: f64 = 0.0;
        for text in &texts {
            let parked: f64 = ["WaitingForApproval", "Completed", "Failed", "Cancelled"]
                .iter()
                .map(|phase| metric_value(text, &format!("agentrt_runs{{phase=\"{phase}\"}}")))
                .sum();
            settled = settled.max(parked);
        }
        let done = if plan.waiting { settled } else { finished };
        if done >= target {
            return Ok(started.elapsed());
        }
        if started.elapsed() > bench.timeout {
            anyhow::bail!(
                "{}: {done} of {} runs settled within {:?}; controller logs in {}",
                plan.name,
                plan.runs,
                bench.timeout,
                controllers
                    .first()
                    .map_or_else(String::new, |c| c.log_path().display().to_string())
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
