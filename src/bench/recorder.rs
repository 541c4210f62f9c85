//! The statuses a workload's runs went through, as the API server served them: one raw watch of
//! the workload's namespace while it runs. They give two figures:
//!
//! - the largest object (bytes of the whole object as the server encoded it, spec, metadata
//!   and status), the figure the object budget of docs/design.md section 3 (guarantee 8) bounds;
//! - the floor's replay ([`super::floor`]): each run's statuses in the order they were written,
//!   so the floor writes as many statuses as the runtime did, of the same sizes, including the
//!   ones a run's window had before sealing moved its steps out (the final record alone holds
//!   only the last window).
//!
//! The watch reads each event line once and keeps the status's text as the server sent it
//! (serde_json's `RawValue`): it builds no object while the runtime is measured, so it adds
//! little CPU to the process it shares with the embedded API server. Only once the runs have
//! ended is each run's last status parsed, to check the recording reached it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::AsyncBufReadExt as _;
use serde::Deserialize;
use serde_json::value::RawValue;

/// At most this many bytes of statuses are kept (1 GiB); past it the recording is dropped
/// and the floor replays the final records instead (the note says so).
const KEEP_BYTES: usize = 1 << 30;

/// How long [`StatusRecorder::finish`] waits for the watch to deliver the runs' final
/// statuses (60 s).
const CATCH_UP: std::time::Duration = std::time::Duration::from_secs(60);

/// What [`StatusRecorder::finish`] hands back.
#[derive(Debug, Default)]
pub struct Recorded {
    /// The largest object seen, in bytes as the server encoded it; `None` when none was seen.
    pub largest_object_bytes: Option<u64>,
    /// Each run's statuses (by run name), in the order the watch delivered them; empty when
    /// they were not kept or the recording is not whole (see `incomplete`).
    pub statuses: BTreeMap<String, Vec<Box<RawValue>>>,
    /// Why the statuses are not whole, when they are not: the LIST before the watch failed,
    /// the watch's history expired (410), the server refused the watch, a line was not an
    /// event, or the statuses passed [`KEEP_BYTES`].
    pub incomplete: Option<String>,
}

impl Recorded {
    /// Statuses kept, over every run.
    pub fn status_count(&self) -> usize {
        self.statuses.values().map(Vec::len).sum()
    }
}

#[derive(Default)]
struct State {
    largest: u64,
    statuses: BTreeMap<String, Vec<Box<RawValue>>>,
    kept_bytes: usize,
    incomplete: Option<String>,
}

/// A raw watch of one namespace's AgentRuns, started before its runs are created.
pub struct StatusRecorder {
    task: tokio::task::JoinHandle<()>,
    state: Arc<Mutex<State>>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize)]
struct Object<'a> {
    #[serde(borrow, default)]
    metadata: Metadata<'a>,
    #[serde(borrow, default)]
    status: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Metadata<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<std::borrow::Cow<'a, str>>,
}

impl StatusRecorder {
    /// Starts watching `namespace`'s AgentRuns from the resourceVersion of a LIST made first,
    /// so every write after this returns is seen, however late the watch connects. With
    /// `keep`, each run's statuses are kept for the floor; without, only the largest object is
    /// measured. A failed LIST leaves the statuses unkept (the reason is in
    /// [`Recorded::incomplete`]).
    pub async fn start(client: &kube::Client, namespace: &str, keep: bool) -> StatusRecorder {
        let state = Arc::new(Mutex::new(State::default()));
        let client = client.clone();
        let path = format!("/apis/agentrt.dev/v1alpha1/namespaces/{namespace}/agentruns");
        let mut resource_version = match list_version(&client, &path).await {
            Ok(version) => version,
            Err(why) => {
                state.lock().unwrap_or_else(|e| e.into_inner()).incomplete = Some(why);
                String::new()
            }
        };
        let shared = state.clone();
        let task = tokio::spawn(async move {
            // The last status kept per run: a metadata-only change repeats it.
            let mut last: BTreeMap<String, Box<RawValue>> = BTreeMap::new();
            loop {
                match watch_once(
                    &client,
                    &path,
                    &mut resource_version,
                    keep,
                    &mut last,
                    &shared,
                )
                .await
                {
                    // The server ended the stream (its timeout): resume where it stopped.
                    Ok(()) => {}
                    // The stream broke: resume where it stopped, after a moment.
                    Err(Ended::Broken) => {
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                    // The history is gone (410) or the answer is not a watch: the statuses
                    // cannot be whole; watch on from now for the largest object alone.
                    Err(Ended::Lost(why)) => {
                        shared
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .incomplete
                            .get_or_insert(why);
                        resource_version.clear();
                        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    }
                }
            }
        });
        StatusRecorder { task, state }
    }

    /// Stops the watch and hands back what it saw. With `finals` (the runs as they ended),
    /// first waits, at most [`CATCH_UP`], until the watch has delivered each one's final
    /// status; without, a moment for the last write to reach it.
    pub async fn finish(self, finals: Option<&[kube::api::DynamicObject]>) -> Recorded {
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        match finals {
            Some(finals) => {
                let mut pending: Vec<&kube::api::DynamicObject> = finals.iter().collect();
                while !self.caught_up(&mut pending) && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
        }
        self.task.abort();
        let _ = self.task.await;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = std::mem::take(&mut *state);
        let incomplete = state.incomplete;
        Recorded {
            largest_object_bytes: (state.largest > 0).then_some(state.largest),
            statuses: if incomplete.is_some() {
                BTreeMap::new()
            } else {
                state.statuses
            },
            incomplete,
        }
    }
}

/// Why a watch request ended early.
#[derive(Debug)]
enum Ended {
    /// The request or its stream failed, or the server answered with an error it may not
    /// repeat (429, 5xx: a 504 from a watch cache behind, an etcd timeout): the watch resumes
    /// from the last version.
    Broken,
    /// What was recorded cannot be whole: the history expired (410), the server refused the
    /// watch (another 4xx), or a line is not an event.
    Lost(String),
}

/// How a watch that the server answered with HTTP `code` ended.
fn ended_by(code: u16, message: &str) -> Ended {
    match code {
        429 | 500..=599 => Ended::Broken,
        _ => Ended::Lost(format!("the watch ended with HTTP {code}: {message}")),
    }
}

/// The resourceVersion of a LIST of `path` (one item at most).
async fn list_version(client: &kube::Client, path: &str) -> Result<String, String> {
    #[derive(Deserialize)]
    struct List<'a> {
        #[serde(borrow)]
        metadata: Metadata<'a>,
    }
    let request = http::Request::get(format!("{path}?limit=1"))
        .body(Vec::new())
        .map_err(|e| format!("the list request: {e}"))?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("the list before the watch failed: {e}"))?;
    let list: List =
        serde_json::from_str(&text).map_err(|e| format!("the list before the watch: {e}"))?;
    list.metadata
        .resource_version
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| "the list before the watch has no resourceVersion".to_string())
}

impl StatusRecorder {
    /// Whether the statuses recorded end, for every run of `pending`, with its final status
    /// (or cannot be whole anyway). The runs found caught up leave `pending`, so each poll
    /// parses only the last status of runs still waiting for theirs.
    fn caught_up(&self, pending: &mut Vec<&kube::api::DynamicObject>) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.incomplete.is_some() {
            return true;
        }
        pending.retain(|run| {
            let name = run.metadata.name.as_deref().unwrap_or_default();
            let last = run.data.get("status").unwrap_or(&serde_json::Value::Null);
            !ends_with(state.statuses.get(name), last)
        });
        pending.is_empty()
    }
}

/// Whether `statuses` (a run's, as recorded) end with `last`.
pub fn ends_with(statuses: Option<&Vec<Box<RawValue>>>, last: &serde_json::Value) -> bool {
    statuses
        .and_then(|statuses| statuses.last())
        .is_some_and(|status| {
            serde_json::from_str::<serde_json::Value>(status.get()).is_ok_and(|seen| &seen == last)
        })
}

/// One watch request, read to its end.
async fn watch_once(
    client: &kube::Client,
    path: &str,
    resource_version: &mut String,
    keep: bool,
    last: &mut BTreeMap<String, Box<RawValue>>,
    shared: &Mutex<State>,
) -> Result<(), Ended> {
    let mut uri = format!("{path}?watch=true&allowWatchBookmarks=true");
    if !resource_version.is_empty() {
        uri.push_str(&format!("&resourceVersion={resource_version}"));
    }
    let Ok(request) = http::Request::get(uri).body(Vec::new()) else {
        return Err(Ended::Lost("the watch request cannot be built".into()));
    };
    let mut body = client
        .request_stream(request)
        .await
        .map_err(|err| match err {
            kube::Error::Api(status) => ended_by(status.code, &status.message),
            _ => Ended::Broken,
        })?;
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = body
            .read_until(b'\n', &mut line)
            .await
            .map_err(|_| Ended::Broken)?;
        if read == 0 {
            return Ok(());
        }
        let text =
            std::str::from_utf8(&line).map_err(|e| Ended::Lost(format!("a watch line: {e}")))?;
        let mut state = shared.lock().unwrap_or_else(|e| e.into_inner());
        absorb(text, keep, resource_version, last, &mut state)?;
    }
}

/// Takes one watch line into `state`: the largest object, and with `keep` the run's status
/// when it changed (a metadata-only change repeats the last one and is skipped, as is the
/// status a run was created with). `resource_version` follows the events and bookmarks, for a
/// watch resumed after the server ended one.
fn absorb(
    text: &str,
    keep: bool,
    resource_version: &mut String,
    last: &mut BTreeMap<String, Box<RawValue>>,
    state: &mut State,
) -> Result<(), Ended> {
    if text.trim().is_empty() {
        return Ok(());
    }
    let event: Event = serde_json::from_str(text)
        .map_err(|e| Ended::Lost(format!("a watch line is not an event: {e}")))?;
    if event.kind == "ERROR" {
        #[derive(Deserialize, Default)]
        struct Status {
            #[serde(default)]
            code: u16,
        }
        let code = serde_json::from_str::<Status>(event.object.get()).map_or(0, |s| s.code);
        return Err(ended_by(code, event.object.get()));
    }
    let object: Object = serde_json::from_str(event.object.get())
        .map_err(|e| Ended::Lost(format!("a watched object: {e}")))?;
    if let Some(rv) = &object.metadata.resource_version {
        *resource_version = rv.to_string();
    }
    if event.kind == "BOOKMARK" {
        return Ok(());
    }
    state.largest = state.largest.max(event.object.get().len() as u64);
    let (Some(name), Some(status)) = (object.metadata.name, object.status) else {
        return Ok(());
    };
    if !keep || state.incomplete.is_some() || event.kind == "DELETED" {
        return Ok(());
    }
    let name = name.into_owned();
    if last.get(&name).is_some_and(|l| l.get() == status.get()) {
        return Ok(());
    }
    let status = status.to_owned();
    last.insert(name.clone(), status.clone());
    // A run's first status, when the server gave it one at its creation (a CRD default),
    // is not a write the runtime made: the floor's create gets it the same way.
    if event.kind == "ADDED" {
        return Ok(());
    }
    state.kept_bytes += status.get().len();
    if state.kept_bytes > KEEP_BYTES {
        state.incomplete = Some(format!(
            "the statuses passed {} MiB, more than the bench keeps",
            KEEP_BYTES >> 20
        ));
        state.statuses.clear();
        return Ok(());
    }
    state.statuses.entry(name).or_default().push(status);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(lines: &[&str], keep: bool) -> (State, String) {
        let mut state = State::default();
        let mut rv = String::new();
        let mut last = BTreeMap::new();
        for line in lines {
            absorb(line, keep, &mut rv, &mut last, &mut state).unwrap();
        }
        (state, rv)
    }

    const ADDED: &str = r#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"1"},"spec":{"goal":"g"},"status":{"phase":"Pending"}}}"#;
    const FIRST: &str = r#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"2"},"spec":{"goal":"g"},"status":{"phase":"Running","stepCount":1}}}"#;
    const RELABELLED: &str = r#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"3","labels":{"x":"y"}},"spec":{"goal":"g"},"status":{"phase":"Running","stepCount":1}}}"#;
    const BOOKMARK: &str =
        r#"{"type":"BOOKMARK","object":{"kind":"AgentRun","metadata":{"resourceVersion":"9"}}}"#;
    const SECOND: &str = r#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"10"},"spec":{"goal":"g"},"status":{"phase":"Completed","stepCount":2}}}"#;
    const OTHER: &str = r#"{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVersion":"11"},"spec":{},"status":{"phase":"Running"}}}"#;
    const DELETED: &str = r#"{"type":"DELETED","object":{"metadata":{"name":"a","resourceVersion":"12"},"spec":{"goal":"g"},"status":{"phase":"Cancelled"}}}"#;

    #[test]
    fn each_status_written_is_kept_once_in_order_and_nothing_else() {
        let (state, rv) = feed(
            &[
                ADDED, FIRST, RELABELLED, BOOKMARK, SECOND, OTHER, DELETED, "",
            ],
            true,
        );
        let a: Vec<&str> = state.statuses["a"].iter().map(|s| s.get()).collect();
        assert_eq!(
            a,
            [
                r#"{"phase":"Running","stepCount":1}"#,
                r#"{"phase":"Completed","stepCount":2}"#
            ]
        );
        assert_eq!(state.statuses["b"].len(), 1);
        assert_eq!(rv, "12");
        let longest = [ADDED, FIRST, RELABELLED, SECOND, OTHER, DELETED]
            .iter()
            .map(|l| {
                let event: serde_json::Value = serde_json::from_str(l).unwrap();
                serde_json::to_string(&event["object"]).unwrap().len() as u64
            })
            .max()
            .unwrap();
        assert_eq!(state.largest, longest);
    }

    #[test]
    fn without_keep_only_the_largest_object_is_measured() {
        let (state, _) = feed(&[ADDED, FIRST, SECOND], false);
        assert!(state.statuses.is_empty());
        assert!(state.largest > 0);
    }

    #[test]
    fn an_expired_history_ends_the_recording_and_a_server_error_resumes_it() {
        let mut state = State::default();
        let expired =
            r#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}"#;
        let ended = absorb(
            expired,
            true,
            &mut String::new(),
            &mut BTreeMap::new(),
            &mut state,
        );
        assert!(
            matches!(&ended, Err(Ended::Lost(why)) if why.contains("410")),
            "{ended:?}"
        );
        let behind = r#"{"type":"ERROR","object":{"kind":"Status","code":504,"reason":"Timeout"}}"#;
        let ended = absorb(
            behind,
            true,
            &mut String::new(),
            &mut BTreeMap::new(),
            &mut state,
        );
        assert!(matches!(ended, Err(Ended::Broken)), "{ended:?}");
        assert!(matches!(ended_by(403, "forbidden"), Ended::Lost(_)));
    }
}
