//! The `job` executor of a tool (`spec.tools[].job`, docs/design.md section 6, "Job tools"):
//! each call a Kubernetes Job in the run's namespace.
//!
//! Owns: its shape and schema. Must not: hold logic (creating, reading and releasing the Job
//! are the controller's, in `controller::calls::job`; resuming after a takeover is the
//! engine's, in `engine::by_job`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `job` executor of a tool (`spec.tools[].job`, docs/design.md section 6, "Job tools"):
/// each call is a Job named from the run's uid, the step and the attempt, owned by the run.
/// The container gets the args as JSON in `AGENTRT_ARGS` (and the file `/agentrt/args.json`
/// when they exceed 32 KiB, `AGENTRT_ARGS` then empty and `AGENTRT_ARGS_FILE` naming the file),
/// `AGENTRT_IDEMPOTENCY_KEY`, `AGENTRT_RUN` (`namespace/name`) and `AGENTRT_STEP`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobTool {
    /// The Pod template, as a Job's `spec.template` (image, command, env, resources,
    /// serviceAccountName, ...); `restartPolicy` defaults to `Never` and must be `Never` or
    /// `OnFailure`. Its first container is the one whose result is read.
    #[schemars(schema_with = "super::schema::json_schema_object")]
    pub template: Value,
    /// The Job's `backoffLimit` (default 0: one Pod, no retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub backoff_limit: Option<i32>,
    /// The Job's `activeDeadlineSeconds`, in seconds (default: the tool's `timeoutSeconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds the finished Job is kept once the run records its outcome (the Job's
    /// `ttlSecondsAfterFinished`, set only then; absent: kept until the run is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 604800))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Where the result is read: `TerminationMessage` (default: the JSON the first container
    /// writes to its `terminationMessagePath`, at most 4096 bytes) or `Log` (the last line of
    /// its log, within the step's content budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<JobResult>,
    /// What a cancel does to a Job still running: `Leave` (default: it runs on, its outcome is
    /// recorded late) or `Delete` (the Job is deleted, foreground, and that is recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cancel: Option<JobOnCancel>,
}

/// Where a Job tool's result is read (`spec.tools[].job.result`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JobResult {
    /// The first container's termination message (at most 4096 bytes), as JSON.
    #[default]
    TerminationMessage,
    /// The last non-empty line of the first container's log, as JSON.
    Log,
}

/// What a cancel does to a Job tool's running Job (`spec.tools[].job.onCancel`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum JobOnCancel {
    /// The Job runs on; its outcome is appended to the record late (the contract for any tool).
    #[default]
    Leave,
    /// The Job is deleted (foreground propagation) and the deletion is recorded.
    Delete,
}
