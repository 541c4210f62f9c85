//! What the engine returns (docs/design.md section 7): a [`Transition`] for the executor (a
//! segment to seal, one status write, bookkeeping in order, exactly one [`Next`]) and an
//! [`Observed`] for a replica that is not executing the run (no call, no lease release).

use serde_json::Value;

use super::*;
use crate::api::{StepIndex, ToolSpec};

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
    /// Milliseconds to wait before sending, the lease checked after the wait: 0, except for a
    /// call sent again by its idempotency key after an interruption, which waits out the first
    /// attempt's `mayRunUntil` (docs/design.md section 5, "a tool that answers by key").
    pub delay_millis: u64,
    /// For a `job` tool, what the executor does with the step's Job ([`JobStage`]); `None` for
    /// an `http` or `mcp` tool.
    pub job: Option<JobStage>,
    /// For an `mcp` tool whose server created a task for this attempt (`step.task_created`
    /// is on the record): follow that task (`tasks/get`, then `tasks/result`) instead of
    /// sending `tools/call`; `None` for every other call (docs/design.md section 6, "MCP
    /// tasks").
    pub task: Option<McpTask>,
}

/// A task an MCP server created for a step's `tools/call` (the experimental Tasks of
/// revision 2025-11-25), as `step.task_created` records it: enough to find it again from
/// another replica (docs/design.md section 6, "MCP tasks").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpTask {
    /// The server's `taskId`.
    pub id: String,
    /// How often the server asks to be polled, in milliseconds (its `pollInterval`; 1000 when
    /// it gave none).
    pub poll_interval_millis: u64,
    /// The `Mcp-Session-Id` the task was created in (tasks belong to their session), if the
    /// server gave one.
    pub session: Option<String>,
    /// The protocol revision the session speaks (`2025-11-25`).
    pub protocol_version: String,
    /// The answer to the task's request for input a person decided on an `input_required`
    /// Approval, sent to the server before the task is followed on; `None` otherwise.
    pub reply: Option<TaskReply>,
}

/// The answer to an MCP task's request for input (`elicitation/create`), as the JSON-RPC
/// response the client sends in the task's session (docs/design.md section 6, "MCP tasks").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskReply {
    /// The server's JSON-RPC id of its request (a number or a string).
    pub request_id: Value,
    /// The response's `result`: `{"action": "accept", "content": {...}}` or
    /// `{"action": "decline"}`.
    pub result: Value,
}

/// An MCP task's request for input, as the server sent it on `tasks/result` (an
/// `elicitation/create`): it becomes an `input_required` Approval.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskInput {
    /// The task asking.
    pub task_id: String,
    /// The server's JSON-RPC id of the request, to answer it by.
    pub request_id: Value,
    /// What it asks, as the server wrote it (at most 4 KiB kept).
    pub message: String,
    /// The JSON Schema the answer must match (`requestedSchema`).
    pub requested_schema: Value,
}

/// The start of a [`ToolOutcome::Unknown`] detail saying a recorded MCP task can no longer be
/// followed (the server forgot it or its session, or it kept working past the tool's
/// timeout): then someone is asked, as for any interrupted call.
pub const TASK_LOST: &str = "task_lost";

/// What the executor does with a `job` tool's Job (docs/design.md section 6, "Job tools"). The
/// Job is named [`job_name`] and is the only one of the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStage {
    /// Create the Job (a Job of the name with the run's uid in its labels is adopted, one
    /// without is a conflict) and say so ([`Input::JobCreated`]).
    Create,
    /// Read the Job by its name: present and the run's, wait for its outcome
    /// ([`Input::ToolFinished`], after [`Input::JobCreated`] when `recorded` is false); absent
    /// and `recorded` (`step.job_created` is on the record), the outcome is unknown
    /// ([`ToolOutcome::Unknown`] whose detail starts with [`JOB_GONE`]); absent and not
    /// recorded, nothing started: create it as [`JobStage::Create`] does. The Job carries a
    /// finalizer until its outcome is on the record, so a created Job never looks absent.
    Resume {
        /// `step.job_created` is on the record for this attempt.
        recorded: bool,
    },
}

/// The start of a [`ToolOutcome::Unknown`] detail saying a Job recorded as created is gone.
pub const JOB_GONE: &str = "job_gone";

/// The name of the Job of `step`'s attempt `attempt` of the run with uid `uid`:
/// `agentrt-<uid>-<step>-<attempt>`, at most 63 characters for any uid Kubernetes assigns (36)
/// and any step and attempt below 10^8 (docs/design.md section 6, "Job tools").
pub fn job_name(uid: &str, step: StepIndex, attempt: i64) -> String {
    format!("agentrt-{uid}-{}-{attempt}", step.get())
}

/// Ask an `http` tool's `reconcile.statusURL` what became of an interrupted call
/// (docs/design.md section 5); the answer comes back as [`super::Input::ToolStatusAnswered`].
/// Asking changes nothing on the tool.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusQuery {
    /// The interrupted step.
    pub step: StepIndex,
    /// The tool as specified (its headers are sent with the GET).
    pub tool: ToolSpec,
    /// The status URL with `{key}` replaced by the percent-encoded idempotency key.
    pub url: String,
    /// The call's idempotency key (`<run uid>/<step>`), also sent as `Idempotency-Key`.
    pub idempotency_key: String,
    /// How long the executor may keep asking while the answer is 202 or `running`, in
    /// milliseconds: the tool's `timeoutSeconds`, counted from the first question.
    pub timeout_millis: u64,
    /// Milliseconds to wait before the first question: 0, or until the first attempt can no
    /// longer be running when a 404 came before then.
    pub delay_millis: u64,
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
        /// `status.phase` of the Approval as read, when it was read: with `resource_version`,
        /// the phase this write moves from, so the controller can tell a transition (a
        /// notification, the decision time) from a write that fills in a field.
        read_phase: Option<crate::api::ApprovalPhase>,
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
    /// Ask a tool's status URL about an interrupted call ([`StatusQuery`]).
    ToolStatus(StatusQuery),
}

impl ExternalCall {
    /// The step the call works on (`None` for the reconcile hook, which looks at the run).
    pub fn step(&self) -> Option<StepIndex> {
        match self {
            ExternalCall::Tool(call) => Some(call.step),
            ExternalCall::Agent { step, .. } => Some(*step),
            ExternalCall::Model(call) => Some(call.step),
            ExternalCall::ToolStatus(query) => Some(query.step),
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
