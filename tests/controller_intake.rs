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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

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
        ControllerSpec {
            prefix: "intake".into(),
            extra: vec!["--metrics-addr".into(), format!("127.0.0.1:{port}")],
            ..ControllerSpec::default()
        },
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
    let done = wait_phase(&client, &ns, "valid", "Completed", Duration::from_secs(60)).await;
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
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=deep"))
            .await
            .expect("events list");
        if list.items.iter().any(|e| {
            e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("InvalidSpec")
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Warning Event InvalidSpec on the deep run:\n{}",
            controller.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(readyz(port).await == 200);
    // No log line carries the object's body.
    let log = controller.log();
    assert!(
        log.lines().all(|line| line.len() < 2_000),
        "a log line is long:\n{}",
        log.lines().map(|l| l.len()).max().unwrap_or(0)
    );
}
