//! The metrics and health endpoints served, and the metrics each write projects.

use tokio_util::sync::CancellationToken;

use super::*;

#[tokio::test]
async fn metrics_and_health_are_served() {
    let metrics = Arc::new(Metrics::default());
    metrics.status_write("ok");
    metrics.status_write_took(0.003);
    metrics.tool_call("lookup", "result", 0.02);
    let addr = serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let get = |path: &'static str| async move {
        let response = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    };
    assert_eq!(get("/healthz").await.0, 200);
    assert_eq!(get("/readyz").await.0, 503);
    let runs = metrics.watch("agentruns", Some("ns"));
    metrics.set_ready();
    assert_eq!(
        get("/readyz").await.0,
        503,
        "started, but the watch has not listed"
    );
    runs.worked();
    assert_eq!(get("/readyz").await.0, 200);
    runs.failed(false, &"connection refused");
    assert_eq!(get("/readyz").await.0, 503, "a failed watch is not synced");
    assert!(metrics
        .encode()
        .contains("agentrt_watches_synced{watch=\"agentruns\",scope=\"ns\"} 0"));
    runs.worked();
    assert_eq!(get("/readyz").await.0, 200);
    let (status, text) = get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("agentrt_status_writes_total{outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("agentrt_tool_calls_total{outcome=\"result\"} 1"),
        "{text}"
    );
    for series in [
        "agentrt_status_writes_total{outcome=\"conflict\"} 0",
        "agentrt_tool_call_duration_seconds_count{tool=\"lookup\"} 1",
        "agentrt_runs{phase=\"Running\"} 0",
        "agentrt_notification_delivery_seconds_count 0",
        "agentrt_takeovers_total 0",
        "agentrt_lease_renew_failures_total 0",
        "agentrt_reconcile_duration_seconds_count 0",
        "agentrt_status_write_duration_seconds_count 1",
        "agentrt_status_write_duration_seconds_bucket{le=\"0.004\"} 1",
        "agentrt_status_write_duration_seconds_bucket{le=\"0.002\"} 0",
        "agentrt_watches_synced{watch=\"agentruns\",scope=\"ns\"} 1",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
}

#[test]
fn a_write_is_counted_by_what_it_added_to_the_record() {
    let metrics = Metrics::default();
    let old = serde_json::json!({
        "steps": [{"index": 0, "status": "executing"}],
        "events": [{"seq": 1, "type": "run.started"}, {"seq": 2, "type": "step.tool_started"}],
        "usage": {"inputTokens": 10, "outputTokens": 5, "estimatedCostMicros": 7, "modelCalls": 1},
    });
    let new = serde_json::json!({
        "steps": [{"index": 0, "status": "interrupted"}, {"index": 1, "status": "done"}],
        "events": [
            {"seq": 1, "type": "run.started"}, {"seq": 2, "type": "step.tool_started"},
            {"seq": 3, "type": "lease.taken_over", "data": {"previousHolder": "a"}},
            {"seq": 4, "type": "step.interrupted", "data": {"previousStatus": "executing"}},
            {"seq": 5, "type": "run.finished", "data": {"phase": "Completed", "reason": "goal_completed"}},
        ],
        "usage": {"inputTokens": 110, "outputTokens": 25, "estimatedCostMicros": 9, "modelCalls": 2},
    });
    metrics.observe_write(&old, &new);
    // The same write seen again (a replay) adds nothing.
    metrics.observe_write(&new, &new);
    let text = metrics.encode();
    for series in [
        "agentrt_steps_total{outcome=\"interrupted\"} 1",
        "agentrt_steps_total{outcome=\"done\"} 1",
        "agentrt_steps_total{outcome=\"failed\"} 0",
        "agentrt_takeovers_total 1",
        "agentrt_interruptions_total{previous=\"executing\"} 1",
        "agentrt_runs_finished_total{phase=\"Completed\",reason=\"goal_completed\"} 1",
        "agentrt_model_tokens_total{direction=\"input\"} 100",
        "agentrt_model_tokens_total{direction=\"output\"} 20",
        "agentrt_model_cost_micros_total 2",
        "agentrt_model_calls_total 1",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
}

#[test]
fn approvals_pending_are_counted_by_kind_and_namespace_and_decisions_timed() {
    let metrics = Metrics::default();
    let pending = std::sync::Arc::new(std::sync::Mutex::new(vec![
        (("policy".to_string(), "a".to_string()), 2),
        (("interrupted_side_effect".to_string(), "b".to_string()), 1),
    ]));
    let source = pending.clone();
    metrics
        .approvals
        .pending_from(Box::new(move || source.lock().unwrap().clone()));
    metrics.approvals.decided("policy", "approved", 42.0);
    let text = metrics.encode();
    for series in [
        "agentrt_approvals_pending{kind=\"policy\",namespace=\"a\"} 2",
        "agentrt_approvals_pending{kind=\"interrupted_side_effect\",namespace=\"b\"} 1",
        "agentrt_approval_decision_seconds_count{kind=\"policy\",outcome=\"approved\"} 1",
        "agentrt_approval_decision_seconds_sum{kind=\"policy\",outcome=\"approved\"} 42.0",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    pending.lock().unwrap().remove(0);
    let text = metrics.encode();
    assert!(
        !text.contains("namespace=\"a\"} "),
        "a label with none pending is still shown:\n{text}"
    );
}
