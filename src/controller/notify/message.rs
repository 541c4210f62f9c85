//! The messages of [`super`]: what one notification says ([`Notice`], taken from the Approval as
//! written, bounded: a few hundred bytes however large the request), and its body as a Slack
//! incoming-webhook message or a structured-mode CloudEvents 1.0 event.
//!
//! Owns: the bodies' fields and their escaping. Must not: carry a webhook's URL, a Secret, or
//! the request's args beyond [`ARGS_SUMMARY_CHARS`].

use std::time::Instant;

use serde_json::{json, Value};

/// The most characters of the args' JSON a message shows; more end with `…`.
pub const ARGS_SUMMARY_CHARS: usize = 200;
/// The most characters of any other field taken from the Approval.
const FIELD_CHARS: usize = 256;

/// A webhook's message format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A Slack incoming-webhook message (`{"text": ...}`, mrkdwn).
    Slack,
    /// A CloudEvents 1.0 event in structured mode (`application/cloudevents+json`).
    CloudEvents,
}

/// What happened to the Approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// It was created: a person is asked.
    Created,
    /// A person decided it (Approved, Rejected, or an interrupted call settled).
    Decided,
    /// It can no longer grant (`status.reason` says why).
    Cancelled,
    /// It expired.
    Expired,
}

impl NoticeKind {
    /// The word of the CloudEvent type `dev.agentrt.approval.<word>`.
    pub fn word(self) -> &'static str {
        match self {
            NoticeKind::Created => "created",
            NoticeKind::Decided => "decided",
            NoticeKind::Cancelled => "cancelled",
            NoticeKind::Expired => "expired",
        }
    }
}

/// One notification, as queued.
#[derive(Clone, Debug)]
pub struct Notice {
    /// What happened.
    pub kind: NoticeKind,
    /// The Approval's namespace.
    pub namespace: String,
    /// The Approval's name.
    pub name: String,
    /// The Approval's uid.
    pub uid: String,
    /// The run's name.
    pub run: String,
    /// The step.
    pub step: Value,
    /// The tool's name.
    pub tool: String,
    /// `spec.kind`.
    pub approval_kind: String,
    /// The args' JSON, at most [`ARGS_SUMMARY_CHARS`] characters.
    pub args: String,
    /// `status.shortHash`, else the first characters of `spec.hash`.
    pub short_hash: String,
    /// `status.phase` as written.
    pub phase: String,
    /// `status.reason`.
    pub reason: Option<String>,
    /// `spec.decision.verdict` and `approver`.
    pub decision: Option<(String, String)>,
    /// `metadata.creationTimestamp`.
    pub created_at: String,
    /// When it happened (RFC 3339): the decision's `decidedAt`, else now.
    pub time: String,
    /// The console's page for it.
    pub console: String,
    /// When it was queued (the delivery latency's start).
    pub queued: Instant,
}

/// At most `max` characters of `text`, with `…` when cut.
fn bounded(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max).collect();
    out.push('…');
    out
}

fn field(object: &Value, pointer: &str) -> String {
    bounded(
        object
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or(""),
        FIELD_CHARS,
    )
}

impl Notice {
    /// The notice of `kind` about `approval` (the object as written), linking to
    /// `<console_url>/approvals/<ns>/<name>`.
    pub fn of(kind: NoticeKind, approval: &Value, console_url: &str) -> Notice {
        let namespace = field(approval, "/metadata/namespace");
        let name = field(approval, "/metadata/name");
        let args = approval
            .pointer("/spec/request/args")
            .map(Value::to_string)
            .unwrap_or_default();
        let short_hash = match approval
            .pointer("/status/shortHash")
            .and_then(Value::as_str)
        {
            Some(short) => bounded(short, 32),
            None => {
                let hash = field(approval, "/spec/hash");
                hash.trim_start_matches("sha256:")
                    .chars()
                    .take(12)
                    .collect()
            }
        };
        let decision = approval.pointer("/spec/decision").map(|d| {
            (
                bounded(d["verdict"].as_str().unwrap_or(""), FIELD_CHARS),
                bounded(d["approver"].as_str().unwrap_or(""), FIELD_CHARS),
            )
        });
        let time = approval
            .pointer("/status/decidedAt")
            .and_then(Value::as_str)
            .filter(|_| kind == NoticeKind::Decided)
            .map(str::to_string)
            .unwrap_or_else(|| {
                if kind == NoticeKind::Created {
                    field(approval, "/metadata/creationTimestamp")
                } else {
                    String::new()
                }
            });
        let time = if time.is_empty() {
            jiff::Timestamp::now().to_string()
        } else {
            time
        };
        Notice {
            kind,
            console: format!("{console_url}/approvals/{namespace}/{name}"),
            namespace,
            name,
            uid: field(approval, "/metadata/uid"),
            run: field(approval, "/spec/runName"),
            step: approval
                .pointer("/spec/stepIndex")
                .cloned()
                .unwrap_or(Value::Null),
            tool: field(approval, "/spec/request/tool/name"),
            approval_kind: field(approval, "/spec/kind"),
            args: bounded(&args, ARGS_SUMMARY_CHARS),
            short_hash,
            phase: field(approval, "/status/phase"),
            reason: approval
                .pointer("/status/reason")
                .and_then(Value::as_str)
                .map(|r| bounded(r, FIELD_CHARS)),
            decision,
            created_at: field(approval, "/metadata/creationTimestamp"),
            time,
            queued: Instant::now(),
        }
    }

    /// `<namespace>/<name>`: the CloudEvent's subject, and what `kubectl agentrt approve`
    /// takes.
    pub fn subject(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The body to POST in `format`.
    pub fn body(&self, format: Format) -> Value {
        match format {
            Format::Slack => self.slack(),
            Format::CloudEvents => self.cloud_event(),
        }
    }

    /// A Slack incoming-webhook message: `text` in mrkdwn, every field from the Approval
    /// escaped ([`slack_escape`]).
    fn slack(&self) -> Value {
        let e = |s: &str| slack_escape(s);
        let subject = e(&self.subject());
        let about = format!(
            "run `{}`, step {}, tool `{}`, kind `{}`",
            e(&self.run),
            self.step,
            e(&self.tool),
            e(&self.approval_kind)
        );
        let link = format!("<{}|Open in the console>", e(&self.console));
        let text = match self.kind {
            NoticeKind::Created => format!(
                "Approval requested: *{subject}* ({about})\nArgs: `{}`\nHash: `{}`\nDecide: `kubectl agentrt approve {subject}`\n{link}",
                e(&self.args),
                e(&self.short_hash),
            ),
            NoticeKind::Decided => {
                let (verdict, approver) = self.decision.clone().unwrap_or_default();
                format!(
                    "Approval *{subject}* decided: *{}* by {} ({about})\n{link}",
                    e(&verdict),
                    e(&approver)
                )
            }
            NoticeKind::Cancelled => format!(
                "Approval *{subject}* cancelled: {} ({about})\n{link}",
                e(self.reason.as_deref().unwrap_or("no reason given"))
            ),
            NoticeKind::Expired => {
                format!("Approval *{subject}* expired before anyone decided it ({about})\n{link}")
            }
        };
        json!({ "text": text })
    }

    /// A structured-mode CloudEvents 1.0 event: `id` is the Approval's uid and the event
    /// (stable across retries, so a receiver can drop a repeat), `source` the Approvals of its
    /// namespace, `type` `dev.agentrt.approval.<word>`, `subject` `<ns>/<name>`.
    fn cloud_event(&self) -> Value {
        let mut data = json!({
            "approval": {
                "namespace": self.namespace,
                "name": self.name,
                "uid": self.uid,
                "kind": self.approval_kind,
                "phase": self.phase,
                "shortHash": self.short_hash,
                "createdAt": self.created_at,
            },
            "run": {"namespace": self.namespace, "name": self.run},
            "step": self.step,
            "tool": self.tool,
            "argsSummary": self.args,
            "approveCommand": format!("kubectl agentrt approve {}", self.subject()),
            "consoleURL": self.console,
        });
        if let Some(reason) = &self.reason {
            data["approval"]["reason"] = json!(reason);
        }
        if let Some((verdict, approver)) = &self.decision {
            data["decision"] = json!({"verdict": verdict, "approver": approver});
        }
        json!({
            "specversion": "1.0",
            "id": format!("{}.{}", self.uid, self.kind.word()),
            "source": format!("/apis/agentrt.dev/v1alpha1/namespaces/{}/approvals", self.namespace),
            "type": format!("dev.agentrt.approval.{}", self.kind.word()),
            "subject": self.subject(),
            "time": self.time,
            "datacontenttype": "application/json",
            "data": data,
        })
    }
}

/// `text` made safe inside a Slack mrkdwn message: `&`, `<` and `>` as Slack's escapes (so no
/// link, mention or `<!channel>` can be injected), a backtick as `'` (so no code span closes),
/// control and bidirectional-override characters as `?`.
pub fn slack_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '`' => out.push('\''),
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.push('?'),
            c if c.is_control() => out.push('?'),
            c => out.push(c),
        }
    }
    out
}
