//! The window and the archive (docs/design.md section 4a, section 3 guarantees 8 and 9,
//! docs/behaviours.md 54-58): which settled steps a window seals into the next
//! `AgentRunSegment`, the segment's canonical sha256 and its name, and (in `chain`) checking a
//! run's chain of segments and stitching them back into the whole history.
//!
//! Owns: the sealing rule as a pure function of the status ([`seal`]; sealing by bytes goes on
//! down to about a third of `seal_bytes`), what the window keeps for the engine's own rules
//! ([`window_limits`]: the trailing identical calls and the trailing failures its loop
//! detection and failure count look back on), the bounded index `status.archive` (the newest
//! [`KEPT_ENTRIES`] entries and a count, [`segment_count`]; older segments are reached through
//! each one's `previous`), the segment hash ([`segment_sha256`]), name ([`segment_name`]) and
//! object ([`segment_object`]). Must not: do I/O, read a clock, or
//! decide when a transition seals (the record's `finish` does, for an executor's write that
//! settles a step; the executor creates the segment, then writes the status [`seal`]
//! returned).

mod chain;
#[cfg(test)]
mod tests;

pub use chain::{
    stitch, verify_chain, verify_segment, ChainFault, ChainReport, SegmentId, Verified,
};

use serde_json::Value;

use super::canonical::{canonical_json, content_hash, CanonicalError};
use crate::api::{
    AgentRunSegmentSpec, AgentRunStatus, Archive, ArchivedSegment, RunEvent, Step, StepIndex,
    StepStatus,
};

/// Sealed steps the executor read from the run's segments for the openai agent's conversation
/// (docs/design.md section 4a: the conversation is rendered from the whole history). The engine
/// does no I/O, so the executor reads the segments [`context_segments`] names (each verified
/// against the record's sha256 with [`verify_segment`]) and hands them in with the run
/// (`RunSnapshot::sealed`). Empty for every other agent and for an observer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SealedHistory {
    /// The steps of each segment read, oldest segment first (shared with the executor's cache).
    pub segments: Vec<std::sync::Arc<Vec<Step>>>,
    /// Steps `(first, last)` of each segment named by [`context_segments`] that could not be
    /// read or did not verify (missing, altered), oldest first: the conversation says so in
    /// their place, and the run goes on.
    pub unreadable: Vec<(i64, i64)>,
}

/// The least number of bytes one step's turn takes in any request, in its summary form: what
/// [`context_segments`] divides the context budget by.
pub const MIN_TURN_BYTES: usize = 64;

/// The sealed segments an openai agent's conversation may need with a context budget of
/// `max_context_bytes` (`spec.agent.openai.maxContextBytes`): the newest ones, until they hold
/// at least `max_context_bytes / MIN_TURN_BYTES` steps (older steps would be left out of the
/// request whatever their size, since even at their smallest those steps fill the budget; a
/// step with no recorded decision adds no turn, so with many of those a few older steps that
/// could have fit are left out all the same). Oldest first. So a long run's model call reads a
/// bounded part of its archive.
pub fn context_segments(archive: &Archive, max_context_bytes: usize) -> &[ArchivedSegment] {
    let enough = max_context_bytes / MIN_TURN_BYTES;
    let mut steps = 0usize;
    let mut first = archive.segments.len();
    while first > 0 && steps < enough {
        first -= 1;
        let segment = &archive.segments[first];
        let count = segment.last_step.saturating_sub(segment.first_step) + 1;
        steps = steps.saturating_add(usize::try_from(count).unwrap_or(0));
    }
    &archive.segments[first..]
}

/// When and how much a window seals (docs/design.md section 4a). The controller's
/// `--seal-steps`, `--seal-bytes` and `--keep-steps` set the first three.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealLimits {
    /// Seal when the window holds more than this many settled steps (default 64).
    pub seal_steps: usize,
    /// Seal when the window's steps and events pass this many bytes of compact JSON (default
    /// 128 KiB; the archive index is not counted).
    pub seal_bytes: usize,
    /// Settled steps that stay in the window when it seals by step count, the most recent ones
    /// (default 8). When it seals by bytes, fewer may stay, down to `min_keep_steps`, so that
    /// the window is left at about a third of `seal_bytes` and the next seal is several steps
    /// away (with 16 KiB answers, 8 kept steps alone are `seal_bytes`).
    pub keep_steps: usize,
    /// Settled steps that always stay in the window: what the engine's own rules look back on
    /// ([`window_limits`] sets it), at least 1 (default 1).
    pub min_keep_steps: usize,
    /// At most this many bytes of steps (canonical JSON) go into one segment, and always at
    /// least one step (default 512 KiB, half the object budget): a run from before sealing,
    /// with hundreds of steps in its status, is sealed a segment per transition as it goes.
    pub segment_bytes: usize,
}

impl SealLimits {
    /// No sealing: for a transition whose segment could not be created, decided again so its
    /// step is written without sealing (docs/design.md section 4a).
    pub fn off() -> SealLimits {
        SealLimits {
            seal_steps: usize::MAX,
            seal_bytes: usize::MAX,
            ..SealLimits::default()
        }
    }

    /// Whether these limits never seal ([`SealLimits::off`]).
    pub fn is_off(&self) -> bool {
        self.seal_steps == usize::MAX && self.seal_bytes == usize::MAX
    }
}

impl Default for SealLimits {
    fn default() -> Self {
        SealLimits {
            seal_steps: 64,
            seal_bytes: 128 * 1024,
            keep_steps: 8,
            min_keep_steps: 1,
            segment_bytes: 512 * 1024,
        }
    }
}

/// The limits a run's window is sealed with (docs/design.md section 4a): `limits` with
/// `min_keep_steps` set to what the engine's own rules look back on (at least 1), and
/// `keep_steps` raised to it.
///
/// The engine decides from the window alone. Loop detection compares the last
/// `spec.limits.loopThreshold` steps, which matter only while they are the same call with the
/// same observation; the failure count counts the trailing failed steps. So the window keeps
/// the trailing run of identical calls (at most `loopThreshold`) and the trailing run of
/// failures (at most `maxConsecutiveToolFailures`) of its settled steps: both decide exactly
/// as over the whole history, for any limit (one raised on a live run included), and a run
/// whose limits are lifted still seals. At least one settled step stays: the step just settled,
/// whose events are the newest and are what the Kubernetes Events and the metrics project
/// from the write.
pub fn window_limits(limits: &SealLimits, run: &crate::api::Limits, steps: &[Step]) -> SealLimits {
    let settled_end = steps
        .iter()
        .rposition(|s| is_settled(s.status))
        .map_or(0, |p| p + 1);
    let settled = &steps[..settled_end];
    let cap = |n: i64| usize::try_from(n).unwrap_or(0);
    let failures = usize::try_from(super::limits::consecutive_failures(settled)).unwrap_or(0);
    let repeats = super::limits::trailing_repeats(settled);
    let needed = limits
        .min_keep_steps
        .max(1)
        .max(failures.min(cap(run.max_consecutive_tool_failures)))
        .max(repeats.min(cap(run.loop_threshold)));
    SealLimits {
        keep_steps: limits.keep_steps.max(needed),
        min_keep_steps: needed,
        ..limits.clone()
    }
}

/// The whole AgentRunSegment object for `seal` of the run `owner` in `namespace`: owned by the
/// run (deleted with it), labelled with its uid ([`crate::api::SEGMENT_RUN_UID_LABEL`]).
pub fn segment_object(namespace: &str, owner: SegmentOwner<'_>, seal: &Seal) -> Value {
    serde_json::json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRunSegment",
        "metadata": {
            "name": seal.name,
            "namespace": namespace,
            "labels": {crate::api::SEGMENT_RUN_UID_LABEL: owner.uid},
            "ownerReferences": [{
                "apiVersion": "agentrt.dev/v1alpha1",
                "kind": "AgentRun",
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": serde_json::to_value(&seal.segment).unwrap_or(Value::Null),
    })
}

/// How many entries of the archive's index `status.archive.segments` keeps: the newest ones
/// (docs/design.md section 4a). Older segments are reached through each segment's `previous`,
/// so the index's size does not grow with the run.
pub const KEPT_ENTRIES: usize = 8;

/// How many segments `archive` says the run has sealed: `count`, or in a record written before
/// the index was bounded (no `count`), the number of its entries.
pub fn segment_count(archive: &Archive) -> i64 {
    archive
        .count
        .unwrap_or_else(|| i64::try_from(archive.segments.len()).unwrap_or(i64::MAX))
}

/// Which run a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOwner<'a> {
    /// The AgentRun's `metadata.name`.
    pub name: &'a str,
    /// The AgentRun's `metadata.uid`.
    pub uid: &'a str,
}

/// One seal: the segment to create, its name, and the status to write after it was created.
#[derive(Debug, Clone, PartialEq)]
pub struct Seal {
    /// `<run>-<index>-<first 10 hex of sha256>` ([`segment_name`]).
    pub name: String,
    /// `sha256:<64 hex>` of `segment` ([`segment_sha256`]).
    pub sha256: String,
    /// The segment's spec.
    pub segment: AgentRunSegmentSpec,
    /// The input status without the sealed steps and events, with the segment appended to
    /// `archive` (only the last [`KEPT_ENTRIES`] entries kept, `count` one more) and
    /// `archive.head` set to its sha256. Every other field is unchanged.
    pub status: AgentRunStatus,
}

/// Why a window cannot be sealed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArchiveError {
    /// A part of the record has no canonical JSON.
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
    /// The window does not continue its archive (step indices or event seqs with a gap, or an
    /// archive whose head is not its last segment): sealing it would seal a broken history.
    #[error("the window cannot be sealed: {0}")]
    Window(String),
}

/// Whether a step is settled (`done` or `failed`): only settled steps are ever sealed
/// (docs/design.md section 4a; `deciding`, `awaiting_approval`, `executing` and
/// `interrupted` are not).
pub fn is_settled(status: StepStatus) -> bool {
    matches!(status, StepStatus::Done | StepStatus::Failed)
}

/// `sha256:` + hex(SHA-256(RFC 8785 canonical JSON of the segment's spec)), the segment's
/// identity in the chain (docs/design.md section 2 "AgentRunSegment").
///
/// # Errors
/// [`CanonicalError`] when a part has no canonical JSON.
pub fn segment_sha256(spec: &AgentRunSegmentSpec) -> Result<String, CanonicalError> {
    let value = serde_json::to_value(spec).map_err(|e| CanonicalError(format!("segment: {e}")))?;
    content_hash(&value)
}

/// A valid object name for segment `index` of run `run_name` with hash `sha256`:
/// `<run>-<index>-<first 10 hex>`.
///
/// A run's name is a DNS subdomain of up to 253 characters, so the name alone may leave no
/// room for the suffix: then the run's name is cut to what fits in 253 characters and any `-`
/// or `.` it then ends with is dropped, so the result is again a DNS subdomain. Two runs whose
/// long names share that prefix still get different names, since the hash covers `runName`
/// and `runUID`.
pub fn segment_name(run_name: &str, index: i64, sha256: &str) -> String {
    let hex: String = sha256
        .trim_start_matches("sha256:")
        .chars()
        .take(10)
        .collect();
    let suffix = format!("-{index}-{hex}");
    let room = 253usize.saturating_sub(suffix.len());
    let mut prefix: String = run_name.chars().take(room).collect();
    while prefix.len() > room {
        prefix.pop();
    }
    let prefix = prefix.trim_end_matches(['-', '.']);
    let prefix = if prefix.is_empty() { "run" } else { prefix };
    format!("{prefix}{suffix}")
}

/// The canonical JSON size of `steps` plus that of `events` (a segment's `bytes`).
///
/// # Errors
/// [`CanonicalError`] when a part has no canonical JSON.
pub fn content_bytes(steps: &[Step], events: &[RunEvent]) -> Result<i64, CanonicalError> {
    let steps = canonical_len(steps)?;
    let events = canonical_len(events)?;
    Ok(i64::try_from(steps.saturating_add(events)).unwrap_or(i64::MAX))
}

fn canonical_len<T: serde::Serialize + ?Sized>(value: &T) -> Result<usize, CanonicalError> {
    let value: Value =
        serde_json::to_value(value).map_err(|e| CanonicalError(format!("record: {e}")))?;
    Ok(canonical_json(&value)?.len())
}

/// The window's size: the compact JSON of `status.steps` and `status.events`, counted without
/// building the text. The archive's own index is left out, so that a long run's index never
/// makes every write seal (it did: 1,413 segments for 2,000 steps of 8 KiB answers), and the
/// rest of the status is small and bounded.
fn window_len(status: &AgentRunStatus) -> usize {
    super::record::encoded_len(&status.steps)
        .saturating_add(super::record::encoded_len(&status.events))
}

/// Whether the step at `position` of `steps` may be sealed: it is settled, or it is an
/// `interrupted` step the run went on past (a later step exists). A takeover resolves only the
/// last step; an interrupted one behind it is history nothing changes again, and keeping it
/// would keep every step after it in the window, so a run interrupted once would grow until
/// its record passes the object budget.
fn sealable(steps: &[Step], position: usize) -> bool {
    steps.get(position).is_some_and(|step| {
        is_settled(step.status)
            || (step.status == StepStatus::Interrupted && position + 1 < steps.len())
    })
}

/// What the window seals now, if anything (docs/design.md section 4a).
///
/// Seals when the window holds more than `seal_steps` settled steps or the window's steps and
/// events pass `seal_bytes` as compact JSON ([`window_len`]; the archive index is not counted).
/// Then the oldest settled steps (a run of settled steps from the window's start: an unsettled
/// step is never sealed, nor anything after it; an `interrupted` step the run went on past
/// counts as settled), all but the last `keep_steps` settled ones (sealing by bytes, more: until
/// the window's steps are down to about `seal_bytes / 3`, keeping at least `min_keep_steps`),
/// and at most `segment_bytes` of them, go into the next segment with
/// their events: the events before the first event of the first step kept, a contiguous seq
/// range (run-level events in it, such as `run.created`, go with the sealed steps). When an
/// event of a sealed step comes after that point, fewer steps are sealed, so a segment always
/// holds whole steps.
///
/// Returns `None` when nothing is to be sealed.
///
/// # Errors
/// [`ArchiveError::Window`] when the window does not continue its archive (see the variant);
/// [`ArchiveError::Canonical`] when a part has no canonical JSON.
pub fn seal(
    owner: SegmentOwner<'_>,
    status: &AgentRunStatus,
    limits: &SealLimits,
) -> Result<Option<Seal>, ArchiveError> {
    let settled = (0..status.steps.len())
        .filter(|p| sealable(&status.steps, *p))
        .count();
    let window_bytes = window_len(status);
    if settled <= limits.seal_steps && window_bytes <= limits.seal_bytes {
        return Ok(None);
    }
    let archive = status.archive.clone().unwrap_or_default();
    let (next_step, next_seq) = window_start(&archive)?;
    check_window(status, next_step, next_seq)?;

    let prefix = (0..status.steps.len())
        .take_while(|p| sealable(&status.steps, *p))
        .count();
    let mut count = prefix.min(settled.saturating_sub(limits.keep_steps));
    if window_bytes > limits.seal_bytes {
        // By bytes: seal on down to about a third of `seal_bytes` (each step's size counted, its
        // events not), keeping at least `min_keep_steps`.
        let most = prefix.min(settled.saturating_sub(limits.min_keep_steps.max(1)));
        let target = limits.seal_bytes / 3;
        let mut left = status.steps[..count]
            .iter()
            .fold(window_bytes, |left, step| {
                left.saturating_sub(super::record::encoded_len(step).saturating_add(1))
            });
        while count < most && left > target {
            left = left
                .saturating_sub(super::record::encoded_len(&status.steps[count]).saturating_add(1));
            count += 1;
        }
    }
    // At most `segment_bytes` of steps, and at least one.
    let mut bytes = 0usize;
    for (i, step) in status.steps.iter().take(count).enumerate() {
        bytes = bytes.saturating_add(canonical_len(step)?);
        if i > 0 && bytes > limits.segment_bytes {
            count = i;
            break;
        }
    }
    let cut = loop {
        if count == 0 {
            return Ok(None);
        }
        let first_kept = status
            .steps
            .get(count)
            .map_or_else(|| next_step + status.steps.len() as i64, |s| s.index.get());
        let cut = status
            .events
            .iter()
            .position(|e| e.step.is_some_and(|s| s.get() >= first_kept))
            .unwrap_or(status.events.len());
        let late = status.events[cut..]
            .iter()
            .filter_map(|e| e.step.map(StepIndex::get))
            .filter(|s| *s < first_kept)
            .min();
        match late {
            // An event of a sealed step after the cut: seal only the steps before it.
            Some(step) => count = usize::try_from(step - next_step).unwrap_or(0),
            None => break cut,
        }
    };

    let steps = status.steps[..count].to_vec();
    let events = status.events[..cut].to_vec();
    let first_seq = events.first().map_or(next_seq, |e| e.seq);
    let last_seq = events.last().map_or(first_seq - 1, |e| e.seq);
    let index = segment_count(&archive);
    let segment = AgentRunSegmentSpec {
        run_name: owner.name.to_string(),
        run_uid: owner.uid.to_string(),
        index,
        first_step: next_step,
        last_step: next_step + count as i64 - 1,
        first_seq,
        last_seq,
        previous: archive.head.clone(),
        step_count: count as i64,
        bytes: content_bytes(&steps, &events)?,
        steps,
        events,
    };
    let sha256 = segment_sha256(&segment)?;
    let name = segment_name(owner.name, index, &sha256);
    let mut after = status.clone();
    after.steps.drain(..count);
    after.events.drain(..cut);
    let mut archive = archive;
    archive.segments.push(ArchivedSegment {
        name: name.clone(),
        index,
        first_step: segment.first_step,
        last_step: segment.last_step,
        first_seq: segment.first_seq,
        last_seq: segment.last_seq,
        bytes: segment.bytes,
        sha256: sha256.clone(),
    });
    let drop = archive.segments.len().saturating_sub(KEPT_ENTRIES);
    archive.segments.drain(..drop);
    archive.count = Some(index + 1);
    archive.head = sha256.clone();
    after.archive = Some(archive);
    Ok(Some(Seal {
        name,
        sha256,
        segment,
        status: after,
    }))
}

/// The first step index and event seq the window must start with, given its archive.
fn window_start(archive: &Archive) -> Result<(i64, i64), ArchiveError> {
    let count = segment_count(archive);
    let kept = i64::try_from(archive.segments.len()).unwrap_or(i64::MAX);
    if count < kept
        || archive
            .segments
            .iter()
            .enumerate()
            .any(|(i, e)| e.index != count - kept + i as i64)
    {
        return Err(ArchiveError::Window(format!(
            "status.archive.segments do not number {}..{} (status.archive.count is {count})",
            count - kept,
            count - 1
        )));
    }
    match archive.segments.last() {
        None if archive.head.is_empty() => Ok((0, 1)),
        None => Err(ArchiveError::Window(format!(
            "status.archive.head is {} but status.archive has no segments",
            archive.head
        ))),
        Some(last) if last.sha256 != archive.head => Err(ArchiveError::Window(format!(
            "status.archive.head {} is not the sha256 of the last segment {} ({})",
            archive.head, last.name, last.sha256
        ))),
        Some(last) => Ok((last.last_step + 1, last.last_seq + 1)),
    }
}

/// The window's steps are `next_step, next_step + 1, ...` and its events `next_seq, ...`.
fn check_window(
    status: &AgentRunStatus,
    next_step: i64,
    next_seq: i64,
) -> Result<(), ArchiveError> {
    for (offset, step) in status.steps.iter().enumerate() {
        let expected = next_step + offset as i64;
        if step.index.get() != expected {
            return Err(ArchiveError::Window(format!(
                "status.steps[{offset}] has index {}, expected {expected}",
                step.index
            )));
        }
    }
    for (offset, event) in status.events.iter().enumerate() {
        let expected = next_seq + offset as i64;
        if event.seq != expected {
            return Err(ArchiveError::Window(format!(
                "status.events[{offset}] has seq {}, expected {expected}",
                event.seq
            )));
        }
    }
    Ok(())
}
