//! What the engine's callers hand in (docs/design.md section 7): the run as read
//! ([`RunSnapshot`]) with its Approvals, who is asking and when ([`Caller`], [`LeaseView`]), the
//! [`Input`] of a step and the outcomes of the calls it made, and the size limits
//! ([`Budgets`]).

use serde_json::Value;

use super::{archive, conversation, model, policy};
use crate::api::{AgentRunSpec, StepIndex, Time, ToolFailure};

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
    /// The spec's length in bytes as the API server stores it ([`super::encoded_len`]): measured once
    /// when the run is read and kept across its status writes while the generation stays (a
    /// CRD upgrade that adds a default changes the served spec without a new generation; the
    /// few bytes are within the object margin until the run is read again). `None` when the
    /// snapshot was not read from an API server; the engine then measures the decoded spec.
    /// The object budget (docs/design.md section 3, guarantee 8) adds it to the status's length
    /// on every write, so measuring it once per read keeps a large spec off each step's path.
    pub spec_bytes: Option<usize>,
    /// The length in bytes of the stored object's `apiVersion`, `kind` and `metadata`
    /// ([`super::encoded_len`]), measured at each read and from each write's answer; 0 when the
    /// snapshot was not read from an API server. Counted in the object budget with the spec:
    /// a client-side `kubectl apply` keeps a copy of the whole spec in the
    /// `kubectl.kubernetes.io/last-applied-configuration` annotation, and managedFields grow
    /// with each manager.
    pub metadata_bytes: usize,
    /// `status` as stored; `Value::Null` when absent.
    pub status: Value,
    /// `status` decoded, when the caller holds it already: the record this replica's engine
    /// wrote in the transition whose write stored `status` ([`super::Transition::record`]), handed
    /// back so the next [`super::step`] does not decode `status` again (issue 15). `None`: the engine
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
/// has seen it unchanged (docs/design.md section 4; judged by [`super::lease_liveness`]).
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

/// What a tool's `reconcile.statusURL` said of an interrupted call, as the executor read it
/// (docs/design.md section 5, "a tool that answers by key").
#[derive(Debug, Clone, PartialEq)]
pub enum StatusAnswer {
    /// 200 `{"state": "succeeded", "result": ...}`: the call took effect with this result.
    Succeeded {
        /// `result` as answered (`null` when absent).
        result: Value,
    },
    /// 200 `{"state": "failed", "error": ...}`: the call arrived and failed.
    Failed {
        /// `error` as answered (`null` when absent).
        error: Value,
    },
    /// 404: the call never arrived; it may be sent (once, with the same key).
    NotFound,
    /// Anything else (another status, unusable JSON, still running when the tool's
    /// `timeoutSeconds` ran out, no answer): the step pauses on the Approval, which shows this.
    Unsettled {
        /// `{status, body}` (the body bounded to 1 KiB) or `{error}`: what the URL said.
        said: Value,
    },
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
/// docs/behaviours.md 66). [`super::agent_calls`] retries a transient one within
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

/// One input to the executor's state machine ([`super::step`]); a replica that is not executing the
/// run calls [`super::observe`] instead.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// This replica just won the run's Lease by compare-and-set (after
    /// [`super::ObserveNext::AcquireLease`]); `takeover` is set when it replaced a holder or an expired or
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
    /// A model attempt ([`super::ExternalCall::Model`]) ended.
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
    /// A `job` tool's Job was created, or found ([`super::JobStage`]); `job` is its uid, or
    /// why a Job of its name is not the run's (a conflict: the run ends `reconcile_conflict`).
    JobCreated {
        /// The step.
        step: StepIndex,
        /// The attempt the Job runs.
        attempt: i64,
        /// The Job's name.
        name: String,
        /// The Job's uid, or why the Job of that name cannot be the run's.
        job: Result<String, String>,
    },
    /// An `mcp` tool's server created a task for the call ([`super::McpTask`]): it is recorded
    /// (`step.task_created`) and followed.
    TaskCreated {
        /// The step.
        step: StepIndex,
        /// The attempt whose `tools/call` created it.
        attempt: i64,
        /// The task.
        task: super::McpTask,
    },
    /// A followed MCP task asks for input ([`super::TaskInput`]): the step pauses on an
    /// `input_required` Approval.
    TaskInputRequired {
        /// The step.
        step: StepIndex,
        /// The attempt whose task asks.
        attempt: i64,
        /// What it asks.
        input: super::TaskInput,
    },
    /// A tool's status URL answered about an interrupted call ([`super::StatusQuery`]).
    ToolStatusAnswered {
        /// The interrupted step asked about.
        step: StepIndex,
        /// What the status URL said.
        answer: StatusAnswer,
    },
    /// The lease was lost (a renewal found another holder, or it expired unrenewed): stop
    /// before the next side effect and record nothing as the step's outcome.
    LeaseLost,
    /// The servers of an [`super::ExternalCall::ListTools`] were listed (or not), one entry per
    /// server asked, in order.
    ToolsListed {
        /// Each server's listing.
        listings: Vec<ServerListing>,
    },
}

/// What one MCP server listed before `run.started` (docs/design.md section 6, pinning).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerListing {
    /// The server's URL, as [`super::ExternalCall::ListTools`] named it.
    pub url: String,
    /// The entries of `tools/list`'s `tools` arrays, every page in order; or why the server
    /// could not be listed (no header value in it), which fails the run `tool_unavailable`.
    pub tools: Result<Vec<Value>, String>,
    /// The protocol revision the listing was made in (recorded in each of its tools' pins),
    /// when known.
    pub protocol: Option<String>,
    /// Who the server said it is (`{name, version}`), recorded in each of its tools' pins.
    pub server_info: Option<Value>,
}
