//! The reconcile hook end to end (docs/design.md section 5; docs/behaviours.md 39-40): a controller child
//! process dies while a RemoteMutation is in flight (`AGENTRT_FAULT=during-tool`, the tool never
//! answers), a second one takes the run over once the 2-second lease expires, marks the step
//! interrupted and POSTs the RunView to a real local hook, then acts on its Reconciliation.
//! Each test asserts the terminal state (or the pause), the journal and how often the tool and
//! the hook were called.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::cluster::TestCluster;
use support::controller::*;
use support::stub::{Answer, Stub};
use support::toolserver::{Behaviour, ToolServer};

const WAIT: Duration = Duration::from_secs(60);

/// A run whose first controller died in the middle of its `charge` call.
struct Interrupted {
    cluster: TestCluster,
    tools: ToolServer,
    name: &'static str,
}

impl Interrupted {
    /// Creates the run and kills its first controller during the tool call. The tool answers
    /// from then on.
    async fn new(name: &'static str, hook_url: &str, hook_timeout: u32) -> Interrupted {
        let cluster = agentrt_cluster().await;
        let tools = ToolServer::start().await;
        tools.set("charge", Behaviour::hanging());
        RunFixture::new("reconcile-charge", &tools.base(), name)
            .hook(hook_url)
            .set("HOOK_TIMEOUT", hook_timeout)
            .create(&cluster.client(), cluster.namespace())
            .await;
        crash_at(
            cluster.kubeconfig(),
            cluster.namespace(),
            "during-tool",
            WAIT,
        );
        tools.set("charge", Behaviour::default());
        Interrupted {
            cluster,
            tools,
            name,
        }
    }

    /// A reconcile hook answering `answers` in turn ([`Stub::start`] at `/reconcile`), and the
    /// run [`Interrupted::new`] with it as its hook (`timeoutSeconds: hook_timeout`).
    async fn with_hook(
        name: &'static str,
        answers: Vec<Answer>,
        hook_timeout: u32,
    ) -> (Interrupted, Stub) {
        let hook = Stub::start("/reconcile", answers).await;
        let run = Interrupted::new(name, &hook.url, hook_timeout).await;
        (run, hook)
    }

    /// Starts the controller that takes the run over.
    fn take_over(&self, spec: ControllerSpec) -> ControllerProcess {
        ControllerProcess::spawn(self.cluster.kubeconfig(), self.cluster.namespace(), spec)
    }

    async fn wait_phase(&self, phase: &str) -> Value {
        // Waits for `phase`, or for any end (a run that ended elsewhere fails at once).
        let status = self
            .cluster
            .wait_status(self.name, WAIT, &format!("phase {phase}"), |s| {
                s["phase"] == phase
                    || matches!(
                        s["phase"].as_str(),
                        Some("Completed" | "Failed" | "Cancelled")
                    )
            })
            .await;
        assert_eq!(status["phase"], phase, "{status}");
        assert_seq_contiguous(&status);
        status
    }

    async fn status(&self) -> Value {
        self.cluster.run_status(self.name).await
    }

    /// The whole scenario for one answer: interrupted, taken over, settled in `phase`.
    async fn settle(name: &'static str, answers: Vec<Answer>, phase: &str) -> (Value, Stub) {
        let (run, hook) = Interrupted::with_hook(name, answers, 10).await;
        let _second = run.take_over(ControllerSpec::named("second"));
        let status = run.wait_phase(phase).await;
        assert_eq!(run.tools.calls().len(), 1, "the charge was not run again");
        assert_eq!(hook.requests().len(), 1, "the hook was asked once");
        (status, hook)
    }
}

/// `type@step` of the events after the takeover began, from `lease.taken_over` on.
fn after_takeover(status: &Value) -> Vec<String> {
    let events = status["events"].as_array().cloned().unwrap_or_default();
    let from = events
        .iter()
        .position(|e| e["type"] == "lease.taken_over")
        .expect("a takeover");
    events[from..]
        .iter()
        .map(|e| match e["step"].as_i64() {
            Some(step) => format!("{}@{step}", e["type"].as_str().unwrap_or("?")),
            None => e["type"].as_str().unwrap_or("?").to_string(),
        })
        .collect()
}

const FAILED_BY_HOOK: [&str; 3] = ["lease.taken_over", "step.interrupted@0", "run.finished"];

/// The run ended `reason` with a detail containing `detail`, and nothing came between the
/// takeover and the end but the interruption ([`FAILED_BY_HOOK`]).
fn assert_failed_by_hook(done: &Value, reason: &str, detail: &str) {
    assert_eq!(done["reason"], reason);
    assert!(
        done["reasonDetail"]
            .as_str()
            .is_some_and(|d| d.contains(detail)),
        "{done}"
    );
    assert_eq!(after_takeover(done), FAILED_BY_HOOK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_lets_the_agent_decide_seeing_the_interruption() {
    if !crash_points() {
        return;
    }
    let (done, hook) = Interrupted::settle(
        "goes-on",
        vec![Answer::Json(json!({"outcome": "continue"}))],
        "Completed",
    )
    .await;
    assert_eq!(done["reason"], "goal_completed");
    assert_eq!(done["result"], json!({"charged": 12}));
    assert_eq!(step_statuses(&done), ["interrupted", "done"]);
    assert_eq!(
        done["steps"][0]["observation"]["content"]["previousStatus"],
        "executing"
    );
    assert_eq!(
        after_takeover(&done),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "run.resumed",
            "step.started@1",
            "step.decided@1",
            "run.finished"
        ]
    );
    let resumed = &events_of(&done, "run.resumed")[0]["data"];
    assert_eq!(resumed["reconciliation"], "continue", "{resumed}");
    // The hook saw the run, its steps (the interrupted one) and its approvals.
    let view = &hook.requests()[0];
    assert_eq!(view["run"]["name"], "goes-on");
    assert_eq!(view["interruptedStep"], 0);
    assert_eq!(view["steps"][0]["status"], "interrupted");
    assert_eq!(view["steps"][0]["decision"]["args"], json!({"amount": 12}));
    assert_eq!(view["approvals"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_ends_the_run_with_the_hooks_result() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "already-done",
        vec![Answer::Json(
            json!({"outcome": "completed", "result": {"charged": 12, "receipt": "r-77"}}),
        )],
        "Completed",
    )
    .await;
    assert_eq!(done["reason"], "goal_completed");
    assert_eq!(done["result"], json!({"charged": 12, "receipt": "r-77"}));
    assert_eq!(after_takeover(&done), FAILED_BY_HOOK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conflict_fails_the_run_reconcile_conflict_with_the_hooks_detail() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "conflicted",
        vec![Answer::Json(
            json!({"outcome": "conflict", "detail": "the card was charged twice already"}),
        )],
        "Failed",
    )
    .await;
    assert_eq!(done["reason"], "reconcile_conflict");
    assert_eq!(done["reasonDetail"], "the card was charged twice already");
    assert_eq!(after_takeover(&done), FAILED_BY_HOOK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_pauses_the_interrupted_call_on_the_hooks_approval_and_approving_runs_it_once() {
    if !crash_points() {
        return;
    }
    let (run, hook) = Interrupted::with_hook(
        "paused",
        vec![Answer::Json(json!({
            "outcome": "waiting",
            "pause": {
                "decision": "require_approval",
                "kind": "charge_check",
                "reason": "the payment provider has no record of this charge yet",
                "presentation": {"title": "Charge 12 again?"},
            },
        }))],
        10,
    )
    .await;
    let _second = run.take_over(ControllerSpec::named("second"));
    let waiting = run.wait_phase("WaitingForApproval").await;
    assert_eq!(step_statuses(&waiting), ["awaiting_approval"]);
    assert_eq!(
        after_takeover(&waiting),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "approval.requested@0"
        ]
    );
    let requested = &events_of(&waiting, "approval.requested")[0]["data"];
    assert_eq!(requested["kind"], "charge_check", "{requested}");
    let approval = run
        .cluster
        .wait_approval("paused", "charge_check", WAIT)
        .await;
    assert_eq!(
        approval.data["spec"]["presentation"],
        json!({"title": "Charge 12 again?"})
    );
    assert_eq!(
        approval.data["spec"]["request"]["args"],
        json!({"amount": 12})
    );
    assert_eq!(run.tools.calls().len(), 1, "nothing ran while waiting");

    run.cluster.decide(&approval, "Approved").await;
    let done = run.wait_phase("Completed").await;
    assert_eq!(done["result"], json!({"charged": 12}));
    let calls = run.tools.calls();
    assert_eq!(calls.len(), 2, "approving ran the call once more");
    assert_eq!(calls[0].key, calls[1].key, "on the same step");
    assert_eq!(calls[1].attempt, "2");
    assert_eq!(hook.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_without_a_pause_fails_reconcile_conflict() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "no-pause",
        vec![Answer::Json(json!({"outcome": "waiting"}))],
        "Failed",
    )
    .await;
    assert_failed_by_hook(&done, "reconcile_conflict", "without a pause");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_on_a_call_whose_args_now_fail_the_schema_ends_it_invalid_then_conflict() {
    if !crash_points() {
        return;
    }
    let (run, _hook) = Interrupted::with_hook(
        "stale-args",
        vec![Answer::Json(json!({
            "outcome": "waiting",
            "pause": {"decision": "require_approval", "kind": "charge_check"},
        }))],
        10,
    )
    .await;
    // The record as a schema change would leave it: the executing call's args no longer pass
    // the tool's schema (amount must be an integer).
    let client = run.cluster.client();
    let ns = run.cluster.namespace();
    let mut steps = run.status().await["steps"].clone();
    steps[0]["decision"]["args"] = json!({"amount": "twelve"});
    runs_api(&client, ns)
        .patch_status(
            "stale-args",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"steps": steps}})),
        )
        .await
        .expect("the status is patched");
    let _second = run.take_over(ControllerSpec::named("second"));
    let done = run.wait_phase("Failed").await;
    assert_eq!(done["reason"], "reconcile_conflict");
    assert_eq!(step_statuses(&done), ["failed"]);
    assert_eq!(
        done["steps"][0]["observation"]["kind"], "invalid_decision",
        "{done}"
    );
    assert_eq!(
        after_takeover(&done),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "step.failed@0",
            "run.finished"
        ]
    );
    assert_eq!(run.tools.calls().len(), 1);
    assert!(run.cluster.approvals_of("stale-args").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_is_not_require_approval_fails_internal_error() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "allow-pause",
        vec![Answer::Json(
            json!({"outcome": "waiting", "pause": {"decision": "allow"}}),
        )],
        "Failed",
    )
    .await;
    assert_eq!(done["reason"], "internal_error");
    assert_eq!(after_takeover(&done), FAILED_BY_HOOK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_fails_internal_error() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "unknown-outcome",
        vec![Answer::Json(json!({"outcome": "maybe"}))],
        "Failed",
    )
    .await;
    assert_failed_by_hook(&done, "internal_error", "\"maybe\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_is_not_json_fails_internal_error_naming_the_hook() {
    if !crash_points() {
        return;
    }
    let (run, hook) = Interrupted::with_hook(
        "not-json",
        vec![Answer::Raw(200, "outcome=completed; result=<charged>")],
        10,
    )
    .await;
    let _second = run.take_over(ControllerSpec::named("second"));
    let done = run.wait_phase("Failed").await;
    assert_eq!(done["reason"], "internal_error");
    let detail = done["reasonDetail"].as_str().unwrap_or("");
    assert!(
        detail.contains(&hook.url) && detail.contains("not JSON"),
        "{detail}"
    );
    assert_eq!(
        hook.requests().len(),
        1,
        "an answer that is not JSON is not retried"
    );
    assert_eq!(after_takeover(&done), FAILED_BY_HOOK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_without_a_json_result_fails_internal_error() {
    if !crash_points() {
        return;
    }
    let (done, _hook) = Interrupted::settle(
        "no-result",
        vec![Answer::Json(json!({"outcome": "completed"}))],
        "Failed",
    )
    .await;
    assert_eq!(done["reason"], "internal_error");
    assert!(done.get("result").is_none_or(Value::is_null), "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_is_down_then_recovers_is_asked_until_it_answers() {
    if !crash_points() {
        return;
    }
    let mut hook = Stub::down("/reconcile");
    let run = Interrupted::new("recovers", &hook.url, 30).await;
    let second = run.take_over(ControllerSpec::named("second"));
    // Up only once the hook was refused at least once.
    wait_until_or(
        WAIT,
        "the hook to be asked",
        || second.log(),
        || second.log().contains("the reconcile hook failed"),
    )
    .await;
    hook.come_up(vec![
        Answer::Raw(503, "starting"),
        Answer::Json(json!({"outcome": "continue"})),
    ])
    .await;
    let done = run.wait_phase("Completed").await;
    assert_eq!(done["result"], json!({"charged": 12}));
    assert_eq!(hook.requests().len(), 2, "a 503, then the answer");
    assert_eq!(run.tools.calls().len(), 1);
    let failures = second.log().matches("the reconcile hook failed").count();
    assert!(failures >= 2, "refused, then 503:\n{}", second.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_that_never_answers_fails_internal_error_naming_it_after_its_timeout() {
    if !crash_points() {
        return;
    }
    let (run, hook) = Interrupted::with_hook("silent", vec![Answer::Hang], 3).await;
    let _second = run.take_over(ControllerSpec::named("second"));
    let done = run.wait_phase("Failed").await;
    assert_eq!(done["reason"], "internal_error");
    let detail = done["reasonDetail"].as_str().unwrap_or("");
    assert!(
        detail.contains(&hook.url) && detail.contains("timeoutSeconds"),
        "{detail}"
    );
    assert_eq!(after_takeover(&done), FAILED_BY_HOOK);
    assert_eq!(run.tools.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_answer_lost_to_a_crash_is_asked_again_and_applied_once() {
    if !crash_points() {
        return;
    }
    let (run, hook) = Interrupted::with_hook(
        "asked-twice",
        vec![Answer::Json(json!({"outcome": "continue"}))],
        10,
    )
    .await;
    let mut second = run.take_over(ControllerSpec::named("second").fault("after-hook-answered"));
    assert!(
        second.was_killed(WAIT),
        "the fault fired:\n{}",
        second.log()
    );
    let _third = run.take_over(ControllerSpec::named("third"));
    let done = run.wait_phase("Completed").await;
    assert_eq!(hook.requests().len(), 2, "the hook answered again");
    assert_eq!(
        after_takeover(&done),
        [
            "lease.taken_over",
            "step.interrupted@0",
            "lease.taken_over",
            "run.resumed",
            "step.started@1",
            "step.decided@1",
            "run.finished"
        ]
    );
    assert_eq!(run.tools.calls().len(), 1);
}
