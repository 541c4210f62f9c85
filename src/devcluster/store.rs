//! The object store: every object (in its storage version) keyed by storage, namespace and
//! name; the global, monotonically increasing `resourceVersion`; and a bounded history of
//! changes from which watches are served.
//!
//! Every write goes through [`Store::put`] or [`Store::remove`], which take the next
//! resourceVersion, stamp it into `metadata.resourceVersion`, record the change and wake the
//! watchers. The store does not know the rules of any verb (see `write.rs` and `delete.rs`);
//! it is always used under the server's one lock, so a verb's checks and its write are atomic.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use super::error::DevClusterError;
use super::registry::Registry;

/// Storage id of CustomResourceDefinitions (their writes change the [`Registry`]).
pub const CRD_STORAGE: &str = "customresourcedefinitions.apiextensions.k8s.io";
/// Storage id of namespaces.
pub const NAMESPACE_STORAGE: &str = "namespaces";

/// Where an object lives: its type's storage id, namespace (`""` if cluster-scoped) and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    /// Storage id of the resource type, e.g. `widgets.example.dev`.
    pub storage: Arc<str>,
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

/// What happened to an object, as a watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created.
    Added,
    /// Updated (including deletion being requested on an object with finalizers).
    Modified,
    /// Removed; the object is its last state with the deletion's resourceVersion.
    Deleted,
}

impl ChangeKind {
    /// The watch event `type`: `ADDED`, `MODIFIED` or `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One recorded change.
#[derive(Debug)]
pub struct Change {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// What happened.
    pub kind: ChangeKind,
    /// Which object.
    pub key: ObjKey,
    /// The object after the change (for deletes, its last state).
    pub object: Arc<Value>,
    /// The object before the change (`None` for creations), for selector transitions.
    pub prev: Option<Arc<Value>>,
    /// `object`'s compact-JSON length, counted against [`HISTORY_BYTES`].
    pub bytes: usize,
    /// The change's own watch event line (its kind, the object), encoded once for the API
    /// version of the first watcher that sent it; watchers of that version share it.
    pub encoded: std::sync::OnceLock<(String, bytes::Bytes)>,
}

/// Changes after a resourceVersion, or the reason they cannot be given.
pub enum Since {
    /// Every change after the requested resourceVersion, oldest first.
    Changes(Vec<Arc<Change>>),
    /// The requested resourceVersion is older than the retained history; the value is the
    /// oldest resourceVersion a watch may start from.
    Expired(u64),
}

/// Makes a resourceVersion ceiling durable (see `persist::reserve`); its error keeps the I/O
/// failure as its source.
pub type Reserve = Box<dyn FnMut(u64) -> Result<(), DevClusterError> + Send>;

/// How many resourceVersions one reservation covers (10 000): a durable write every that many
/// writes, and the most a restart skips.
pub const RESERVE_BLOCK: u64 = 10_000;

/// The most bytes (compact JSON of the changed objects) the change history keeps, whatever
/// its count allows: 256 MiB.
pub const HISTORY_BYTES: usize = 256 * 1024 * 1024;

/// The compact-JSON length of `value`, counted without building the text.
fn encoded_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => 0,
    }
}

/// The objects, the resourceVersion counter, the change history and the served types.
pub struct Store {
    objects: BTreeMap<ObjKey, Arc<Value>>,
    rv: u64,
    /// With `--data-dir`: the reserved ceiling and how to raise it. No resourceVersion above
    /// the ceiling is handed out before it is raised (so a restart can start above it).
    reservation: Option<(u64, Reserve)>,
    history: VecDeque<Arc<Change>>,
    history_cap: usize,
    /// The compact-JSON bytes of the objects `history` holds, and the most it may hold
    /// ([`HISTORY_BYTES`]): a server whose objects are large keeps fewer changes rather than
    /// gigabytes of them (kube-apiserver's watch cache is bounded too; a watcher that falls
    /// behind gets 410 Gone and relists).
    history_bytes: usize,
    history_bytes_cap: usize,
    /// Every change with a resourceVersion above this is still in `history`.
    history_floor: u64,
    registry: Arc<Registry>,
    notify: watch::Sender<u64>,
    /// With `--data-dir`: every change is appended here before it is answered.
    journal: Option<super::persist::Journal>,
    /// The validating admission webhooks handed in (`webhook.rs`).
    webhooks: Vec<super::webhook::ValidatingWebhook>,
}

impl Store {
    /// Keeps at most `bytes` of changed objects in the history (default [`HISTORY_BYTES`]).
    #[cfg(test)]
    pub fn set_history_bytes(&mut self, bytes: usize) {
        self.history_bytes_cap = bytes;
    }

    /// An empty store keeping the last `history_cap` changes (at least 1), starting at
    /// resourceVersion `rv`.
    pub fn new(history_cap: usize, rv: u64) -> Store {
        let (notify, _) = watch::channel(rv);
        Store {
            objects: BTreeMap::new(),
            rv,
            reservation: None,
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            history_bytes: 0,
            history_bytes_cap: HISTORY_BYTES,
            history_floor: rv,
            registry: Arc::new(Registry::builtins()),
            notify,
            journal: None,
            webhooks: Vec::new(),
        }
    }

    /// The validating admission webhooks every create and update asks (`webhook.rs`).
    pub fn set_webhooks(&mut self, webhooks: Vec<super::webhook::ValidatingWebhook>) {
        self.webhooks = webhooks;
    }

    /// The validating admission webhooks.
    pub fn webhooks(&self) -> &[super::webhook::ValidatingWebhook] {
        &self.webhooks
    }

    /// From now on, appends every change to `journal` before the write returns (see
    /// `persist.rs`), so a kill of the server loses no answered write.
    pub fn journal_to(&mut self, journal: super::persist::Journal) {
        self.journal = Some(journal);
    }

    /// Sets the journal aside at the current resourceVersion (a snapshot of this state is
    /// about to be written) and begins a new one. Returns that resourceVersion.
    ///
    /// # Errors
    /// When the journal cannot be set aside (the snapshot then covers it anyway; the old
    /// journal is replayed over it at start, which changes nothing).
    pub fn rotate_journal(&mut self) -> Result<u64, super::error::DevClusterError> {
        let rv = self.rv;
        if let Some(journal) = &mut self.journal {
            journal.rotate(rv)?;
        }
        Ok(rv)
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// From now on, reserves resourceVersions [`RESERVE_BLOCK`] at a time with `reserve`
    /// before handing them out, starting with one block above the current one.
    ///
    /// # Errors
    /// When the first reservation cannot be made (then none is set up).
    pub fn reserve_with(&mut self, mut reserve: Reserve) -> Result<(), DevClusterError> {
        let ceiling = self.rv.saturating_add(RESERVE_BLOCK);
        reserve(ceiling)?;
        self.reservation = Some((ceiling, reserve));
        Ok(())
    }

    /// Takes the next resourceVersion, raising the reservation first when it would pass it.
    /// A reservation that fails is logged and tried again on the next write (the write still
    /// happens: refusing it would not make the lost reservation durable either).
    fn next_rv(&mut self) -> u64 {
        let next = self.rv + 1;
        if let Some((ceiling, reserve)) = &mut self.reservation {
            if next > *ceiling {
                let raised = next.saturating_add(RESERVE_BLOCK);
                match reserve(raised) {
                    Ok(()) => *ceiling = raised,
                    Err(e) => tracing::error!(
                        "agentrt dev: cannot reserve resourceVersions up to {raised}: {e}; a \
                         crash now could let a restarted server reuse resourceVersions"
                    ),
                }
            }
        }
        self.rv = next;
        next
    }

    /// A receiver that changes whenever the resourceVersion moves (for watchers and the
    /// snapshot writer).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// The served types (rebuilt when a CRD is written).
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// Rebuilds the served types from the stored CRDs.
    pub fn rebuild_registry(&mut self) {
        let crds: Vec<Arc<Value>> = self
            .list(CRD_STORAGE, None)
            .map(|(_, v)| v.clone())
            .collect();
        self.registry = Arc::new(Registry::with_crds(crds.iter().map(|v| v.as_ref())));
    }

    /// The object at `key`.
    pub fn get(&self, key: &ObjKey) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }

    /// The objects of one storage, in one namespace (`Some`) or all (`None`), ordered by
    /// namespace then name.
    pub fn list<'a>(
        &'a self,
        storage: &str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Arc<Value>)> + 'a {
        let start = ObjKey {
            storage: Arc::from(storage),
            namespace: namespace.unwrap_or("").to_string(),
            name: String::new(),
        };
        let storage_id = start.storage.clone();
        self.objects
            .range((Bound::Included(start), Bound::Unbounded))
            .take_while(move |(k, _)| {
                k.storage == storage_id && namespace.is_none_or(|ns| k.namespace == ns)
            })
    }

    /// Every object (for garbage collection and snapshots).
    /// The objects of `storage` (in `namespace`, or all) as they were at resourceVersion `rv`:
    /// the current ones with every later change undone. `Err(oldest)` when the history no
    /// longer reaches back to `rv` (as etcd answers for a compacted revision), or `rv` is in the
    /// future.
    pub fn list_at(
        &self,
        storage: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> Result<BTreeMap<ObjKey, Arc<Value>>, u64> {
        if rv < self.history_floor || rv > self.rv {
            return Err(self.history_floor);
        }
        let mut objects: BTreeMap<ObjKey, Arc<Value>> = self
            .list(storage, namespace)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let start = self.history.partition_point(|c| c.rv <= rv);
        for change in self.history.range(start..).rev() {
            let key = &change.key;
            if &*key.storage != storage || namespace.is_some_and(|ns| key.namespace != ns) {
                continue;
            }
            match &change.prev {
                Some(prev) => objects.insert(key.clone(), prev.clone()),
                None => objects.remove(key),
            };
        }
        Ok(objects)
    }

    pub fn all(&self) -> impl Iterator<Item = (&ObjKey, &Arc<Value>)> {
        self.objects.iter()
    }

    /// Stores `object` at `key` with the next resourceVersion and records the change.
    /// Returns the stored object.
    pub fn put(&mut self, key: ObjKey, mut object: Value, kind: ChangeKind) -> Arc<Value> {
        let rv = self.next_rv();
        set_rv(&mut object, rv);
        let object = Arc::new(object);
        let prev = self.objects.insert(key.clone(), object.clone());
        self.record(kind, key, object.clone(), prev);
        object
    }

    /// Removes the object at `key`, recording a DELETED change whose object is `last` (or the
    /// stored object) with the deletion's resourceVersion. Returns that object.
    pub fn remove(&mut self, key: &ObjKey, last: Option<Value>) -> Option<Arc<Value>> {
        let stored = self.objects.remove(key)?;
        let rv = self.next_rv();
        let mut object = last.unwrap_or_else(|| stored.as_ref().clone());
        set_rv(&mut object, rv);
        let object = Arc::new(object);
        self.record(
            ChangeKind::Deleted,
            key.clone(),
            object.clone(),
            Some(stored),
        );
        Some(object)
    }

    fn record(
        &mut self,
        kind: ChangeKind,
        key: ObjKey,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        if let Some(journal) = &mut self.journal {
            let stored = (kind != ChangeKind::Deleted).then_some(object.as_ref());
            if let Err(e) = journal.append(self.rv, &key, stored) {
                tracing::error!(
                    "agentrt dev: cannot journal a change: {e}; a crash before the next \
                     snapshot would lose it"
                );
            }
        }
        let bytes = encoded_len(object.as_ref());
        self.history_bytes = self.history_bytes.saturating_add(bytes);
        self.history.push_back(Arc::new(Change {
            rv: self.rv,
            kind,
            key,
            object,
            prev,
            bytes,
            encoded: std::sync::OnceLock::new(),
        }));
        // Always keep the newest change, whatever its size.
        while self.history.len() > self.history_cap
            || (self.history_bytes > self.history_bytes_cap && self.history.len() > 1)
        {
            if let Some(old) = self.history.pop_front() {
                self.history_floor = old.rv;
                self.history_bytes = self.history_bytes.saturating_sub(old.bytes);
            }
        }
        self.notify.send_replace(self.rv);
    }

    /// The changes after resourceVersion `rv`, if the history still holds all of them.
    ///
    /// A resourceVersion from the future (a client of an earlier server that started afresh)
    /// is treated as expired too, so the client re-lists instead of waiting for changes it
    /// would never see.
    pub fn since(&self, rv: u64) -> Since {
        if rv < self.history_floor || rv > self.rv {
            return Since::Expired(self.history_floor);
        }
        let start = self.history.partition_point(|c| c.rv <= rv);
        Since::Changes(self.history.range(start..).cloned().collect())
    }

    /// Loads objects (from a snapshot) at resourceVersion `rv`, replacing everything, with an
    /// empty history starting there: a watch from any earlier resourceVersion gets 410. The
    /// server passes an `rv` above every one the previous server handed out (see
    /// `persist.rs`), not the snapshot's own.
    pub fn restore(&mut self, rv: u64, objects: Vec<(ObjKey, Value)>) {
        self.objects = objects.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        self.rv = rv;
        self.history.clear();
        self.history_floor = rv;
        self.rebuild_registry();
        self.notify.send_replace(rv);
    }
}

fn set_rv(object: &mut Value, rv: u64) {
    if let Some(meta) = object
        .as_object_mut()
        .map(|o| {
            o.entry("metadata")
                .or_insert_with(|| Value::Object(Default::default()))
        })
        .and_then(Value::as_object_mut)
    {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> ObjKey {
        ObjKey {
            storage: Arc::from("configmaps"),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn every_write_takes_the_next_resource_version() {
        let mut s = Store::new(10, 100);
        let a = s.put(
            key("a"),
            json!({"metadata": {"name": "a"}}),
            ChangeKind::Added,
        );
        let b = s.put(
            key("b"),
            json!({"metadata": {"name": "b"}}),
            ChangeKind::Added,
        );
        assert_eq!(a["metadata"]["resourceVersion"], "101");
        assert_eq!(b["metadata"]["resourceVersion"], "102");
        let gone = s.remove(&key("a"), None).expect("removed");
        assert_eq!(gone["metadata"]["resourceVersion"], "103");
        assert_eq!(s.rv(), 103);
    }

    #[test]
    fn history_older_than_the_window_has_expired() {
        let mut s = Store::new(2, 0);
        for n in ["a", "b", "c", "d"] {
            s.put(key(n), json!({}), ChangeKind::Added);
        }
        assert!(matches!(s.since(1), Since::Expired(2)));
        match s.since(2) {
            Since::Changes(c) => assert_eq!(c.iter().map(|c| c.rv).collect::<Vec<_>>(), [3, 4]),
            Since::Expired(_) => panic!("rv 2 is still in the window"),
        }
    }

    #[test]
    fn history_keeps_no_more_bytes_than_its_budget() {
        let mut s = Store::new(100, 0);
        s.set_history_bytes(3000);
        let big = json!({"data": "x".repeat(1000)});
        for n in ["a", "b", "c", "d", "e"] {
            s.put(key(n), big.clone(), ChangeKind::Added);
        }
        // Each object is a little over 1000 bytes: two fit in 3000, the rest expired although
        // the count would keep 100.
        match s.since(3) {
            Since::Changes(c) => assert_eq!(c.iter().map(|c| c.rv).collect::<Vec<_>>(), [4, 5]),
            Since::Expired(floor) => panic!("rv 3 is within the budget (floor {floor})"),
        }
        assert!(matches!(s.since(2), Since::Expired(3)));
        // A single change over the budget is still kept: a watcher sees the newest change.
        s.put(
            key("f"),
            json!({"data": "y".repeat(5000)}),
            ChangeKind::Added,
        );
        assert!(matches!(s.since(5), Since::Changes(c) if c.len() == 1));
    }

    #[test]
    fn a_resource_version_from_the_future_has_expired() {
        let mut s = Store::new(10, 50);
        s.put(key("a"), json!({}), ChangeKind::Added);
        assert!(matches!(s.since(51), Since::Changes(_)));
        assert!(matches!(s.since(52), Since::Expired(50)));
    }

    #[test]
    fn resource_versions_are_reserved_a_block_ahead() {
        let reserved = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut s = Store::new(10, 100);
        let log = reserved.clone();
        s.reserve_with(Box::new(move |ceiling| {
            log.lock().expect("log").push(ceiling);
            Ok(())
        }))
        .expect("reserved");
        for _ in 0..RESERVE_BLOCK + 1 {
            s.put(key("a"), json!({}), ChangeKind::Modified);
        }
        assert_eq!(s.rv(), 100 + RESERVE_BLOCK + 1);
        let reserved = reserved.lock().expect("log").clone();
        assert_eq!(
            reserved,
            [100 + RESERVE_BLOCK, 100 + 2 * RESERVE_BLOCK + 1],
            "each reservation is made before a resourceVersion above the last is handed out"
        );
    }

    #[test]
    fn list_is_scoped_to_storage_and_namespace() {
        let mut s = Store::new(10, 0);
        s.put(key("a"), json!({}), ChangeKind::Added);
        let mut other = key("b");
        other.namespace = "other".into();
        s.put(other, json!({}), ChangeKind::Added);
        assert_eq!(s.list("configmaps", Some("default")).count(), 1);
        assert_eq!(s.list("configmaps", None).count(), 2);
        assert_eq!(s.list("secrets", None).count(), 0);
    }
}
