//! Projections of the record the controller publishes (docs/design.md section 4: "Approvals,
//! Kubernetes Events and metrics are projections of it"): the Kubernetes Events a status write
//! implies, derived from the journal entries it added. Nothing here decides what a run does.

use serde_json::Value;

use super::model::INSECURE_KEY_REFUSAL;
use crate::api::AgentRunStatus;

/// A Kubernetes Event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeEventType {
    /// Something expected happened.
    Normal,
    /// Something an operator may want to look at.
    Warning,
}

impl KubeEventType {
    /// `Normal` or `Warning`, as the Event API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            KubeEventType::Normal => "Normal",
            KubeEventType::Warning => "Warning",
        }
    }
}

/// One Kubernetes Event to publish on the AgentRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeEventProjection {
    /// Normal or Warning.
    pub type_: KubeEventType,
    /// CamelCase reason (`Started`, `Completed`, `ApprovalRequested`, `TakenOver`, ...).
    pub reason: String,
    /// A human line.
    pub message: String,
}

/// Decodes a stored status (`null` is a new run's empty status).
///
/// # Errors
/// A sentence naming the part that does not decode (`status.steps[2] does not decode: ...`).
pub fn decode_status(status: &Value) -> Result<AgentRunStatus, String> {
    super::record::decode(status)
}

/// The reason of the Normal Event projected from `run.started` (the controller holds it a
/// while so that the run's next Normal Event folds into it, docs/design.md section 4).
pub const STARTED_REASON: &str = "Started";

/// The Kubernetes Events for the journal entries `new_status` adds to `old_status`: phase
/// changes (started, finished), approvals requested and decided, takeovers, interruptions,
/// resumptions and limits. Reads the journals leniently, so it works on any two statuses.
pub fn kube_events(old_status: &Value, new_status: &Value) -> Vec<KubeEventProjection> {
    let last_seq = events(old_status)
        .iter()
        .filter_map(|e| e.get("seq").and_then(Value::as_i64))
        .max()
        .unwrap_or(0);
    events(new_status)
        .iter()
        .filter(|e| e.get("seq").and_then(Value::as_i64).unwrap_or(0) > last_seq)
        .filter_map(project)
        .collect()
}

/// The model limits checked against a projection before an attempt (docs/behaviours.md 46):
/// their `value` is what the attempt would bring the total to, not what was reached.
const PROJECTED_LIMITS: [&str; 3] = ["maxModelCalls", "maxTotalTokens", "maxEstimatedCostMicros"];

/// A `limit.exceeded` in words: a projected model limit "would be exceeded: 227 projected, limit
/// 100"; a model endpoint that cannot be used names why (`InsecureModelEndpoint` when the key was
/// kept from plain http); usage that cannot be trusted says so; any other "reached: 51 of 50".
fn limit_exceeded(
    data: &Value,
    text: &dyn Fn(&str) -> String,
) -> (KubeEventType, &'static str, String) {
    let limit = text("limit");
    let message = match limit.as_str() {
        "modelEndpoint" => {
            let detail = text("detail");
            let reason = if detail.contains(INSECURE_KEY_REFUSAL) {
                "InsecureModelEndpoint"
            } else {
                "ModelEndpointUnusable"
            };
            return (KubeEventType::Warning, reason, detail);
        }
        "reportedUsage" => format!(
            "the model's reported usage cannot be trusted: {}",
            text("detail")
        ),
        _ if data.get("missingOutputCap").is_some() => format!(
            "{limit} is set, so every model call needs an output cap \
             (spec.agent.openai.maxOutputTokens or spec.limits.maxOutputTokensPerCall)"
        ),
        _ if PROJECTED_LIMITS.contains(&limit.as_str()) => format!(
            "{limit} would be exceeded: {} projected, limit {}",
            text("value"),
            text("max")
        ),
        _ => format!("{limit} reached: {} of {}", text("value"), text("max")),
    };
    (KubeEventType::Warning, "LimitExceeded", message)
}

fn events(status: &Value) -> &[Value] {
    status
        .get("events")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn project(event: &Value) -> Option<KubeEventProjection> {
    let type_ = event.get("type").and_then(Value::as_str)?;
    let data = event.get("data").cloned().unwrap_or(Value::Null);
    let text = |field: &str| {
        data.get(field)
            .map(|v| match v {
                Value::String(s) => s.clone(),
                Value::Null => "-".to_string(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| "-".to_string())
    };
    let step = event
        .get("step")
        .and_then(Value::as_i64)
        .map_or_else(|| "-".to_string(), |s| s.to_string());
    let (kind, reason, message) = match type_ {
        "run.started" => (
            KubeEventType::Normal,
            STARTED_REASON,
            format!("the run started (holder {})", text("holder")),
        ),
        "run.finished" => {
            let phase = text("phase");
            let kind = if phase == "Completed" {
                KubeEventType::Normal
            } else {
                KubeEventType::Warning
            };
            let mut message = format!("the run ended {phase}: {}", text("reason"));
            if data.get("detail").is_some() {
                message.push_str(&format!(" ({})", text("detail")));
            }
            return Some(KubeEventProjection {
                type_: kind,
                reason: phase,
                message,
            });
        }
        "approval.requested" if data.get("replaces").is_some() => (
            KubeEventType::Warning,
            "ApprovalConflict",
            format!(
                "Approval {} {}; it was left as it is and step {step} waits for Approval {} instead",
                text("replaces"),
                text("conflict"),
                text("approval")
            ),
        ),
        "approval.requested" => (
            KubeEventType::Normal,
            "ApprovalRequested",
            format!(
                "step {step} waits for Approval {} ({}): {}",
                text("approval"),
                text("kind"),
                text("reason")
            ),
        ),
        "approval.decided" => (
            KubeEventType::Normal,
            "ApprovalDecided",
            format!(
                "Approval {} was {} {}",
                text("approval"),
                text("verdict"),
                // spec.decision.approver is optional.
                match data.get("approver").and_then(Value::as_str) {
                    Some(approver) if !approver.is_empty() => format!("by {approver}"),
                    _ => "(no approver named)".to_string(),
                }
            ),
        ),
        "lease.taken_over" => (
            KubeEventType::Warning,
            "TakenOver",
            // A Lease released by a replica that stopped cleanly (or deleted) has no expiry to
            // name, and a run never held has no previous holder: said so, not "-".
            match (data.get("previousHolder"), data.get("previousExpiry")) {
                (Some(Value::String(previous)), Some(Value::String(expiry))) => format!(
                    "{} took the run over from {previous} (lease expired {expiry})",
                    text("holder")
                ),
                (Some(Value::String(previous)), _) => format!(
                    "{} took the run over from {previous}, whose lease was released or deleted",
                    text("holder")
                ),
                _ => format!("{} took the run over (no previous holder)", text("holder")),
            },
        ),
        "step.interrupted" => (
            KubeEventType::Warning,
            "StepInterrupted",
            format!(
                "step {step} was interrupted while {}",
                text("previousStatus")
            ),
        ),
        "run.resumed" => (
            KubeEventType::Normal,
            "Resumed",
            match (data.get("approval"), data.get("reconciliation").and_then(Value::as_str)) {
                (Some(_), _) => format!("the run resumed with Approval {}", text("approval")),
                (None, Some("resend")) => format!(
                    "the run resumed after {}: step {} is sent again with the same \
                     Idempotency-Key, as its tool allows",
                    text("after"),
                    text("step")
                ),
                (None, _) => format!("the run resumed after {}", text("after")),
            },
        ),
        "step.tool_finished"
            if data
                .get("settledBy")
                .and_then(|s| s.get("statusURL"))
                .is_some() =>
        {
            (
                KubeEventType::Normal,
                "SettledByTool",
                format!(
                    "step {step}'s interrupted call of {} was settled by the tool's status URL: {}",
                    text("tool"),
                    data.pointer("/settledBy/state")
                        .and_then(Value::as_str)
                        .unwrap_or("-")
                ),
            )
        }
        "limit.exceeded" => limit_exceeded(&data, &text),
        "tool.pinned" if data.get("hintsDisagree").is_some() => (
            KubeEventType::Warning,
            "ToolHintsDisagree",
            format!(
                "the MCP server's annotations of {} claim more danger than its side-effect class; the class decides: {}",
                text("tool"),
                text("hintsDisagree")
            ),
        ),
        "loop.detected" => (
            KubeEventType::Warning,
            "LoopDetected",
            format!(
                "{} was called {} times in a row with the same args and answer",
                text("tool"),
                text("count")
            ),
        ),
        _ => return None,
    };
    Some(KubeEventProjection {
        type_: kind,
        reason: reason.to_string(),
        message,
    })
}
