//! Checking a run's chain of segments against its record and stitching the whole history back
//! together (docs/design.md section 4a "Reading", section 3 guarantee 9, docs/behaviours.md 58).
//!
//! Owns: what makes a chain intact (each segment present, hashing to the sha256 the record
//! names, pointing at the one before it, continuing its steps and seqs) and the whole record it
//! gives back. Must not: fetch anything (the caller passes what it fetched) or repair anything:
//! a missing or altered segment is reported, never skipped.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use super::segment_name;
use crate::api::{AgentRunSegmentSpec, AgentRunStatus, Archive, ArchivedSegment};
use crate::engine::canonical::content_hash;

/// Why a run's history is not intact: the first problem found, oldest segment first.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChainFault {
    /// The record, or the segment after it, names a segment that was not found.
    #[error("segment {name} (index {index}) is missing")]
    Missing {
        /// Its index in the chain.
        index: i64,
        /// Its name.
        name: String,
    },
    /// The segment found under the name does not hash to the sha256 the record (or, for one
    /// older than the record's kept entries, the segment after it) names: it was edited, or
    /// replaced by other content.
    #[error("segment {name} (index {index}) was altered: its sha256 is {found}, the record names {expected}")]
    Altered {
        /// Its index.
        index: i64,
        /// Its name.
        name: String,
        /// The sha256 in `status.archive`.
        expected: String,
        /// The sha256 of what was found (or why it has none).
        found: String,
    },
    /// The segment hashes as the record says, but does not fit the chain: it names another run,
    /// another index or predecessor, or its steps or seqs do not continue the one before.
    /// This means `status.archive` itself was edited.
    #[error("segment {name} (index {index}) does not fit the chain: {detail}")]
    Broken {
        /// Its index.
        index: i64,
        /// Its name.
        name: String,
        /// What does not fit.
        detail: String,
    },
    /// `status.archive` or the window does not continue the chain (a head that is not the last
    /// segment's sha256, a window that does not start where the last segment ends).
    #[error("the record does not continue its archive: {0}")]
    Record(String),
}

impl ChainFault {
    /// The segment named by the fault, if it names one.
    pub fn segment(&self) -> Option<&str> {
        match self {
            ChainFault::Missing { name, .. }
            | ChainFault::Altered { name, .. }
            | ChainFault::Broken { name, .. } => Some(name),
            ChainFault::Record(_) => None,
        }
    }
}

/// What an intact chain covers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChainReport {
    /// Segments checked.
    pub segments: usize,
    /// Sealed steps: `(first, last)`, `None` when nothing is sealed.
    pub sealed_steps: Option<(i64, i64)>,
    /// Sealed event seqs: `(first, last)`, `None` when no event is sealed.
    pub sealed_seqs: Option<(i64, i64)>,
    /// The chain's head (`status.archive.head`; empty when nothing is sealed).
    pub head: String,
}

impl fmt::Display for ChainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let range = |r: Option<(i64, i64)>| match r {
            Some((a, b)) => format!("{a}..{b}"),
            None => "none".to_string(),
        };
        write!(
            f,
            "{} segment(s), sealed steps {}, sealed events seq {}, head {}",
            self.segments,
            range(self.sealed_steps),
            range(self.sealed_seqs),
            if self.head.is_empty() {
                "(none)"
            } else {
                &self.head
            }
        )
    }
}

/// An intact chain: its segments in order, decoded, and what they cover.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    /// The segments, index 0 first.
    pub segments: Vec<AgentRunSegmentSpec>,
    /// What was checked.
    pub report: ChainReport,
}

/// Checks the chain `archive` names against the segments fetched (name → `spec` exactly as
/// read from the API server; the sha256 is computed over that, never over a re-encoding).
///
/// The record keeps only the newest entries of its index (`status.archive.segments`, at most
/// [`super::KEPT_ENTRIES`]) and `count`; the older segments are found by walking back from the
/// oldest kept entry: each segment's `spec.previous` is the sha256 of the one before it, whose
/// name follows from it ([`segment_name`]). Each segment, newest reachable first on the walk and
/// then all of them in order, must be present ([`ChainFault::Missing`]), hash to the sha256 the
/// record or the next segment names ([`ChainFault::Altered`]), and fit the chain
/// ([`ChainFault::Broken`]): belong to run `run_uid`, carry its index and name, point at the
/// previous segment's sha256 (empty for 0), continue its steps and seqs without gaps from step
/// 0 and seq 1, and match the record's entry where it keeps one. The kept entries must number
/// `count - kept .. count - 1` and the head must be the last sha256 ([`ChainFault::Record`]).
/// Fetched segments the chain does not reach (an orphan left by a crash between create and
/// status write) are ignored.
///
/// # Errors
/// The first fault, oldest segment first (a segment missing on the walk hides those before it,
/// so it is the oldest that can be named).
pub fn verify_chain(
    run_uid: &str,
    archive: Option<&Archive>,
    fetched: &BTreeMap<String, Value>,
) -> Result<Verified, ChainFault> {
    let empty = Archive::default();
    let archive = archive.unwrap_or(&empty);
    let count = super::segment_count(archive);
    let kept = archive.segments.len() as i64;
    if count < kept {
        return Err(ChainFault::Record(format!(
            "status.archive.count is {count} but status.archive.segments keeps {kept} entries"
        )));
    }
    let first_kept = count - kept;
    for (position, entry) in archive.segments.iter().enumerate() {
        if entry.index != first_kept + position as i64 {
            return Err(ChainFault::Broken {
                index: first_kept + position as i64,
                name: entry.name.clone(),
                detail: format!(
                    "status.archive.segments[{position}] has index {}, expected {} (count {count})",
                    entry.index,
                    first_kept + position as i64
                ),
            });
        }
    }
    let decode =
        |index: i64, name: &str, sha256: &str| -> Result<AgentRunSegmentSpec, ChainFault> {
            let Some(raw) = fetched.get(name) else {
                return Err(ChainFault::Missing {
                    index,
                    name: name.to_string(),
                });
            };
            let found = content_hash(raw).unwrap_or_else(|e| format!("(none: {e})"));
            if found != sha256 {
                return Err(ChainFault::Altered {
                    index,
                    name: name.to_string(),
                    expected: sha256.to_string(),
                    found,
                });
            }
            serde_json::from_value(raw.clone()).map_err(|e| ChainFault::Altered {
                index,
                name: name.to_string(),
                expected: sha256.to_string(),
                found: format!("{found}, and it does not decode: {e}"),
            })
        };
    // (index, name, sha256, spec) of every segment: the walk back from the oldest kept entry
    // (faults there are older than any in the kept entries), then the other kept entries.
    let mut chain: Vec<(i64, String, String, AgentRunSegmentSpec)> = Vec::new();
    if let Some(oldest) = archive.segments.first() {
        let (mut index, mut name, mut sha256) =
            (oldest.index, oldest.name.clone(), oldest.sha256.clone());
        loop {
            let spec = decode(index, &name, &sha256)?;
            let previous = spec.previous.clone();
            let run_name = spec.run_name.clone();
            chain.push((index, name.clone(), sha256, spec));
            if index == 0 {
                break;
            }
            if previous.is_empty() {
                return Err(ChainFault::Broken {
                    index,
                    name,
                    detail: format!("its spec.previous is empty, but it is segment {index}"),
                });
            }
            index -= 1;
            name = segment_name(&run_name, index, &previous);
            sha256 = previous;
        }
        chain.reverse();
        for entry in &archive.segments[1..] {
            let spec = decode(entry.index, &entry.name, &entry.sha256)?;
            chain.push((entry.index, entry.name.clone(), entry.sha256.clone(), spec));
        }
    }
    let mut segments: Vec<AgentRunSegmentSpec> = Vec::with_capacity(chain.len());
    let (mut next_step, mut next_seq, mut previous) = (0i64, 1i64, String::new());
    for (index, name, sha256, spec) in chain {
        let entry = usize::try_from(index - first_kept)
            .ok()
            .and_then(|p| archive.segments.get(p).map(|e| (p, e)));
        let describes = entry.is_none_or(|(_, e)| {
            (e.first_step, e.last_step, e.first_seq, e.last_seq, e.bytes)
                == (
                    spec.first_step,
                    spec.last_step,
                    spec.first_seq,
                    spec.last_seq,
                    spec.bytes,
                )
        });
        let checks = [
            (spec.run_uid == run_uid, format!("it belongs to run uid {}", spec.run_uid)),
            (spec.index == index, format!("its spec.index is {}", spec.index)),
            (
                segment_name(&spec.run_name, index, &sha256) == name,
                format!(
                    "its name should be {}",
                    segment_name(&spec.run_name, index, &sha256)
                ),
            ),
            (
                spec.previous == previous,
                format!(
                    "its spec.previous is {:?}, the segment before it is {:?}",
                    spec.previous, previous
                ),
            ),
            (
                spec.first_step == next_step && spec.first_seq == next_seq,
                format!(
                    "it starts at step {} seq {}, expected step {next_step} seq {next_seq}",
                    spec.first_step, spec.first_seq
                ),
            ),
            (
                spec.steps.len() as i64 == spec.step_count
                    && spec.last_step == spec.first_step + spec.step_count - 1
                    && spec.last_seq == spec.first_seq + spec.events.len() as i64 - 1
                    && spec.steps.iter().enumerate().all(|(i, s)| s.index.get() == spec.first_step + i as i64)
                    && spec.events.iter().enumerate().all(|(i, e)| e.seq == spec.first_seq + i as i64),
                "its steps or events do not run firstStep..lastStep and firstSeq..lastSeq without gaps".to_string(),
            ),
            (
                describes,
                format!(
                    "status.archive.segments[{}] does not describe it",
                    entry.map_or(0, |(p, _)| p)
                ),
            ),
        ];
        if let Some((_, detail)) = checks.into_iter().find(|(ok, _)| !ok) {
            return Err(ChainFault::Broken {
                index,
                name,
                detail,
            });
        }
        next_step = spec.last_step + 1;
        next_seq = spec.last_seq + 1;
        previous = sha256;
        segments.push(spec);
    }
    if archive.head != previous || (count > 0 && archive.segments.is_empty()) {
        return Err(ChainFault::Record(format!(
            "status.archive.head is {:?} (count {count}), the last segment's sha256 is {previous:?}",
            archive.head
        )));
    }
    let report = ChainReport {
        segments: segments.len(),
        sealed_steps: (next_step > 0).then_some((0, next_step - 1)),
        sealed_seqs: (next_seq > 1).then_some((1, next_seq - 1)),
        head: previous,
    };
    Ok(Verified { segments, report })
}

/// What names one sealed segment: its index, object name and sha256, enough to read it and
/// check it ([`verify_segment`]). An [`ArchivedSegment`] entry of `status.archive` gives one;
/// a segment found through a newer one's `previous` gives one too, before anything else of it
/// is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentId<'a> {
    /// Its index in the chain.
    pub index: i64,
    /// Its object's name.
    pub name: &'a str,
    /// The sha256 of its content.
    pub sha256: &'a str,
}

impl<'a> From<&'a ArchivedSegment> for SegmentId<'a> {
    fn from(entry: &'a ArchivedSegment) -> SegmentId<'a> {
        SegmentId {
            index: entry.index,
            name: &entry.name,
            sha256: &entry.sha256,
        }
    }
}

/// One segment as read (`spec` exactly as the API server returned it), checked against its
/// entry in `status.archive`: it hashes to the sha256 the record names and decodes. Enough to
/// trust its steps on their own (the record's sha256 names its content); [`verify_chain`] also
/// checks how the segments fit together. What the executor uses for each segment it reads for
/// a conversation (docs/design.md section 4a).
///
/// # Errors
/// [`ChainFault::Altered`] when it hashes to something else or does not decode.
pub fn verify_segment<'a>(
    entry: impl Into<SegmentId<'a>>,
    raw: &Value,
) -> Result<AgentRunSegmentSpec, ChainFault> {
    let entry = entry.into();
    let found = content_hash(raw).unwrap_or_else(|e| format!("(none: {e})"));
    if found != entry.sha256 {
        return Err(ChainFault::Altered {
            index: entry.index,
            name: entry.name.to_string(),
            expected: entry.sha256.to_string(),
            found,
        });
    }
    serde_json::from_value(raw.clone()).map_err(|e| ChainFault::Altered {
        index: entry.index,
        name: entry.name.to_string(),
        expected: entry.sha256.to_string(),
        found: format!("{found}, and it does not decode: {e}"),
    })
}

/// The whole record: `status` with `steps` and `events` as if nothing were sealed (the
/// verified segments' steps and events, then the window's), `archive` kept. Steps must run
/// 0, 1, 2... and events seq 1, 2, 3... without gaps across the seams.
///
/// # Errors
/// [`ChainFault::Record`] when the window does not continue the segments.
pub fn stitch(status: &AgentRunStatus, verified: &Verified) -> Result<AgentRunStatus, ChainFault> {
    let mut whole = status.clone();
    let sealed_steps: usize = verified.segments.iter().map(|s| s.steps.len()).sum();
    let sealed_events: usize = verified.segments.iter().map(|s| s.events.len()).sum();
    let mut steps = Vec::with_capacity(sealed_steps + status.steps.len());
    let mut events = Vec::with_capacity(sealed_events + status.events.len());
    for segment in &verified.segments {
        steps.extend(segment.steps.iter().cloned());
        events.extend(segment.events.iter().cloned());
    }
    steps.extend(status.steps.iter().cloned());
    events.extend(status.events.iter().cloned());
    if let Some((i, step)) = steps
        .iter()
        .enumerate()
        .find(|(i, s)| s.index.get() != *i as i64)
    {
        return Err(ChainFault::Record(format!(
            "step {i} of the whole history has index {} ({} sealed, the window starts at {})",
            step.index,
            sealed_steps,
            status
                .steps
                .first()
                .map_or("-".into(), |s| s.index.to_string())
        )));
    }
    if let Some((i, event)) = events
        .iter()
        .enumerate()
        .find(|(i, e)| e.seq != *i as i64 + 1)
    {
        return Err(ChainFault::Record(format!(
            "event {} of the whole history has seq {} ({} sealed, the window starts at seq {})",
            i + 1,
            event.seq,
            sealed_events,
            status
                .events
                .first()
                .map_or("-".into(), |e| e.seq.to_string())
        )));
    }
    whole.steps = steps;
    whole.events = events;
    Ok(whole)
}
