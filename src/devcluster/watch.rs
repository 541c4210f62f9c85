//! Watch streams: newline-delimited JSON `{"type": ..., "object": ...}` events over a chunked
//! response, as kube-apiserver's watch cache sends them.
//!
//! - Start: without `resourceVersion` or with `"0"`, an ADDED event for every existing object
//!   first, then changes; with `resourceVersion=N`, every change after N; with
//!   `sendInitialEvents=true`, the existing objects followed by a BOOKMARK annotated
//!   `k8s.io/initial-events-end: "true"` (streaming lists, as kube-runtime's watcher may use).
//! - A resourceVersion older than the retained history (or a watcher so slow the history
//!   moved past it) gets an ERROR event carrying a 410 `Expired` Status
//!   (`too old resource version: N (M)`) and the stream ends, so clients re-list.
//! - Selectors are applied to each change; an object that stops matching is sent as DELETED,
//!   one that starts matching as ADDED (kube-apiserver's cacher does the same).
//! - `allowWatchBookmarks=true`: a BOOKMARK (only `metadata.resourceVersion`) every
//!   bookmark interval. `timeoutSeconds` ends the stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::convert::from_storage;
use super::route::Target;
use super::selectors::{FieldSelector, LabelSelector};
use super::server::Shared;
use super::status::ApiError;
use super::store::{ChangeKind, Since, Store};
use super::table::{self, IncludeObject};

/// The parameters of a watch request.
pub struct WatchParams {
    /// `resourceVersion`: `None`/`"0"` = from now with the current objects first.
    pub resource_version: Option<u64>,
    /// Whether the current objects are sent first as ADDED events.
    pub initial_events: bool,
    /// `sendInitialEvents=true`: end the initial events with the annotated bookmark.
    pub initial_events_end: bool,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// `labelSelector`.
    pub labels: LabelSelector,
    /// `fieldSelector`.
    pub fields: FieldSelector,
    /// `Some` when the client asked for Table events.
    pub table: Option<IncludeObject>,
}

type Chunk = Result<Bytes, Infallible>;

/// Starts a watch; the returned stream is the response body.
pub fn start(shared: Arc<Shared>, t: Target, p: WatchParams) -> ReceiverStream<Chunk> {
    let (tx, rx) = mpsc::channel::<Chunk>(256);
    tokio::spawn(async move {
        let mut w = Watcher {
            shared,
            t,
            p,
            tx,
            cursor: 0,
        };
        w.run().await;
    });
    ReceiverStream::new(rx)
}

struct Watcher {
    shared: Arc<Shared>,
    t: Target,
    p: WatchParams,
    tx: mpsc::Sender<Chunk>,
    cursor: u64,
}

enum Step {
    Continue,
    Stop,
}

impl Watcher {
    /// One event line. `type` is written before `object`, as kube-apiserver writes it: a
    /// client reading the event as an adjacently tagged enum (kube-rs's `WatchEvent`) can then
    /// parse the object in place instead of buffering it until it learns the type.
    fn line(event: &Value) -> Chunk {
        let mut bytes = Vec::new();
        match (event.get("type"), event.get("object")) {
            (Some(kind), Some(object)) if event.as_object().is_some_and(|m| m.len() == 2) => {
                bytes.extend_from_slice(b"{\"type\":");
                let _ = serde_json::to_writer(&mut bytes, kind);
                bytes.extend_from_slice(b",\"object\":");
                let _ = serde_json::to_writer(&mut bytes, object);
                bytes.push(b'}');
            }
            _ => {
                let _ = serde_json::to_writer(&mut bytes, event);
            }
        }
        bytes.push(b'\n');
        Ok(Bytes::from(bytes))
    }

    async fn send(&self, event: Value) -> Step {
        match self.tx.send(Self::line(&event)).await {
            Ok(()) => Step::Continue,
            Err(_) => Step::Stop,
        }
    }

    fn matches(&self, object: &Value) -> bool {
        self.p.labels.matches(object) && self.p.fields.matches(object)
    }

    fn in_scope(&self, storage: &str, namespace: &str) -> bool {
        *self.t.rt.storage == *storage
            && self.t.namespace.as_deref().is_none_or(|ns| ns == namespace)
    }

    /// The event for a stored object, in the client's version (and as a Table if asked).
    fn event(&self, kind: &str, stored: &Value, rv: Option<u64>) -> Value {
        let mut object = from_storage(&self.t.rt, &self.t.version, stored);
        if let Some(rv) = rv {
            object["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
        if let Some(include) = self.p.table {
            object = table::table(&self.t.rt, &self.t.version, &[object], None, include);
        }
        json!({"type": kind, "object": object})
    }

    fn bookmark(&self, initial_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": self.cursor.to_string()});
        if initial_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"type": "BOOKMARK", "object": {
            "kind": self.t.rt.kind,
            "apiVersion": self.t.rt.api_version(&self.t.version),
            "metadata": metadata,
        }})
    }

    fn expired(&self, requested: u64, oldest: u64) -> Value {
        let status = ApiError::Expired(format!("too old resource version: {requested} ({oldest})"))
            .to_status();
        json!({"type": "ERROR", "object": status})
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(&mut self) {
        let mut changes = self.lock().subscribe();
        let first = self.begin();
        for event in first.0 {
            if let Step::Stop = self.send(event).await {
                return;
            }
        }
        if !first.1 {
            return;
        }
        // Changes already made after the starting resourceVersion.
        if let Step::Stop = self.drain().await {
            return;
        }
        let deadline = self.p.timeout.map(|d| Instant::now() + d);
        let interval = self.shared.bookmark_interval;
        let mut next_bookmark = Instant::now() + interval;
        loop {
            let sleep_deadline = tokio::time::sleep_until(deadline.unwrap_or_else(far_future));
            let bookmark_due = tokio::time::sleep_until(next_bookmark);
            tokio::select! {
                _ = self.tx.closed() => return,
                _ = self.shared.shutdown.cancelled() => return,
                _ = sleep_deadline => return,
                _ = bookmark_due, if self.p.bookmarks => {
                    next_bookmark = Instant::now() + interval;
                    if let Step::Stop = self.drain().await {
                        return;
                    }
                    if let Step::Stop = self.send(self.bookmark(false)).await {
                        return;
                    }
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if let Step::Stop = self.drain().await {
                        return;
                    }
                }
            }
        }
    }

    /// The first events (initial ADDED events, the initial-events-end bookmark, or a 410),
    /// computed atomically with the cursor. The flag says whether to keep streaming.
    fn begin(&mut self) -> (Vec<Value>, bool) {
        let shared = self.shared.clone();
        let store = shared.store.lock().unwrap_or_else(|e| e.into_inner());
        let mut events = Vec::new();
        match self.p.resource_version {
            Some(rv) if !self.p.initial_events => {
                if let Since::Expired(oldest) = store.since(rv) {
                    return (vec![self.expired(rv, oldest)], false);
                }
                self.cursor = rv;
            }
            _ => {
                self.cursor = store.rv();
                if self.p.initial_events {
                    let ns = if self.t.rt.namespaced {
                        self.t.namespace.as_deref()
                    } else {
                        None
                    };
                    for (_, obj) in store.list(&self.t.rt.storage, ns) {
                        if self.matches(obj) {
                            events.push(self.event("ADDED", obj, None));
                        }
                    }
                }
                if self.p.initial_events_end {
                    events.push(self.bookmark(true));
                }
            }
        }
        (events, true)
    }

    /// Sends every change after the cursor that this watch should see. The changes are taken
    /// under the store's lock; the events are built and sent after it is released (the changes
    /// are immutable), so a watcher never holds writers up while it copies objects.
    async fn drain(&mut self) -> Step {
        let since = {
            let store = self.lock();
            match store.since(self.cursor) {
                Since::Expired(oldest) => Err(oldest),
                Since::Changes(changes) => Ok((changes, store.rv())),
            }
        };
        let (changes, rv) = match since {
            Ok(since) => since,
            Err(oldest) => {
                let _ = self.send(self.expired(self.cursor, oldest)).await;
                return Step::Stop;
            }
        };
        for c in changes {
            self.cursor = c.rv;
            if !self.in_scope(&c.key.storage, &c.key.namespace) {
                continue;
            }
            let now = c.kind != ChangeKind::Deleted && self.matches(&c.object);
            let before = c.prev.as_deref().is_some_and(|p| self.matches(p));
            let (kind, object, rv) = match (now, before) {
                (true, false) => ("ADDED", &*c.object, None),
                (true, true) => (c.kind.as_str(), &*c.object, None),
                (false, true) => match (&c.kind, c.prev.as_deref()) {
                    (ChangeKind::Deleted, _) => ("DELETED", &*c.object, None),
                    (_, Some(prev)) => ("DELETED", prev, Some(c.rv)),
                    (_, None) => continue,
                },
                (false, false) => continue,
            };
            let line = if kind == c.kind.as_str() && rv.is_none() && self.p.table.is_none() {
                // The change as it is: encoded once, shared by every watcher of this version.
                match c.encoded.get() {
                    Some((version, line)) if *version == self.t.version => Ok(line.clone()),
                    _ => {
                        let line = Self::line(&self.event(kind, object, None));
                        if let Ok(bytes) = &line {
                            let _ = c.encoded.set((self.t.version.clone(), bytes.clone()));
                        }
                        line
                    }
                }
            } else {
                Self::line(&self.event(kind, object, rv))
            };
            if self.tx.send(line).await.is_err() {
                return Step::Stop;
            }
        }
        self.cursor = self.cursor.max(rv);
        Step::Continue
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365)
}
