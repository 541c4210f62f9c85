//! The closed sets of docs/design.md sections 1-2, with exactly the spellings listed there.
//!
//! Values a user writes in a spec, and phases, conditions and verdicts follow the Kubernetes
//! conventions (CamelCase). The run's record keeps the vocabulary's snake_case spellings for
//! step statuses, decision and observation kinds, terminal reasons, event types and tool and
//! decider failures (a condition's reason is the terminal reason in CamelCase). A golden
//! test (`tests/api_spellings.rs`) pins every spelling.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The side-effect class of a tool, set by whoever writes the manifest (docs/design.md section 1).
#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord,
)]
pub enum SideEffect {
    /// Reads only; safe to run again after an interruption.
    ReadOnly,
    /// Changes state local to the agent's environment.
    LocalMutation,
    /// Changes state in a remote system (a refund, an email).
    RemoteMutation,
    /// Destroys something.
    Destructive,
}

impl SideEffect {
    /// Every class, in the order docs/design.md lists them.
    pub const ALL: [SideEffect; 4] = [
        SideEffect::ReadOnly,
        SideEffect::LocalMutation,
        SideEffect::RemoteMutation,
        SideEffect::Destructive,
    ];

    /// The spelling used in manifests and in the record (`ReadOnly`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::ReadOnly => "ReadOnly",
            SideEffect::LocalMutation => "LocalMutation",
            SideEffect::RemoteMutation => "RemoteMutation",
            SideEffect::Destructive => "Destructive",
        }
    }
}

/// What the openai agent makes of a reply with no tool call that ended normally
/// (`finish_reason: stop`) with text (`spec.agent.openai.textAnswer`; docs/design.md section 6,
/// docs/behaviours.md 72).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum TextAnswer {
    /// The text is the final answer: the run completes with `{text: ...}` as its result (the
    /// default, the chat-completions ecosystem's convention).
    #[default]
    Complete,
    /// The reply is an `invalid_decision` (`no_tool_call`): only `agentrt_complete` completes.
    Invalid,
}

/// What a policy says about a proposed tool call, as written in a spec (`spec.policy`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PolicyOutcome {
    /// Run the tool.
    Allow,
    /// Do not run it; the agent sees a `policy_denied` observation and the loop continues.
    Deny,
    /// Fail the run `policy_abort`.
    Abort,
    /// Pause on an Approval a person decides.
    RequireApproval,
}

/// The phase of an AgentRun (`status.phase`). A run never shows an interrupted phase: an
/// interrupted run stays `Running` until a replica takes it over (docs/design.md section 2).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RunPhase {
    /// Created, not yet started by a controller.
    #[default]
    Pending,
    /// A controller holds (or held) its lease and runs its loop.
    Running,
    /// Paused on an Approval; no lease is held.
    WaitingForApproval,
    /// Ended `goal_completed` (terminal).
    Completed,
    /// Ended with a failure reason (terminal).
    Failed,
    /// Ended `operator_cancelled`, `approval_rejected` or `approval_expired` (terminal).
    Cancelled,
}

impl RunPhase {
    /// Completed, Failed and Cancelled never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunPhase::Completed | RunPhase::Failed | RunPhase::Cancelled
        )
    }
}

/// A step's status in the record (docs/design.md section 1).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    /// The agent is being asked for a decision.
    Deciding,
    /// Paused on an Approval.
    AwaitingApproval,
    /// The tool call was started (`step.tool_started` is recorded).
    Executing,
    /// Finished with a tool result (or a completing decision).
    Done,
    /// Finished without a result: tool error, denial, invalid decision, cancel.
    Failed,
    /// Its process stopped while it was deciding or executing; its outcome is unknown.
    Interrupted,
}

/// The kind of a decision the agent returned (docs/design.md section 1). The record keeps the kind
/// verbatim as a string, because an agent may return an unknown or missing one.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Call a tool with args.
    ToolCall,
    /// The goal is reached; `result` is the run's result.
    Complete,
    /// The agent gives up; `message` is the detail.
    Fail,
}

impl DecisionKind {
    /// Parses the recorded spelling; `None` for anything else.
    pub fn parse(kind: &str) -> Option<DecisionKind> {
        match kind {
            "tool_call" => Some(DecisionKind::ToolCall),
            "complete" => Some(DecisionKind::Complete),
            "fail" => Some(DecisionKind::Fail),
            _ => None,
        }
    }
}

/// What the agent sees next (docs/design.md section 1).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ObservationKind {
    /// The tool answered 2xx with JSON.
    ToolResult,
    /// The tool failed (non-2xx, refused connection, content not JSON, ...).
    ToolError,
    /// The policy denied the call (or a person rejected it).
    PolicyDenied,
    /// The decision could not be used (unknown kind or tool, args failing the schema, ...).
    InvalidDecision,
    /// The step's process stopped; content names the status it was in.
    Interrupted,
}

/// The policy's decision in the record (`step.policy` events), snake_case.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum PolicyDecisionKind {
    /// Run the tool.
    Allow,
    /// Fail the step with `policy_denied`.
    Deny,
    /// Fail the run `policy_abort`.
    Abort,
    /// Pause on an Approval.
    RequireApproval,
}

impl From<PolicyOutcome> for PolicyDecisionKind {
    fn from(outcome: PolicyOutcome) -> Self {
        match outcome {
            PolicyOutcome::Allow => PolicyDecisionKind::Allow,
            PolicyOutcome::Deny => PolicyDecisionKind::Deny,
            PolicyOutcome::Abort => PolicyDecisionKind::Abort,
            PolicyOutcome::RequireApproval => PolicyDecisionKind::RequireApproval,
        }
    }
}

/// Why a run ended (`status.reason`, docs/design.md section 1).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum TerminalReason {
    GoalCompleted,
    GoalFailed,
    LimitSteps,
    LimitModelCalls,
    LimitTokens,
    LimitCost,
    LimitActiveTime,
    LimitElapsedTime,
    ApprovalExpired,
    ModelUnavailable,
    RepeatedToolFailures,
    LoopDetected,
    PolicyAbort,
    ToolAbort,
    ApprovalRejected,
    OperatorCancelled,
    ReconcileConflict,
    AgentError,
    InternalError,
    RecordTooLarge,
    /// An MCP server could not be listed at start, or does not list a spec'd tool
    /// (docs/design.md section 6, docs/behaviours.md 63).
    ToolUnavailable,
    /// The spec cannot become a run's tools: a toolset's expansion failed (an invalid or
    /// repeated name, an override naming no included tool).
    InvalidSpec,
}

impl TerminalReason {
    /// The phase a run ending with this reason takes.
    pub fn phase(self) -> RunPhase {
        match self {
            TerminalReason::GoalCompleted => RunPhase::Completed,
            TerminalReason::OperatorCancelled
            | TerminalReason::ApprovalRejected
            | TerminalReason::ApprovalExpired => RunPhase::Cancelled,
            _ => RunPhase::Failed,
        }
    }

    /// The `reason` of the run's `Ready` condition when it ended this way: the same word in
    /// CamelCase (`goal_completed` is `GoalCompleted`), as the Kubernetes API conventions ask
    /// of a condition's reason (docs/design.md section 1); `status.reason` keeps snake_case.
    pub fn condition_reason(self) -> &'static str {
        match self {
            TerminalReason::GoalCompleted => "GoalCompleted",
            TerminalReason::GoalFailed => "GoalFailed",
            TerminalReason::LimitSteps => "LimitSteps",
            TerminalReason::LimitModelCalls => "LimitModelCalls",
            TerminalReason::LimitTokens => "LimitTokens",
            TerminalReason::LimitCost => "LimitCost",
            TerminalReason::LimitActiveTime => "LimitActiveTime",
            TerminalReason::LimitElapsedTime => "LimitElapsedTime",
            TerminalReason::ApprovalExpired => "ApprovalExpired",
            TerminalReason::ModelUnavailable => "ModelUnavailable",
            TerminalReason::RepeatedToolFailures => "RepeatedToolFailures",
            TerminalReason::LoopDetected => "LoopDetected",
            TerminalReason::PolicyAbort => "PolicyAbort",
            TerminalReason::ToolAbort => "ToolAbort",
            TerminalReason::ApprovalRejected => "ApprovalRejected",
            TerminalReason::OperatorCancelled => "OperatorCancelled",
            TerminalReason::ReconcileConflict => "ReconcileConflict",
            TerminalReason::AgentError => "AgentError",
            TerminalReason::InternalError => "InternalError",
            TerminalReason::RecordTooLarge => "RecordTooLarge",
            TerminalReason::ToolUnavailable => "ToolUnavailable",
            TerminalReason::InvalidSpec => "InvalidSpec",
        }
    }
}

/// The type of an event in the run's audit journal (`status.events[].type`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    #[serde(rename = "run.created")]
    RunCreated,
    #[serde(rename = "run.started")]
    RunStarted,
    #[serde(rename = "step.started")]
    StepStarted,
    #[serde(rename = "step.decided")]
    StepDecided,
    #[serde(rename = "step.policy")]
    StepPolicy,
    #[serde(rename = "step.tool_started")]
    StepToolStarted,
    /// A `job` tool's Job was created (or found after a takeover) for an attempt: {job, uid,
    /// attempt} (docs/design.md section 6, "Job tools").
    #[serde(rename = "step.job_created")]
    StepJobCreated,
    /// An `mcp` tool's server created a task for an attempt's `tools/call`: {taskId,
    /// pollIntervalMillis, session, protocolVersion, attempt} (docs/design.md section 6, "MCP
    /// tasks").
    #[serde(rename = "step.task_created")]
    StepTaskCreated,
    /// The answer to an MCP task's request for input was decided and is sent to the server:
    /// {approval, taskId, requestId, action (`accept` or `decline`), violations (why an answer
    /// that did not match the requested schema was declined)} (docs/design.md section 6, "MCP
    /// tasks").
    #[serde(rename = "step.input_answered")]
    StepInputAnswered,
    #[serde(rename = "step.tool_finished")]
    StepToolFinished,
    #[serde(rename = "step.failed")]
    StepFailed,
    #[serde(rename = "step.interrupted")]
    StepInterrupted,
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    #[serde(rename = "approval.decided")]
    ApprovalDecided,
    #[serde(rename = "run.resumed")]
    RunResumed,
    #[serde(rename = "lease.taken_over")]
    LeaseTakenOver,
    #[serde(rename = "limit.exceeded")]
    LimitExceeded,
    #[serde(rename = "loop.detected")]
    LoopDetected,
    #[serde(rename = "model.dispatched")]
    ModelDispatched,
    #[serde(rename = "model.completed")]
    ModelCompleted,
    #[serde(rename = "model.failed")]
    ModelFailed,
    /// An attempt of the webhook agent that brought no decision ({attempt, status, error,
    /// transient, retryAfterMs, retryInMs}; docs/behaviours.md 66).
    #[serde(rename = "agent.failed")]
    AgentFailed,
    /// An MCP tool's definition pinned before `run.started` ({tool, sha256}; docs/behaviours.md
    /// 60).
    #[serde(rename = "tool.pinned")]
    ToolPinned,
    /// The spec of a live run was edited: {generation, fields: ["spec.policy", ...]}, in the
    /// first write after the edit (docs/behaviours.md 73).
    #[serde(rename = "spec.changed")]
    SpecChanged,
    #[serde(rename = "run.finished")]
    RunFinished,
}

/// Why a tool call failed (`engine::ToolOutcome::Error`), recorded as the `failure` of the
/// step's `tool_error` observation (docs/design.md section 6).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum ToolFailure {
    /// A non-2xx answer (its body kept).
    HttpStatus,
    /// A 2xx answer that is not JSON (bytes kept, base64 if not UTF-8).
    InvalidContent,
    /// The connection was refused before anything was sent.
    ConnectionRefused,
    /// The args could not be encoded for the request.
    InvalidArgs,
    /// The request could not be built (the tool's URL or a header).
    InvalidRequest,
    /// The answer was over the size the executor reads.
    ResponseTooLarge,
    /// The executor panicked around the call.
    ExecutorPanic,
    /// The tool names no executor this controller has.
    NoExecutor,
    /// A header the call needs (a Secret's value) could not be read.
    HeaderUnavailable,
    /// The MCP server's definition of the tool is not the pinned one (or it lists the tool no
    /// more): the call was not sent (docs/behaviours.md 61).
    DefinitionChanged,
    /// The MCP tool answered `isError: true` (docs/behaviours.md 63).
    ToolReportedError,
    /// The MCP server answered `tools/call` with a JSON-RPC error {code, message}.
    McpError,
    /// A `job` tool's Job failed (its condition and the container's termination message
    /// kept), or was deleted because the run was cancelled (`onCancel: Delete`).
    JobFailed,
}

impl ToolFailure {
    /// Every value, in the order above.
    pub const ALL: [ToolFailure; 13] = [
        ToolFailure::HttpStatus,
        ToolFailure::InvalidContent,
        ToolFailure::ConnectionRefused,
        ToolFailure::InvalidArgs,
        ToolFailure::InvalidRequest,
        ToolFailure::ResponseTooLarge,
        ToolFailure::ExecutorPanic,
        ToolFailure::NoExecutor,
        ToolFailure::HeaderUnavailable,
        ToolFailure::DefinitionChanged,
        ToolFailure::ToolReportedError,
        ToolFailure::McpError,
        ToolFailure::JobFailed,
    ];

    /// The spelling in the record (`http_status`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolFailure::HttpStatus => "http_status",
            ToolFailure::InvalidContent => "invalid_content",
            ToolFailure::ConnectionRefused => "connection_refused",
            ToolFailure::InvalidArgs => "invalid_args",
            ToolFailure::InvalidRequest => "invalid_request",
            ToolFailure::ResponseTooLarge => "response_too_large",
            ToolFailure::ExecutorPanic => "executor_panic",
            ToolFailure::NoExecutor => "no_executor",
            ToolFailure::HeaderUnavailable => "header_unavailable",
            ToolFailure::DefinitionChanged => "definition_changed",
            ToolFailure::ToolReportedError => "tool_reported_error",
            ToolFailure::McpError => "mcp_error",
            ToolFailure::JobFailed => "job_failed",
        }
    }

    /// The value spelled `word`, if any.
    pub fn parse(word: &str) -> Option<ToolFailure> {
        Self::ALL.into_iter().find(|v| v.as_str() == word)
    }
}

impl std::fmt::Display for ToolFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a decider's answer holds no usable decision: the `failure` of a recorded `{kind:
/// invalid, failure, ...}` decision, named again in the step's `invalid_decision` observation
/// (docs/behaviours.md 8).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum DeciderFailure {
    /// The reply has no function call.
    NoToolCall,
    /// The reply stopped at its output cap (`finish_reason: length`).
    Truncated,
    /// The body is not a chat completion, or a built-in call's arguments are not usable.
    Unparseable,
    /// The answer is JSON the Kubernetes API cannot store exactly (nesting past 100 levels, an
    /// integer outside int64, a number outside float64).
    Unstorable,
}

impl DeciderFailure {
    /// Every value, in the order above.
    pub const ALL: [DeciderFailure; 4] = [
        DeciderFailure::NoToolCall,
        DeciderFailure::Truncated,
        DeciderFailure::Unparseable,
        DeciderFailure::Unstorable,
    ];

    /// The spelling in the record (`no_tool_call`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DeciderFailure::NoToolCall => "no_tool_call",
            DeciderFailure::Truncated => "truncated",
            DeciderFailure::Unparseable => "unparseable",
            DeciderFailure::Unstorable => "unstorable",
        }
    }

    /// The value spelled `word`, if any.
    pub fn parse(word: &str) -> Option<DeciderFailure> {
        Self::ALL.into_iter().find(|v| v.as_str() == word)
    }
}

impl std::fmt::Display for DeciderFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An Approval's phase (`status.phase`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ApprovalPhase {
    /// Waiting for a person.
    #[default]
    Pending,
    /// Decided Approved and not yet executed: a grant.
    Approved,
    /// Decided Rejected.
    Rejected,
    /// Past `expiresAt` undecided, or a grant past grantTTLSeconds.
    Expired,
    /// The grant was executed (at most once).
    Executed,
    /// A `TookEffect` or `DidNotTakeEffect` decision on an `interrupted_side_effect` Approval
    /// was recorded as its step's outcome; nothing ran (docs/design.md section 5).
    Settled,
    /// It can no longer grant: its run ended, the policy or the schema refused the call on
    /// re-check, or a later Approval of the step superseded it (`status.reason` says which).
    Cancelled,
}

impl ApprovalPhase {
    /// Whether an Approval's status may move from `self` to `next` (docs/design.md section 2: a
    /// phase only moves forward). Pending → any other phase; Approved → Executed, Settled,
    /// Expired or Cancelled; Rejected, Expired, Executed, Settled and Cancelled are final.
    /// Writing the same phase
    /// again (to fill in a time or the short hash) is allowed.
    pub fn may_become(self, next: ApprovalPhase) -> bool {
        use ApprovalPhase::*;
        match (self, next) {
            (a, b) if a == b => true,
            (Pending, _) => true,
            (Approved, Executed | Settled | Expired | Cancelled) => true,
            _ => false,
        }
    }
}

/// What a person decided on an Approval (`spec.decision.verdict`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Run the request the hash names.
    Approved,
    /// Do not; the run ends `approval_rejected`.
    Rejected,
    /// Only on an `interrupted_side_effect` Approval: the interrupted call took effect;
    /// `spec.decision.result` (a JSON object) is recorded as its outcome, checked as a tool's
    /// result is, and the run goes on without running it (docs/design.md section 5).
    TookEffect,
    /// Only on an `interrupted_side_effect` Approval: the interrupted call did not take
    /// effect; the step is recorded as not executed, the agent sees that and decides again.
    DidNotTakeEffect,
}

/// The approval kind the controller uses for a side effect whose outcome is unknown.
pub const INTERRUPTED_SIDE_EFFECT: &str = "interrupted_side_effect";

/// The approval kind of an MCP task that asks for input (`input_required`, an
/// `elicitation/create` of its server): the decision's `answer` is sent back to the server as
/// the answer (docs/design.md section 6, "MCP tasks").
pub const INPUT_REQUIRED: &str = "input_required";

/// The approval kind of a call whose policy rule's `when` failed on its args (a missing key, a
/// wrong type): a person decides it (docs/behaviours.md 12).
pub const POLICY_ERROR: &str = "policy_error";
