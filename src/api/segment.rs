//! The `AgentRunSegment` custom resource (docs/design.md section 2 "AgentRunSegment", section
//! 4a): a sealed, immutable piece of a run's history, chained to the one before it by SHA-256,
//! and the run status's index of them (`status.archive`, [`Archive`]).
//!
//! Owns: the segment's shape, its schema and CEL rules (spec immutable; no status), the label it
//! is listed by. Must not: hold logic (its hash, name and sealing are `engine::archive`).
//!
//! The Steps and Bytes printer columns read two spec fields beyond the design's list,
//! `stepCount` and `bytes`; they are part of the spec, so the segment's sha256 covers them, and
//! CEL holds `stepCount` to the number of steps.

// Each `printcolumn(...)` repeats `type_ = ...`; clippy reads the repeats as duplicates.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::{RunEvent, Step};

/// The label every segment carries: its run's uid (a uid always fits a label value, a run name
/// of up to 253 characters does not), so a run's segments are listed with one selector.
pub const SEGMENT_RUN_UID_LABEL: &str = "agentrt.dev/run-uid";

/// A sealed piece of a run's history: steps `firstStep..=lastStep` and events
/// `firstSeq..=lastSeq`, exactly as they stood in the record (docs/design.md section 4a).
///
/// Created only by the controller, owned by its AgentRun (deleted with it), named
/// `<run>-<index>-<first 10 hex of its sha256>`. The whole spec is immutable (CEL
/// `self == oldSelf`); the object has no status (a `status` written to it is pruned, since the
/// schema declares none). Its sha256 is SHA-256 of the spec's canonical JSON (RFC 8785).
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[kube(
    group = "agentrt.dev",
    version = "v1alpha1",
    kind = "AgentRunSegment",
    plural = "agentrunsegments",
    singular = "agentrunsegment",
    namespaced,
    shortname = "arseg",
    category = "agentrt",
    printcolumn(
        name = "Run",
        type_ = "string",
        json_path = ".spec.runName",
        description = "The AgentRun this segment belongs to"
    ),
    printcolumn(
        name = "Index",
        type_ = "integer",
        json_path = ".spec.index",
        description = "Position in the run's chain of segments (0, 1, 2...)"
    ),
    printcolumn(
        name = "Steps",
        type_ = "integer",
        json_path = ".spec.stepCount",
        description = "Steps sealed in this segment"
    ),
    printcolumn(
        name = "Bytes",
        type_ = "integer",
        json_path = ".spec.bytes",
        description = "Canonical JSON size of the sealed steps and events"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self == oldSelf",
        "message": "spec is immutable: an AgentRunSegment is a sealed piece of a run's history, and no field of its spec may be changed",
        "messageExpression": "'spec is immutable: an AgentRunSegment is a sealed piece of a run\\'s history, and spec.' + (self.runName != oldSelf.runName ? 'runName' : self.runUID != oldSelf.runUID ? 'runUID' : self.index != oldSelf.index ? 'index' : self.firstStep != oldSelf.firstStep ? 'firstStep' : self.lastStep != oldSelf.lastStep ? 'lastStep' : self.firstSeq != oldSelf.firstSeq ? 'firstSeq' : self.lastSeq != oldSelf.lastSeq ? 'lastSeq' : self.stepCount != oldSelf.stepCount ? 'stepCount' : self.bytes != oldSelf.bytes ? 'bytes' : self.steps != oldSelf.steps ? 'steps' : (has(self.previous) != has(oldSelf.previous) || (has(self.previous) && self.previous != oldSelf.previous)) ? 'previous' : 'events') + ' may not be changed'",
        "reason": "FieldValueForbidden"
    },
    {"rule": "self.stepCount == size(self.steps) && self.lastStep - self.firstStep + 1 == self.stepCount", "message": "spec.stepCount must be the number of steps, lastStep - firstStep + 1"},
    {"rule": "(self.index == 0) == (self.previous == '')", "message": "spec.previous is empty exactly for segment 0"}
]))]
pub struct AgentRunSegmentSpec {
    /// The AgentRun's name.
    #[schemars(length(min = 1, max = 253))]
    pub run_name: String,
    /// The AgentRun's uid.
    #[serde(rename = "runUID")]
    #[schemars(length(min = 1, max = 64))]
    pub run_uid: String,
    /// Position in the run's chain: 0, 1, 2...
    #[schemars(range(min = 0))]
    pub index: i64,
    /// The index of the first step sealed here.
    #[schemars(range(min = 0))]
    pub first_step: i64,
    /// The index of the last step sealed here (`firstStep + stepCount - 1`).
    #[schemars(range(min = 0))]
    pub last_step: i64,
    /// The `seq` of the first event sealed here.
    #[schemars(range(min = 1))]
    pub first_seq: i64,
    /// The `seq` of the last event sealed here (`firstSeq - 1` when no event is sealed).
    #[schemars(range(min = 0))]
    pub last_seq: i64,
    /// `sha256:<64 hex>` of segment `index - 1`; empty for segment 0.
    #[serde(default)]
    #[schemars(regex(pattern = r"^(sha256:[0-9a-f]{64})?$"))]
    pub previous: String,
    /// How many steps are sealed here (the Steps printer column; covered by the sha256).
    #[schemars(range(min = 1))]
    pub step_count: i64,
    /// The canonical JSON size of `steps` plus that of `events`, in bytes (the Bytes printer
    /// column; covered by the sha256).
    #[schemars(range(min = 0))]
    pub bytes: i64,
    /// The steps, in order, exactly as they stood in the record.
    #[schemars(length(min = 1, max = 4096))]
    pub steps: Vec<Step>,
    /// The events, seq `firstSeq..=lastSeq` without gaps, exactly as they stood in the record.
    #[serde(default)]
    #[schemars(length(max = 65536))]
    pub events: Vec<RunEvent>,
}

/// `status.archive` of an AgentRun: the newest entries of the index of its sealed segments, how
/// many there are, and the chain's head (docs/design.md section 4a). Absent on a run that never
/// sealed.
///
/// Bounded whatever the run's length: `segments` keeps at most the last 8 entries (the engine's
/// `archive::KEPT_ENTRIES`); the older segments are found by walking the chain back from the
/// oldest kept entry, each segment's `spec.previous` naming the sha256 (and so the name) of the
/// one before it. `count` is the number of segments sealed, so the entries kept are
/// `count - len(segments) .. count - 1`; segment 0 starts at step 0 and seq 1.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Archive {
    /// The newest sealed segments, oldest first, at most 8; their `index` values are
    /// consecutive and the last is `count - 1`.
    #[serde(default)]
    pub segments: Vec<ArchivedSegment>,
    /// How many segments the run has sealed (indices `0..count`). Absent in a record written
    /// before the index was bounded, where `segments` holds every entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub count: Option<i64>,
    /// `sha256:<64 hex>` of the last segment (empty when there is none).
    #[serde(default)]
    pub head: String,
}

/// One sealed segment as the record knows it: enough to fetch it and check it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ArchivedSegment {
    /// The AgentRunSegment's name, `<run>-<index>-<first 10 hex of sha256>`.
    pub name: String,
    /// Position in the chain.
    pub index: i64,
    /// The first step it holds.
    pub first_step: i64,
    /// The last step it holds.
    pub last_step: i64,
    /// The first event seq it holds.
    pub first_seq: i64,
    /// The last event seq it holds (`firstSeq - 1` when it holds none).
    pub last_seq: i64,
    /// Its `spec.bytes`.
    pub bytes: i64,
    /// `sha256:<64 hex>` of the segment's spec, canonical JSON (RFC 8785).
    pub sha256: String,
}
