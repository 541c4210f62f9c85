//! The sealed steps an executor hands the engine for an openai agent's conversation
//! (docs/design.md section 4a, last bullet; docs/behaviours.md 59): the segments
//! `engine::archive::context_segments` names, and older ones found by walking back through each
//! segment's `previous` while they are needed (`status.archive` keeps only the newest 8
//! entries), read once per executor and cached by sha256.
//!
//! Owns: reading a segment (GET), checking it against the record's archive entry
//! (`engine::archive::verify_segment`, the same check `agentrt verify` makes of each segment),
//! the cache, and saying once per segment, as a log line and a Warning Event, that one could not
//! be read. Must not: decide what the model is shown (the engine does, from the
//! [`SealedHistory`] this gives it) or fail the run over a segment: a missing or altered one is
//! handed in as unreadable and the conversation says so in its place.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use super::cluster::RunKey;
use super::context::Context;
use crate::api::{Archive, Step};
use crate::engine::archive::{
    context_segments, segment_name, verify_segment, SealedHistory, SegmentId, MIN_TURN_BYTES,
};
use crate::engine::RunSnapshot;

/// How many bytes of segments (their `bytes` in `status.archive`) one executor's cache holds:
/// 8 MiB. The least recently used segments are dropped first; one dropped is read again when
/// a later request needs it.
pub const CACHE_BYTES: usize = 8 * 1024 * 1024;

/// One executor's segments, by sha256, least recently used first.
#[derive(Debug, Default)]
pub struct SegmentCache {
    entries: VecDeque<Cached>,
    bytes: usize,
    /// Segments this executor found unreadable, by name: reported once each and not read
    /// again.
    warned: BTreeSet<String>,
}

#[derive(Debug)]
struct Cached {
    sha256: String,
    steps: Arc<Vec<Step>>,
    bytes: usize,
    /// What the walk back needs of it: the sha256 of the segment before (empty for index 0)
    /// and the run name its name was made from.
    previous: String,
    run_name: String,
}

/// A segment read (or cached): its steps and the link to the one before.
#[derive(Debug, Clone)]
struct Read {
    steps: Arc<Vec<Step>>,
    previous: String,
    run_name: String,
}

/// A segment to read: what names it, and the steps it is known to hold (first, last) for what
/// a warning says when it cannot be read.
#[derive(Debug, Clone, Copy)]
struct Wanted<'a> {
    id: SegmentId<'a>,
    steps: (i64, i64),
}

impl SegmentCache {
    /// The sealed steps the engine needs for `run`'s next model request: empty unless the run
    /// has an openai agent and sealed history. Reads (GET) only segments not cached.
    pub async fn history(
        &mut self,
        ctx: &Context,
        key: &RunKey,
        run: &RunSnapshot,
    ) -> SealedHistory {
        let Some(agent) = run.spec.agent.openai.as_ref() else {
            return SealedHistory::default();
        };
        let Some(archive) = archive_of(&run.status) else {
            return SealedHistory::default();
        };
        let budget = usize::try_from(agent.max_context_bytes).unwrap_or(0);
        let mut history = SealedHistory::default();
        let named = context_segments(&archive, budget);
        let mut oldest: Option<(i64, Option<Read>)> = None;
        let mut steps = 0usize;
        for entry in named {
            let read = self
                .segment(
                    ctx,
                    key,
                    run,
                    Wanted {
                        id: entry.into(),
                        steps: (entry.first_step, entry.last_step),
                    },
                )
                .await;
            match &read {
                Some(r) => {
                    steps = steps.saturating_add(r.steps.len());
                    history.segments.push(r.steps.clone());
                }
                None => history.unreadable.push((entry.first_step, entry.last_step)),
            }
            if oldest.is_none() {
                oldest = Some((entry.first_step, read));
            }
        }
        // The record keeps only the newest entries: when they do not hold enough steps to fill
        // the budget, older segments are found through `previous`, newest first, until they do
        // (or the chain reaches index 0, or a segment cannot be read: then what is older is
        // left out, as the conversation says).
        let enough = budget / MIN_TURN_BYTES;
        let all_kept = named.len() == archive.segments.len();
        let mut older: Vec<Arc<Vec<Step>>> = Vec::new();
        let mut unreadable_older: Option<(i64, i64)> = None;
        if let (true, Some((mut first_step, Some(mut read))), Some(mut index)) =
            (all_kept, oldest, archive.segments.first().map(|e| e.index))
        {
            while steps < enough && index > 0 && !read.previous.is_empty() {
                index -= 1;
                let name = segment_name(&read.run_name, index, &read.previous);
                let wanted = Wanted {
                    id: SegmentId {
                        index,
                        name: &name,
                        sha256: &read.previous,
                    },
                    // Not known before it is read: the steps before the newer one.
                    steps: (0, first_step - 1),
                };
                match self.segment(ctx, key, run, wanted).await {
                    Some(r) => {
                        steps = steps.saturating_add(r.steps.len());
                        first_step = r.steps.first().map_or(0, |s| s.index.get());
                        older.push(r.steps.clone());
                        read = r;
                    }
                    None => {
                        unreadable_older = Some((0, first_step - 1));
                        break;
                    }
                }
            }
        }
        if !older.is_empty() || unreadable_older.is_some() {
            older.reverse();
            older.append(&mut history.segments);
            history.segments = older;
            if let Some(range) = unreadable_older {
                history.unreadable.insert(0, range);
            }
        }
        history
    }

    /// Keeps the segment this executor just created (its spec as sent, hashing to `sha256`), so
    /// that it is never read back.
    pub fn remember(&mut self, sha256: &str, spec: &Value, bytes: usize) {
        if let Ok(segment) = serde_json::from_value::<crate::api::AgentRunSegmentSpec>(spec.clone())
        {
            self.insert(
                sha256,
                Read {
                    steps: Arc::new(segment.steps),
                    previous: segment.previous,
                    run_name: segment.run_name,
                },
                bytes,
            );
        }
    }

    async fn segment(
        &mut self,
        ctx: &Context,
        key: &RunKey,
        run: &RunSnapshot,
        wanted: Wanted<'_>,
    ) -> Option<Read> {
        let entry = wanted.id;
        if let Some(at) = self.entries.iter().position(|c| c.sha256 == entry.sha256) {
            let cached = self.entries.remove(at)?;
            let read = Read {
                steps: cached.steps.clone(),
                previous: cached.previous.clone(),
                run_name: cached.run_name.clone(),
            };
            self.entries.push_back(cached);
            return Some(read);
        }
        if self.warned.contains(entry.name) {
            return None;
        }
        ctx.metrics.segment_reads.inc();
        let read = ctx.api.get_segment(&key.namespace, entry.name).await;
        let problem = match read {
            Ok(Some(object)) => match verify_segment(entry, &object["spec"]) {
                Ok(segment) => {
                    let bytes = usize::try_from(segment.bytes).unwrap_or(0);
                    let read = Read {
                        steps: Arc::new(segment.steps),
                        previous: segment.previous,
                        run_name: segment.run_name,
                    };
                    self.insert(entry.sha256, read.clone(), bytes);
                    return Some(read);
                }
                Err(fault) => fault.to_string(),
            },
            Ok(None) => format!("segment {} (index {}) is missing", entry.name, entry.index),
            Err(err) => format!("segment {} cannot be read: {err}", entry.name),
        };
        if self.warned.insert(entry.name.to_string()) {
            tracing::warn!(
                segment = %entry.name,
                %problem,
                "a sealed segment cannot be used; the model is told steps {}..{} could not be read",
                wanted.steps.0,
                wanted.steps.1
            );
            ctx.events.warn(
                run,
                "SegmentUnreadable",
                format!(
                    "{problem}; the model's request says steps {}..{} could not be read \
                     (inspect with `agentrt verify {}`)",
                    wanted.steps.0, wanted.steps.1, key.name
                ),
            );
        }
        None
    }

    fn insert(&mut self, sha256: &str, read: Read, bytes: usize) {
        if self.entries.iter().any(|c| c.sha256 == sha256) {
            return;
        }
        self.entries.push_back(Cached {
            sha256: sha256.to_string(),
            steps: read.steps,
            bytes,
            previous: read.previous,
            run_name: read.run_name,
        });
        self.bytes = self.bytes.saturating_add(bytes);
        // The newest always stays, even when it alone is over the bound.
        while self.bytes > CACHE_BYTES && self.entries.len() > 1 {
            if let Some(old) = self.entries.pop_front() {
                self.bytes = self.bytes.saturating_sub(old.bytes);
            }
        }
    }
}

/// `status.archive` of a stored status, when it has segments.
fn archive_of(status: &Value) -> Option<Archive> {
    let archive: Archive = serde_json::from_value(status.get("archive")?.clone()).ok()?;
    (!archive.segments.is_empty()).then_some(archive)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::AgentRunSegmentSpec;
    use crate::api::ArchivedSegment;
    use crate::controller::context::{ContextParts, Settings};
    use crate::controller::fake::{run_object, FakeApi};
    use crate::controller::identity::HolderId;
    use crate::controller::metrics::Metrics;
    use crate::controller::projection::EventSink;
    use crate::engine::archive::{segment_name, segment_sha256};

    fn context(api: Arc<FakeApi>) -> Context {
        let (kicks, _) = tokio::sync::mpsc::unbounded_channel();
        Context::new(ContextParts {
            api,
            settings: Settings::new(HolderId::with_random_suffix("segments")),
            events: EventSink::disabled(),
            metrics: Arc::new(Metrics::default()),
            http: crate::tools::http::client().expect("a client"),
            shutdown: tokio_util::sync::CancellationToken::new(),
            kicks,
        })
    }

    /// Segment `index` holding steps `first..first+2` of run `r`, and its archive entry.
    fn segment(index: i64, first: i64, previous: &str) -> (AgentRunSegmentSpec, ArchivedSegment) {
        let steps: Vec<Value> = (first..first + 2)
            .map(|i| json!({"index": i, "status": "done", "attempts": 1}))
            .collect();
        let spec: AgentRunSegmentSpec = serde_json::from_value(json!({
            "runName": "r", "runUID": "uid-r", "index": index,
            "firstStep": first, "lastStep": first + 1,
            "firstSeq": first + 1, "lastSeq": first,
            "previous": previous, "stepCount": 2, "bytes": 100,
            "steps": steps, "events": [],
        }))
        .expect("a segment");
        let sha256 = segment_sha256(&spec).expect("sha256");
        let entry = ArchivedSegment {
            name: segment_name("r", index, &sha256),
            index,
            first_step: first,
            last_step: first + 1,
            first_seq: first + 1,
            last_seq: first,
            bytes: 100,
            sha256,
        };
        (spec, entry)
    }

    /// Run `ns/r` with an openai agent, Running, with `archive` as its `status.archive`.
    fn openai_run(archive: Value) -> RunSnapshot {
        let mut object = run_object("ns", "r", 30);
        object["metadata"]["resourceVersion"] = json!("1");
        object["spec"]["agent"] =
            json!({"openai": {"baseURL": "http://127.0.0.1:1/v1", "model": "m"}});
        object["status"] = json!({"phase": "Running", "archive": archive});
        crate::controller::cluster::StoredRun::from_object(object)
            .expect("a run")
            .snapshot
    }

    #[tokio::test]
    async fn each_segment_is_read_once_and_an_altered_one_is_named_unreadable_not_fatal() {
        let api = Arc::new(FakeApi::default());
        let (zero, zero_entry) = segment(0, 0, "");
        let (one, one_entry) = segment(1, 2, &zero_entry.sha256);
        for (spec, entry) in [(&zero, &zero_entry), (&one, &one_entry)] {
            let mut spec = serde_json::to_value(spec).expect("JSON");
            if entry.index == 1 {
                spec["steps"][0]["status"] = json!("failed");
            }
            api.state.lock().unwrap().segments.insert(
                ("ns".into(), entry.name.clone()),
                json!({"metadata": {"name": entry.name}, "spec": spec}),
            );
        }
        let run = openai_run(json!({
            "segments": [zero_entry, one_entry], "head": one_entry.sha256,
        }));
        let ctx = context(api);
        let key = RunKey {
            namespace: "ns".into(),
            name: "r".into(),
        };
        let mut cache = SegmentCache::default();
        for _ in 0..3 {
            let history = cache.history(&ctx, &key, &run).await;
            assert_eq!(history.segments, vec![Arc::new(zero.steps.clone())]);
            assert_eq!(history.unreadable, vec![(2, 3)]);
        }
        assert_eq!(ctx.metrics.segment_reads.get(), 2, "each segment read once");

        // Not an openai agent: nothing is read.
        let mut scripted = run.clone();
        std::sync::Arc::make_mut(&mut scripted.spec).agent.openai = None;
        let mut cache = SegmentCache::default();
        let history = cache.history(&ctx, &key, &scripted).await;
        assert_eq!(history, SealedHistory::default());
        assert_eq!(ctx.metrics.segment_reads.get(), 2);
    }

    fn empty() -> Read {
        Read {
            steps: Arc::new(Vec::new()),
            previous: String::new(),
            run_name: "r".into(),
        }
    }

    /// `status.archive` keeps only the newest entries (here one of three): the segments before
    /// it are found through each one's `previous`, read once, and handed in oldest first; a
    /// missing one ends the walk with the steps before it named unreadable.
    #[tokio::test]
    async fn older_segments_than_the_record_keeps_are_found_through_previous() {
        let api = Arc::new(FakeApi::default());
        let (zero, zero_entry) = segment(0, 0, "");
        let (one, one_entry) = segment(1, 2, &zero_entry.sha256);
        let (two, two_entry) = segment(2, 4, &one_entry.sha256);
        for (spec, entry) in [(&zero, &zero_entry), (&one, &one_entry), (&two, &two_entry)] {
            api.state.lock().unwrap().segments.insert(
                ("ns".into(), entry.name.clone()),
                json!({"metadata": {"name": entry.name}, "spec": spec}),
            );
        }
        let run = openai_run(json!({
            "segments": [two_entry], "count": 3, "head": two_entry.sha256,
        }));
        let ctx = context(api.clone());
        let key = RunKey {
            namespace: "ns".into(),
            name: "r".into(),
        };
        let mut cache = SegmentCache::default();
        for _ in 0..2 {
            let history = cache.history(&ctx, &key, &run).await;
            let expected: Vec<Arc<Vec<Step>>> = [&zero, &one, &two]
                .iter()
                .map(|s| Arc::new(s.steps.clone()))
                .collect();
            assert_eq!(history.segments, expected);
            assert!(history.unreadable.is_empty());
        }
        assert_eq!(ctx.metrics.segment_reads.get(), 3, "each segment read once");

        api.state
            .lock()
            .unwrap()
            .segments
            .remove(&("ns".into(), zero_entry.name.clone()));
        let mut cache = SegmentCache::default();
        let history = cache.history(&ctx, &key, &run).await;
        assert_eq!(
            history.segments,
            vec![Arc::new(one.steps.clone()), Arc::new(two.steps.clone())]
        );
        assert_eq!(
            history.unreadable,
            vec![(0, 1)],
            "steps 0-1 could not be read"
        );
    }

    #[test]
    fn the_cache_is_bounded_by_bytes_keeping_the_newest() {
        let mut cache = SegmentCache::default();
        for i in 0..5 {
            cache.insert(&format!("sha256:{i}"), empty(), CACHE_BYTES / 2);
        }
        assert_eq!(cache.entries.len(), 2);
        assert!(cache.bytes <= CACHE_BYTES);
        assert_eq!(
            cache.entries.back().map(|c| c.sha256.as_str()),
            Some("sha256:4")
        );
        cache.insert("sha256:big", empty(), CACHE_BYTES * 2);
        assert_eq!(
            cache.entries.len(),
            1,
            "the newest stays even alone over the bound"
        );
    }
}
