//! The AgentRun's status: the run's record (docs/design.md sections 2, 4 and 4a): phase and
//! reason, the window of steps and events, the archive index, usage, the lease fence and
//! conditions. Written only by the controller, by compare-and-set.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schema::{any_json, json_object, time_schema};
use super::vocab::{
    EventType, ObservationKind, PolicyDecisionKind, RunPhase, StepStatus, TerminalReason,
};
use super::{StepIndex, Time};

/// The run's record (docs/design.md sections 2 and 4). Written only by compare-and-set.
///
/// Its schema defaults the whole status to `{phase: Pending}`: the API server fills that in when
/// it reads a run no controller has written yet, so `kubectl get ar` shows `Pending` before a
/// controller picks the run up (a printer column cannot default; docs/behaviours.md 74).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("default" = {"phase": "Pending"}))]
pub struct AgentRunStatus {
    /// Where the run is.
    #[serde(default)]
    pub phase: RunPhase,
    /// Why it ended (terminal runs only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TerminalReason>,
    /// Words on the reason: the failing field, the agent's message, the approver's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_detail: Option<String>,
    /// The run's result (Completed only), as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub result: Option<Value>,
    /// Steps recorded.
    #[serde(default)]
    pub step_count: i64,
    /// The tool of the latest step, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_tool: Option<String>,
    /// The steps, in order; step i is `steps[i]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<Step>,
    /// Model usage totals.
    #[serde(default)]
    pub usage: Usage,
    /// Seconds spent deciding and executing, summed over steps.
    #[serde(default)]
    pub active_seconds: f64,
    /// Which replica holds the run and its epoch (the fence; docs/design.md section 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseRecord>,
    /// The audit journal: seq 1, 2, 3… without gaps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<RunEvent>,
    /// The sealed history: segments and the chain's head; absent until the run first seals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<super::segment::Archive>,
    /// Each MCP tool's definition as pinned before `run.started` (docs/design.md section 6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_pins: Vec<super::mcp::ToolPin>,
    /// `Ready`, `WaitingForApproval`, ... with observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Each top-level spec field but `cancel` → the first 16 hex digits of SHA-256 of its
    /// canonical JSON, as of `observedGeneration`: how a write after an edit knows which fields
    /// changed (`spec.changed`, docs/design.md section 2).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spec_hashes: BTreeMap<String, String>,
    /// When `run.started` was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub started_at: Option<Time>,
    /// When `run.finished` was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub finished_at: Option<Time>,
}

/// Model usage totals (saturating).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Model attempts dispatched.
    #[serde(default)]
    pub model_calls: i64,
    /// Input tokens.
    #[serde(default)]
    pub input_tokens: i64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: i64,
    /// Estimated cost in micros.
    #[serde(default)]
    pub estimated_cost_micros: i64,
}

/// The holder recorded in the run (the fence).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRecord {
    /// The holder identity (controller name + per-process random suffix).
    pub holder: String,
    /// Incremented each time a holder takes the run to act on it: `run.started`, each resume
    /// after a wait (`run.resumed` {holder, epoch}) and each takeover (`lease.taken_over`), so
    /// two writes under one epoch are one holder's (docs/design.md section 4).
    pub epoch: i64,
}

/// One step: a decision and what it caused.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// 0-based position in `steps`.
    pub index: StepIndex,
    /// Where the step is.
    pub status: StepStatus,
    /// The agent's decision, recorded verbatim before it is validated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<DecisionRecord>,
    /// The policy's decision on the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRecord>,
    /// What the agent sees next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// Approvals asked for this step, oldest first; only the last can grant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<StepApproval>,
    /// Tool calls started for this step (the `Agentrt-Attempt` header).
    #[serde(default)]
    pub attempts: i64,
    /// When the step (or its current active phase) started; reset when a grant executes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub started_at: Option<Time>,
    /// When the step ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub finished_at: Option<Time>,
}

/// A decision as the agent gave it. `kind` is kept verbatim (it may be unknown or missing);
/// args that are not usable JSON are kept in `invalidArgs`, never in `args`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DecisionRecord {
    /// `tool_call`, `complete`, `fail`, or whatever the agent said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The tool a `tool_call` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The call's args as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub args: Option<Value>,
    /// Args that were not usable JSON, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_args: Option<String>,
    /// A `complete` decision's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub result: Option<Value>,
    /// A `fail` decision's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Any other field the agent sent, verbatim.
    #[serde(default, flatten, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}

/// The policy's decision on a step.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRecord {
    /// `allow`, `deny`, `abort`, `require_approval`.
    pub decision: PolicyDecisionKind,
    /// The rule that matched; absent for the side-effect class default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The rule's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The admin policy that decided (docs/design.md section 6, admin policies); absent when the
    /// run's own `spec.policy` did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PolicySource>,
}

/// An admin policy that decided a step: `AgentPolicy` or `ClusterAgentPolicy`, which one, at
/// which generation, and which of its rules (absent: its side-effect class outcome).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicySource {
    /// `AgentPolicy` or `ClusterAgentPolicy`.
    pub kind: String,
    /// The AgentPolicy's namespace; absent for a ClusterAgentPolicy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// Its `metadata.generation` when it decided.
    pub generation: i64,
    /// The index of the rule in its `spec.rules` that decided; absent for its class outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_index: Option<i64>,
}

impl PolicySource {
    /// `AgentPolicy ns/name` or `ClusterAgentPolicy name`, as a person reads it.
    pub fn display_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind, self.name),
            None => format!("{} {}", self.kind, self.name),
        }
    }
}

/// What the agent sees after a step.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// `tool_result`, `tool_error`, `policy_denied`, `invalid_decision`, `interrupted`.
    pub kind: ObservationKind,
    /// The content, as JSON (cut to the per-step budget; see `truncated`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_json")]
    pub content: Option<Value>,
    /// A short human line.
    #[serde(default)]
    pub summary: String,
    /// `sha256:<hex>` of the canonical JSON of the full content.
    #[serde(default)]
    pub content_hash: String,
    /// Set when the content was cut: its full size and hash are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<Truncation>,
}

/// How content over the per-step budget was cut (docs/design.md section 3, guarantee 8).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Truncation {
    /// Size of the full content in bytes (canonical JSON).
    pub original_bytes: i64,
    /// `sha256:<hex>` of the full content.
    pub sha256: String,
}

/// An Approval asked for a step, as the record knows it (the record is the source of truth;
/// the Approval object is its projection).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StepApproval {
    /// The Approval's name, `<run>-<step>-<n>`.
    pub name: String,
    /// The approval kind (the policy's kind, or `interrupted_side_effect`).
    pub kind: String,
    /// `sha256:<hex>` over {kind, capability, presentation, request}.
    pub hash: String,
    /// When it was requested.
    #[schemars(schema_with = "time_schema")]
    pub requested_at: Time,
    /// When it expires undecided, if approvalTTLSeconds is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub expires_at: Option<Time>,
    /// The verdict copied from the Approval (`approval.decided`), once acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<super::vocab::Verdict>,
    /// Set when its grant was executed (at most once).
    #[serde(default)]
    pub executed: bool,
}

/// One event of the run's audit journal.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// 1, 2, 3… per run, no gaps.
    pub seq: i64,
    /// When the state changed.
    #[schemars(schema_with = "time_schema")]
    pub time: Time,
    /// The event type.
    #[serde(rename = "type")]
    pub type_: EventType,
    /// The step it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<StepIndex>,
    /// A small JSON payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub data: Option<Value>,
}

/// A condition, as the Kubernetes API conventions define it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `WaitingForApproval`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False`, `Unknown`.
    pub status: String,
    /// CamelCase reason.
    #[serde(default)]
    pub reason: String,
    /// Human message.
    #[serde(default)]
    pub message: String,
    /// When status last changed.
    #[schemars(schema_with = "time_schema")]
    pub last_transition_time: Time,
    /// The generation this condition reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
