//! The floor: the same API server's bare compare-and-set status-write loop. It replays the
//! records the runtime wrote, without the runtime: for each finished run, an AgentRun with the
//! same spec is created (in a namespace no controller watches) and its status replaced with the
//! run's record as it grew, step by step (steps `[..k]` and the journal up to them, then the
//! whole record), each on the `resourceVersion` the previous write returned. So the floor makes
//! the runs and writes as many statuses, of the same sizes, as the runtime did, and nothing
//! else: no leases, no reads, no watches, no tools.

use std::time::Instant;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use kube::api::{DynamicObject, PostParams};
use kube::Client;
use serde_json::{json, Value};

use super::target::runs_api;

/// The statuses to replay for one finished run's `status`: one per step prefix, then the whole.
pub fn growth(status: &Value) -> Vec<Value> {
    let steps = status["steps"].as_array().cloned().unwrap_or_default();
    let events = status["events"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::with_capacity(steps.len() + 1);
    for k in 1..=steps.len() {
        // The journal up to the last entry of step k-1 (entries without a step come along).
        let last_seq = events
            .iter()
            .filter(|e| e["step"].as_i64().is_some_and(|s| s < k as i64))
            .filter_map(|e| e["seq"].as_i64())
            .max()
            .unwrap_or(0);
        let mut partial = status.clone();
        partial["steps"] = Value::Array(steps[..k].to_vec());
        partial["stepCount"] = json!(k);
        partial["events"] = Value::Array(
            events
                .iter()
                .filter(|e| e["seq"].as_i64().unwrap_or(0) <= last_seq)
                .cloned()
                .collect(),
        );
        out.push(partial);
    }
    out.push(status.clone());
    out
}

/// Replays the records of `runs` (whole AgentRun objects as finished) in `namespace`,
/// `parallel` runs at a time: each object is created with the run's spec, then its status is
/// replaced as the record grew. Returns status writes per second over the whole replay
/// (creates included, as the runtime's figure includes the creation of its runs).
///
/// # Errors
/// When a create or a write is refused (a 409 here would mean someone else writes: none must).
pub async fn writes_per_sec(
    client: &Client,
    namespace: &str,
    runs: &[DynamicObject],
    parallel: usize,
) -> anyhow::Result<f64> {
    let api = runs_api(client, namespace);
    let replays: Vec<(DynamicObject, Vec<Value>)> = runs
        .iter()
        .map(|run| {
            let name = format!("floor-{}", run.metadata.name.clone().unwrap_or_default());
            let object: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "agentrt.dev/v1alpha1",
                "kind": "AgentRun",
                "metadata": {"name": name},
                "spec": run.data["spec"],
            }))?;
            anyhow::Ok((
                object,
                growth(run.data.get("status").unwrap_or(&Value::Null)),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let total: usize = replays.iter().map(|(_, statuses)| statuses.len()).sum();
    let started = Instant::now();
    futures::stream::iter(replays.into_iter().map(|(object, statuses)| {
        let api = api.clone();
        async move {
            let name = object.metadata.name.clone().unwrap_or_default();
            let mut object = api
                .create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("floor: cannot create {namespace}/{name}"))?;
            for status in statuses {
                object.data["status"] = status;
                object = api
                    .replace_status(&name, &PostParams::default(), &object)
                    .await
                    .with_context(|| format!("floor: status write of {namespace}/{name}"))?;
            }
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(parallel.max(1))
    .try_collect::<Vec<()>>()
    .await?;
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_replayed_as_it_grew() {
        let status = json!({
            "phase": "Completed",
            "stepCount": 2,
            "steps": [{"index": 0}, {"index": 1}],
            "events": [
                {"seq": 1, "type": "run.started"},
                {"seq": 2, "type": "step.started", "step": 0},
                {"seq": 3, "type": "step.started", "step": 1},
                {"seq": 4, "type": "run.finished"},
            ],
        });
        let replay = growth(&status);
        assert_eq!(replay.len(), 3);
        assert_eq!(replay[0]["steps"].as_array().unwrap().len(), 1);
        assert_eq!(replay[0]["events"].as_array().unwrap().len(), 2);
        assert_eq!(replay[1]["events"].as_array().unwrap().len(), 3);
        assert_eq!(replay[2], status);
    }
}
