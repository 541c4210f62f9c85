//! The engine's cost per step as a run's record grows (not a timed test): a scripted run of
//! `AGENTRT_BENCH_STEPS` (default 400) small tool steps is driven through `engine::step` alone,
//! no I/O, and the mean time of a transition over the first and the last tenth is printed with
//! the final record's size. The engine reads and rewrites the whole record each step, so this
//! grows with the record (docs/performance.md).
//!
//! Driven twice, alternating, three times: as the executor steps (the record its last write
//! encoded handed back, `RunSnapshot::record`) and as a step after a re-read (the status
//! decoded every step); the difference is what the hand-back saves per step.
//!
//! `cargo bench --bench engine_step`

use std::time::{Duration, Instant};

use agentrt::engine::{step, Budgets, Caller, ExternalCall, Input, Next, RunSnapshot, ToolOutcome};

fn main() {
    let steps: usize = std::env::var("AGENTRT_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let manifest =
        agentrt::bench::manifests::tool_loop("r", "http://127.0.0.1:1", "small", steps, 30);
    let spec = match serde_json::from_value::<agentrt::api::AgentRunSpec>(manifest["spec"].clone())
    {
        Ok(spec) => std::sync::Arc::new(spec),
        Err(err) => {
            eprintln!("the benchmark run does not decode: {err}");
            std::process::exit(1);
        }
    };
    for round in 0..3 {
        for hand_back in [true, false] {
            let (times, bytes) = drive(&manifest, &spec, hand_back);
            let tenth = (times.len() / 10).max(1);
            let mean_ms = |part: &[Duration]| {
                part.iter().map(Duration::as_secs_f64).sum::<f64>() / part.len() as f64 * 1000.0
            };
            let all_ms = mean_ms(&times);
            println!(
                "{} ({round}): {} transitions: mean {:.3} ms over all, {:.3} ms over the first tenth, {:.3} ms over the last; final record {} KiB",
                if hand_back {
                    "record handed back"
                } else {
                    "status decoded each step"
                },
                times.len(),
                all_ms,
                mean_ms(&times[..tenth]),
                mean_ms(&times[times.len() - tenth..]),
                bytes / 1024
            );
        }
    }
}

/// Drives the run through `engine::step` to its end: the time of each transition and the final
/// record's length in bytes. `hand_back`: the executor's path, each write's record handed to
/// the next step; else the status is decoded every step.
fn drive(
    manifest: &serde_json::Value,
    spec: &std::sync::Arc<agentrt::api::AgentRunSpec>,
    hand_back: bool,
) -> (Vec<Duration>, usize) {
    let mut run = RunSnapshot {
        namespace: "ns".into(),
        name: "r".into(),
        uid: "6f1c2a4e-8d3b-4f5a-9c7e-0123456789ab".into(),
        generation: 1,
        spec: spec.clone(),
        // Measured once, as the controller measures the spec it read.
        spec_bytes: serde_json::to_vec(&manifest["spec"])
            .ok()
            .map(|text| text.len()),
        metadata_bytes: serde_json::to_vec(&manifest["metadata"]).map_or(0, |text| text.len()),
        status: serde_json::Value::Null,
        record: None,
        created_by: None,
        sealed: Default::default(),
    };
    let caller = Caller {
        holder: "bench-1".into(),
        now: agentrt::api::Time(jiff::Timestamp::now()),
        draining: false,
        admin: Default::default(),
    };
    let budgets = Budgets::default();
    let mut input = Input::LeaseAcquired { takeover: None };
    let mut times: Vec<Duration> = Vec::new();
    loop {
        let started = Instant::now();
        let transition = match step(&run, &[], &caller, &budgets, input.clone()) {
            Ok(transition) => transition,
            Err(err) => {
                eprintln!("the engine refused an input: {err}");
                std::process::exit(1);
            }
        };
        times.push(started.elapsed());
        if let Some(status) = transition.write {
            // As the executor keeps it: the status sent, and its record handed back.
            run.status = status;
            run.record = if hand_back { transition.record } else { None };
        }
        let next = match transition.next {
            Next::Call(ExternalCall::Tool(call)) => Some(Input::ToolFinished {
                step: call.step,
                attempt: call.attempt,
                outcome: ToolOutcome::Result {
                    status: 200,
                    content: serde_json::json!({"ok": true, "item": call.step}),
                    duration_ms: 1,
                },
            }),
            _ => None,
        };
        match next {
            Some(next) => input = next,
            None => break,
        }
    }
    let bytes = serde_json::to_vec(&run.status).map_or(0, |b| b.len());
    (times, bytes)
}
