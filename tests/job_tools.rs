//! Job tools on a cluster with a node (issue 37 item 1; docs/design.md section 6 "Job tools" and
//! section 5's Job rows; docs/behaviours.md 116-121). Every call runs as a real Job whose Pod
//! runs `tests/images/job-tool.rs` (the image `scripts/in-cluster-stage` builds and loads), and
//! controllers are the real binary on the host, SIGKILLed at the named fault points around a Job
//! step. What is checked is what a user relies on: the result the container wrote is the step's
//! observation, a failed Job is a `tool_error`, a takeover never asks a person and never runs
//! the call twice (the Pods the Job controller created are counted), a Job of the name that is
//! not the run's is never adopted, and cancel leaves the Job or deletes it as `onCancel` says.
//!
//! It runs only where `AGENTRT_JOB_TOOL_IMAGE` names the loaded image and
//! `AGENTRT_TEST_KUBECONFIG` a cluster with a node (the in-cluster stage of `scripts/test` sets
//! both); elsewhere each test says so in one line and passes.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use support::cluster::TestCluster;
use support::controller::*;

/// How long a run may take here: a Pod starts in a few seconds on the node, a takeover waits
/// for a 2-second lease.
const WAIT: Duration = Duration::from_secs(120);

/// The Job-tool image, or `None` (after saying why on stderr) where there is no node.
fn image(test: &str) -> Option<String> {
    match (
        std::env::var("AGENTRT_JOB_TOOL_IMAGE"),
        std::env::var("AGENTRT_TEST_KUBECONFIG"),
    ) {
        (Ok(image), Ok(kubeconfig)) if !image.is_empty() && !kubeconfig.is_empty() => Some(image),
        _ => {
            eprintln!(
                "{test}: not run: it needs a node and the job-tool image (scripts/test's \
                 in-cluster stage sets AGENTRT_JOB_TOOL_IMAGE)"
            );
            None
        }
    }
}

/// A run named `name` of one call of tool `work` (side-effect class `RemoteMutation`, allowed
/// without a person, so that only an interruption could ask one), then `complete`. `job` is the
/// tool's `job` block with the pod template's container running `image` with `flags`.
fn job_run(name: &str, image: &str, flags: &[&str], job: Value) -> String {
    let mut tool_job = json!({
        "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "tool",
                "image": image,
                "imagePullPolicy": "Never",
                "args": flags,
            }],
        }},
    });
    if let (Some(extra), Some(into)) = (job.as_object(), tool_job.as_object_mut()) {
        for (k, v) in extra {
            into.insert(k.clone(), v.clone());
        }
    }
    let run = json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {
            "goal": "Run the job once, whoever is alive.",
            "leaseDurationSeconds": 2,
            "agent": {"scripted": {"decisions": [
                {"kind": "tool_call", "tool": "work", "args": {"item": 7}},
                {"kind": "complete", "result": {"done": true}},
            ]}},
            "tools": [{
                "name": "work",
                "description": "Does the work in a Job.",
                "sideEffect": "RemoteMutation",
                "timeoutSeconds": 60,
                "inputSchema": {"type": "object"},
                "job": tool_job,
            }],
            "policy": {"sideEffects": {
                "ReadOnly": "Allow", "LocalMutation": "Allow",
                "RemoteMutation": "Allow", "Destructive": "Allow",
            }},
        },
    });
    serde_yaml::to_string(&run).expect("the run is YAML")
}

/// Creates the run; returns its uid.
async fn create(cluster: &TestCluster, yaml: &str) -> String {
    let run = cluster.create_run(yaml).await;
    run.metadata.uid.expect("uid")
}

/// The Pods the Job controller created in the test's namespace for Jobs of run `uid`.
async fn pods_of(cluster: &TestCluster, uid: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), cluster.namespace());
    pods.list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("job-name"))
                .is_some_and(|job| job.starts_with(&format!("agentrt-{uid}-")))
        })
        .collect()
}

/// The run's Jobs in the test's namespace.
async fn jobs(cluster: &TestCluster) -> Vec<Job> {
    let jobs: Api<Job> = Api::namespaced(cluster.client(), cluster.namespace());
    jobs.list(&ListParams::default())
        .await
        .expect("list jobs")
        .items
}

/// Asserts step 0's observation is the job-tool's result for run `uid`.
fn assert_result(status: &Value, uid: &str) {
    let step = &status["steps"][0];
    assert_eq!(step["status"], "done", "{step}");
    let content = &step["observation"]["content"];
    assert_eq!(content["ok"], true, "{step}");
    assert_eq!(content["args"], json!({"item": 7}), "{step}");
    assert_eq!(content["key"], format!("{uid}/0"), "{step}");
    assert_eq!(content["step"], 0, "{step}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_tool_completes_with_the_result_its_container_wrote_and_releases_its_job() {
    let Some(image) = image("completes") else {
        return;
    };
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "c");
    let uid = create(
        &cluster,
        &job_run(
            "completes",
            &image,
            &[],
            json!({"ttlSecondsAfterFinished": 3600}),
        ),
    )
    .await;
    let status = cluster.wait_phase("completes", "Completed", WAIT).await;
    assert_result(&status, &uid);
    let created = events_of(&status, "step.job_created");
    assert_eq!(created.len(), 1, "{status}");
    assert_eq!(created[0]["data"]["job"], format!("agentrt-{uid}-0-1"));
    assert_eq!(pods_of(&cluster, &uid).await.len(), 1, "one Pod ran");
    // The Job is the run's (owner reference, labels), and once the outcome is recorded its
    // finalizer is gone and its TTL counts from then.
    let job = eventually("the Job released", WAIT, || async {
        let jobs = jobs(&cluster).await;
        let job = jobs.into_iter().next()?;
        let finalizers = job.metadata.finalizers.clone().unwrap_or_default();
        (!finalizers.iter().any(|f| f == "agentrt.dev/outcome")).then_some(job)
    })
    .await;
    let owner = &job.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(owner.kind, "AgentRun");
    assert_eq!(owner.uid, uid);
    assert_eq!(
        job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished),
        Some(3600)
    );
    cluster.assert_no_approval("completes").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_result_in_the_log_a_failed_job_and_a_result_that_is_not_json() {
    let Some(image) = image("outcomes") else {
        return;
    };
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "c");
    let logged = create(
        &cluster,
        &job_run("logged", &image, &["--log"], json!({"result": "Log"})),
    )
    .await;
    create(
        &cluster,
        &job_run("failing", &image, &["--fail"], json!({})),
    )
    .await;
    create(
        &cluster,
        &job_run("garbled", &image, &["--not-json"], json!({})),
    )
    .await;

    let status = cluster.wait_phase("logged", "Completed", WAIT).await;
    assert_result(&status, &logged);

    let status = cluster.wait_phase("failing", "Completed", WAIT).await;
    let step = &status["steps"][0];
    assert_eq!(step["status"], "failed", "{step}");
    assert_eq!(step["observation"]["kind"], "tool_error", "{step}");
    assert_eq!(
        step["observation"]["summary"], "work failed: job_failed",
        "{step}"
    );
    let content = &step["observation"]["content"];
    assert_eq!(
        content["condition"]["reason"], "BackoffLimitExceeded",
        "{content}"
    );
    assert!(
        content["terminationMessage"]
            .as_str()
            .is_some_and(|m| m.contains("refused")),
        "the container's termination message is carried: {content}"
    );

    let status = cluster.wait_phase("garbled", "Completed", WAIT).await;
    let step = &status["steps"][0];
    assert_eq!(step["status"], "failed", "{step}");
    assert!(
        step["observation"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains("invalid_content")),
        "{step}"
    );
}

/// The crash matrix of a Job step: the first controller dies at `fault`, the second takes the
/// run over; the run completes with the container's result, nobody is asked, and exactly one
/// Pod ran. Prints the row for the matrix.
async fn crash_matrix_row(test: &str, name: &str, fault: &str, flags: &[&str]) {
    if !crash_points() {
        return;
    }
    let Some(image) = image(test) else {
        return;
    };
    let cluster = agentrt_cluster().await;
    let uid = create(&cluster, &job_run(name, &image, flags, json!({}))).await;
    let (_first, second) = crash_then_take_over_in(&cluster, fault, WAIT);
    let status = cluster.wait_phase(name, "Completed", WAIT).await;
    assert_result(&status, &uid);
    let approvals = cluster.approvals_of(name).await.len();
    let pods = pods_of(&cluster, &uid).await.len();
    eprintln!(
        "{test}: job tool × {fault}: settled without a person: {}, approvals: {approvals}, \
         Pods run: {pods}",
        approvals == 0
    );
    assert_eq!(pods, 1, "exactly one Pod ran:\n{}", second.log());
    assert_eq!(jobs(&cluster).await.len(), 1, "exactly one Job was created");
    assert!(
        event_types(&status).iter().any(|t| t == "run.resumed"),
        "the second controller took the run over: {:?}",
        event_types(&status)
    );
    cluster.assert_no_approval(name).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_after_the_start_is_recorded_the_takeover_creates_the_job_once() {
    crash_matrix_row(
        "crash_before_create",
        "before-create",
        "after-tool-started",
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_after_the_job_is_created_before_the_write_the_takeover_adopts_it() {
    crash_matrix_row(
        "crash_after_create",
        "after-create",
        "after-job-created",
        &["--sleep-ms", "2000"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_while_the_job_runs_the_takeover_waits_for_it() {
    crash_matrix_row(
        "crash_while_running",
        "while-running",
        "during-tool",
        &["--sleep-ms", "6000"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_after_the_job_finished_before_the_write_the_takeover_takes_its_outcome() {
    crash_matrix_row(
        "crash_after_finish",
        "after-finish",
        "after-job-finished",
        &[],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_of_the_name_that_is_not_the_runs_is_a_conflict_and_left_alone() {
    let Some(image) = image("conflict") else {
        return;
    };
    let cluster = agentrt_cluster().await;
    let uid = create(&cluster, &job_run("conflict", &image, &[], json!({}))).await;
    // Someone else's Job already has the name of the first attempt's.
    let other: Job = serde_json::from_value(json!({
        "metadata": {"name": format!("agentrt-{uid}-0-1"), "labels": {"team": "other"}},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "other", "image": image, "imagePullPolicy": "Never",
                            "args": ["--log"]}],
        }}},
    }))
    .expect("a Job");
    Api::<Job>::namespaced(cluster.client(), cluster.namespace())
        .create(&PostParams::default(), &other)
        .await
        .expect("the other Job is created");
    let _controller = start_controller(&cluster, "c");
    let status = cluster.wait_phase("conflict", "Failed", WAIT).await;
    assert_eq!(status["reason"], "reconcile_conflict", "{status}");
    let job = Api::<Job>::namespaced(cluster.client(), cluster.namespace())
        .get(&format!("agentrt-{uid}-0-1"))
        .await
        .expect("the other Job is still there");
    assert!(
        job.metadata.owner_references.unwrap_or_default().is_empty()
            && job.metadata.finalizers.unwrap_or_default().is_empty(),
        "the other Job was not adopted"
    );
}

/// The observation of the record's late `step.tool_finished` (`null` while there is none).
fn late_observation(status: &Value) -> Value {
    events_of(status, "step.tool_finished")
        .iter()
        .find(|e| e["data"]["late"] == true)
        .map_or(Value::Null, |e| e["data"]["observation"].clone())
}

/// Cancels run `name` once its Job exists; returns the cancelled status.
async fn cancel_while_running(cluster: &TestCluster, name: &str) -> Value {
    eventually("the Job exists", WAIT, || async {
        (!jobs(cluster).await.is_empty()).then_some(())
    })
    .await;
    runs_api(&cluster.client(), cluster.namespace())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"cancel": true}})),
        )
        .await
        .expect("cancel");
    cluster.wait_phase(name, "Cancelled", WAIT).await
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_leaves_the_job_and_records_its_outcome_late_unless_on_cancel_deletes_it() {
    let Some(image) = image("cancel") else {
        return;
    };
    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "c");
    let uid = create(
        &cluster,
        &job_run("left", &image, &["--sleep-ms", "8000"], json!({})),
    )
    .await;
    cancel_while_running(&cluster, "left").await;
    // The tool is not interrupted: its outcome is appended after run.finished.
    let late = cluster
        .wait_status("left", WAIT, "the late outcome", |s| {
            events_of(s, "step.tool_finished")
                .iter()
                .any(|e| e["data"]["late"] == true)
        })
        .await;
    assert_eq!(late["phase"], "Cancelled");
    assert_eq!(
        late_observation(&late)["content"]["ok"],
        true,
        "the Job's result is the late outcome: {late}"
    );
    assert_eq!(pods_of(&cluster, &uid).await.len(), 1);

    let cluster = agentrt_cluster().await;
    let _controller = start_controller(&cluster, "d");
    create(
        &cluster,
        &job_run(
            "deleted",
            &image,
            &["--sleep-ms", "60000"],
            json!({"onCancel": "Delete"}),
        ),
    )
    .await;
    cancel_while_running(&cluster, "deleted").await;
    let status = cluster
        .wait_status("deleted", WAIT, "the deletion recorded", |s| {
            late_observation(s)["content"]["deleted"].is_string()
        })
        .await;
    assert_eq!(
        late_observation(&status)["summary"],
        "work failed: job_failed"
    );
    eventually("the Job deleted", WAIT, || async {
        jobs(&cluster).await.is_empty().then_some(())
    })
    .await;
}
