//! A `job` tool's call as a Kubernetes Job in the run's namespace (docs/design.md section 6,
//! "Job tools"): created under its derived name ([`crate::engine::job_name`]) with the run's
//! labels, owned by the run and held by the [`FINALIZER`] until its outcome is on the record;
//! waited for by reading it; its result read from its Pod.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::super::cluster::{ApiError, RunState, RUN_UID_LABEL};
use super::super::context::Context;
use super::super::fault::{self, FaultPoint};
use crate::api::{JobOnCancel, JobResult, JobTool, ToolFailure};
use crate::engine::{job_name, JobStage, ToolCall, ToolOutcome, JOB_GONE};
use crate::tools::http::millis;

/// The finalizer that keeps a Job (and so its outcome) until the write recording that outcome
/// landed; removed then ([`release`]).
pub const FINALIZER: &str = "agentrt.dev/outcome";
/// The label naming the step of a Job.
pub const STEP_LABEL: &str = "agentrt.dev/step";
/// The label naming the attempt of a Job.
pub const ATTEMPT_LABEL: &str = "agentrt.dev/attempt";
/// Args longer than this (bytes of JSON) reach the container as a file, not in `AGENTRT_ARGS`.
pub const ARGS_ENV_LIMIT: usize = 32 * 1024;
/// The annotation of the Pod template holding the args, mounted as `/agentrt/args.json`.
const ARGS_ANNOTATION: &str = "agentrt.dev/args";
/// The annotation of a Job holding the tool's `ttlSecondsAfterFinished`, set on the Job by
/// [`release`] once its outcome is on the record.
const TTL_ANNOTATION: &str = "agentrt.dev/ttl-seconds-after-outcome";
/// How often a Job is read while it runs.
const POLL: Duration = Duration::from_millis(500);
/// The most bytes of a Pod's log read for a `result: Log` tool.
const LOG_LIMIT_BYTES: i64 = 256 * 1024;

/// What one call of the Job executor came to.
#[derive(Debug)]
pub enum JobStep {
    /// The Job was created or found (its uid), or a Job of its name is not the run's (why).
    Created {
        /// The Job's name.
        name: String,
        /// Its uid, or the conflict.
        job: Result<String, String>,
    },
    /// The Job ended (or is gone, or could not be created): the step's outcome.
    Finished(ToolOutcome),
}

/// Performs `call` of a `job` tool at `stage`: creates the Job or reads it, and waits for its
/// outcome. Runs until the Job ends; the caller drops it to stop waiting (the Job runs on).
pub async fn call_job(
    ctx: &Context,
    state: &RunState,
    call: &ToolCall,
    stage: JobStage,
) -> JobStep {
    let started = Instant::now();
    let failed = |failure: ToolFailure, content: Value| {
        JobStep::Finished(ToolOutcome::Error {
            failure,
            status: None,
            content,
            duration_ms: millis(started),
        })
    };
    let Some(spec) = call.tool.job.as_deref() else {
        return failed(
            ToolFailure::NoExecutor,
            json!("the tool has no job executor"),
        );
    };
    if !ctx.settings.runs_pods {
        return failed(
            ToolFailure::NoExecutor,
            json!(format!(
                "tool {} is a Job tool and this cluster runs no Pods (agentrt dev has no nodes); \
                 run it on a cluster with nodes",
                call.tool.name
            )),
        );
    }
    let snapshot = &state.run.snapshot;
    let namespace = snapshot.namespace.as_str();
    let name = job_name(&snapshot.uid, call.step, call.attempt);
    let found = match stage {
        JobStage::Create => None,
        JobStage::Resume { recorded } => match read(ctx, namespace, &name).await {
            Some(job) => Some(job),
            None if recorded => {
                return JobStep::Finished(ToolOutcome::Unknown {
                    detail: format!(
                        "{JOB_GONE}: the Job {name} is gone although the record says it was \
                         created; whether it ran is unknown"
                    ),
                    duration_ms: millis(started),
                })
            }
            None => None,
        },
    };
    let job = match found {
        Some(job) => job,
        None => {
            let body = match manifest(state, call, spec, &name) {
                Ok(body) => body,
                Err(err) => return failed(ToolFailure::InvalidRequest, json!(err)),
            };
            match ctx.api.create_job(namespace, &body).await {
                Ok(created) => {
                    fault::check(FaultPoint::AfterJobCreated, Some(call.step.get()));
                    created
                }
                Err(ApiError::Conflict(_)) => match read(ctx, namespace, &name).await {
                    Some(job) => job,
                    None => {
                        return failed(
                            ToolFailure::InvalidRequest,
                            json!(format!("the Job {name} exists and cannot be read")),
                        )
                    }
                },
                Err(err) => {
                    // Refused (RBAC, quota, an admission policy): nothing was created.
                    return failed(
                        ToolFailure::InvalidRequest,
                        json!(format!("cannot create the Job {name}: {err}")),
                    );
                }
            }
        }
    };
    let labels = &job["metadata"]["labels"];
    if labels[RUN_UID_LABEL] != snapshot.uid.as_str() {
        return JobStep::Created {
            name,
            job: Err(format!(
                "its label {RUN_UID_LABEL} is {}, the run's uid is {}",
                labels[RUN_UID_LABEL], snapshot.uid
            )),
        };
    }
    let uid = job["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if stage != (JobStage::Resume { recorded: true }) {
        return JobStep::Created { name, job: Ok(uid) };
    }
    let outcome = wait(ctx, state, spec, &name, &uid, started).await;
    fault::check(FaultPoint::AfterJobFinished, Some(call.step.get()));
    JobStep::Finished(outcome)
}

/// The Job as stored; `None` when absent. Read errors are retried (a Job is never taken as
/// absent because a read failed).
async fn read(ctx: &Context, namespace: &str, name: &str) -> Option<Value> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match ctx.api.get_job(namespace, name).await {
            Ok(job) => return job,
            Err(err) => {
                tracing::info!(job = name, %err, "cannot read the Job; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The Job of `call` (docs/design.md section 6, "Job tools"): the template with the args and
/// the run's names in each container's env, `restartPolicy` `Never` unless set, labelled with
/// the run's uid, the step and the attempt, owned by the run, held by [`FINALIZER`].
fn manifest(
    state: &RunState,
    call: &ToolCall,
    spec: &JobTool,
    name: &str,
) -> Result<Value, String> {
    let snapshot = &state.run.snapshot;
    let mut template = spec.template.clone();
    if !template.is_object() {
        return Err("spec.tools[].job.template is not an object".into());
    }
    let args = serde_json::to_string(&call.args).map_err(|err| err.to_string())?;
    let labels = json!({
        RUN_UID_LABEL: snapshot.uid,
        STEP_LABEL: call.step.get().to_string(),
        ATTEMPT_LABEL: call.attempt.to_string(),
    });
    let mut env = vec![
        json!({"name": "AGENTRT_IDEMPOTENCY_KEY", "value": call.idempotency_key}),
        json!({"name": "AGENTRT_RUN", "value": format!("{}/{}", snapshot.namespace, snapshot.name)}),
        json!({"name": "AGENTRT_STEP", "value": call.step.get().to_string()}),
    ];
    let as_file = args.len() > ARGS_ENV_LIMIT;
    if as_file {
        env.push(json!({"name": "AGENTRT_ARGS", "value": ""}));
        env.push(json!({"name": "AGENTRT_ARGS_FILE", "value": "/agentrt/args.json"}));
        template["metadata"]["annotations"][ARGS_ANNOTATION] = json!(args);
    } else {
        env.push(json!({"name": "AGENTRT_ARGS", "value": args}));
    }
    for (key, value) in labels.as_object().into_iter().flatten() {
        template["metadata"]["labels"][key] = value.clone();
    }
    let pod = &mut template["spec"];
    if pod.get("restartPolicy").is_none_or(Value::is_null) {
        pod["restartPolicy"] = json!("Never");
    }
    if as_file {
        let volume = json!({
            "name": "agentrt-args",
            "downwardAPI": {"items": [{
                "path": "args.json",
                "fieldRef": {"fieldPath": format!("metadata.annotations['{ARGS_ANNOTATION}']")},
            }]},
        });
        match pod["volumes"].as_array_mut() {
            Some(volumes) => volumes.push(volume),
            None => pod["volumes"] = json!([volume]),
        }
    }
    let Some(containers) = pod["containers"].as_array_mut() else {
        return Err("spec.tools[].job.template.spec.containers is missing".into());
    };
    for container in containers {
        match container["env"].as_array_mut() {
            // Ours last: a variable of the same name in the template is overridden.
            Some(existing) => existing.extend(env.iter().cloned()),
            None => container["env"] = json!(env),
        }
        if as_file {
            let mount = json!({"name": "agentrt-args", "mountPath": "/agentrt", "readOnly": true});
            match container["volumeMounts"].as_array_mut() {
                Some(mounts) => mounts.push(mount),
                None => container["volumeMounts"] = json!([mount]),
            }
        }
    }
    let deadline = spec
        .active_deadline_seconds
        .unwrap_or(call.tool.timeout_seconds.max(1));
    let mut annotations = json!({});
    if let Some(ttl) = spec.ttl_seconds_after_finished {
        annotations[TTL_ANNOTATION] = json!(ttl.to_string());
    }
    Ok(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": snapshot.namespace,
            "labels": labels,
            "annotations": annotations,
            "finalizers": [FINALIZER],
            "ownerReferences": [{
                "apiVersion": "agentrt.dev/v1alpha1",
                "kind": "AgentRun",
                "name": snapshot.name,
                "uid": snapshot.uid,
                "controller": true,
                "blockOwnerDeletion": false,
            }],
        },
        "spec": {
            "backoffLimit": spec.backoff_limit.unwrap_or(0),
            "activeDeadlineSeconds": deadline,
            "template": template,
        },
    }))
}

/// The condition of `type_` with status `True`, when the Job has one.
fn condition<'a>(job: &'a Value, type_: &str) -> Option<&'a Value> {
    job["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")
}

/// Waits for the Job `name` (uid `uid`) to complete or fail and reads its outcome. A Job gone
/// while waited for is an unknown outcome ([`JOB_GONE`]); a cancelled run's Job is deleted
/// when the tool says `onCancel: Delete`.
async fn wait(
    ctx: &Context,
    state: &RunState,
    spec: &JobTool,
    name: &str,
    uid: &str,
    started: Instant,
) -> ToolOutcome {
    let snapshot = &state.run.snapshot;
    let namespace = snapshot.namespace.as_str();
    let delete_on_cancel = spec.on_cancel == Some(JobOnCancel::Delete);
    loop {
        let Some(job) = read(ctx, namespace, name).await else {
            return ToolOutcome::Unknown {
                detail: format!("{JOB_GONE}: the Job {name} was deleted while it was waited for"),
                duration_ms: millis(started),
            };
        };
        if job["metadata"]["uid"] != uid {
            return ToolOutcome::Unknown {
                detail: format!("{JOB_GONE}: the Job {name} was replaced by another of its name"),
                duration_ms: millis(started),
            };
        }
        if condition(&job, "Complete").is_some() {
            return completed(ctx, namespace, spec, name, uid, &job, started).await;
        }
        if let Some(failed) = condition(&job, "Failed") {
            let message = termination(ctx, namespace, uid, &job, "Failed").await;
            return ToolOutcome::Error {
                failure: ToolFailure::JobFailed,
                status: None,
                content: json!({
                    "job": name,
                    "condition": {"reason": failed["reason"], "message": failed["message"]},
                    "terminationMessage": message.map(|(_, m)| m),
                }),
                duration_ms: millis(started),
            };
        }
        if delete_on_cancel && super::run_cancelled(ctx, state).await {
            tracing::info!(
                job = name,
                "the run is cancelled and its tool says onCancel: Delete"
            );
            if let Err(err) = ctx.api.delete_job(namespace, name).await {
                tracing::warn!(job = name, %err, "cannot delete the Job of a cancelled run");
            }
            return ToolOutcome::Error {
                failure: ToolFailure::JobFailed,
                status: None,
                content: json!({
                    "job": name,
                    "deleted": "the run was cancelled and the tool says onCancel: Delete",
                }),
                duration_ms: millis(started),
            };
        }
        fault::check(FaultPoint::DuringTool, labels_step(&job));
        tokio::time::sleep(POLL).await;
    }
}

/// The step a Job runs, from its label.
fn labels_step(job: &Value) -> Option<i64> {
    job["metadata"]["labels"][STEP_LABEL].as_str()?.parse().ok()
}

/// A completed Job's result: its first container's termination message, or the last line of
/// its log, as JSON (not JSON: `invalid_content`).
async fn completed(
    ctx: &Context,
    namespace: &str,
    spec: &JobTool,
    name: &str,
    uid: &str,
    job: &Value,
    started: Instant,
) -> ToolOutcome {
    let duration_ms = millis(started);
    let (pod, text) = match spec.result.unwrap_or_default() {
        JobResult::TerminationMessage => {
            match termination(ctx, namespace, uid, job, "Succeeded").await {
                Some(found) => found,
                None => {
                    return ToolOutcome::Error {
                        failure: ToolFailure::InvalidContent,
                        status: None,
                        content: json!(format!(
                            "the Job {name} completed and no Pod of it holds a termination message"
                        )),
                        duration_ms,
                    }
                }
            }
        }
        JobResult::Log => match last_log_line(ctx, namespace, uid, job).await {
            Ok(found) => found,
            Err(err) => {
                return ToolOutcome::Error {
                    failure: ToolFailure::InvalidContent,
                    status: None,
                    content: json!(format!(
                        "the Job {name} completed and its log cannot be read: {err}"
                    )),
                    duration_ms,
                }
            }
        },
    };
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(content) => ToolOutcome::Result {
            status: 200,
            content,
            duration_ms,
        },
        Err(err) => ToolOutcome::Error {
            failure: ToolFailure::InvalidContent,
            status: None,
            content: json!({
                "job": name,
                "pod": pod,
                "error": format!("the result is not JSON: {err}"),
                "text": text,
            }),
            duration_ms,
        },
    }
}

/// The name of the first container of the Job's template.
fn first_container(job: &Value) -> String {
    job["spec"]["template"]["spec"]["containers"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The Pods of the Job in `phase`, newest last.
async fn pods_in(ctx: &Context, namespace: &str, uid: &str, phase: &str) -> Vec<Value> {
    let mut pods = match ctx.api.list_job_pods(namespace, uid).await {
        Ok(pods) => pods,
        Err(err) => {
            tracing::info!(%err, "cannot list the Job's Pods");
            Vec::new()
        }
    };
    pods.retain(|p| p["status"]["phase"] == phase);
    pods.sort_by(|a, b| {
        a["metadata"]["creationTimestamp"]
            .as_str()
            .cmp(&b["metadata"]["creationTimestamp"].as_str())
    });
    pods
}

/// The termination message of the first container of the Job's last Pod in `phase`: (pod,
/// message).
async fn termination(
    ctx: &Context,
    namespace: &str,
    uid: &str,
    job: &Value,
    phase: &str,
) -> Option<(String, String)> {
    let container = first_container(job);
    pods_in(ctx, namespace, uid, phase)
        .await
        .iter()
        .rev()
        .find_map(|pod| {
            let statuses = pod["status"]["containerStatuses"].as_array()?;
            let status = statuses.iter().find(|s| s["name"] == container.as_str())?;
            let message = status["state"]["terminated"]["message"].as_str()?;
            Some((
                pod["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                message.to_string(),
            ))
        })
}

/// The last non-empty line of the first container's log of the Job's succeeded Pod.
async fn last_log_line(
    ctx: &Context,
    namespace: &str,
    uid: &str,
    job: &Value,
) -> Result<(String, String), String> {
    let container = first_container(job);
    let pods = pods_in(ctx, namespace, uid, "Succeeded").await;
    let pod = pods
        .last()
        .and_then(|p| p["metadata"]["name"].as_str())
        .ok_or("no succeeded Pod of it is left")?
        .to_string();
    let log = ctx
        .api
        .pod_log(namespace, &pod, &container, LOG_LIMIT_BYTES)
        .await
        .map_err(|err| err.to_string())?;
    let line = log
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or("its log is empty")?
        .to_string();
    Ok((pod, line))
}

/// Removes [`FINALIZER`] from the Job `name` and sets its `ttlSecondsAfterFinished` (when the
/// tool gave one, kept on the Job as an annotation): its outcome is on the record. A Job
/// already gone is fine.
pub async fn release(ctx: &Context, namespace: &str, name: &str) {
    for _ in 0..5 {
        let Some(job) = ctx.api.get_job(namespace, name).await.ok().flatten() else {
            return;
        };
        let finalizers: Vec<Value> = job["metadata"]["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let mut patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": job["metadata"]["resourceVersion"],
            },
        });
        let ttl = job["metadata"]["annotations"][TTL_ANNOTATION]
            .as_str()
            .and_then(|t| t.parse::<i32>().ok());
        if let Some(ttl) = ttl {
            patch["spec"] = json!({"ttlSecondsAfterFinished": ttl});
        }
        match ctx.api.patch_job(namespace, name, &patch).await {
            Ok(()) | Err(ApiError::NotFound(_)) => return,
            Err(err) => tracing::info!(job = name, %err, "cannot release the Job; retrying"),
        }
    }
    tracing::warn!(
        job = name,
        "the Job keeps its finalizer; the next holder releases it"
    );
}

/// Releases the run's Jobs whose outcome is on the record (a `step.tool_finished` of their step
/// and attempt, or a later attempt of their step): those a holder that stopped before releasing
/// left. Lists Jobs only for a run that has a `job` tool.
pub async fn release_settled(ctx: &Context, state: &RunState) {
    let snapshot = &state.run.snapshot;
    let spec = &snapshot.spec;
    if !ctx.settings.runs_pods || spec.tools.iter().all(|t| t.job.is_none()) {
        return;
    }
    let jobs = match ctx.api.list_jobs(&snapshot.namespace, &snapshot.uid).await {
        Ok(jobs) => jobs,
        Err(err) => {
            tracing::info!(%err, "cannot list the run's Jobs");
            return;
        }
    };
    let status = &snapshot.status;
    for job in jobs {
        let Some((step, attempt)) = step_and_attempt(&job) else {
            continue;
        };
        if held(&job) && settled(status, step, attempt) {
            let name = job["metadata"]["name"].as_str().unwrap_or_default();
            release(ctx, &snapshot.namespace, name).await;
        }
    }
}

/// How often [`sweep`] looks through the Jobs of runs (seconds).
pub const SWEEP_SECONDS: u64 = 300;

/// Releases every Job of a run (in `scopes`: namespaces, `None` for all) that still holds the
/// [`FINALIZER`] although nobody will record its outcome any more or the record already holds
/// it: its run is gone (deleted, or another run of the name), or its run's record holds the
/// outcome of its step and attempt (a holder died between that write and the release, and the
/// run ended, so no holder comes back to [`release_settled`]). A Job of a live run whose
/// outcome is not recorded is left to the run's executor. Read errors leave Jobs as they are
/// for the next sweep (docs/design.md section 6, "Job tools").
pub async fn sweep(ctx: &Context, scopes: &[Option<String>]) {
    for scope in scopes {
        let jobs = match ctx.api.list_run_jobs(scope.as_deref()).await {
            Ok(jobs) => jobs,
            Err(err) => {
                tracing::info!(%err, "cannot list the runs' Jobs; the next sweep tries again");
                continue;
            }
        };
        for job in jobs {
            if !held(&job) {
                continue;
            }
            let meta = &job["metadata"];
            let (Some(namespace), Some(name)) = (meta["namespace"].as_str(), meta["name"].as_str())
            else {
                continue;
            };
            let owner = meta["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|o| o["kind"] == "AgentRun")
                .and_then(|o| o["name"].as_str());
            let run = match owner {
                Some(owner) => match ctx.api.get_run(namespace, owner).await {
                    Ok(run) => run,
                    Err(err) => {
                        tracing::info!(job = name, %err, "cannot read the Job's run; left for the next sweep");
                        continue;
                    }
                },
                None => None,
            };
            let release_it = match run {
                Some(run) if meta["labels"][RUN_UID_LABEL] == run.snapshot.uid.as_str() => {
                    step_and_attempt(&job)
                        .is_some_and(|(step, attempt)| settled(&run.snapshot.status, step, attempt))
                }
                // The run is gone: nobody can record the outcome; the Job goes with its owner.
                _ => owner.is_some(),
            };
            if release_it {
                tracing::info!(
                    job = name,
                    namespace,
                    "releasing a Job whose outcome is recorded or whose run is gone"
                );
                release(ctx, namespace, name).await;
            }
        }
    }
}

/// Whether the Job still holds the [`FINALIZER`].
fn held(job: &Value) -> bool {
    job["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
}

/// The step and attempt a Job's labels name.
fn step_and_attempt(job: &Value) -> Option<(i64, i64)> {
    let labels = &job["metadata"]["labels"];
    let number = |label: &str| labels[label].as_str()?.parse::<i64>().ok();
    Some((number(STEP_LABEL)?, number(ATTEMPT_LABEL)?))
}

/// Whether the record (status as JSON) holds the outcome of `step`'s attempt `attempt`.
fn settled(status: &Value, step: i64, attempt: i64) -> bool {
    let events = status["events"].as_array().into_iter().flatten();
    let finished = events.clone().any(|e| {
        e["type"] == "step.tool_finished" && e["step"] == step && e["data"]["attempt"] == attempt
    });
    let later = events.clone().any(|e| {
        e["type"] == "step.tool_started"
            && e["step"] == step
            && e["data"]["attempt"].as_i64().is_some_and(|a| a > attempt)
    });
    finished || later
}
