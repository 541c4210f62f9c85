//! The run state machine (docs/design.md sections 3-6, docs/behaviours.md 1-50): pure, synchronous, no
//! I/O, no clock of its own, no `kube`, no `async`.
//!
//! Two entry points, one per caller, each returning only what that caller may do:
//!
//! - [`observe`] (a replica that is not executing the run; a reconcile) returns an
//!   [`Observed`]: `write: Option<status>`, then `approvals: Vec<ApprovalWrite>`, then `next:
//!   ObserveNext` = `Nothing | AcquireLease { takeover } | RequeueAfter { millis }`. It has no
//!   call and no lease release: an observer never starts a side effect (docs/design.md section 5).
//!   After the lease is won, the executor calls [`step`] with [`Input::LeaseAcquired`].
//! - [`step`] (the executor, holding the lease) takes one [`Input`] and returns a
//!   [`Transition`]: `seal: Option<SegmentCreate>` (a segment to create first, when the write
//!   records a step's outcome and the window is due to seal: docs/design.md section 4a), then
//!   `write: Option<status>`, then `bookkeeping: Vec<Bookkeeping>`
//!   (`Approval(ApprovalWrite::Create | ApprovalWrite::Status)` in order, then `ReleaseLease`
//!   last and only before a stop), then exactly one `next: Next` = `Call(ExternalCall)` (`Tool
//!   | Agent | Model | ReconcileHook | ListTools`, whose outcome comes back as
//!   [`Input::ToolFinished`], [`Input::AgentAnswered`], [`Input::ModelAnswered`],
//!   [`Input::Reconciled`] or [`Input::ToolsListed`]) or `Stop`. `ListTools` (a new run with MCP
//!   tools, before anything is written) is the one call that follows no write: listing changes
//!   nothing on a server (docs/design.md section 6, pinning).
//!   One durable write between two external actions, never fewer (docs/design.md section 4).
//!
//! The write of either is a compare-and-set replace of the run's status on the
//! `resourceVersion` the snapshot was read at. On a conflict (409) the rest of the value is
//! dropped, the controller re-reads the run and its Approvals and asks again (the same input
//! for [`step`]); the engine re-decides from the fresh record (and stops if this replica is no
//! longer the recorded holder or the run ended).
//!
//! Both are pure functions of (run, approvals, caller, input): applying an input again to a
//! record that already holds its effect writes nothing twice and never starts a started step
//! again (guarantee 1); a step found `executing` by its own holder is left to a takeover.
//! [`Engine`] carries both as function pointers for a caller that wants a scripted engine.
//!
//! The rooms (each names the rules it holds in its `//!` header):
//! - `record`: the working copy of the status, events numbered without gaps, conditions, the
//!   one write a transition ends with and the object budget (docs/behaviours.md 49-50);
//! - `raw`: a record that will not decode (docs/behaviours.md 41);
//! - `observe`: the resume table for a replica that is not executing the run, and cancel
//!   (docs/behaviours.md 30, 42);
//! - `lease`: when another holder's Lease may be taken: seen unchanged for its duration plus a
//!   margin on the asking replica's monotonic clock, never by comparing clocks (docs/design.md
//!   section 4, docs/behaviours.md 30-31);
//! - `start`: a new run's first write (docs/behaviours.md 1-3), after listing its MCP servers
//!   and pinning their tools (docs/behaviours.md 60, 63); the run's tools everywhere are the
//!   effective ones of `pins::effective_tools` (`effective_run` below);
//! - `limits`: the limits before each step (docs/behaviours.md 4-6);
//! - `loop_`: starting steps and taking decisions (docs/behaviours.md 7-10);
//! - `model_calls`: model attempts, accounted by the `model` rules (docs/behaviours.md 45-48);
//!   what the model is asked is the `conversation` (no provider's shape; the provider's wire
//!   comes in through [`Budgets::model_wire`]), rendered from the whole history (the sealed
//!   steps the executor hands in as [`RunSnapshot::sealed`], then the window) and bounded by
//!   `maxContextBytes` (docs/design.md section 4a, docs/behaviours.md 59);
//! - `calls`: the policy and starting a tool (docs/behaviours.md 11-14);
//! - `outcome`: tool outcomes and late outcomes (docs/behaviours.md 15-18, 44);
//! - `approvals`: pauses and the Approval objects as the record's projection (docs/behaviours.md
//!   19, 26);
//! - `waiting`: a waiting run's latest Approval: missing, foreign, pending, rejected, expired
//!   or granted (docs/behaviours.md 23-25, 34-35);
//! - `grants`: executing a grant (docs/behaviours.md 21-22, 26);
//! - `takeover`: takeovers, interrupted steps, the reconcile hook (docs/behaviours.md 31-40);
//! - `projection`: Kubernetes Events derived from the journal.
//!
//! The rule modules `canonical`, `hash`, `validate`, `policy`, `content` and `model` hold the
//! pure functions the machine calls (canonical JSON and hashes, schema checks, the policy,
//! content budgets, model accounting).

pub mod agent_calls;
mod approvals;
pub mod archive;
mod calls;
pub mod canonical;
pub mod content;
pub mod conversation;
mod grants;
pub mod hash;
mod lease;
mod limits;
mod loop_;
pub mod model;
mod model_calls;
mod observe;
mod outcome;
pub mod pins;
pub mod policy;
mod projection;
mod raw;
mod record;
mod start;
mod takeover;
pub mod validate;
mod waiting;

#[cfg(test)]
mod tests;

use serde_json::Value;

use crate::api::{AgentRunSpec, RunPhase, StepIndex, Time, ToolFailure, ToolSpec};

pub use approvals::{approval_name, recorded_approvals, short_hash, status_write_version};
pub use lease::{lease_liveness, LeaseLiveness};
pub use observe::{
    first_write_precedes_any_call, is_new_run, is_unwritten_status, lease_release_needed,
    lease_watch_behind, observe_needed, observer_wait, slot_wait_unread, WatchBehind, WatchedView,
    LAG_CAP_MILLIS, LAG_CAP_PRESENT_MILLIS,
};
pub use projection::{
    decode_status, kube_events, KubeEventProjection, KubeEventType, STARTED_REASON,
};
pub use raw::spec_undecodable;
pub(crate) use record::encoded_len;
pub use takeover::INTERRUPTED_NOTICE;

/// How big things may get (docs/design.md section 3, guarantee 8), and the model provider's wire
/// the requests are measured in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budgets {
    /// Per-step content budget in bytes (canonical JSON); default 16 KiB.
    pub step_content_bytes: usize,
    /// The serialized AgentRun object's budget in bytes; default 1 MiB.
    pub object_bytes: usize,
    /// How a model request is rendered and encoded: the engine projects each attempt over the
    /// bytes this gives (docs/behaviours.md 46). Default [`conversation::ModelWire::NEUTRAL`];
    /// the controller hands in `agents::openai::WIRE`.
    pub model_wire: conversation::ModelWire,
    /// When and how much an executor's transition seals (docs/design.md section 4a; the
    /// controller's `--seal-steps`, `--seal-bytes`, `--keep-steps`). The window also keeps
    /// what the engine's loop detection and failure count look back on
    /// ([`archive::window_limits`]).
    pub seal: archive::SealLimits,
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            step_content_bytes: 16 * 1024,
            object_bytes: 1024 * 1024,
            model_wire: conversation::ModelWire::NEUTRAL,
            seal: archive::SealLimits::default(),
        }
    }
}

/// The run as stored: identity, spec, and the status exactly as read (it may not decode;
/// docs/design.md section 3, guarantee 7).
#[derive(Debug, Clone, PartialEq)]
pub struct RunSnapshot {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.generation` (copied to `observedGeneration`).
    pub generation: i64,
    /// The spec, decoded by the controller (the API server's schema makes a spec that does not
    /// decode unlikely; the controller logs such a run and leaves it alone). Shared: every
    /// snapshot of one generation holds the same decoded spec.
    pub spec: std::sync::Arc<AgentRunSpec>,
    /// The spec's length in bytes as the API server stores it ([`encoded_len`]): measured once
    /// when the run is read and kept across its status writes while the generation stays (a
    /// CRD upgrade that adds a default changes the served spec without a new generation; the
    /// few bytes are within the object margin until the run is read again). `None` when the
    /// snapshot was not read from an API server; the engine then measures the decoded spec.
    /// The object budget (docs/design.md section 3, guarantee 8) adds it to the status's length
    /// on every write, so measuring it once per read keeps a large spec off each step's path.
    pub spec_bytes: Option<usize>,
    /// The length in bytes of the stored object's `apiVersion`, `kind` and `metadata`
    /// ([`encoded_len`]), measured at each read and from each write's answer; 0 when the
    /// snapshot was not read from an API server. Counted in the object budget with the spec:
    /// a client-side `kubectl apply` keeps a copy of the whole spec in the
    /// `kubectl.kubernetes.io/last-applied-configuration` annotation, and managedFields grow
    /// with each manager.
    pub metadata_bytes: usize,
    /// `status` as stored; `Value::Null` when absent.
    pub status: Value,
    /// `status` decoded, when the caller holds it already: the record this replica's engine
    /// wrote in the transition whose write stored `status` ([`Transition::record`]), handed
    /// back so the next [`step`] does not decode `status` again (issue 15). `None`: the engine
    /// decodes `status`. When `Some`, it is exactly what decoding `status` gives (debug
    /// builds check it on every step); whoever changes `status` sets it to `None`.
    pub record: Option<std::sync::Arc<crate::api::AgentRunStatus>>,
    /// The run's creator, from its annotation [`CREATED_BY_ANNOTATION`] (set and checked by the
    /// chart's optional four-eyes admission policy). Copied onto each Approval as
    /// [`RUN_CREATED_BY_ANNOTATION`] so the policy can refuse that user's decision.
    pub created_by: Option<String>,
    /// The sealed steps the executor read from the run's segments (those
    /// [`archive::context_segments`] names, verified against `status.archive`), for an openai
    /// agent's conversation (docs/design.md section 4a); empty for every other agent and for an
    /// observer. Not part of what is stored on the AgentRun.
    pub sealed: archive::SealedHistory,
}

/// The AgentRun annotation naming the user who created it (the chart's four-eyes policy).
pub const CREATED_BY_ANNOTATION: &str = "agentrt.dev/created-by";

/// The Approval annotation carrying its run's creator (the chart's four-eyes policy).
pub const RUN_CREATED_BY_ANNOTATION: &str = "agentrt.dev/run-created-by";

/// One of the run's Approval objects as stored (whole object JSON; it may not decode).
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalSnapshot {
    /// `metadata.name`.
    pub name: String,
    /// The whole object as read (apiVersion, kind, metadata, spec, status).
    pub object: Value,
}

/// What the run's Lease object says, as read by the replica asking, and how long that replica
/// has seen it unchanged (docs/design.md section 4; judged by [`lease_liveness`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaseView {
    /// `spec.holderIdentity`, when the Lease exists and names one.
    pub holder: Option<String>,
    /// `spec.renewTime` (or acquireTime), when set: the holder's wall-clock time, recorded in
    /// `lease.taken_over` as `previousExpiry` (plus the duration) and never compared with the
    /// asking replica's clock.
    pub renewed_at: Option<Time>,
    /// `spec.leaseDurationSeconds`, when set.
    pub duration_seconds: Option<i64>,
    /// Milliseconds, on the asking replica's monotonic clock, since it first saw this Lease as
    /// it is now (same holder, renewTime and resourceVersion); 0 when first seen at this read.
    pub unchanged_for_ms: u64,
    /// Milliseconds of unchanged observation the asking replica requires beyond
    /// `leaseDurationSeconds` before it judges the Lease expired (`--lease-skew-margin-ms`).
    pub takeover_margin_ms: u64,
}

/// The replica calling the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// This process's holder identity (controller name + per-process random suffix).
    pub holder: String,
    /// The current time by this replica's clock.
    pub now: Time,
    /// This replica is shutting down gracefully: record what came back, start nothing new
    /// (no step, no tool), release the lease and stop (docs/design.md section 4: a stopping loop
    /// starts no further side effect, and must not record one as started).
    pub draining: bool,
    /// The admin policies (`AgentPolicy`, `ClusterAgentPolicy`) that select the run, as this
    /// replica read them for this call (docs/design.md section 6, admin policies): combined with
    /// the run's own policy at each decision, their ceilings lower its limits; `Unavailable`
    /// when they could not be read (every call then waits for a person).
    pub admin: std::sync::Arc<policy::admin::AdminPolicies>,
}

/// The previous holder a takeover replaces (recorded in `lease.taken_over`).
#[derive(Debug, Clone, PartialEq)]
pub struct PreviousHolder {
    /// Its identity (`None` when the Lease was absent).
    pub holder: Option<String>,
    /// When its Lease said it expires: renewTime + `leaseDurationSeconds`, by the previous
    /// holder's clock (recorded as `previousExpiry`; not what decided the takeover).
    pub expired_at: Option<Time>,
    /// By when, on the taking replica's wall clock, the previous holder had stopped starting
    /// side effects: when the taker first saw the Lease as it is now (its `now` minus
    /// [`LeaseView::unchanged_for_ms`]) plus `leaseDurationSeconds`. The holder starts nothing
    /// once its last acknowledged renewal, sent before the taker could see it, is a duration
    /// old on its own monotonic clock (docs/leases.md), so every attempt it started began
    /// before this moment. Recorded in `lease.taken_over` as `previousStoppedBy`, it bounds
    /// when an interrupted call's re-run may start (docs/design.md section 5). `None` when
    /// the Lease was not observed (a takeover applied again from the record).
    pub stopped_by: Option<Time>,
}

/// How a tool call ended, as the executor saw it (docs/design.md section 6).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    /// 2xx with JSON content.
    Result {
        /// HTTP status.
        status: u16,
        /// The answer.
        content: Value,
        /// Wall time of the call in milliseconds.
        duration_ms: u64,
    },
    /// The tool failed: non-2xx (body kept), content not JSON (`invalid_content`, bytes kept,
    /// base64 if not UTF-8), connection refused before sending, a panic around the call.
    Error {
        /// Why, as the record spells it (`http_status`, `invalid_content`, ...).
        failure: ToolFailure,
        /// HTTP status when there was one.
        status: Option<u16>,
        /// What to show the agent (the body as JSON, or a string).
        content: Value,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The request was sent and no answer came (timeout, lost connection): the outcome is
    /// unknown and is handled as an interruption (docs/design.md section 5).
    Unknown {
        /// What happened, for the record.
        detail: String,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
    /// The tool's answer asks to abort the run (`tool_abort`).
    Abort {
        /// Why, from the tool.
        detail: String,
        /// The answer.
        content: Value,
        /// Wall time in milliseconds.
        duration_ms: u64,
    },
}

/// Why one attempt of the webhook agent brought no decision (docs/design.md section 6;
/// docs/behaviours.md 66). [`agent_calls`] retries a transient one within
/// `spec.agent.webhook.timeoutSeconds`; anything else ends the run `agent_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFailure {
    /// A sentence naming the URL and what happened (recorded in `agent.failed` and, when the
    /// run ends, in its reasonDetail).
    pub detail: String,
    /// The HTTP status, `None` when no answer came (connection refused, timeout, lost
    /// connection).
    pub status: Option<u16>,
    /// Whether asking again may help: no answer, 408, 425, 429 or 5xx. Asking again is safe:
    /// nothing was executed.
    pub transient: bool,
    /// The server's `Retry-After` (or `retry-after-ms`), in milliseconds.
    pub retry_after_millis: Option<u64>,
}

impl From<String> for AgentFailure {
    /// A failure that is not retried.
    fn from(detail: String) -> AgentFailure {
        AgentFailure {
            detail,
            status: None,
            transient: false,
            retry_after_millis: None,
        }
    }
}

impl From<&str> for AgentFailure {
    /// A failure that is not retried.
    fn from(detail: &str) -> AgentFailure {
        AgentFailure::from(detail.to_string())
    }
}

/// How one model attempt ended, as the executor saw it (docs/design.md section 6; docs/behaviours.md
/// 45-48). Charged by [`model::charge`], retried by [`model::retry_plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum ModelOutcome {
    /// A 2xx reply, read by the decider (`agents::openai::parse_reply`) into the decision to
    /// record and the usage the reply reported.
    Answered {
        /// The decision (`{kind, tool, args}`, `{kind, tool, invalidArgs}`, `{kind: complete,
        /// result}`, `{kind: fail, message}`, or an invalid reply as `{kind: invalid, ...}`).
        decision: Value,
        /// The usage reported; `None` when the reply reported none.
        usage: Option<model::ReportedUsage>,
        /// Wall time in milliseconds.
        latency_ms: u64,
    },
    /// Any other HTTP answer: 408, 409, 425, 429 and 5xx are tried again, anything else ends
    /// the run `model_unavailable`.
    Failed {
        /// The HTTP status.
        status: u16,
        /// `Retry-After` (or `retry-after-ms`) in milliseconds, when the answer had one.
        retry_after_ms: Option<u64>,
        /// What happened, for the record.
        detail: String,
        /// Wall time in milliseconds.
        latency_ms: u64,
    },
    /// The request was sent and no answer came (timeout, lost connection): charged its
    /// projection and tried again.
    NoAnswer {
        /// What happened.
        detail: String,
        /// Wall time in milliseconds.
        latency_ms: u64,
    },
    /// Nothing was sent: charged nothing. A refused connection is tried again (`retryable`);
    /// an unusable endpoint or key ends the run `model_unavailable`.
    NotSent {
        /// What happened.
        detail: String,
        /// Whether sending again may help.
        retryable: bool,
    },
}

/// One input to the executor's state machine ([`step`]); a replica that is not executing the
/// run calls [`observe`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// This replica just won the run's Lease by compare-and-set (after
    /// [`ObserveNext::AcquireLease`]); `takeover` is set when it replaced a holder or an expired or
    /// absent Lease of a run that had already started.
    LeaseAcquired {
        /// Set for a takeover (docs/design.md section 4).
        takeover: Option<PreviousHolder>,
    },
    /// The agent answered (webhook/openai): the raw decision JSON, or why there is none.
    AgentAnswered {
        /// The step the decision is for.
        step: StepIndex,
        /// The decision as received, or why this attempt brought none (retried while
        /// transient and within the budget, else `agent_error`).
        decision: Result<Value, AgentFailure>,
    },
    /// A tool call of `step` ended.
    ToolFinished {
        /// The step.
        step: StepIndex,
        /// The attempt (`Agentrt-Attempt`) that ended.
        attempt: i64,
        /// How it ended.
        outcome: ToolOutcome,
    },
    /// A model attempt ([`ExternalCall::Model`]) ended.
    ModelAnswered {
        /// The step being decided.
        step: StepIndex,
        /// The attempt that ended.
        attempt: i64,
        /// How it ended.
        outcome: ModelOutcome,
    },
    /// The reconcile hook answered a Reconciliation (`{outcome, result, detail, pause}`), or
    /// failed after its retries.
    Reconciled {
        /// The answer JSON, or why there is none.
        answer: Result<Value, String>,
    },
    /// The lease was lost (a renewal found another holder, or it expired unrenewed): stop
    /// before the next side effect and record nothing as the step's outcome.
    LeaseLost,
    /// The servers of an [`ExternalCall::ListTools`] were listed (or not), one entry per
    /// server asked, in order.
    ToolsListed {
        /// Each server's listing.
        listings: Vec<ServerListing>,
    },
}

/// What one MCP server listed before `run.started` (docs/design.md section 6, pinning).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerListing {
    /// The server's URL, as [`ExternalCall::ListTools`] named it.
    pub url: String,
    /// The entries of `tools/list`'s `tools` arrays, every page in order; or why the server
    /// could not be listed (no header value in it), which fails the run `tool_unavailable`.
    pub tools: Result<Vec<Value>, String>,
}

/// A tool call to perform, after the write recording `step.tool_started` succeeded.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The step.
    pub step: StepIndex,
    /// 1 for the first start of this step, 2 after a granted re-run, ...
    pub attempt: i64,
    /// The tool as specified.
    pub tool: ToolSpec,
    /// The args to POST.
    pub args: Value,
    /// `<run uid>/<step>`: the same for every attempt of the step.
    pub idempotency_key: String,
    /// The pin of an `mcp` tool (`status.toolPins[]`): the executor lists the server first and
    /// sends `tools/call` only when [`pins::check`] says `Unchanged` (docs/behaviours.md 61).
    // Boxed, as `ToolSpec.mcp` is, so that a call stays small.
    pub pin: Option<Box<crate::api::ToolPin>>,
}

/// A write to one of the run's Approvals, asked by an executor or an observer.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalWrite {
    /// Create this Approval (whole object: metadata with name, namespace, ownerReferences,
    /// labels; spec). AlreadyExists is success (the name and hash are in the record).
    Create {
        /// The object.
        approval: Value,
    },
    /// Write this Approval's status (phase, reason, times, shortHash). The engine asks only
    /// for a phase that may follow the one it read ([`crate::api::ApprovalPhase::may_become`]);
    /// the write is conditional on `resource_version`, so a replica that read a stale Approval
    /// changes nothing (409), and without one (an Approval created in this transition) the
    /// controller reads it first and writes only a phase that may follow.
    Status {
        /// The Approval's name.
        name: String,
        /// The whole new `status`.
        status: Value,
        /// `metadata.resourceVersion` of the Approval as read, when it was read.
        resource_version: Option<String>,
        /// The `spec.hash` the record holds for it: an object found under this name with
        /// another hash (another run's, issue 16) is never written.
        hash: String,
    },
}

/// What an executor does after its status write landed and before its [`Next`], in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Bookkeeping {
    /// Create an Approval or write its status.
    Approval(ApprovalWrite),
    /// Release the run's Lease (the run is waiting for approval or ended). Always the last
    /// bookkeeping of a transition, and only when its [`Next`] is [`Next::Stop`].
    ReleaseLease,
}

/// A model attempt to send (see [`ExternalCall::Model`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCall {
    /// The step.
    pub step: StepIndex,
    /// 1, 2, ... per step; each retry is a new attempt.
    pub attempt: i64,
    /// The JSON body (goal, tool specs, steps), as for [`ExternalCall::Agent`].
    pub request: Value,
    /// The output cap to send (`maxOutputTokens`, or `maxOutputTokensPerCall`, the smaller).
    pub max_output_tokens: Option<i64>,
    /// How long to wait before sending, in milliseconds (a retry's backoff; 0 for a first
    /// attempt).
    pub delay_millis: u64,
}

/// The one external action a transition may end with; its outcome comes back as the next
/// [`Input`]. Started only if this replica's lease is unexpired by its own clock.
#[derive(Debug, Clone, PartialEq)]
pub enum ExternalCall {
    /// Call the tool; the outcome comes back as [`Input::ToolFinished`].
    Tool(ToolCall),
    /// Ask the run's webhook agent for step `step`'s decision, POSTing `request`; the answer
    /// comes back as [`Input::AgentAnswered`].
    Agent {
        /// The step.
        step: StepIndex,
        /// The JSON body (goal, tool specs, steps, approvals).
        request: Value,
        /// 1 for the first attempt of this step's decision, then 2, 3, ... (each failed one
        /// is in the journal as `agent.failed`).
        attempt: u32,
        /// How long to wait before sending, in milliseconds (a retry's backoff; 0 first).
        delay_millis: u64,
        /// How long this attempt may take once sent, in milliseconds: what is left of
        /// `spec.agent.webhook.timeoutSeconds` after the wait.
        timeout_millis: u64,
    },
    /// Ask the run's model (`spec.agent.openai`) for a step's decision: wait
    /// `delay_millis`, check the lease, then send `request`. The write before it recorded
    /// `model.dispatched` with this attempt's projection; the outcome comes back as
    /// [`Input::ModelAnswered`].
    Model(ModelCall),
    /// POST this RunView (run, steps, approvals) to the reconcile hook; the answer comes back
    /// as [`Input::Reconciled`].
    ReconcileHook {
        /// The JSON body.
        view: Value,
    },
    /// List these MCP servers' tools (`initialize`, `tools/list` through every page) before a
    /// new run starts, so the engine can pin them (docs/design.md section 6); the listings come
    /// back as [`Input::ToolsListed`]. Nothing was written before it and listing changes
    /// nothing on a server.
    ListTools {
        /// Each server once, with the headers to send (Secrets resolved by the executor).
        servers: Vec<crate::api::McpServer>,
    },
}

impl ExternalCall {
    /// The step the call works on (`None` for the reconcile hook, which looks at the run).
    pub fn step(&self) -> Option<StepIndex> {
        match self {
            ExternalCall::Tool(call) => Some(call.step),
            ExternalCall::Agent { step, .. } => Some(*step),
            ExternalCall::Model(call) => Some(call.step),
            ExternalCall::ReconcileHook { .. } | ExternalCall::ListTools { .. } => None,
        }
    }
}

/// How an executor transition ends.
// One per transition, moved once: boxing the call buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Make this one external call and feed its outcome back.
    Call(ExternalCall),
    /// The executor ends: the run is terminal, waiting, or no longer this replica's.
    Stop,
}

/// A sealed segment to create before a transition's status write (docs/design.md section 4a,
/// docs/behaviours.md 55-56).
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentCreate {
    /// `metadata.name`: `<run>-<index>-<first 10 hex of sha256>` ([`archive::segment_name`]).
    pub name: String,
    /// `sha256:<64 hex>` of the segment's spec ([`archive::segment_sha256`]); an object
    /// found under `name` is the same segment exactly when its spec hashes to this.
    pub sha256: String,
    /// The whole AgentRunSegment: apiVersion, kind, metadata (name, namespace, the run-uid
    /// label, an ownerReference to the run) and spec.
    pub object: Value,
}

/// What [`step`] returns to the executor: the protocol of the module doc as a type.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// Create this segment first, when the transition seals (docs/design.md section 4a): only
    /// with a `write`, which then drops the sealed steps and events and appends the segment to
    /// `status.archive`. AlreadyExists with a spec hashing to its `sha256` is success; another
    /// spec under the name is never overwritten, and the executor stops without writing.
    pub seal: Option<SegmentCreate>,
    /// The whole new `status`, to replace the stored one by compare-and-set on the
    /// `resourceVersion` the snapshot was read at; `None` when the record did not change. On a
    /// conflict (409) the bookkeeping and `next` are dropped, the run and its Approvals re-read
    /// and [`step`] asked again with the same input.
    pub write: Option<Value>,
    /// The record `write` encodes, decoded as it is (`None` without a write): once the write
    /// landed, the executor keeps it as the snapshot's [`RunSnapshot::record`] beside the
    /// status it sent.
    pub record: Option<std::sync::Arc<crate::api::AgentRunStatus>>,
    /// Performed in order after the write landed.
    pub bookkeeping: Vec<Bookkeeping>,
    /// Then exactly one of: an external call, or stop.
    pub next: Next,
}

impl Transition {
    /// Nothing to write, nothing to do: the executor ends.
    pub fn stop() -> Transition {
        Transition {
            seal: None,
            write: None,
            record: None,
            bookkeeping: Vec::new(),
            next: Next::Stop,
        }
    }
}

/// What an observer does last, after its write and Approval writes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ObserveNext {
    /// Nothing: the run's own changes (or the resync) wake the observer again.
    #[default]
    Nothing,
    /// The run needs a holder: win its Lease by compare-and-set, then start an executor that
    /// calls [`step`] with [`Input::LeaseAcquired`] carrying `takeover`.
    AcquireLease {
        /// Set when this acquisition is a takeover.
        takeover: Option<PreviousHolder>,
    },
    /// Look at the run again after this many milliseconds (an expiry, a lease to wait out).
    RequeueAfter {
        /// Milliseconds.
        millis: u64,
    },
}

/// What [`observe`] returns to a replica that is not executing the run: never a side effect,
/// never a lease release.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observed {
    /// The whole new `status` (cancel, expiry, rejection, a record that will not decode), by
    /// compare-and-set as for [`Transition::write`]; on a conflict the rest is dropped and the
    /// run observed again.
    pub write: Option<Value>,
    /// Approval writes (a missing recorded Approval recreated, a decided one projected), in
    /// order after the write landed.
    pub approvals: Vec<ApprovalWrite>,
    /// Then this.
    pub next: ObserveNext,
}

/// The engine's two entry points as one value, so the controller can be given a scripted
/// engine in its tests.
#[derive(Debug, Clone, Copy)]
pub struct Engine {
    /// [`step`], for the executor.
    pub step: StepFn,
    /// [`observe`], for a replica that is not executing the run.
    pub observe: ObserveFn,
}

/// The signature of [`step`].
pub type StepFn = fn(
    &RunSnapshot,
    &[ApprovalSnapshot],
    &Caller,
    &Budgets,
    Input,
) -> Result<Transition, EngineError>;

/// The signature of [`observe`].
pub type ObserveFn =
    fn(&RunSnapshot, &[ApprovalSnapshot], &Caller, &Budgets, &LeaseView) -> Observed;

impl Engine {
    /// This module's [`step`] and [`observe`].
    pub const PURE: Engine = Engine { step, observe };
}

/// Why the engine could not produce a transition. Every other failure becomes part of the
/// record (a failed step, an `internal_error` run), so this is only for a caller mistake.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The input does not fit the run (e.g. a tool outcome for a step that is not executing).
    #[error("AgentRun {namespace}/{name}: {detail}")]
    UnexpectedInput {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What did not fit.
        detail: String,
    },
}

/// Decides what `run` does next on `input`, for the replica executing it (holding, or just
/// winning, its Lease).
///
/// `approvals` are the run's Approval objects (label `agentrt.dev/run-uid=<uid>`), `caller` the
/// replica asking and its clock, `budgets` the size limits.
///
/// # Errors
/// [`EngineError::UnexpectedInput`] when the input cannot apply to the run as stored (the
/// controller re-reads and observes instead).
pub fn step(
    run: &RunSnapshot,
    approvals: &[ApprovalSnapshot],
    caller: &Caller,
    budgets: &Budgets,
    input: Input,
) -> Result<Transition, EngineError> {
    let mut stored = match &run.record {
        Some(record) => {
            debug_assert_eq!(
                record::decode(&run.status).as_ref(),
                Ok(&**record),
                "RunSnapshot::record is not the status decoded"
            );
            record.clone()
        }
        None => match record::decode(&run.status) {
            Ok(stored) => std::sync::Arc::new(stored),
            Err(detail) => return Ok(raw::undecodable_step(run, caller, &input, detail)),
        },
    };
    if let Input::ToolsListed { listings } = &input {
        // The pins go into the working record first, so that this very transition (the first
        // step's decision and call included) sees the pinned tools.
        if stored.phase == RunPhase::Pending && stored.tool_pins.is_empty() {
            if let Ok(pins) = start::pin_listings(&run.spec, listings) {
                std::sync::Arc::make_mut(&mut stored).tool_pins = pins;
            }
        }
    }
    // docs/design.md section 5, terminal runs: nothing. A journal holding `run.finished` ended the
    // run whatever `phase` says now (a status write by hand cannot bring a run back to life).
    if ended_by_journal(&stored) {
        return Ok(Transition::stop());
    }
    let effective = effective_run(run, &stored, caller);
    let run = effective.as_ref();
    let mut txn = record::Txn::new(run, approvals, caller, budgets, stored, true);
    match input {
        Input::LeaseLost => txn.stop(),
        input => executor_input(&mut txn, input)?,
    }
    Ok(txn.finish().into_transition())
}

/// Decides what a replica that is not executing `run` does with it (a reconcile; docs/design.md
/// section 5, the resume table): it may write (cancel, expiry, rejection, a record that will
/// not decode), create a missing Approval or project a decided one, ask for the lease, or
/// requeue; it never starts a side effect (docs/design.md section 5).
///
/// `lease` is the run's Lease as this replica read it and how long it has seen it unchanged;
/// the other arguments are as for [`step`].
pub fn observe(
    run: &RunSnapshot,
    approvals: &[ApprovalSnapshot],
    caller: &Caller,
    budgets: &Budgets,
    lease: &LeaseView,
) -> Observed {
    let stored = match record::decode(&run.status) {
        Ok(stored) => std::sync::Arc::new(stored),
        Err(detail) => return raw::undecodable_observe(run, caller, lease, detail),
    };
    if ended_by_journal(&stored) {
        return Observed::default();
    }
    let effective = effective_run(run, &stored, caller);
    let run = effective.as_ref();
    let mut txn = record::Txn::new(run, approvals, caller, budgets, stored, false);
    observe::observe(&mut txn, lease);
    txn.finish().into_observation()
}

/// The run with its effective tools in `spec.tools` ([`pins::effective_tools`]) and its
/// effective limits in `spec.limits` (lowered to the admin policies' ceilings,
/// [`policy::admin::effective_limits`]): the one accessor every rule reading the run's tools or
/// limits goes through (validation, policy, the agents' conversation, loop detection,
/// approvals, the limits). Borrowed as stored when neither changes anything.
fn effective_run<'a>(
    run: &'a RunSnapshot,
    stored: &crate::api::AgentRunStatus,
    caller: &Caller,
) -> std::borrow::Cow<'a, RunSnapshot> {
    let pinned = pins::needs_pins(&run.spec) && !stored.tool_pins.is_empty();
    let limits = policy::admin::effective_limits(&run.spec.limits, &caller.admin);
    if !pinned && matches!(limits, std::borrow::Cow::Borrowed(_)) {
        return std::borrow::Cow::Borrowed(run);
    }
    let limits = limits.into_owned();
    let mut run = run.clone();
    let spec = std::sync::Arc::make_mut(&mut run.spec);
    spec.limits = limits;
    if pinned {
        spec.tools = pins::effective_tools(spec, &stored.tool_pins);
    }
    std::borrow::Cow::Owned(run)
}

/// A journal holding `run.finished` under a phase that is not terminal (a status edited by
/// hand): the run ended all the same.
fn ended_by_journal(stored: &crate::api::AgentRunStatus) -> bool {
    !stored.phase.is_terminal()
        && stored
            .events
            .iter()
            .any(|e| e.type_ == crate::api::EventType::RunFinished)
}

/// An input from the executor (the replica holding, or just winning, the lease).
fn executor_input(txn: &mut record::Txn, input: Input) -> Result<(), EngineError> {
    // A listing comes back before the first write, when the record names no holder yet.
    let acquired = matches!(input, Input::LeaseAcquired { .. })
        || (matches!(input, Input::ToolsListed { .. }) && txn.status.phase == RunPhase::Pending);
    // Someone took the run over: this executor stops without writing (docs/behaviours.md 33).
    if !acquired && txn.holder() != Some(txn.caller.holder.as_str()) {
        txn.stop();
        return Ok(());
    }
    if txn.status.phase.is_terminal() {
        if let Input::ToolFinished {
            step,
            attempt,
            outcome,
        } = input
        {
            outcome::late(txn, step, attempt, outcome)?;
        }
        txn.release_and_stop();
        return Ok(());
    }
    // docs/behaviours.md 43: a live loop finds the cancellation at its next write.
    if txn.run.spec.cancel {
        observe::cancel(txn);
        // A tool that returned just now: its outcome comes after `run.finished` (44).
        if let Input::ToolFinished {
            step,
            attempt,
            outcome,
        } = input
        {
            outcome::late(txn, step, attempt, outcome)?;
        }
        txn.release_and_stop();
        return Ok(());
    }
    let phase = txn.status.phase;
    match input {
        Input::LeaseAcquired { takeover } => match phase {
            RunPhase::Pending => start::begin(txn),
            RunPhase::WaitingForApproval => waiting::waiting(txn),
            _ => takeover::take_over(txn, takeover),
        },
        Input::ToolsListed { listings } if phase == RunPhase::Pending => {
            start::listed(txn, listings)
        }
        _ if phase != RunPhase::Running => txn.release_and_stop(),
        Input::AgentAnswered { step, decision } => loop_::agent_answered(txn, step, decision)?,
        Input::ToolFinished {
            step,
            attempt,
            outcome,
        } => outcome::tool_finished(txn, step, attempt, outcome)?,
        Input::ModelAnswered {
            step,
            attempt,
            outcome,
        } => model_calls::answered(txn, step, attempt, outcome)?,
        Input::Reconciled { answer } => takeover::reconciled(txn, answer),
        Input::LeaseLost | Input::ToolsListed { .. } => txn.stop(),
    }
    Ok(())
}
