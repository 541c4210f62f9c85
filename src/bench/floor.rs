//! The floor: the same API server's bare compare-and-set status-write loop. It replays the
//! statuses the runtime wrote, without the runtime: for each finished run, an AgentRun with the
//! same spec is created (in a namespace no controller watches) and its status replaced with each
//! status the run went through, in order, each on the `resourceVersion` the previous write
//! returned. The statuses are the ones a watch of the workload saw
//! ([`super::recorder::StatusRecorder`], the server's own bytes), so the floor writes as many
//! statuses, of the same sizes, as the runtime did; a run the watch did not record whole is
//! replayed from its final record as it grew ([`growth`]). Nothing else: no leases, no reads,
//! no watches, no tools, and no decoding of the answers beyond their `resourceVersion`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use kube::api::{DynamicObject, PostParams};
use kube::Client;
use serde::Deserialize;
use serde_json::value::RawValue;
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

/// What one replay of the floor measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Replay {
    /// Status writes per second over the whole replay (creates included, as the runtime's
    /// figure includes the creation of its runs).
    pub writes_per_sec: f64,
    /// Status writes made.
    pub writes: usize,
    /// Runs replayed from the statuses the watch recorded.
    pub recorded_runs: usize,
    /// Runs replayed from their final record as it grew (the watch did not record them, or
    /// not their last status).
    pub rebuilt_runs: usize,
    /// The status writes' answer times added up, in seconds (from the request sent to its
    /// answer's `resourceVersion` read), to compare with what the controllers saw
    /// (`agentrt_status_write_duration_seconds`).
    pub write_seconds: f64,
    /// Status writes whose answer was lost and that were settled by reading the run back: a
    /// write the API server timed out on (504) that the client sent again, which then
    /// conflicted with itself (kube-apiserver under load, `long` at 2,000 steps).
    pub settled_writes: usize,
}

impl Replay {
    /// The mean answer time of one status write, in milliseconds (0 when none was made).
    pub fn mean_write_ms(&self) -> f64 {
        if self.writes == 0 {
            0.0
        } else {
            self.write_seconds * 1000.0 / self.writes as f64
        }
    }
}

/// The part of a status write's answer the next write needs.
#[derive(Deserialize)]
struct Answer {
    metadata: AnswerMetadata,
}

#[derive(Deserialize)]
struct AnswerMetadata {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

/// Replays the statuses of `runs` (whole AgentRun objects as finished) in `namespace`,
/// `parallel` runs at a time: `recorded` holds each run's statuses by name, in the order they
/// were written; a run without them, or whose last recorded status is not its final one, is
/// replayed from its final record ([`growth`]).
///
/// # Errors
/// When a create or a write is refused (a 409 here would mean someone else writes: none must),
/// or an answer has no `metadata.resourceVersion`.
pub async fn replay(
    client: &Client,
    namespace: &str,
    runs: &[DynamicObject],
    recorded: &BTreeMap<String, Vec<Box<RawValue>>>,
    parallel: usize,
) -> anyhow::Result<Replay> {
    let api = runs_api(client, namespace);
    let mut measured = Replay::default();
    let mut replays: Vec<(DynamicObject, Vec<Cow<'_, RawValue>>)> = Vec::new();
    for run in runs {
        let source = run.metadata.name.clone().unwrap_or_default();
        let name = format!("floor-{source}");
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": name},
            "spec": run.data["spec"],
        }))?;
        let last = run.data.get("status").unwrap_or(&Value::Null);
        // Recorded whole only if the watch saw the run's last status: one it missed at the
        // end would leave the floor writes short.
        let whole = recorded
            .get(&source)
            .filter(|statuses| super::recorder::ends_with(Some(statuses), last));
        let statuses: Vec<Cow<'_, RawValue>> = match whole {
            Some(statuses) => {
                measured.recorded_runs += 1;
                statuses
                    .iter()
                    .map(|status| Cow::Borrowed(&**status))
                    .collect()
            }
            None => {
                measured.rebuilt_runs += 1;
                growth(last)
                    .iter()
                    .map(|status| serde_json::value::to_raw_value(status).map(Cow::Owned))
                    .collect::<Result<_, _>>()?
            }
        };
        measured.writes += statuses.len();
        replays.push((object, statuses));
    }
    let started = Instant::now();
    let write_seconds = futures::stream::iter(replays.into_iter().map(|(object, statuses)| {
        let api = api.clone();
        let client = client.clone();
        async move {
            let name = object.metadata.name.clone().unwrap_or_default();
            let created = api
                .create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("floor: cannot create {namespace}/{name}"))?;
            let mut resource_version = created.metadata.resource_version.unwrap_or_default();
            let uri =
                format!("/apis/agentrt.dev/v1alpha1/namespaces/{namespace}/agentruns/{name}/status");
            let name_json = serde_json::to_string(&name)?;
            let mut write_seconds = 0.0;
            let mut settled = 0;
            for status in statuses {
                // Without the spec, as the runtime writes a status (the status subresource
                // takes everything but the status from the stored object).
                let body = format!(
                    r#"{{"apiVersion":"agentrt.dev/v1alpha1","kind":"AgentRun","metadata":{{"name":{name_json},"resourceVersion":{}}},"status":{}}}"#,
                    serde_json::to_string(&resource_version)?,
                    status.get()
                );
                let request = http::Request::put(&uri)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(body.into_bytes())?;
                let sent = Instant::now();
                match client.request_text(request).await {
                    Ok(answer) => {
                        let answer: Answer = serde_json::from_str(&answer).with_context(|| {
                            format!("floor: the answer to a status write of {namespace}/{name}")
                        })?;
                        resource_version = answer.metadata.resource_version;
                    }
                    // Nobody else writes these runs: a 409 is this write landing once already
                    // (its first answer lost, the client sending it again). Read back, go on
                    // from what is stored if it is this status, else fail.
                    Err(kube::Error::Api(refused)) if refused.is_conflict() => {
                        let sent: Value = serde_json::from_str(status.get())?;
                        resource_version =
                            settle(&api, &name, &sent).await.with_context(|| {
                                format!("floor: status write of {namespace}/{name}: {refused}")
                            })?;
                        settled += 1;
                    }
                    Err(err) => {
                        return Err(anyhow::Error::new(err)
                            .context(format!("floor: status write of {namespace}/{name}")))
                    }
                }
                write_seconds += sent.elapsed().as_secs_f64();
            }
            anyhow::Ok((write_seconds, settled))
        }
    }))
    .buffer_unordered(parallel.max(1))
    .try_collect::<Vec<(f64, usize)>>()
    .await?;
    measured.write_seconds = write_seconds.iter().map(|(seconds, _)| seconds).sum();
    measured.settled_writes = write_seconds.iter().map(|(_, settled)| settled).sum();
    measured.writes_per_sec = measured.writes as f64 / started.elapsed().as_secs_f64();
    Ok(measured)
}

/// The `resourceVersion` of the run `name` when its stored status is `sent`: a status write
/// whose answer was lost landed.
///
/// # Errors
/// When the run cannot be read, or holds another status (someone else wrote it).
async fn settle(
    api: &kube::Api<DynamicObject>,
    name: &str,
    sent: &Value,
) -> anyhow::Result<String> {
    let stored = api.get_status(name).await?;
    anyhow::ensure!(
        stored.data.get("status") == Some(sent),
        "the run holds another status than the one written: someone else writes it"
    );
    stored
        .metadata
        .resource_version
        .context("the run read back has no metadata.resourceVersion")
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
