//! Issue 34: no object a run's author can create stops the controller for the other runs. A
//! run whose scripted args nest 150 levels deep (past serde_json's 128) is accepted by
//! kube-apiserver's schema when the webhook is off; the controller's run watch still lists,
//! `/readyz` stays 200, a valid run created afterwards completes, and the deep run ends
//! `invalid_spec` with a Warning Event `InvalidSpec`. Where the API server refuses the deep run
//! at admission (the embedded server applies the engine's spec check), the refusal is asserted
//! and the valid run still completes.

mod support;

use std::time::{Duration, Instant};

use kube::api::{ListParams, PostParams};
use serde_json::{json, Value};
use support::controller::*;
use support::free_port;
use support::metrics::{sample, scrape};

fn nested(depth: usize) -> Value {
    let mut value = json!(1);
    for _ in 0..depth {
        value = json!({ "a": value });
    }
    value
}

fn run(name: &str, decisions: Value) -> Value {
    json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name},
        "spec": {"goal": "g", "agent": {"scripted": {"decisions": decisions}}},
    })
}

/// POSTs `object` as text (kube's typed create would decode the deep answer and fail).
async fn create_raw(client: &kube::Client, ns: &str, object: &Value) -> Result<(), String> {
    let request = kube::core::Request::new(format!(
        "/apis/agentrt.dev/v1alpha1/namespaces/{ns}/agentruns"
    ))
    .create(
        &PostParams::default(),
        serde_json::to_vec(object).expect("encodes"),
    )
    .expect("a request");
    client
        .request_text(request)
        .await
        .map(|_| ())
        .map_err(|err| err.to_string())
}

async fn readyz(port: u16) -> u16 {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    match client
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
    {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_nested_150_deep_does_not_stop_the_controller_for_other_runs() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("intake").metrics_on(port),
    );
    let deep = run(
        "deep",
        json!([{"kind": "tool_call", "tool": "t", "args": nested(150)}]),
    );
    let accepted = match create_raw(&client, &ns, &deep).await {
        Ok(()) => true,
        Err(refusal) => {
            assert!(
                cluster.is_embedded(),
                "kube-apiserver without the webhook accepts the deep run: {refusal}"
            );
            assert!(
                refusal.contains("deeper")
                    || refusal.contains("recursion")
                    || refusal.contains("nest"),
                "the refusal names the depth: {refusal}"
            );
            false
        }
    };
    let valid = run(
        "valid",
        json!([{"kind": "complete", "result": {"ok": true}}]),
    );
    create_raw(&client, &ns, &valid)
        .await
        .expect("the valid run is created");
    let done = cluster
        .wait_phase("valid", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(done["reason"], "goal_completed", "{}", controller.log());
    let deadline = Instant::now() + Duration::from_secs(10);
    while readyz(port).await != 200 {
        assert!(
            Instant::now() < deadline,
            "/readyz is not 200:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("the deep run was accepted: {accepted}");
    if !accepted {
        return;
    }
    // The deep run ends invalid_spec; its status is read as text (kube's typed get would fail
    // to decode the run, as the controller's did before issue 34).
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let request = kube::core::Request::new(format!(
            "/apis/agentrt.dev/v1alpha1/namespaces/{ns}/agentruns"
        ))
        .get("deep", &Default::default())
        .expect("a request");
        let text = client.request_text(request).await.expect("the run is read");
        // The controller's own reading of it: the spec does not decode, the status does.
        let status = match agentrt::controller::cluster::StoredRun::from_text(&text) {
            Err(agentrt::controller::cluster::DecodeError::Spec { status, .. }) => status,
            other => panic!("the deep run reads as {other:?}"),
        };
        if status["phase"] == "Failed" || Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        status["reason"],
        "invalid_spec",
        "{status}\n{}",
        controller.log()
    );
    assert!(
        status["reasonDetail"]
            .as_str()
            .is_some_and(|d| d.contains("recursion limit exceeded")),
        "{status}"
    );
    // A Warning Event names it.
    cluster
        .wait_warning_event("deep", "InvalidSpec", Duration::from_secs(30), || {
            controller.log()
        })
        .await;
    assert!(readyz(port).await == 200);
    // No log line carries the object's body.
    let log = controller.log();
    assert!(
        log.lines().all(|line| line.len() < 2_000),
        "a log line is long:\n{}",
        log.lines().map(|l| l.len()).max().unwrap_or(0)
    );
}

/// Issue 34 item 6: a ValidatingAdmissionPolicy denies the controller's status writes of one
/// run. The run shows a Warning Event naming the policy, the refusals are counted and stay few
/// (backed off, not retried as conflicts), and another run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_refused_by_a_policy_is_said_and_backed_off() {
    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        return eprintln!(
            "needs kube-apiserver: the embedded server has no ValidatingAdmissionPolicy"
        );
    }
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let policy = format!("deny-blocked-{ns}");
    let manifest = format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {policy}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [agentrt.dev]
      apiVersions: ["*"]
      operations: [UPDATE]
      resources: [agentruns/status]
  validations:
  - expression: "object.metadata.namespace != '{ns}' || object.metadata.name != 'blocked'"
    message: status writes of blocked are refused
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {policy}}}
spec:
  policyName: {policy}
  validationActions: [Deny]
"#
    );
    let out = cluster.apply(&manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The policy takes a moment to be served.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("refused").metrics_on(port),
    );
    let complete = json!([{"kind": "complete", "result": {"ok": true}}]);
    create_raw(&client, &ns, &run("blocked", complete.clone()))
        .await
        .expect("created");
    create_raw(&client, &ns, &run("free", complete))
        .await
        .expect("created");
    cluster
        .wait_phase("free", "Completed", Duration::from_secs(60))
        .await;
    let note = cluster
        .wait_warning_event(
            "blocked",
            "StatusWriteRefused",
            Duration::from_secs(30),
            || controller.log(),
        )
        .await
        .message
        .unwrap_or_default();
    assert!(note.contains(&policy), "the Event names the policy: {note}");
    // Over the next 10 s the refusals stay few: 2 s, 4 s, 8 s apart.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let text = scrape(port).await;
    // A policy's denial is 422 Invalid unless its validation names another reason.
    let refused = sample(
        &text,
        "agentrt_status_writes_refused_total{reason=\"Invalid\"}",
    )
    .unwrap_or_else(|| panic!("no refusal counted:\n{text}"));
    assert!(
        (1.0..=6.0).contains(&refused),
        "{refused} refused writes in ~12 s"
    );
    let conflicts =
        sample(&text, "agentrt_status_writes_total{outcome=\"conflict\"}").unwrap_or(0.0);
    assert!(conflicts <= 2.0, "refusals are not conflicts: {conflicts}");
    let status = status(&client, &ns, "blocked").await;
    assert_ne!(status["phase"], "Completed", "{status}");
    let _ = cluster.kubectl(&[
        "delete",
        "validatingadmissionpolicybinding,validatingadmissionpolicy",
        &policy,
    ]);
}

/// Issue 34: anyone who may create Approvals can write one nested 150 deep. The Approval watch
/// decodes each object on its own: the deep one is set aside (a Warning Event
/// `InvalidApproval`, `agentrt_objects_set_aside_total{part="approval"}`, no log line with its
/// body), `/readyz` stays 200, and a run waiting for its own Approval is woken by the decision
/// and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_nested_150_deep_is_set_aside_and_the_approval_watch_serves_the_others() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = support::toolserver::ToolServer::start().await;
    let port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        ControllerSpec::named("intake-approvals").metrics_on(port),
    );
    let deep = json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {"name": "deep"},
        "spec": {
            "runName": "nobody", "runUID": "0000", "stepIndex": 0, "kind": "policy",
            "request": {
                "run": {"namespace": ns, "name": "nobody", "uid": "0000"},
                "step": 0,
                "tool": {"name": "t", "inputSchema": {"type": "object"},
                         "sideEffect": "RemoteMutation", "timeoutSeconds": 30},
                "args": nested(150),
            },
            "hash": format!("sha256:{}", "0".repeat(64)),
        },
    });
    let request = kube::core::Request::new(format!(
        "/apis/agentrt.dev/v1alpha1/namespaces/{ns}/approvals"
    ))
    .create(
        &PostParams::default(),
        serde_json::to_vec(&deep).expect("encodes"),
    )
    .expect("a request");
    client
        .request_text(request)
        .await
        .expect("both servers accept an Approval nested 150 deep");

    RunFixture::new("needs-approval", &tools.base(), "waits")
        .create_in(&cluster)
        .await;
    // Listed by the run's label: a client listing every Approval would fail on the deep one.
    let approvals = approvals_api(&client, &ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    let approval = loop {
        let list = approvals
            .list(&ListParams::default().labels("agentrt.dev/run=waits"))
            .await
            .expect("list the run's approvals");
        if let Some(found) = list.items.into_iter().next() {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "the run never asked for approval:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cluster.decide(&approval, "Approved").await;
    let done = cluster
        .wait_phase("waits", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(done["reason"], "goal_completed", "{}", controller.log());
    assert_eq!(tools.calls_of_run(&format!("{ns}/waits")).len(), 1);

    let event = cluster
        .wait_warning_event("deep", "InvalidApproval", Duration::from_secs(30), || {
            controller.log()
        })
        .await;
    let note = event.message.as_deref().unwrap_or_default();
    assert!(
        note.contains("recursion limit exceeded") && note.len() < 1_000,
        "{note}"
    );
    assert_eq!(readyz(port).await, 200, "{}", controller.log());
    let metrics = scrape(port).await;
    let set_aside = sample(
        &metrics,
        "agentrt_objects_set_aside_total{part=\"approval\"}",
    )
    .unwrap_or(0.0);
    assert!(set_aside >= 1.0, "{metrics}");
    let log = controller.log();
    assert!(
        log.lines().all(|line| line.len() < 2_000),
        "a log line is long:\n{}",
        log.lines().map(|l| l.len()).max().unwrap_or(0)
    );
}
