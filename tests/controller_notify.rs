//! Approval notifications (issue 39 item 2; docs/design.md section 7, "Notifications";
//! docs/behaviours.md 132-135) against a local HTTP receiver: a controller child process with
//! `--notify-webhook`, its URL in a file as the chart mounts a Secret's key.
//!
//! - Each event of an Approval is delivered once, in order (created, then decided), to a
//!   Slack and a CloudEvents webhook; both bodies are checked field by field; the URL's secret
//!   token never appears in the controller's log, the run's record, the Approval or its
//!   Events; `/metrics` counts the deliveries, the pending Approval by kind and namespace, and
//!   the time to the decision. The delivery latency from the record's `approval.requested`
//!   event to the receiver is printed (`--nocapture`).
//! - A receiver down, then up: the message is retried and arrives once.
//! - A queue of one and a receiver that never answers: the messages that find it full are
//!   dropped, counted and said by a Warning Event on their Approval, and the runs are not
//!   delayed.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;
use support::cli::{agentrt, table_row, text};
use support::controller::*;
use support::free_port;
use support::metrics::{sample, scrape};
use support::runs::name_of;
use support::toolserver::ToolServer;

/// The secret part of every webhook URL: a grep finds any copy of it.
const TOKEN: &str = "T0KEN-notify-5e1d-never-shown";
const WAIT: Duration = Duration::from_secs(60);

/// One message the receiver got.
#[derive(Clone, Debug)]
struct Received {
    hook: String,
    content_type: String,
    body: Value,
    at: jiff::Timestamp,
}

/// A local HTTP receiver: `POST /hooks/{hook}/{token}` is recorded (200) when the token is
/// right, and held `hang` long first when set.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    hang: Arc<Mutex<Option<Duration>>>,
}

impl Receiver {
    /// Serves on `127.0.0.1:port` until the test ends.
    async fn serve_on(&self, port: u16) {
        let app = axum::Router::new()
            .route("/hooks/{hook}/{token}", axum::routing::post(receive))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the receiver");
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    fn of(&self, hook: &str) -> Vec<Received> {
        let got = self.got.lock().expect("lock");
        got.iter().filter(|r| r.hook == hook).cloned().collect()
    }

    /// The messages of `hook` about Approval `subject` (`ns/name`), as (CloudEvent type or
    /// Slack text's first words).
    async fn wait_for(&self, hook: &str, n: usize, log: impl Fn() -> String) -> Vec<Received> {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.of(hook);
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{hook} got {} of {n} messages: {got:?}\n{}",
                got.len(),
                log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    Path((hook, token)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let at = jiff::Timestamp::now();
    if token != TOKEN {
        return StatusCode::FORBIDDEN;
    }
    let hang = *receiver.hang.lock().expect("lock");
    if let Some(hang) = hang {
        tokio::time::sleep(hang).await;
    }
    receiver.got.lock().expect("lock").push(Received {
        hook,
        content_type: headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        body: serde_json::from_str(&body).unwrap_or(Value::String(body)),
        at,
    });
    StatusCode::OK
}

/// `--notify-webhook` for `hook` (`slack` or `cloudevents`) of the receiver on `port`, its URL
/// written to a file in the cluster's directory (as the chart mounts the Secret's key).
fn webhook(cluster: &support::cluster::TestCluster, hook: &str, port: u16) -> Vec<String> {
    let file = cluster.dir().join(format!("{hook}-url"));
    std::fs::write(
        &file,
        format!("http://127.0.0.1:{port}/hooks/{hook}/{TOKEN}\n"),
    )
    .expect("url file");
    vec![
        "--notify-webhook".to_string(),
        format!(
            "name={hook},format={hook},url-file={}",
            file.to_string_lossy()
        ),
    ]
}

fn spec(prefix: &str, args: Vec<Vec<String>>) -> ControllerSpec {
    let mut spec = ControllerSpec::named(prefix);
    spec.extra.extend(args.into_iter().flatten());
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_approval_event_is_delivered_once_in_order_and_the_url_never_shown() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let port = free_port();
    let receiver = Receiver::default();
    receiver.serve_on(port).await;
    let metrics_port = free_port();
    let mut spec = spec(
        "notify",
        vec![
            webhook(&cluster, "slack", port),
            webhook(&cluster, "cloudevents", port),
            vec![
                "--notify-console-url".into(),
                "http://console.example:8765/".into(),
            ],
        ],
    )
    .metrics_on(metrics_port);
    spec.log = Some("debug,kube=warn,hyper=warn,tower=warn,h2=warn,rustls=warn".into());
    let controller = ControllerProcess::spawn(cluster.kubeconfig(), &ns, spec);

    let approval = cluster
        .run_awaiting_approval(
            &fixture("needs-approval", &tools.base(), "notified"),
            "notified",
            "policy",
        )
        .await;
    let name = name_of(&approval);
    let subject = format!("{ns}/{name}");
    let created = receiver
        .wait_for("cloudevents", 1, || controller.log())
        .await;
    let slack_created = receiver.wait_for("slack", 1, || controller.log()).await;

    // The latency: from the record's approval.requested to the receiver.
    let record = cluster.run_status("notified").await;
    let requested = events_of(&record, "approval.requested")
        .first()
        .and_then(|e| e["time"].as_str())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .expect("approval.requested has a time");
    let created_at: jiff::Timestamp = approval
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .expect("creationTimestamp")
        .parse()
        .expect("time");
    for got in [&created[0], &slack_created[0]] {
        let latency = got.at.duration_since(requested);
        println!(
            "notification latency ({}): {:.3} s after approval.requested ({requested}), {:.3} s after creationTimestamp ({created_at}, whole seconds)",
            got.hook,
            latency.as_secs_f64(),
            got.at.duration_since(created_at).as_secs_f64()
        );
        assert!(latency.as_secs_f64() < 10.0, "{latency:?}");
    }

    // The pending Approval by kind and namespace, before the decision.
    let pending = format!("agentrt_approvals_pending{{kind=\"policy\",namespace=\"{ns}\"}}");
    eventually("the pending gauge", Duration::from_secs(10), || async {
        (sample(&scrape(metrics_port).await, &pending) == Some(1.0)).then_some(())
    })
    .await;

    cluster.decide(&approval, "Approved").await;
    cluster.wait_phase("notified", "Completed", WAIT).await;
    let events = receiver
        .wait_for("cloudevents", 2, || controller.log())
        .await;
    let slack = receiver.wait_for("slack", 2, || controller.log()).await;
    // Nothing more comes: the Approval's Executed is not an event, and each was sent once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events_now = receiver.of("cloudevents");
    assert_eq!(events_now.len(), 2, "{events_now:?}");
    assert_eq!(receiver.of("slack").len(), 2, "{:?}", receiver.of("slack"));

    // CloudEvents: structured mode, field by field, created before decided.
    let types: Vec<&str> = events
        .iter()
        .map(|r| r.body["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        types,
        [
            "dev.agentrt.approval.created",
            "dev.agentrt.approval.decided"
        ]
    );
    let uid = approval.metadata.uid.clone().expect("uid");
    for (got, word) in events.iter().zip(["created", "decided"]) {
        let e = &got.body;
        assert!(
            got.content_type.starts_with("application/cloudevents+json"),
            "{}",
            got.content_type
        );
        assert_eq!(e["specversion"], "1.0");
        assert_eq!(e["id"], format!("{uid}.{word}"));
        assert_eq!(
            e["source"],
            format!("/apis/agentrt.dev/v1alpha1/namespaces/{ns}/approvals")
        );
        assert_eq!(e["subject"], subject);
        assert!(
            e["time"]
                .as_str()
                .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
            "{e}"
        );
        assert_eq!(e["datacontenttype"], "application/json");
        assert_eq!(e["data"]["approval"]["name"], name);
        assert_eq!(e["data"]["approval"]["uid"], uid);
        assert_eq!(e["data"]["approval"]["kind"], "policy");
        assert_eq!(e["data"]["run"]["name"], "notified");
        assert_eq!(e["data"]["tool"], "change");
        assert_eq!(e["data"]["argsSummary"], r#"{"item":1}"#);
        assert_eq!(
            e["data"]["approveCommand"],
            format!("kubectl agentrt approve {subject}")
        );
        assert_eq!(
            e["data"]["consoleURL"],
            format!("http://console.example:8765/approvals/{subject}")
        );
    }
    assert_eq!(events[1].body["data"]["decision"]["verdict"], "Approved");
    assert_eq!(events[1].body["data"]["approval"]["phase"], "Approved");

    // Slack: one text, field by field.
    let first = slack[0].body["text"].as_str().expect("text").to_string();
    assert_eq!(slack[0].content_type, "application/json");
    for part in [
        format!("Approval requested: *{subject}*"),
        "run `notified`".to_string(),
        "tool `change`".to_string(),
        "kind `policy`".to_string(),
        "Args: `{\"item\":1}`".to_string(),
        format!("`kubectl agentrt approve {subject}`"),
        format!("<http://console.example:8765/approvals/{subject}|Open in the console>"),
    ] {
        assert!(first.contains(&part), "{part} missing from {first}");
    }
    let second = slack[1].body["text"].as_str().expect("text");
    assert!(
        second.contains(&format!("Approval *{subject}* decided: *Approved* by test")),
        "{second}"
    );

    // /metrics: the deliveries, the time to the decision, nothing pending any more.
    let text = scrape(metrics_port).await;
    for hook in ["slack", "cloudevents"] {
        for (outcome, n) in [("delivered", 2.0), ("failed", 0.0), ("dropped", 0.0)] {
            let series =
                format!("agentrt_notifications_total{{webhook=\"{hook}\",outcome=\"{outcome}\"}}");
            assert_eq!(sample(&text, &series), Some(n), "{series}:\n{text}");
        }
    }
    assert_eq!(
        sample(
            &text,
            "agentrt_approval_decision_seconds_count{kind=\"policy\",outcome=\"approved\"}"
        ),
        Some(1.0),
        "{text}"
    );
    eventually("no Approval pending", Duration::from_secs(10), || async {
        sample(&scrape(metrics_port).await, &pending)
            .is_none()
            .then_some(())
    })
    .await;
    if let (Some(sum), Some(count)) = (
        sample(&text, "agentrt_notification_delivery_seconds_sum"),
        sample(&text, "agentrt_notification_delivery_seconds_count"),
    ) {
        println!(
            "queued to delivered: {count} messages, {:.1} ms on average",
            1000.0 * sum / count
        );
    }

    // The URL's token: in no log line, record, Approval or Event.
    let record = cluster.run_status("notified").await.to_string();
    let stored = cluster.approval(&name).await;
    let events_listed = cluster.kubectl_ok(&["get", "events", "-o", "json"]);
    for (what, text) in [
        ("the controller's log", controller.log()),
        ("the run's record", record),
        (
            "the Approval",
            serde_json::to_string(&stored).expect("json"),
        ),
        ("the Events", events_listed),
    ] {
        assert!(
            !text.contains(TOKEN),
            "{what} carries the webhook URL's token"
        );
    }
    assert!(
        controller.log().contains("notifying Approvals"),
        "{}",
        controller.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_then_up_gets_the_message_once_after_retries() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let port = free_port();
    let metrics_port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        spec(
            "retry",
            vec![
                webhook(&cluster, "cloudevents", port),
                vec!["--notify-retry-ms".into(), "200".into()],
            ],
        )
        .metrics_on(metrics_port),
    );
    let approval = cluster
        .run_awaiting_approval(
            &fixture("needs-approval", &tools.base(), "retried"),
            "retried",
            "policy",
        )
        .await;
    let retried = "agentrt_notifications_total{webhook=\"cloudevents\",outcome=\"retried\"}";
    eventually("a retry", Duration::from_secs(20), || async {
        sample(&scrape(metrics_port).await, retried)
            .filter(|n| *n >= 2.0)
            .map(|_| ())
    })
    .await;

    let receiver = Receiver::default();
    receiver.serve_on(port).await;
    let got = receiver
        .wait_for("cloudevents", 1, || controller.log())
        .await;
    assert_eq!(got[0].body["type"], "dev.agentrt.approval.created");
    assert_eq!(
        got[0].body["subject"],
        format!("{ns}/{}", name_of(&approval))
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        receiver.of("cloudevents").len(),
        1,
        "delivered more than once"
    );
    let text = scrape(metrics_port).await;
    assert_eq!(
        sample(
            &text,
            "agentrt_notifications_total{webhook=\"cloudevents\",outcome=\"delivered\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert!(
        !controller.log().contains(TOKEN),
        "the log carries the URL's token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_counts_and_warns_and_never_delays_a_run() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let port = free_port();
    let receiver = Receiver::default();
    // Every message is held a minute: the first is in flight, the next fills the queue.
    *receiver.hang.lock().expect("lock") = Some(Duration::from_secs(60));
    receiver.serve_on(port).await;
    let metrics_port = free_port();
    let controller = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        spec(
            "full",
            vec![
                webhook(&cluster, "slack", port),
                vec!["--notify-queue".into(), "1".into()],
            ],
        )
        .metrics_on(metrics_port),
    );
    let started = Instant::now();
    let names = ["full-a", "full-b", "full-c", "full-d"];
    for run in names {
        cluster
            .create_run(&fixture("needs-approval", &tools.base(), run))
            .await;
    }
    let mut approvals = Vec::new();
    for run in names {
        approvals.push(cluster.wait_approval(run, "policy", WAIT).await);
    }
    let waited = started.elapsed();
    println!("4 runs waiting on their Approvals {waited:?} after their creation");
    assert!(
        waited < Duration::from_secs(20),
        "the runs were delayed: {waited:?}\n{}",
        controller.log()
    );
    let dropped = "agentrt_notifications_total{webhook=\"slack\",outcome=\"dropped\"}";
    let n = eventually("drops counted", Duration::from_secs(10), || async {
        sample(&scrape(metrics_port).await, dropped).filter(|n| *n >= 2.0)
    })
    .await;
    assert!(
        n <= 2.0,
        "{n} dropped of 4 with one in flight and one queued"
    );
    // Each drop is said by a Warning Event on its Approval (published at --event-qps).
    let names: Vec<String> = approvals.iter().map(name_of).collect();
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(cluster.client(), &ns);
    eventually(
        "a NotificationDropped Event per drop",
        Duration::from_secs(20),
        || {
            let (events, names) = (events.clone(), names.clone());
            async move {
                let list = events.list(&kube::api::ListParams::default()).await.ok()?;
                let warned = list
                    .items
                    .iter()
                    .filter(|e| {
                        e.type_.as_deref() == Some("Warning")
                            && e.reason.as_deref() == Some("NotificationDropped")
                            && e.involved_object.kind.as_deref() == Some("Approval")
                            && names.contains(&e.involved_object.name.clone().unwrap_or_default())
                    })
                    .count();
                (warned as f64 >= n).then_some(())
            }
        },
    )
    .await;
    assert!(
        !controller.log().contains(TOKEN),
        "the log carries the URL's token"
    );
}

/// The events the receiver got for `hook`, as (subject, CloudEvent type word), in arrival
/// order.
fn sent(receiver: &Receiver, hook: &str) -> Vec<(String, String)> {
    receiver
        .of(hook)
        .iter()
        .map(|r| {
            (
                r.body["subject"].as_str().unwrap_or("").to_string(),
                r.body["type"]
                    .as_str()
                    .unwrap_or("")
                    .trim_start_matches("dev.agentrt.approval.")
                    .to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_replicas_each_event_is_sent_once_approved_rejected_cancelled_expired() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let port = free_port();
    let receiver = Receiver::default();
    receiver.serve_on(port).await;
    let hook = webhook(&cluster, "cloudevents", port);
    let a = ControllerProcess::spawn(
        cluster.kubeconfig(),
        &ns,
        spec("replica-a", vec![hook.clone()]),
    );
    let b = ControllerProcess::spawn(cluster.kubeconfig(), &ns, spec("replica-b", vec![hook]));
    let logs = || format!("{}\n---\n{}", a.log(), b.log());

    let runs = [
        "two-approved",
        "two-rejected",
        "two-cancelled",
        "two-expired",
    ];
    for run in runs {
        let mut yaml = fixture("needs-approval", &tools.base(), run);
        if run == "two-expired" {
            yaml = yaml.replace(
                "  leaseDurationSeconds: 2\n",
                "  leaseDurationSeconds: 2\n  limits: {approvalTTLSeconds: 3}\n",
            );
        }
        cluster.create_run(&yaml).await;
    }
    let mut approvals = Vec::new();
    for run in runs {
        approvals.push(cluster.wait_approval(run, "policy", WAIT).await);
    }
    // `kubectl agentrt approvals` shows each one's age and the time left before it expires.
    let out = agentrt(&cluster, &["approvals"]);
    let table = text(&out);
    assert!(out.status.success(), "{table}");
    assert_eq!(table_row(&table, 0)[7..], ["AGE", "EXPIRES"], "{table}");
    let expiring = table
        .lines()
        .find(|l| l.starts_with(&name_of(&approvals[3])))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .expect("the expiring Approval's row");
    assert!(
        expiring[7].ends_with('s') && ["1s", "2s", "3s", "expired"].contains(&expiring[8]),
        "{table}"
    );
    receiver.wait_for("cloudevents", 4, logs).await;
    cluster.decide(&approvals[0], "Approved").await;
    cluster.decide(&approvals[1], "Rejected").await;
    cluster.cancel_run("two-cancelled");
    let expected: Vec<(String, String)> = approvals
        .iter()
        .zip(["decided", "decided", "cancelled", "expired"])
        .flat_map(|(approval, last)| {
            let subject = format!("{ns}/{}", name_of(approval));
            [
                (subject.clone(), "created".to_string()),
                (subject, last.to_string()),
            ]
        })
        .collect();
    receiver.wait_for("cloudevents", expected.len(), logs).await;
    // Nothing more: no event is sent twice by the two replicas.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let got = sent(&receiver, "cloudevents");
    let mut sorted = got.clone();
    sorted.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(sorted, want, "each event once:\n{got:?}\n{}", logs());
    // Per Approval, created before its end.
    for approval in &approvals {
        let subject = format!("{ns}/{}", name_of(approval));
        let order: Vec<&str> = got
            .iter()
            .filter(|(s, _)| *s == subject)
            .map(|(_, t)| t.as_str())
            .collect();
        assert_eq!(order[0], "created", "{subject}: {order:?}");
    }
    let rejected = receiver
        .of("cloudevents")
        .into_iter()
        .find(|r| {
            r.body["subject"] == format!("{ns}/{}", name_of(&approvals[1]))
                && r.body["type"] == "dev.agentrt.approval.decided"
        })
        .expect("the rejection");
    assert_eq!(rejected.body["data"]["decision"]["verdict"], "Rejected");
    let cancelled = receiver
        .of("cloudevents")
        .into_iter()
        .find(|r| r.body["type"] == "dev.agentrt.approval.cancelled")
        .expect("the cancellation");
    assert!(
        cancelled.body["data"]["approval"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("cancel")),
        "{}",
        cancelled.body
    );
}
