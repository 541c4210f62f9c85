//! `job` tools through the real engine against the fake API, with a test kubelet that finishes
//! the Jobs it is told to (docs/design.md section 6, "Job tools"; docs/behaviours.md 116-121).

use super::*;
use crate::controller::calls::job::FINALIZER;

/// How the test kubelet ends a Job.
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    /// A Pod succeeds; its termination message echoes the args as `{"echo": args}`; its log's
    /// last line is `{"from": "log"}`.
    Succeed,
    /// A Pod fails with termination message `boom`; the Job fails `BackoffLimitExceeded`.
    Fail,
    /// The Job runs on.
    Hold,
}

/// Finishes each Job of the fake as `ending` says, as the Job controller and a kubelet would.
fn kubelet(api: Arc<FakeApi>, ending: Arc<Mutex<Ending>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let ending = *ending.lock().unwrap();
            {
                let mut state = api.state.lock().unwrap();
                let mut new_pods = Vec::new();
                for job in state.jobs.values_mut() {
                    if ending == Ending::Hold || job["status"]["conditions"].is_array() {
                        continue;
                    }
                    let uid = job["metadata"]["uid"].clone();
                    let name = job["metadata"]["name"].as_str().unwrap().to_string();
                    let container = &job["spec"]["template"]["spec"]["containers"][0];
                    let args = container["env"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .find(|e| e["name"] == "AGENTRT_ARGS")
                        .and_then(|e| e["value"].as_str())
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .unwrap_or(Value::Null);
                    let (phase, message, condition) = match ending {
                        Ending::Succeed => (
                            "Succeeded",
                            json!({"echo": args}).to_string(),
                            json!({"type": "Complete", "status": "True"}),
                        ),
                        _ => (
                            "Failed",
                            "boom".to_string(),
                            json!({"type": "Failed", "status": "True",
                                   "reason": "BackoffLimitExceeded",
                                   "message": "Job has reached the specified backoff limit"}),
                        ),
                    };
                    new_pods.push((
                        json!({
                            "metadata": {
                                "namespace": job["metadata"]["namespace"],
                                "name": format!("{name}-pod"),
                                "labels": {"batch.kubernetes.io/controller-uid": uid},
                                "creationTimestamp": "2026-12-06T00:00:00Z",
                            },
                            "status": {
                                "phase": phase,
                                "containerStatuses": [{
                                    "name": container["name"],
                                    "state": {"terminated": {"message": message}},
                                }],
                            },
                        }),
                        "starting\n{\"from\": \"log\"}\n\n".to_string(),
                    ));
                    job["status"]["conditions"] = json!([condition]);
                }
                state.pods.extend(new_pods);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

/// A run of one `job` tool `work` ({n: 1}), then complete.
fn job_run(name: &str, job: Value) -> Value {
    let mut run = run_object("ns", name, 2);
    run["spec"]["agent"] = json!({"scripted": {"decisions": [
        {"kind": "tool_call", "tool": "work", "args": {"n": 1}},
        {"kind": "complete", "result": {"done": true}},
    ]}});
    run["spec"]["tools"] = json!([{
        "name": "work", "sideEffect": "LocalMutation", "timeoutSeconds": 30,
        "inputSchema": {"type": "object"},
        "job": job,
    }]);
    run
}

fn template() -> Value {
    json!({"template": {"spec": {"containers": [{"name": "main", "image": "registry.local/work:1"}]}}})
}

/// A context running the real engine.
fn real(api: Arc<FakeApi>, prefix: &str) -> Arc<Context> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    Arc::new(Context::new(ContextParts {
        api,
        settings: Settings {
            engine: Engine::PURE,
            skew_margin: Duration::from_millis(100),
            ..Settings::new(HolderId::with_random_suffix(prefix))
        },
        events: EventSink::disabled(),
        metrics: Arc::new(Metrics::default()),
        http: crate::tools::http::client().unwrap(),
        shutdown: CancellationToken::new(),
        kicks: tx,
    }))
}

async fn until_idle_long(ctx: &Context) {
    for _ in 0..400 {
        if ctx.executors.executing() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the executor did not stop");
}

fn event_types(run: &Value) -> Vec<String> {
    run["status"]["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Waits until the stored run's events include `event`.
async fn until_event(api: &FakeApi, name: &str, event: &str) {
    for _ in 0..400 {
        if event_types(&api.run("ns", name)).iter().any(|t| t == event) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{event} never came: {:?}",
        event_types(&api.run("ns", name))
    );
}

/// Stops `ctx`'s executors (a graceful shutdown: the Lease released, the step left executing).
async fn stop(ctx: &Context) {
    ctx.executors.shutdown.cancel();
    until_idle_long(ctx).await;
}

#[tokio::test]
async fn a_job_tool_runs_as_one_owned_labelled_job_whose_message_is_the_result() {
    let mut spec = template();
    spec["ttlSecondsAfterFinished"] = json!(60);
    let api = Arc::new(FakeApi::with_run(job_run("jobok", spec)));
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Succeed)));
    let ctx = real(api.clone(), "a");
    observe(&ctx, &key("jobok"), None).await.unwrap();
    until_idle_long(&ctx).await;
    let run = api.run("ns", "jobok");
    assert_eq!(run["status"]["phase"], "Completed", "{}", run["status"]);
    assert_eq!(
        run["status"]["steps"][0]["observation"]["content"],
        json!({"echo": {"n": 1}}),
        "the termination message is the step's result"
    );
    let types = event_types(&run);
    let at = |t: &str| types.iter().position(|x| x == t).unwrap();
    assert!(at("step.tool_started") < at("step.job_created"));
    assert!(at("step.job_created") < at("step.tool_finished"));
    let state = api.state.lock().unwrap();
    assert_eq!(state.job_creates, 1, "one Job per step");
    let (_, job) = state.jobs.iter().next().unwrap();
    assert_eq!(job["metadata"]["name"], "agentrt-uid-jobok-0-1");
    assert_eq!(
        job["metadata"]["labels"]["agentrt.dev/run-uid"],
        "uid-jobok"
    );
    assert_eq!(job["metadata"]["labels"]["agentrt.dev/step"], "0");
    assert_eq!(job["metadata"]["labels"]["agentrt.dev/attempt"], "1");
    assert_eq!(job["metadata"]["ownerReferences"][0]["uid"], "uid-jobok");
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(job["spec"]["activeDeadlineSeconds"], 30);
    assert_eq!(job["spec"]["template"]["spec"]["restartPolicy"], "Never");
    let env = &job["spec"]["template"]["spec"]["containers"][0]["env"];
    let var = |n: &str| {
        env.as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].clone())
    };
    assert_eq!(var("AGENTRT_ARGS"), Some(json!("{\"n\":1}")));
    assert_eq!(var("AGENTRT_IDEMPOTENCY_KEY"), Some(json!("uid-jobok/0")));
    assert_eq!(var("AGENTRT_RUN"), Some(json!("ns/jobok")));
    assert_eq!(var("AGENTRT_STEP"), Some(json!("0")));
    assert!(
        !job["metadata"]["finalizers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == FINALIZER),
        "the finalizer is removed once the outcome is on the record: {}",
        job["metadata"]
    );
    assert_eq!(
        job["spec"]["ttlSecondsAfterFinished"], 60,
        "the TTL counts from then"
    );
}

#[tokio::test]
async fn a_failed_job_is_a_tool_error_and_a_log_result_is_its_last_line() {
    let api = Arc::new(FakeApi::with_run(job_run("jobfail", template())));
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Fail)));
    let ctx = real(api.clone(), "a");
    observe(&ctx, &key("jobfail"), None).await.unwrap();
    until_idle_long(&ctx).await;
    let run = api.run("ns", "jobfail");
    let step = &run["status"]["steps"][0];
    assert_eq!(step["status"], "failed", "{step}");
    assert_eq!(step["observation"]["kind"], "tool_error", "{step}");
    let content = &step["observation"]["content"];
    assert_eq!(
        content["condition"]["reason"], "BackoffLimitExceeded",
        "{content}"
    );
    assert_eq!(content["terminationMessage"], "boom");

    let mut spec = template();
    spec["result"] = json!("Log");
    let api = Arc::new(FakeApi::with_run(job_run("joblog", spec)));
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Succeed)));
    let ctx = real(api.clone(), "a");
    observe(&ctx, &key("joblog"), None).await.unwrap();
    until_idle_long(&ctx).await;
    let run = api.run("ns", "joblog");
    assert_eq!(
        run["status"]["steps"][0]["observation"]["content"],
        json!({"from": "log"})
    );
}

#[tokio::test]
async fn a_takeover_waits_for_the_job_it_finds_and_asks_no_one() {
    let api = Arc::new(FakeApi::with_run(job_run("jobtake", template())));
    let ending = Arc::new(Mutex::new(Ending::Hold));
    let _kubelet = kubelet(api.clone(), ending.clone());
    let a = real(api.clone(), "a");
    observe(&a, &key("jobtake"), None).await.unwrap();
    until_event(&api, "jobtake", "step.job_created").await;
    stop(&a).await;
    *ending.lock().unwrap() = Ending::Succeed;
    let b = real(api.clone(), "b");
    observe(&b, &key("jobtake"), None).await.unwrap();
    until_idle_long(&b).await;
    let run = api.run("ns", "jobtake");
    assert_eq!(run["status"]["phase"], "Completed", "{}", run["status"]);
    let state = api.state.lock().unwrap();
    assert_eq!(
        state.job_creates, 1,
        "the Job was read, never created again"
    );
    assert!(state.approvals.is_empty(), "nobody was asked");
    let resumed = run["status"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "run.resumed" && e["data"]["reconciliation"] == "job")
        .expect("run.resumed by the Job");
    assert_eq!(resumed["data"]["job"], "agentrt-uid-jobtake-0-1");
}

#[tokio::test]
async fn a_takeover_creates_the_job_nobody_created_and_adopts_the_one_whose_write_was_lost() {
    // The holder stops after recording the start and before creating the Job.
    let api = Arc::new(FakeApi::with_run(job_run("jobnone", template())));
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Succeed)));
    let a = real(api.clone(), "a");
    let shutdown = a.executors.shutdown.clone();
    api.state.lock().unwrap().after_status_write = Some(Box::new(move |status: &Value| {
        if status["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["type"] == "step.tool_started"))
        {
            shutdown.cancel();
        }
    }));
    observe(&a, &key("jobnone"), None).await.unwrap();
    until_idle_long(&a).await;
    assert_eq!(
        api.state.lock().unwrap().job_creates,
        0,
        "stopped before creating"
    );
    api.state.lock().unwrap().after_status_write = None;
    let b = real(api.clone(), "b");
    observe(&b, &key("jobnone"), None).await.unwrap();
    until_idle_long(&b).await;
    let run = api.run("ns", "jobnone");
    assert_eq!(run["status"]["phase"], "Completed", "{}", run["status"]);
    assert_eq!(api.state.lock().unwrap().job_creates, 1);
    assert!(api.state.lock().unwrap().approvals.is_empty());

    // A Job of the attempt's name with the run's uid exists already (created, and the write
    // saying so lost): adopted, not created twice.
    let api = Arc::new(FakeApi::with_run(job_run("jobadopt", template())));
    api.create_job(
        "ns",
        &json!({"metadata": {"name": "agentrt-uid-jobadopt-0-1",
                             "labels": {"agentrt.dev/run-uid": "uid-jobadopt"}},
                "spec": {"template": template()["template"]}}),
    )
    .await
    .unwrap();
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Succeed)));
    let a = real(api.clone(), "a");
    observe(&a, &key("jobadopt"), None).await.unwrap();
    until_idle_long(&a).await;
    let run = api.run("ns", "jobadopt");
    assert_eq!(run["status"]["phase"], "Completed", "{}", run["status"]);
    assert_eq!(
        api.state.lock().unwrap().jobs.len(),
        1,
        "one Job for the step"
    );
}

#[tokio::test]
async fn a_job_of_the_name_that_is_not_the_runs_is_a_conflict_never_adopted() {
    let api = Arc::new(FakeApi::with_run(job_run("jobother", template())));
    api.create_job(
        "ns",
        &json!({"metadata": {"name": "agentrt-uid-jobother-0-1",
                             "labels": {"agentrt.dev/run-uid": "someone-else"}}}),
    )
    .await
    .unwrap();
    let a = real(api.clone(), "a");
    observe(&a, &key("jobother"), None).await.unwrap();
    until_idle_long(&a).await;
    let run = api.run("ns", "jobother");
    assert_eq!(run["status"]["phase"], "Failed", "{}", run["status"]);
    assert_eq!(
        run["status"]["reason"], "reconcile_conflict",
        "{}",
        run["status"]
    );
}

#[tokio::test]
async fn a_job_recorded_as_created_and_gone_asks_a_person_saying_so() {
    let api = Arc::new(FakeApi::with_run(job_run("jobgone", template())));
    let a = real(api.clone(), "a");
    observe(&a, &key("jobgone"), None).await.unwrap();
    until_event(&api, "jobgone", "step.job_created").await;
    stop(&a).await;
    // Removed past its finalizer (by hand): the record says it was created.
    api.state.lock().unwrap().jobs.clear();
    let b = real(api.clone(), "b");
    observe(&b, &key("jobgone"), None).await.unwrap();
    until_idle_long(&b).await;
    let run = api.run("ns", "jobgone");
    assert_eq!(
        run["status"]["phase"], "WaitingForApproval",
        "{}",
        run["status"]
    );
    let state = api.state.lock().unwrap();
    assert_eq!(state.job_creates, 1, "never created again by itself");
    let (_, approval) = state.approvals.iter().next().expect("an Approval");
    let presentation = &approval["spec"]["presentation"];
    assert_eq!(approval["spec"]["kind"], "interrupted_side_effect");
    assert_eq!(
        presentation["job"]["name"], "agentrt-uid-jobgone-0-1",
        "{presentation}"
    );
    assert!(
        presentation["job"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("is gone")),
        "{presentation}"
    );
}

#[tokio::test]
async fn a_cluster_without_pods_fails_a_job_call_at_once_saying_so() {
    let api = Arc::new(FakeApi::with_run(job_run("jobdev", template())));
    let ctx = real(api.clone(), "a");
    let ctx = {
        let mut settings = ctx.settings.clone();
        settings.runs_pods = false;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<RunKey>();
        tokio::spawn(async move { while rx.recv().await.is_some() {} });
        Arc::new(Context::new(ContextParts {
            api: api.clone(),
            settings,
            events: EventSink::disabled(),
            metrics: Arc::new(Metrics::default()),
            http: crate::tools::http::client().unwrap(),
            shutdown: CancellationToken::new(),
            kicks: tx,
        }))
    };
    observe(&ctx, &key("jobdev"), None).await.unwrap();
    until_idle_long(&ctx).await;
    let run = api.run("ns", "jobdev");
    let step = &run["status"]["steps"][0];
    assert_eq!(step["observation"]["kind"], "tool_error", "{step}");
    assert!(
        step["observation"]["content"]
            .to_string()
            .contains("runs no Pods"),
        "{step}"
    );
    assert_eq!(api.state.lock().unwrap().job_creates, 0);
}

#[tokio::test]
async fn the_sweep_releases_jobs_whose_outcome_is_recorded_or_whose_run_is_gone_and_only_those() {
    let api = Arc::new(FakeApi::with_run(job_run("jobsweep", template())));
    let _kubelet = kubelet(api.clone(), Arc::new(Mutex::new(Ending::Succeed)));
    let ctx = real(api.clone(), "a");
    observe(&ctx, &key("jobsweep"), None).await.unwrap();
    until_idle_long(&ctx).await;
    assert_eq!(api.run("ns", "jobsweep")["status"]["phase"], "Completed");
    let holds = |name: &str| {
        api.state.lock().unwrap().jobs[&("ns".to_string(), name.to_string())]["metadata"]
            ["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
    };
    let owned_by = |run: &str, step: i64| {
        json!({"metadata": {
            "namespace": "ns",
            "name": format!("agentrt-uid-{run}-{step}-1"),
            "labels": {"agentrt.dev/run-uid": format!("uid-{run}"),
                       "agentrt.dev/step": step.to_string(), "agentrt.dev/attempt": "1"},
            "finalizers": [FINALIZER],
            "ownerReferences": [{"kind": "AgentRun", "name": run, "uid": format!("uid-{run}")}],
        }})
    };
    // A holder died between the write recording the outcome and the release, and the run
    // ended: the finalizer is back on the run's Job.
    let done = "agentrt-uid-jobsweep-0-1";
    api.state
        .lock()
        .unwrap()
        .jobs
        .get_mut(&("ns".to_string(), done.to_string()))
        .expect("the run's Job")["metadata"]["finalizers"] = json!([FINALIZER]);
    // A Job of a run that is gone, and one of the live run's step 5, whose outcome is not
    // recorded.
    api.create_job("ns", &owned_by("deleted", 0)).await.unwrap();
    api.create_job("ns", &owned_by("jobsweep", 5))
        .await
        .unwrap();
    assert!(holds(done) && holds("agentrt-uid-deleted-0-1"));

    crate::controller::calls::job::sweep(&ctx, &[None]).await;
    assert!(!holds(done), "the recorded outcome's Job is released");
    assert!(
        !holds("agentrt-uid-deleted-0-1"),
        "the Job of a run that is gone is released"
    );
    assert!(
        holds("agentrt-uid-jobsweep-5-1"),
        "a Job whose outcome is not on the record is left to its run"
    );
}
