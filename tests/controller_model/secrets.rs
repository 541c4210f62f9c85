//! The API key of the `openai` agent (docs/design.md section 6): read from its Secret, sent only
//! as `Authorization: Bearer`, and never in the status, the events, the controller's log or an
//! error, as text or as base64. The same for an Approval notification webhook's URL (docs/design.md
//! section 7, "Notifications"): its attempts fail (nothing listens) and are retried, logged at
//! trace and said by a Warning Event, and its secret token is in none of them.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_never_appears_in_status_events_logs_or_errors() {
    let (cluster, tools) = setup().await;
    let ns = cluster.namespace().to_string();
    // A server that echoes the Authorization header in its error bodies.
    let echoes = ModelServer::start(vec![
        Reply::echoing_authorization(500),
        Reply::tool_call("lookup_order", json!({"order": 1042}), usage(900, 10, 0)),
        Reply::complete(json!({"damaged": true}), usage(1000, 10, 0)),
    ])
    .await;
    let refuses = ModelServer::start(vec![Reply::echoing_authorization(401)]).await;
    // The webhook's URL, as the chart mounts its Secret's key; nothing listens there.
    let url_file = cluster.dir().join("webhook-url");
    std::fs::write(
        &url_file,
        format!(
            "http://127.0.0.1:{}/services/{WEBHOOK_TOKEN}",
            support::free_port()
        ),
    )
    .expect("url file");
    let mut spec = ControllerSpec::named("c").log("trace");
    spec.extra.extend([
        "--notify-webhook".to_string(),
        format!("name=ops,format=slack,url-file={}", url_file.display()),
        "--notify-retry-ms".to_string(),
        "50".to_string(),
        "--notify-attempts".to_string(),
        "3".to_string(),
    ]);
    let controller = ControllerProcess::spawn(cluster.kubeconfig(), &ns, spec);
    let asks = cluster
        .run_awaiting_approval(
            &fixture("needs-approval", &tools.base(), "asks"),
            "asks",
            "policy",
        )
        .await;
    start_run(&cluster, &tools, "echoed", &echoes.base_url(), |_| {}).await;
    start_run(&cluster, &tools, "refused", &refuses.base_url(), |_| {}).await;
    // A key is never sent over plain http to a host that is not a loopback address.
    start_run(
        &cluster,
        &tools,
        "not-loopback",
        "http://10.255.255.1:9/v1",
        |_| {},
    )
    .await;

    let echoed = wait_done(&cluster, "echoed").await;
    assert_eq!(echoed["phase"], "Completed", "{echoed}");
    let refused = wait_done(&cluster, "refused").await;
    assert_eq!(refused["reason"], "model_unavailable", "{refused}");
    assert!(
        data_of(&refused, "model.failed")[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("rejected credentials: Bearer ***")),
        "{refused}"
    );
    let plain = wait_done(&cluster, "not-loopback").await;
    assert_eq!(plain["reason"], "model_unavailable", "{plain}");
    let detail = plain["reasonDetail"].as_str().unwrap_or("");
    assert!(detail.contains("plain http"), "{detail}");
    assert_eq!(
        events_of(&plain, "model.failed")[0]["data"]["outcome"],
        "not_sent"
    );

    // The notification was tried, retried and given up, said on the Approval.
    let failed = cluster
        .wait_warning_event(
            &support::runs::name_of(&asks),
            "NotificationFailed",
            Duration::from_secs(30),
            || controller.log(),
        )
        .await;
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|n| n.contains("webhook ops")),
        "{failed:?}"
    );

    // The key did go where it belongs.
    assert_eq!(
        echoes.received()[0].authorization.as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
    let encoded = base64_of(KEY);
    let mut places = vec![
        ("the controller's trace log", controller.log()),
        (
            "the runs",
            cluster.kubectl_ok(&["get", "agentruns", "-o", "json"]),
        ),
        (
            "the Kubernetes Events",
            cluster.kubectl_ok(&["get", "events", "-o", "json"]),
        ),
        (
            "kubectl describe",
            cluster.kubectl_ok(&["describe", "agentruns"]),
        ),
    ];
    places.push((
        "the Approvals",
        cluster.kubectl_ok(&["get", "approvals", "-o", "json"]),
    ));
    for name in ["echoed", "refused", "not-loopback", "asks"] {
        let status = cluster.run_status(name).await;
        places.push(("a status", status.to_string()));
    }
    assert!(
        places[0].1.contains("TRACE"),
        "the controller logged at trace"
    );
    for (place, text) in places {
        assert!(!text.contains(KEY), "the key is in {place}");
        assert!(
            !text.contains("never-shown"),
            "part of the key is in {place}"
        );
        assert!(!text.contains(&encoded), "the key (base64) is in {place}");
        assert!(
            !text.contains(WEBHOOK_TOKEN),
            "the webhook URL's token is in {place}"
        );
    }
}

/// The secret part of the notification webhook's URL (as in a Slack incoming-webhook URL).
const WEBHOOK_TOKEN: &str = "T0000/B0000/webhook-token-never-shown";

/// Standard base64 of `text` (what a Secret's `data` holds).
fn base64_of(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = text.as_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
