//! Notifications about Approvals (issue 39; docs/design.md section 7, "Notifications"): a
//! message POSTed to each configured webhook when an Approval is created, decided, cancelled or
//! expires, as a Slack incoming-webhook message or a structured-mode CloudEvent
//! ([`message`]).
//!
//! Each transition is notified by the replica that wrote it: an Approval is created by exactly
//! one create that landed, and each phase change by exactly one status write that won its
//! compare-and-set (`controller::writes`), so with several replicas each event is sent once.
//! Writers only enqueue ([`Notifier::approval_written`], a non-blocking `try_send`): a run is
//! never delayed. One task per webhook sends its queue in order, retrying the message at the
//! head with exponential backoff, so an Approval's `created` goes before its `decided`. A
//! message that finds the queue full, or that fails for good, is counted
//! (`agentrt_notifications_total{outcome="dropped"|"failed"}`) and said by a Warning Event on
//! the Approval; it is never lost silently (a crash loses what was queued in memory).
//!
//! Owns: the webhook settings (`--notify-*`), the queues and their senders. Must not: decide
//! anything about a run, log or send a webhook's URL (it is a secret: a Secret's key read from
//! a file the chart mounts, or an environment variable).

pub mod message;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use super::projection::EventSink;
use crate::api::ApprovalPhase;
pub use message::{Format, Notice, NoticeKind};

/// Where a webhook's URL is read, at each attempt (a rotated Secret is picked up).
#[derive(Clone, Debug, PartialEq)]
pub enum UrlSource {
    /// A file (the Secret's key as the chart mounts it), trimmed.
    File(PathBuf),
    /// An environment variable (`valueFrom.secretKeyRef`).
    Env(String),
}

impl UrlSource {
    fn read(&self) -> Result<String, String> {
        let url = match self {
            UrlSource::File(path) => std::fs::read_to_string(path)
                .map_err(|err| format!("cannot read its URL file {}: {err}", path.display()))?,
            UrlSource::Env(var) => {
                std::env::var(var).map_err(|_| format!("its URL variable {var} is not set"))?
            }
        };
        let url = url.trim().to_string();
        if url.is_empty() {
            return Err("its URL is empty".to_string());
        }
        Ok(url)
    }
}

/// One webhook of `--notify-webhook name=N,format=slack|cloudevents,url-file=PATH|url-env=VAR`.
#[derive(Clone, Debug, PartialEq)]
pub struct Webhook {
    /// Its name, in metrics, logs and Events (never its URL).
    pub name: String,
    /// The message format.
    pub format: Format,
    /// Where its URL is read.
    pub url: UrlSource,
}

impl std::str::FromStr for Webhook {
    type Err = String;

    fn from_str(text: &str) -> Result<Webhook, String> {
        let (mut name, mut format, mut url) = (None, None, None);
        for part in text.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                format!("--notify-webhook: {part:?} is not key=value (name=, format=, url-file= or url-env=)")
            })?;
            match key.trim() {
                "name" => name = Some(value.trim().to_string()),
                "format" => {
                    format = Some(match value.trim() {
                        "slack" => Format::Slack,
                        "cloudevents" => Format::CloudEvents,
                        other => {
                            return Err(format!(
                                "--notify-webhook: format {other:?} is not slack or cloudevents"
                            ))
                        }
                    })
                }
                "url-file" => url = Some(UrlSource::File(PathBuf::from(value.trim()))),
                "url-env" => url = Some(UrlSource::Env(value.trim().to_string())),
                other => return Err(format!("--notify-webhook: unknown key {other:?}")),
            }
        }
        let name = name
            .filter(|n| !n.is_empty())
            .ok_or("--notify-webhook: name= is required")?;
        Ok(Webhook {
            name,
            format: format.ok_or("--notify-webhook: format= is required")?,
            url: url.ok_or("--notify-webhook: url-file= or url-env= is required")?,
        })
    }
}

/// The flags of notifications, part of `agentrt controller`'s options.
#[derive(clap::Args, Debug, Clone)]
pub struct NotifyArgs {
    /// POST a message about each Approval created, decided, cancelled or expired to a webhook:
    /// `name=N,format=slack|cloudevents,url-file=PATH` (or `url-env=VAR`); the URL, a secret,
    /// is read from the file (a Secret's key the chart mounts) or variable at each attempt and
    /// never logged. Repeat for several.
    #[arg(long = "notify-webhook")]
    pub webhooks: Vec<Webhook>,
    /// The console's base URL, for the link in each message (`<base>/approvals/<ns>/<name>`).
    #[arg(long, default_value = "http://127.0.0.1:8765")]
    pub notify_console_url: String,
    /// Messages waiting per webhook at most; one that finds the queue full is dropped and
    /// counted (`agentrt_notifications_total{outcome="dropped"}`) with a Warning Event.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub notify_queue: u32,
    /// Attempts per message (the first and its retries) before it fails for good.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub notify_attempts: u32,
    /// Milliseconds before the first retry; each next waits twice as long, at most 60 s.
    #[arg(long, default_value_t = 500)]
    pub notify_retry_ms: u64,
}

impl Default for NotifyArgs {
    fn default() -> Self {
        NotifyArgs {
            webhooks: Vec::new(),
            notify_console_url: "http://127.0.0.1:8765".to_string(),
            notify_queue: 1000,
            notify_attempts: 10,
            notify_retry_ms: 500,
        }
    }
}

/// The longest wait between two attempts.
const MAX_RETRY: Duration = Duration::from_secs(60);
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// What an Approval write means for notifications: the event of a phase change from `from` to
/// `to`, if any (Pending to a verdict is `decided`; to Cancelled or Expired from Pending or
/// Approved, `cancelled` or `expired`; Executed and a write within one phase are none).
pub fn transition(from: ApprovalPhase, to: ApprovalPhase) -> Option<NoticeKind> {
    use ApprovalPhase::*;
    match (from, to) {
        (a, b) if a == b => None,
        (Pending, Approved | Rejected | Settled) => Some(NoticeKind::Decided),
        (_, Cancelled) => Some(NoticeKind::Cancelled),
        (_, Expired) => Some(NoticeKind::Expired),
        _ => None,
    }
}

/// The queues of this replica's webhooks; cheap to clone. [`Notifier::none`] sends nothing.
#[derive(Clone, Default)]
pub struct Notifier {
    queues: Arc<Vec<Queue>>,
    console_url: Arc<str>,
}

struct Queue {
    name: String,
    tx: mpsc::Sender<Notice>,
    metrics: Arc<Metrics>,
    events: EventSink,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.queues.iter().map(|q| q.name.as_str()).collect();
        f.debug_struct("Notifier")
            .field("webhooks", &names)
            .finish()
    }
}

impl Notifier {
    /// No webhook: every event is ignored.
    pub fn none() -> Notifier {
        Notifier::default()
    }

    /// Starts one sender task per webhook of `args`, until `shutdown`.
    pub fn start(
        args: &NotifyArgs,
        http: reqwest::Client,
        metrics: Arc<Metrics>,
        events: EventSink,
        shutdown: CancellationToken,
    ) -> Notifier {
        let bound = usize::try_from(args.notify_queue).unwrap_or(1000).max(1);
        let mut queues = Vec::new();
        for webhook in &args.webhooks {
            let (tx, rx) = mpsc::channel(bound);
            // Every outcome shown from the start, at zero.
            for outcome in ["delivered", "retried", "failed", "dropped"] {
                metrics.approvals.notification(&webhook.name, outcome, 0);
            }
            let sender = Sender {
                webhook: webhook.clone(),
                http: http.clone(),
                metrics: metrics.clone(),
                events: events.clone(),
                attempts: args.notify_attempts.max(1),
                first_retry: Duration::from_millis(args.notify_retry_ms.max(1)),
            };
            tokio::spawn(sender.run(rx, shutdown.clone()));
            tracing::info!(webhook = %webhook.name, format = ?webhook.format, "notifying Approvals");
            queues.push(Queue {
                name: webhook.name.clone(),
                tx,
                metrics: metrics.clone(),
                events: events.clone(),
            });
        }
        Notifier {
            queues: Arc::new(queues),
            console_url: Arc::from(args.notify_console_url.trim_end_matches('/')),
        }
    }

    /// Queues `kind` about `approval` (the object as the write that made it returned it) for
    /// every webhook; never waits. A full queue drops the message, counted and said by a
    /// Warning Event on the Approval.
    pub fn approval_written(&self, kind: NoticeKind, approval: &Value) {
        if self.queues.is_empty() {
            return;
        }
        let notice = Notice::of(kind, approval, &self.console_url);
        for queue in self.queues.iter() {
            match queue.tx.try_send(notice.clone()) {
                Ok(()) => queue.metrics.approvals.queued(&queue.name, 1),
                Err(_) => {
                    queue
                        .metrics
                        .approvals
                        .notification(&queue.name, "dropped", 1);
                    tracing::warn!(webhook = %queue.name, approval = %notice.subject(), event = notice.kind.word(), "notification dropped: the webhook's queue is full");
                    queue.events.warn_about(
                        reference(&notice),
                        "NotificationDropped",
                        format!(
                            "the {} notification to webhook {} was dropped: its queue is full (--notify-queue)",
                            notice.kind.word(),
                            queue.name
                        ),
                    );
                }
            }
        }
    }
}

/// The reference a Warning Event about `notice`'s Approval names.
fn reference(notice: &Notice) -> ObjectReference {
    ObjectReference {
        api_version: Some("agentrt.dev/v1alpha1".into()),
        kind: Some("Approval".into()),
        name: Some(notice.name.clone()),
        namespace: Some(notice.namespace.clone()),
        uid: Some(notice.uid.clone()).filter(|u| !u.is_empty()),
        ..ObjectReference::default()
    }
}

/// One webhook's sender: its queue, in order.
struct Sender {
    webhook: Webhook,
    http: reqwest::Client,
    metrics: Arc<Metrics>,
    events: EventSink,
    attempts: u32,
    first_retry: Duration,
}

/// How one attempt went.
enum Attempt {
    Delivered,
    /// Worth trying again (no answer, 408, 429, 5xx), why.
    Retry(String),
    /// Not (another 4xx, no URL), why.
    Fail(String),
}

impl Sender {
    async fn run(self, mut rx: mpsc::Receiver<Notice>, shutdown: CancellationToken) {
        loop {
            let notice = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = rx.recv() => match next {
                    Some(notice) => notice,
                    None => return,
                },
            };
            self.metrics.approvals.queued(&self.webhook.name, -1);
            self.deliver(&notice, &shutdown).await;
        }
    }

    async fn deliver(&self, notice: &Notice, shutdown: &CancellationToken) {
        let name = &self.webhook.name;
        let body = notice.body(self.webhook.format);
        let mut wait = self.first_retry;
        let mut why = String::new();
        for attempt in 1..=self.attempts {
            match self.attempt(&body).await {
                Attempt::Delivered => {
                    self.metrics.approvals.notification(name, "delivered", 1);
                    self.metrics
                        .approvals
                        .delivered_after(notice.queued.elapsed().as_secs_f64());
                    tracing::debug!(webhook = %name, approval = %notice.subject(), event = notice.kind.word(), attempt, "notification delivered");
                    return;
                }
                Attempt::Fail(reason) => {
                    why = reason;
                    break;
                }
                Attempt::Retry(reason) => {
                    why = reason;
                    if attempt == self.attempts {
                        break;
                    }
                    self.metrics.approvals.notification(name, "retried", 1);
                    tracing::info!(webhook = %name, approval = %notice.subject(), event = notice.kind.word(), attempt, %why, retry_in = ?wait, "notification not delivered; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = (wait * 2).min(MAX_RETRY);
                }
            }
        }
        self.metrics.approvals.notification(name, "failed", 1);
        tracing::warn!(webhook = %name, approval = %notice.subject(), event = notice.kind.word(), %why, "notification failed");
        self.events.warn_about(
            reference(notice),
            "NotificationFailed",
            format!(
                "the {} notification to webhook {name} failed: {why}",
                notice.kind.word()
            ),
        );
    }

    async fn attempt(&self, body: &Value) -> Attempt {
        let url = match self.webhook.url.read() {
            Ok(url) => url,
            Err(why) => return Attempt::Fail(why),
        };
        let content_type = match self.webhook.format {
            Format::Slack => "application/json",
            Format::CloudEvents => "application/cloudevents+json; charset=utf-8",
        };
        let sent = self
            .http
            .post(&url)
            .header(http::header::CONTENT_TYPE, content_type)
            .timeout(ATTEMPT_TIMEOUT)
            .body(body.to_string())
            .send()
            .await;
        match sent {
            // The error without its URL: the URL is a secret.
            Err(err) => Attempt::Retry(format!("no answer: {}", err.without_url())),
            Ok(answer) => {
                let status = answer.status();
                if status.is_success() {
                    Attempt::Delivered
                } else if status.is_server_error()
                    || status == http::StatusCode::REQUEST_TIMEOUT
                    || status == http::StatusCode::TOO_MANY_REQUESTS
                {
                    Attempt::Retry(format!("answered {status}"))
                } else {
                    Attempt::Fail(format!("answered {status}"))
                }
            }
        }
    }
}

/// When an Approval was created, seconds before `decided` (RFC 3339 times as the API server
/// writes them); `None` when either does not parse or the difference is negative.
pub fn seconds_between(created: &str, decided: &str) -> Option<f64> {
    let created: jiff::Timestamp = created.parse().ok()?;
    let decided: jiff::Timestamp = decided.parse().ok()?;
    let span = decided.duration_since(created);
    let seconds = span.as_secs_f64();
    (seconds >= 0.0).then_some(seconds)
}

#[cfg(test)]
mod tests;
