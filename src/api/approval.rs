//! The `Approval` custom resource (docs/design.md section 2): a pause for a person, bound by hash to
//! the exact request it shows. Created only by the controller, owned by its AgentRun.

// Each `printcolumn(...)` repeats `type_ = ...`; clippy reads the repeats as duplicates.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schema::{any_json, json_object, json_schema_object, time_schema};
use super::vocab::{ApprovalPhase, SideEffect, Verdict};
use super::{StepIndex, Time};

/// What a person is asked to approve. Immutable once created, except `decision`, which is
/// written once and must carry `spec.hash`.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "agentrt.dev",
    version = "v1alpha1",
    kind = "Approval",
    plural = "approvals",
    singular = "approval",
    namespaced,
    status = "ApprovalStatus",
    shortname = "apv",
    category = "agentrt",
    printcolumn(name = "Run", type_ = "string", json_path = ".spec.runName"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".spec.stepIndex"),
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(name = "Tool", type_ = "string", json_path = ".spec.request.tool.name"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Hash",
        type_ = "string",
        json_path = ".status.shortHash",
        description = "The first characters of spec.hash"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.runName == oldSelf.runName && self.runUID == oldSelf.runUID && self.stepIndex == oldSelf.stepIndex && self.kind == oldSelf.kind && self.request == oldSelf.request && self.hash == oldSelf.hash", "message": "an Approval's spec is immutable; only spec.decision may be written, once"},
    {"rule": "has(self.capability) == has(oldSelf.capability) && (!has(self.capability) || self.capability == oldSelf.capability) && has(self.presentation) == has(oldSelf.presentation) && (!has(self.presentation) || self.presentation == oldSelf.presentation) && has(self.reason) == has(oldSelf.reason) && (!has(self.reason) || self.reason == oldSelf.reason)", "message": "an Approval's spec is immutable; only spec.decision may be written, once"},
    {"rule": "!has(oldSelf.decision) || (has(self.decision) && self.decision == oldSelf.decision)", "message": "spec.decision is written once and cannot be changed or removed"},
    {"rule": "!has(self.decision) || self.decision.hash == self.hash", "message": "spec.decision.hash must equal spec.hash: the request you approved is not the one stored", "fieldPath": ".decision.hash"},
    {"rule": "!has(self.decision) || self.decision.verdict == 'Approved' || self.decision.verdict == 'Rejected' || self.kind == 'interrupted_side_effect'", "message": "TookEffect and DidNotTakeEffect settle an interrupted call: only an interrupted_side_effect Approval takes them (use Approved or Rejected)", "fieldPath": ".decision.verdict"},
    {"rule": "!has(self.decision) || has(self.decision.result) == (self.decision.verdict == 'TookEffect')", "message": "spec.decision.result is required with verdict TookEffect and refused with any other verdict", "fieldPath": ".decision.result"},
    {"rule": "!has(self.decision) || has(self.decision.answer) == (self.kind == 'input_required' && self.decision.verdict == 'Approved')", "message": "spec.decision.answer (an object matching spec.presentation.requestedSchema) is required to approve an input_required Approval and refused on any other decision", "fieldPath": ".decision.answer"}
]))]
pub struct ApprovalSpec {
    /// The AgentRun's name.
    #[schemars(length(min = 1, max = 253))]
    pub run_name: String,
    /// The AgentRun's uid.
    #[serde(rename = "runUID")]
    #[schemars(length(min = 1, max = 64))]
    pub run_uid: String,
    /// The step this approval is for.
    #[schemars(range(min = 0))]
    pub step_index: StepIndex,
    /// The policy's approval kind, or `interrupted_side_effect`.
    #[schemars(length(min = 1, max = 128))]
    pub kind: String,
    /// Exactly what the hash covers, with `kind`, `capability` and `presentation`.
    pub request: ApprovalRequest,
    /// What approving grants, as a JSON object. An object (not any JSON) so that the API
    /// server's CEL sees the field and can hold it immutable: kube-apiserver leaves a field
    /// with no `type` out of the types its rules compile against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub capability: Option<Value>,
    /// What the approver is shown, as a JSON object (typed for CEL, like `capability`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub presentation: Option<Value>,
    /// Why approval is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub reason: Option<String>,
    /// `sha256:<64 hex>` over the canonical JSON of {kind, capability, presentation, request}.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub hash: String,
    /// Written once by a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<ApprovalDecision>,
}

/// The request an approval is bound to (docs/design.md section 2, "The hash").
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequest {
    /// The run.
    pub run: RunRef,
    /// The step index.
    pub step: StepIndex,
    /// The tool as specified in the run.
    pub tool: ToolRef,
    /// The call's args.
    #[schemars(schema_with = "any_json")]
    pub args: Value,
}

/// Which run an approval belongs to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// uid.
    pub uid: String,
}

/// The tool fields an approval covers.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolRef {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default)]
    pub description: String,
    /// The tool's input schema.
    #[schemars(schema_with = "json_schema_object")]
    pub input_schema: Value,
    /// Side-effect class.
    pub side_effect: SideEffect,
    /// Timeout in seconds.
    pub timeout_seconds: i64,
    /// Whether a result completes the run.
    #[serde(default)]
    pub terminal: bool,
    /// For an MCP tool, its pin's `sha256:<hex>` (`status.toolPins[]`): the approval's hash
    /// covers the pinned definition (docs/behaviours.md 65).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_sha256: Option<String>,
}

/// The most characters `spec.decision.note` holds (its schema's `maxLength`, counted in
/// characters as kube-apiserver does); the CLI refuses a longer `--note` before sending it.
pub const DECISION_NOTE_MAX_CHARS: usize = 4096;

/// A person's decision.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalDecision {
    /// `Approved` (run the request) or `Rejected` (end the run); on an
    /// `interrupted_side_effect` Approval also `TookEffect` (record `result` as the call's
    /// outcome, run nothing) or `DidNotTakeEffect` (record it not executed, run nothing).
    pub verdict: Verdict,
    /// Must equal `spec.hash` (the API server refuses anything else).
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub hash: String,
    /// Who decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<String>,
    /// Why; a rejection's note becomes the run's reasonDetail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = DECISION_NOTE_MAX_CHARS))]
    pub note: Option<String>,
    /// With `TookEffect` only (and required with it): the interrupted call's result as the
    /// tool would have answered it, a JSON object (typed for CEL, like `capability`). The
    /// engine records it as the step's `tool_result`, bounded as a tool's answer is
    /// (docs/design.md section 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub result: Option<Value>,
    /// With `Approved` on an `input_required` Approval only (and required there): the answer
    /// to the MCP server's request, a JSON object that must match the Approval's
    /// `presentation.requestedSchema`; it is sent to the server as an `accept` (an answer that
    /// does not match is sent as `decline`, saying why in the record; docs/design.md section 6,
    /// "MCP tasks").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub answer: Option<Value>,
}

/// The Approval's observed state, written by the controller.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalStatus {
    /// `Pending`, `Approved`, `Rejected`, `Expired`, `Executed`, `Cancelled`; only moves
    /// forward: from `Pending` to any other, from `Approved` to `Executed`, `Expired` or
    /// `Cancelled`, never back.
    #[serde(default)]
    pub phase: ApprovalPhase,
    /// Why it is `Cancelled`: its run ended (`run completed`, `run cancelled`, `run failed:
    /// <terminal reason>`), the step's call was refused on re-check (its observation kind), or
    /// a later Approval of the step superseded it (`superseded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// The first 12 hex characters of the hash, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_hash: Option<String>,
    /// When the decision was seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub decided_at: Option<Time>,
    /// When a pending approval expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub expires_at: Option<Time>,
    /// When the grant was executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub executed_at: Option<Time>,
}
