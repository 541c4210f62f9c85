//! What the console's templates show of Approvals and runs (docs/design.md section 2,
//! "Console"): every string a model, a tool, a server or a manifest author chose escaped and
//! bounded by the CLI's helpers ([`crate::cli::escape`], [`crate::cli::render`]) before the
//! templates escape it again for HTML. Must not: read the API server or decide anything.

use serde::Serialize;
use serde_json::Value;

use crate::api::{Approval, ApprovalPhase, INTERRUPTED_SIDE_EFFECT};
use crate::cli::escape::{escape_bounded, render_json, DEFAULT_MAX_CHARS};
use crate::cli::render;

fn esc(text: &str) -> String {
    escape_bounded(text, DEFAULT_MAX_CHARS)
}

/// A serialized enum's wire spelling (`Pending`, `RemoteMutation`).
pub(super) fn wire<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// An Approval's phase (`Pending` when it has no status yet).
pub(super) fn phase(approval: &Approval) -> ApprovalPhase {
    approval
        .status
        .as_ref()
        .map(|s| s.phase)
        .unwrap_or(ApprovalPhase::Pending)
}

/// `namespace/name`, the key the page and its forms name an Approval by.
pub(super) fn key(approval: &Approval) -> String {
    format!(
        "{}/{}",
        approval.metadata.namespace.as_deref().unwrap_or(""),
        approval.metadata.name.as_deref().unwrap_or("")
    )
}

/// How long ago, as `42s`, `5m`, `3h`, `2d`.
fn age(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> String {
    let Some(created) = created else {
        return "-".into();
    };
    let seconds = jiff::Timestamp::now()
        .duration_since(created.0)
        .as_secs()
        .max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// One inbox row.
#[derive(Serialize, Debug)]
pub(super) struct Row {
    /// `namespace/name` (`data-approval`).
    pub key: String,
    /// `metadata.namespace`, escaped.
    pub namespace: String,
    /// `metadata.name`, escaped.
    pub name: String,
    /// `spec.kind` (`policy`, `interrupted_side_effect`, ...), escaped.
    pub kind: String,
    /// The run's `namespace/name`.
    pub run: String,
    /// The request's step index.
    pub step: i64,
    /// The tool's name, escaped.
    pub tool: String,
    /// The tool's side-effect class.
    pub side_effect: String,
    /// `status.phase` (`Pending` before the controller wrote one).
    pub phase: String,
    /// Pending and undecided: the page offers approve and reject.
    pub pending: bool,
    /// Since creation (`5m`).
    pub age: String,
    /// `status.expiresAt`, or `-`.
    pub expires: String,
    /// `spec.hash` as shown, decided on.
    pub hash: String,
    /// `metadata.resourceVersion` as read, the decision's precondition.
    pub resource_version: String,
}

/// The inbox's row of `approval`.
pub(super) fn row(approval: &Approval) -> Row {
    let spec = &approval.spec;
    let phase = phase(approval);
    Row {
        key: key(approval),
        namespace: esc(approval.metadata.namespace.as_deref().unwrap_or("")),
        name: esc(approval.metadata.name.as_deref().unwrap_or("")),
        kind: escape_bounded(&spec.kind, 64),
        run: esc(&format!(
            "{}/{}",
            spec.request.run.namespace, spec.request.run.name
        )),
        step: spec.request.step.get(),
        tool: escape_bounded(&spec.request.tool.name, 80),
        side_effect: spec.request.tool.side_effect.as_str().to_string(),
        phase: wire(&phase),
        pending: phase == ApprovalPhase::Pending && spec.decision.is_none(),
        age: age(approval.metadata.creation_timestamp.as_ref()),
        expires: approval
            .status
            .as_ref()
            .and_then(|s| s.expires_at.as_ref())
            .map(|t| t.to_string())
            .unwrap_or_else(|| "-".into()),
        hash: spec.hash.clone(),
        resource_version: approval
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default(),
    }
}

/// Pending first, then oldest first (by creation, then name).
pub(super) fn inbox_order(approvals: &mut [Approval]) {
    approvals.sort_by_key(|a| {
        (
            phase(a) != ApprovalPhase::Pending || a.spec.decision.is_some(),
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            key(a),
        )
    });
}

/// The notice of an `interrupted_side_effect` Approval (docs/design.md section 5).
#[derive(Serialize, Debug)]
pub(super) struct Interrupted {
    /// The presentation's notice (the outcome is unknown), escaped.
    pub notice: String,
    /// The first attempt's `Idempotency-Key`.
    pub idempotency_key: Option<String>,
    /// When the first attempt started (RFC 3339).
    pub started_at: Option<String>,
    /// Until when it may still be running (RFC 3339).
    pub may_run_until: Option<String>,
}

/// One Approval's page.
#[derive(Serialize, Debug)]
pub(super) struct Detail {
    /// What the inbox shows of it.
    #[serde(flatten)]
    pub row: Row,
    /// The request's run uid, escaped.
    pub run_uid: String,
    /// `spec.reason`, escaped.
    pub reason: Option<String>,
    /// The tool's description, escaped.
    pub tool_description: String,
    /// The tool's timeout, in seconds.
    pub timeout_seconds: i64,
    /// The args, pretty JSON, every string escaped and bounded.
    pub args: String,
    /// `spec.capability`, pretty JSON, escaped and bounded.
    pub capability: Option<String>,
    /// The admin policy that required it, as one line.
    pub required_by: Option<String>,
    /// For an `interrupted_side_effect` Approval: the outcome-unknown notice.
    pub interrupted: Option<Interrupted>,
    /// An MCP call's server, tool, pin and annotations, pretty JSON.
    pub mcp: Option<String>,
    /// The whole presentation, pretty JSON.
    pub presentation: Option<String>,
    /// `Approved by alice: note`, when decided.
    pub decision: Option<String>,
    /// `status.reason` (why it ended without executing), escaped.
    pub status_reason: Option<String>,
}

/// The page of `approval`.
pub(super) fn detail(approval: &Approval) -> Detail {
    let spec = &approval.spec;
    let presentation = spec.presentation.as_ref();
    let text =
        |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_str).map(esc);
    let interrupted = (spec.kind == INTERRUPTED_SIDE_EFFECT).then(|| {
        let first = presentation.and_then(|p| p.get("firstAttempt"));
        Interrupted {
            notice: text(presentation, "notice").unwrap_or_else(|| {
                "The first attempt of this call was interrupted: whether it took effect is \
                 unknown."
                    .into()
            }),
            idempotency_key: text(first, "idempotencyKey"),
            started_at: text(first, "startedAt"),
            may_run_until: text(first, "mayRunUntil"),
        }
    });
    let mcp = presentation
        .and_then(|p| p.get("mcp").or_else(|| p.get("pinSha256").map(|_| p)))
        .map(|m| render_json(m, DEFAULT_MAX_CHARS));
    Detail {
        row: row(approval),
        run_uid: esc(&spec.request.run.uid),
        reason: spec.reason.as_deref().map(esc),
        tool_description: esc(&spec.request.tool.description),
        timeout_seconds: spec.request.tool.timeout_seconds,
        args: render_json(&spec.request.args, DEFAULT_MAX_CHARS),
        capability: spec
            .capability
            .as_ref()
            .map(|c| render_json(c, DEFAULT_MAX_CHARS)),
        required_by: presentation.and_then(render::approval_policy),
        interrupted,
        mcp,
        presentation: presentation.map(|p| render_json(p, DEFAULT_MAX_CHARS)),
        decision: spec.decision.as_ref().map(|d| {
            format!(
                "{} by {}{}",
                wire(&d.verdict),
                esc(d.approver.as_deref().unwrap_or("(unknown)")),
                d.note
                    .as_deref()
                    .map(|n| format!(": {}", esc(n)))
                    .unwrap_or_default()
            )
        }),
        status_reason: approval
            .status
            .as_ref()
            .and_then(|s| s.reason.as_deref())
            .map(esc),
    }
}
