//! The `AgentRun` custom resource (docs/design.md section 2): its spec as a user writes it and its
//! status, which is the run's record and the source of truth (docs/design.md section 4).

// Each `printcolumn(...)` repeats `type_ = ...`; clippy reads the repeats as duplicates.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schema::{json_object, json_schema_object};
use super::status::AgentRunStatus;
use super::vocab::{PolicyOutcome, SideEffect, TextAnswer};

/// The desired run: a goal, the agent that decides, the tools it may call, a policy and limits.
///
/// `goal`, `agent` and `tools` are immutable after creation (CEL `self == oldSelf`); `policy`
/// and `limits` may change and apply at the next evaluation; `cancel` may only go false → true.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "agentrt.dev",
    version = "v1alpha1",
    kind = "AgentRun",
    plural = "agentruns",
    singular = "agentrun",
    namespaced,
    status = "AgentRunStatus",
    shortname = "ar",
    category = "agentrt",
    // `kubectl get ar --field-selector status.phase=Failed` (docs/design.md section 2).
    selectable = ".status.phase",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the run is"
    ),
    printcolumn(
        name = "Steps",
        type_ = "integer",
        json_path = ".status.stepCount",
        description = "Steps recorded"
    ),
    printcolumn(
        name = "Tool",
        type_ = "string",
        json_path = ".status.currentTool",
        description = "The tool of the current step"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "Why the run ended"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Holder",
        type_ = "string",
        json_path = ".status.lease.holder",
        description = "The replica that holds the run's lease",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.toolSets) || !has(self.tools) || self.toolSets.all(s, self.tools.all(t, t.name != s.name))", "message": "spec.toolSets[].name must differ from every spec.tools[].name"}
]))]
pub struct AgentRunSpec {
    /// What the agent should achieve, in words. Immutable.
    #[schemars(length(min = 1, max = 65536))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "spec.goal is immutable; create a new AgentRun to change it"}]))]
    pub goal: String,
    /// The agent that decides each step: exactly one of `scripted`, `openai`, `webhook`. Immutable.
    pub agent: AgentSpec,
    /// The tools the agent may call; names are unique. Immutable.
    #[serde(default)]
    #[schemars(length(max = 64))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "spec.tools is immutable; create a new AgentRun to change them"}]
    ))]
    pub tools: Vec<ToolSpec>,
    /// Many tools of one MCP server each, named `<set>__<server tool>` (docs/design.md
    /// section 6); names are unique and differ from the tools' names. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["name"],
        "x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "spec.toolSets is immutable; create a new AgentRun to change them"}]
    ))]
    pub tool_sets: Vec<super::mcp::ToolSet>,
    /// What may run without a person: outcome per side-effect class, then rules.
    #[serde(default)]
    pub policy: PolicySpec,
    /// Budgets checked before each step (docs/design.md section 6).
    #[serde(default)]
    pub limits: Limits,
    /// The consumer's hook asked after a takeover interrupted a step (docs/design.md section 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<ReconcileSpec>,
    /// How long a holder's lease lasts without renewal, in seconds (default 30).
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = 2, max = 3600))]
    pub lease_duration_seconds: i64,
    /// Set to true to cancel the run; may only go false → true.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self || !oldSelf", "message": "spec.cancel may only change from false to true"}]))]
    pub cancel: bool,
}

fn default_lease_duration_seconds() -> i64 {
    30
}

/// The agent of a run: exactly one of its fields is set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self == oldSelf", "message": "spec.agent is immutable; create a new AgentRun to change it"},
    {"rule": "(has(self.scripted) ? 1 : 0) + (has(self.openai) ? 1 : 0) + (has(self.webhook) ? 1 : 0) == 1", "message": "spec.agent must set exactly one of scripted, openai, webhook"}
]))]
pub struct AgentSpec {
    /// Decision i is `decisions[i]`: for tests, demos and fixed pipelines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripted: Option<ScriptedAgent>,
    /// An OpenAI-compatible chat-completions endpoint with tool calling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openai: Option<OpenAiAgent>,
    /// An HTTP endpoint that receives the run's record and returns the next decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookAgent>,
}

/// A fixed list of decisions, recorded verbatim as the agent's answers.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ScriptedAgent {
    /// Each item is a decision, a JSON object: `{kind: tool_call, tool, args}`,
    /// `{kind: complete, result}` or `{kind: fail, message}`. An item that is not an object
    /// (a string, number, boolean or null) is refused by the schema; an object is kept as
    /// written, so a malformed one (an unknown kind, a missing tool) is recorded verbatim and
    /// its step fails `invalid_decision`.
    #[schemars(schema_with = "decisions_schema")]
    pub decisions: Vec<Value>,
}

fn decisions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 10000,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// An OpenAI-compatible chat-completions agent.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OpenAiAgent {
    /// Base URL of the API, e.g. `https://api.openai.com/v1`.
    #[serde(rename = "baseURL")]
    #[schemars(length(min = 1))]
    pub base_url: String,
    /// Model name.
    #[schemars(length(min = 1))]
    pub model: String,
    /// The Secret key holding the API key (read at call time, never recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
    /// Output token cap per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_output_tokens: Option<i64>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// A system prompt placed before the goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// Prices in micros per million tokens, for the cost estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<ModelPrices>,
    /// How long one attempt may take, reply body included, in seconds (default 120). An
    /// attempt that gets no answer in time is charged its projection and tried again.
    #[serde(default = "default_model_timeout_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i64,
    /// The bytes a request's conversation is fitted into, as sent (default 262144, 256 KiB; at
    /// least 4096). The conversation is rendered from the run's whole history, sealed steps
    /// included: past this budget older tool results are cut to their summary first, then the
    /// oldest steps are left out with one line saying how many. The goal and the window's
    /// steps always stay whole, so a request whose goal and window alone pass the budget is
    /// sent whole, larger than this (docs/design.md section 4a; docs/behaviours.md 59).
    #[serde(default = "default_max_context_bytes")]
    #[schemars(range(min = 4096, max = 67108864))]
    pub max_context_bytes: i64,

    /// A reply with no tool call that ended normally (`finish_reason: stop`) with text:
    /// `Complete` (default) completes the run with `{text: ...}` as its result; `Invalid` makes
    /// it an `invalid_decision` (`no_tool_call`), so only `agentrt_complete` completes.
    #[serde(default)]
    pub text_answer: TextAnswer,
}

fn default_model_timeout_seconds() -> i64 {
    120
}

/// `spec.agent.openai.maxContextBytes` when not set: 256 KiB.
pub const DEFAULT_MAX_CONTEXT_BYTES: i64 = 256 * 1024;

fn default_max_context_bytes() -> i64 {
    DEFAULT_MAX_CONTEXT_BYTES
}

impl Default for OpenAiAgent {
    fn default() -> Self {
        OpenAiAgent {
            base_url: String::new(),
            model: String::new(),
            api_key_secret_ref: None,
            max_output_tokens: None,
            temperature: None,
            system_prompt: None,
            prices: None,
            timeout_seconds: default_model_timeout_seconds(),
            max_context_bytes: default_max_context_bytes(),
            text_answer: TextAnswer::default(),
        }
    }
}

/// Prices of a model, in micros (millionths of a currency unit) per million tokens.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ModelPrices {
    /// Per million input tokens.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub input_micros_per_million: i64,
    /// Per million cached input tokens.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub cached_input_micros_per_million: i64,
    /// Per million output tokens.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub output_micros_per_million: i64,
}

/// A reference to one key of a Secret in the run's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The key within it.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// An HTTP endpoint the runtime POSTs to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAgent {
    /// The URL (http or https).
    #[schemars(length(min = 1))]
    pub url: String,
    /// In seconds (default 30): how long the endpoint is asked in all, retries after a
    /// connection failure, a timeout, 408, 425, 429 or a 5xx included: for the webhook agent,
    /// one step's decision, counted from the step's start, before the run fails `agent_error`
    /// (docs/behaviours.md 66); for the reconcile hook, before it fails `internal_error`.
    #[serde(default = "default_webhook_timeout_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: i64,
}

fn default_webhook_timeout_seconds() -> i64 {
    30
}

/// A tool the agent may call, with exactly one executor: `http`, `mcp` or `job`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "(has(self.http) ? 1 : 0) + (has(self.mcp) ? 1 : 0) + (has(self.job) ? 1 : 0) == 1", "message": "spec.tools[] must set exactly one executor: http, mcp or job"},
    {"rule": "has(self.mcp) || has(self.inputSchema)", "message": "spec.tools[].inputSchema is required for an http or job tool (only an mcp tool may leave it out: its schema is the server's, pinned at start)"}
]))]
pub struct ToolSpec {
    /// Unique among the run's tools.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// What the tool does, shown to the agent.
    #[serde(default)]
    #[schemars(length(max = 8192))]
    pub description: String,
    /// The JSON Schema the args must pass. `$ref`, `$schema` and `$id` may only point inside it.
    /// Required for an `http` tool; an `mcp` tool may leave it out (JSON `null` here), its
    /// schema then being the server's, pinned at start (docs/design.md section 6).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    #[schemars(schema_with = "json_schema_object")]
    pub input_schema: Value,
    /// The tool's side-effect class.
    pub side_effect: SideEffect,
    /// How long one call may take, in seconds (default 30).
    #[serde(default = "default_tool_timeout_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: i64,
    /// A successful call completes the run with its content as the result.
    #[serde(default)]
    pub terminal: bool,
    /// The executor: POST the args as JSON to a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpTool>,
    /// The executor: call a tool of an MCP server (docs/design.md section 6).
    // Boxed so that a tool spec stays small inside the engine's calls; the shape is the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<Box<super::mcp::McpTool>>,
    /// The executor: run each call as a Kubernetes Job in the run's namespace
    /// (docs/design.md section 6, "Job tools"). Needs a cluster with nodes.
    // Boxed, as `mcp` is: the pod template is large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<Box<super::job::JobTool>>,
}

fn default_tool_timeout_seconds() -> i64 {
    30
}

/// The `http` executor of a tool (docs/design.md section 6).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpTool {
    /// The URL the args are POSTed to.
    #[schemars(length(min = 1))]
    pub url: String,
    /// Extra headers, each a literal value or a Secret key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HttpHeader>,
    /// How a call of this tool interrupted by a takeover is settled without a person, when the
    /// tool can tell (docs/design.md section 5, "a tool that answers by key"). Absent: an
    /// interrupted non-`ReadOnly` call pauses on an `interrupted_side_effect` Approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<HttpReconcile>,
}

/// What an `http` tool's owner declares it can say about a call after an interruption
/// (`spec.tools[].http.reconcile`, docs/design.md section 5).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpReconcile {
    /// `Honored`: a request repeated with the same `Idempotency-Key` returns the first
    /// outcome without repeating the effect, so an interrupted call is sent again with its key
    /// (no earlier than the first attempt's `mayRunUntil`). Default `NotHonored`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_keys: Option<IdempotencyKeys>,
    /// A URL template with `{key}` (replaced by the call's idempotency key, percent-encoded)
    /// that a GET asks what became of an interrupted call, before anything else: 200
    /// `{"state": "succeeded", "result": ...}` or `{"state": "failed", "error": ...}` settles
    /// the step; 404 means it never arrived, so it is sent (once, same key); 202 or
    /// `{"state": "running"}` means ask again with backoff within the tool's `timeoutSeconds`;
    /// anything else pauses on the Approval, showing what it said. Sent with the tool's
    /// headers; `http` or `https`.
    #[serde(default, rename = "statusURL", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub status_url: Option<String>,
}

/// Whether an `http` tool returns the first outcome for a request repeated with the same
/// `Idempotency-Key` (`spec.tools[].http.reconcile.idempotencyKeys`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum IdempotencyKeys {
    /// The tool's owner says nothing about repeated keys: an interrupted call is never sent
    /// again without someone who knows (the default).
    #[default]
    NotHonored,
    /// A repeated key returns the first outcome without repeating the effect (as the IETF
    /// Idempotency-Key draft, Stripe and Adyen specify).
    Honored,
}

/// One header of an `http` tool.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// A literal value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value from a Secret key in the run's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<SecretKeyRef>,
}

/// The policy: a default outcome per side-effect class, then rules (first match wins).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    /// Outcome per side-effect class when no rule matches.
    #[serde(default)]
    pub side_effects: SideEffectPolicy,
    /// Evaluated in order before the class default; the first match wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub rules: Vec<PolicyRule>,
}

/// The default outcome for each side-effect class.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct SideEffectPolicy {
    /// Default `Allow`.
    #[serde(rename = "ReadOnly", default = "allow")]
    pub read_only: PolicyOutcome,
    /// Default `Allow`.
    #[serde(rename = "LocalMutation", default = "allow")]
    pub local_mutation: PolicyOutcome,
    /// Default `RequireApproval`.
    #[serde(rename = "RemoteMutation", default = "require_approval")]
    pub remote_mutation: PolicyOutcome,
    /// Default `Deny`.
    #[serde(rename = "Destructive", default = "deny")]
    pub destructive: PolicyOutcome,
}

fn allow() -> PolicyOutcome {
    PolicyOutcome::Allow
}
fn require_approval() -> PolicyOutcome {
    PolicyOutcome::RequireApproval
}
fn deny() -> PolicyOutcome {
    PolicyOutcome::Deny
}

impl Default for SideEffectPolicy {
    fn default() -> Self {
        SideEffectPolicy {
            read_only: allow(),
            local_mutation: allow(),
            remote_mutation: require_approval(),
            destructive: deny(),
        }
    }
}

impl SideEffectPolicy {
    /// The default outcome for `class`.
    pub fn outcome(&self, class: SideEffect) -> PolicyOutcome {
        match class {
            SideEffect::ReadOnly => self.read_only,
            SideEffect::LocalMutation => self.local_mutation,
            SideEffect::RemoteMutation => self.remote_mutation,
            SideEffect::Destructive => self.destructive,
        }
    }
}

/// One policy rule.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// Names the rule in the record.
    #[schemars(length(min = 1, max = 128))]
    pub name: String,
    /// Tool name globs (`*`, `?`) the rule applies to; empty means every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tools: Vec<String>,
    /// A CEL expression over `tool` (string), `args` (the call's args) and `sideEffect`
    /// (string); the rule matches when it is true. Absent means always.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub when: Option<String>,
    /// What happens when the rule matches.
    pub outcome: PolicyOutcome,
    /// Why, shown in the record and on an Approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `RequireApproval`: the approval kind (default `policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// For `RequireApproval`: what the approval grants, as a JSON object (it becomes the
    /// Approval's `spec.capability`, which must be an object: docs/design.md section 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub capability: Option<Value>,
    /// For `RequireApproval`: what the approver is shown, as a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub presentation: Option<Value>,
}

/// Budgets of a run (docs/design.md section 6). Optional limits are off when absent.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Most steps a run may start (default 50).
    #[serde(default = "default_max_steps")]
    #[schemars(range(min = 1))]
    pub max_steps: i64,
    /// Most failures in a row: tool errors, denials, invalid decisions, interruptions (default 3).
    #[serde(default = "default_max_failures")]
    #[schemars(range(min = 1))]
    pub max_consecutive_tool_failures: i64,
    /// Identical tool-call steps in a row that count as a loop (default 3).
    #[serde(default = "default_loop_threshold")]
    #[schemars(range(min = 1))]
    pub loop_threshold: i64,
    /// Most model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_model_calls: Option<i64>,
    /// Most input + output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_total_tokens: Option<i64>,
    /// Output token cap per model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_output_tokens_per_call: Option<i64>,
    /// Most estimated cost, in micros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_estimated_cost_micros: Option<i64>,
    /// Most seconds spent deciding and executing (not waiting for approval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_active_seconds: Option<i64>,
    /// Most seconds from start to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_elapsed_seconds: Option<i64>,
    /// A pending Approval expires after this many seconds.
    #[serde(
        rename = "approvalTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub approval_ttl_seconds: Option<i64>,
    /// An approved, unexecuted grant expires this many seconds after its decision.
    #[serde(
        rename = "grantTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub grant_ttl_seconds: Option<i64>,
}

fn default_max_steps() -> i64 {
    50
}
fn default_max_failures() -> i64 {
    3
}
fn default_loop_threshold() -> i64 {
    3
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: default_max_steps(),
            max_consecutive_tool_failures: default_max_failures(),
            loop_threshold: default_loop_threshold(),
            max_model_calls: None,
            max_total_tokens: None,
            max_output_tokens_per_call: None,
            max_estimated_cost_micros: None,
            max_active_seconds: None,
            max_elapsed_seconds: None,
            approval_ttl_seconds: None,
            grant_ttl_seconds: None,
        }
    }
}

/// The consumer's reconcile hook.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileSpec {
    /// POSTed a RunView after a takeover interrupted a step; answers a Reconciliation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookAgent>,
}

/// A spec decoded by [`decode_spec`]: the spec, and the fields it had that no AgentRun has.
#[derive(Debug)]
pub struct DecodedSpec {
    /// The spec.
    pub spec: AgentRunSpec,
    /// Each field of the manifest the spec does not have, by its path (`spec.limits.maxStep`):
    /// what `kubectl apply` refuses as `strict decoding error: unknown field` (the API server
    /// prunes it when validation is off).
    pub unknown_fields: Vec<String>,
}

/// Decodes `spec` (an AgentRun's `spec`, as JSON) as [`AgentRunSpec`].
///
/// # Errors
/// When it does not decode: the message names the field by its path from `spec`
/// (`spec.limits.maxSteps: invalid type: string "ten", expected an integer`), as the API
/// server's schema check would.
pub fn decode_spec(spec: &serde_json::Value) -> Result<DecodedSpec, String> {
    let mut unknown_fields = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let decoded = {
        let tracked = serde_path_to_error::Deserializer::new(spec, &mut track);
        serde_ignored::deserialize(tracked, |path| {
            unknown_fields.push(format!("spec.{path}"));
        })
    };
    match decoded {
        Ok(spec) => Ok(DecodedSpec {
            spec,
            unknown_fields,
        }),
        Err(err) => {
            let path = track.path().to_string();
            let field = if path == "." || path.is_empty() {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            Err(format!("{field}: {}", in_api_words(&err.to_string())))
        }
    }
}

/// A serde message in the API's words: `expected i64` says `expected an integer`.
fn in_api_words(message: &str) -> String {
    let mut words = message.to_string();
    for (rust, api) in [
        ("expected i64", "expected an integer"),
        ("expected u64", "expected a non-negative integer"),
        ("expected i32", "expected an integer"),
        ("expected u32", "expected a non-negative integer"),
        ("expected usize", "expected a non-negative integer"),
        ("expected f64", "expected a number"),
        ("expected u8", "expected a small non-negative integer"),
    ] {
        words = words.replace(rust, api);
    }
    words
}
