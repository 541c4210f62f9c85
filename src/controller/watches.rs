//! The kube-runtime Controller over AgentRuns in one scope (a namespace, or all): what wakes a
//! run's reconcile. Watches are filtered so a replica does not wake on every status write
//! (ARCHITECTURE.md): a run wakes on a new generation (a spec change such as cancel), a phase change
//! or a new recorded holder; on any change to its Approvals (a person's decision); on a change
//! of its Lease's holder (a release, a takeover); and on its executors' requests. Every Lease
//! change (each renewal) also updates this replica's observation of that Lease
//! ([`super::lease::observation`]) without waking a reconcile.
//!
//! Every replica receives every write of every run it watches, so what it keeps of one is
//! small ([`WatchedRun`]: metadata, phase, holder); the record is skipped while the event is
//! parsed. A reconcile reads the run live before it decides, except a new run's: until a
//! controller first writes its status, the run is kept whole ([`FreshRun`]), and the
//! compare-and-set of that write on the event's resourceVersion is the fence (docs/design.md
//! section 7).
//!
//! Recovery (issue 16): each watch is kube-runtime's `watcher` wrapped so that
//! - any error makes it relist from scratch (as client-go's reflector does), so a watch that
//!   failed is synced again only once the API server has answered a list, and `/readyz`
//!   (see [`WatchHealth`]) reflects it;
//! - it backs off on its own, with [`WatchBackoff`]: bounded ([`BACKOFF_MAX`]), reset once
//!   the watch works again, and no wait at all after a 410 Gone (the API server answers; only
//!   the resourceVersion is too old, as after a restart or a compaction);
//! - its errors stop there: they never reach the kube-runtime Controller, whose own trigger
//!   backoff would otherwise pause every watch of the scope for up to 30 s per error.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::Event;
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::cluster::{DecodeError, StoredRun};
use super::context::{Context, RunKey};
use super::metrics::WatchHealth;
use super::{failures, lease};
use crate::api::{AgentRun, Approval};

/// What a replica keeps of a watched AgentRun: its metadata and the status fields that wake it
/// or that the metrics count. The record (the steps, the journal) is skipped while parsing,
/// without being built; so is the spec of a run that has a status.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchedRun {
    /// `metadata`: only its name, namespace, uid, resourceVersion, generation and
    /// deletionTimestamp ([`watched_metadata`]); the resourceVersion is dropped before the
    /// run is stored (the watcher has taken it by then).
    pub metadata: ObjectMeta,
    /// `status.phase`, `status.lease.holder` and `status.observedGeneration`.
    pub status: WatchedStatus,
    /// Whether the watch event that delivered it wakes its reconcile ([`wakes`]); not part of
    /// the object.
    #[serde(skip)]
    pub wakes: bool,
    /// A new run's object as this event showed it, but for its managedFields ([`FreshRun`]:
    /// no controller has written its status yet), so the reconcile that starts it needs no
    /// read; `None` for every other run, and when the replica's budget for them
    /// ([`FRESH_BUDGET_BYTES`], [`keeps_fresh`]) is spent.
    #[serde(skip)]
    pub fresh: Option<FreshRun>,
    /// Why the watched object does not decode (a part nested past serde_json's 128 levels, or
    /// of a type the schema lets through; at most [`super::cluster::CAUSE_CHARS`] characters
    /// and never the object's text), `None` for a run that does: the run is kept with its
    /// identity only and its reconcile sets it aside (issue 34).
    #[serde(skip)]
    pub undecodable: Option<Arc<str>>,
}

/// The bytes of JSON text a replica process keeps at most in [`FreshRun`]s (12 MiB: about
/// 5,000 runs of a 2 KiB spec each, their managedFields dropped); a new run beyond it is read
/// by its reconcile, as every run was before (issue 15). With 8 MiB, 10,000 new runs across
/// 3 replicas left about 700 of each replica's own runs to be read.
pub const FRESH_BUDGET_BYTES: usize = 12 << 20;

/// Past this many bytes of [`FreshRun`]s alive (a quarter of [`FRESH_BUDGET_BYTES`]), a new
/// run is kept only by the replica its uid ranks first among the replicas seen
/// ([`super::spread::place`]): the one that tries it first and whose free slots go to such
/// runs first, so the rest of the budget holds the runs this replica most likely starts.
/// Kept by every replica below it: the one that ranks first may have no slot free, and
/// another then starts the run.
pub const FRESH_OTHERS_BYTES: usize = FRESH_BUDGET_BYTES / 4;

/// The bytes of [`FreshRun`] text alive in this process.
static FRESH_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A new run's whole object (apiVersion, kind, metadata with its resourceVersion, spec, and
/// its status when that is the CRD's default `{phase: Pending, ...}`) as JSON text, from the
/// watch event that delivered it (issue 15: the reconcile that starts a new run reads
/// nothing). Its `metadata.managedFields` are dropped (about 40% of a new run's object on
/// kube-apiserver) and only their length is kept, counted back into the run's
/// `metadata_bytes` for the object budget; a status write without managedFields leaves the
/// stored ones as they are. Its first status write is a compare-and-set on that
/// resourceVersion, so a run that changed since the event (a spec edit, another replica's
/// write) is refused with 409 and read again: the text is never trusted beyond what the API
/// server confirms (docs/design.md section 7).
#[derive(Clone)]
pub struct FreshRun(Arc<FreshText>);

/// The text, the length of the managedFields dropped from it, and the count of live bytes it
/// is counted in (given back when it is dropped).
struct FreshText {
    text: Box<str>,
    managed_fields_bytes: usize,
    account: &'static AtomicUsize,
}

impl Drop for FreshText {
    fn drop(&mut self) {
        self.account.fetch_sub(self.text.len(), Ordering::Relaxed);
    }
}

impl std::fmt::Debug for FreshRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FreshRun({} bytes)", self.0.text.len())
    }
}

impl FreshRun {
    /// Keeps `object` as text without its managedFields, counted in `account`; `None` when
    /// that would take the count over `budget` bytes (or it does not serialize).
    fn keep(
        mut object: Value,
        managed_fields_bytes: usize,
        account: &'static AtomicUsize,
        budget: usize,
    ) -> Option<FreshRun> {
        let managed_fields_bytes =
            managed_fields_bytes + super::cluster::take_managed_fields(&mut object);
        let text = serde_json::to_string(&object).ok()?;
        let len = text.len();
        let before = account.fetch_add(len, Ordering::Relaxed);
        if before.saturating_add(len) > budget {
            account.fetch_sub(len, Ordering::Relaxed);
            return None;
        }
        Some(FreshRun(Arc::new(FreshText {
            text: text.into_boxed_str(),
            managed_fields_bytes,
            account,
        })))
    }

    /// The run as stored when the event was made, without its managedFields, whose length
    /// `snapshot.metadata_bytes` counts all the same.
    ///
    /// # Errors
    /// A [`DecodeError`] when the text does not decode as a run (its spec does not, or its
    /// metadata lacks a uid or resourceVersion): the caller reads the run instead.
    pub fn stored(&self) -> Result<StoredRun, DecodeError> {
        let object: Value =
            serde_json::from_str(&self.0.text).map_err(|source| DecodeError::Text {
                run: String::from("(watched)"),
                cause: super::cluster::bounded_cause(&source),
            })?;
        let mut run = StoredRun::from_object(object)?;
        run.snapshot.metadata_bytes = run
            .snapshot
            .metadata_bytes
            .saturating_add(self.0.managed_fields_bytes);
        Ok(run)
    }

    /// The bytes of [`FreshRun`] text alive in this process.
    pub fn bytes_alive() -> usize {
        FRESH_BYTES.load(Ordering::Relaxed)
    }
}

impl<'de> Deserialize<'de> for WatchedRun {
    /// Takes the top-level fields as raw text (skipped over without serde_json's recursion
    /// limit; the spec skipped unkept once the metadata says a controller wrote the status),
    /// then decodes each on its own ([`WatchedRun::from_parts`]): this never fails for an
    /// object the API server sends, so one object nested past serde_json's 128 levels, or of
    /// a type the schema lets through, does not fail the list or the watch of every other run
    /// (issue 34). Such a run is kept with its identity and the cause
    /// ([`WatchedRun::undecodable`]).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = WatchedRun;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an AgentRun object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WatchedRun, A::Error> {
                let mut parts = RawRun::default();
                // Whether the metadata, parsed before the spec (both API servers write an
                // object's fields in name order), says a controller wrote the status: the
                // spec is then skipped unkept (a scripted run's spec can be most of the
                // object, and every status write delivers it again).
                let mut written = false;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "apiVersion" => parts.api_version = Some(map.next_value()?),
                        "kind" => parts.kind = Some(map.next_value()?),
                        "metadata" => {
                            let raw: Box<RawValue> = map.next_value()?;
                            written = WatchedMeta::parse(raw.get())
                                .is_ok_and(|meta| meta.status_written());
                            parts.metadata = Some(raw);
                        }
                        "spec" if !written => parts.spec = Some(map.next_value()?),
                        "status" => parts.status = Some(map.next_value()?),
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(WatchedRun::from_parts(parts))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// A watched run's top-level fields as raw text ([`WatchedRun`]'s `Deserialize`).
#[derive(Default)]
struct RawRun {
    api_version: Option<Box<RawValue>>,
    kind: Option<Box<RawValue>>,
    metadata: Option<Box<RawValue>>,
    spec: Option<Box<RawValue>>,
    status: Option<Box<RawValue>>,
}

/// A watched run's `metadata` as parsed: every field but `managedFields` as JSON, and of
/// those only their length and whether one names the status subresource (their `fieldsV1`
/// mirror the spec's shape, so they are skipped over, never built).
struct WatchedMeta {
    fields: serde_json::Map<String, Value>,
    managed_fields_bytes: usize,
    /// `None` without managedFields; else whether an entry names the status subresource.
    status_writer: Option<bool>,
}

impl WatchedMeta {
    fn parse(text: &str) -> Result<WatchedMeta, serde_json::Error> {
        #[derive(Deserialize)]
        struct Entry {
            #[serde(default)]
            subresource: Option<String>,
        }
        let metadata: super::cluster::Metadata = serde_json::from_str(text)?;
        let status_writer = if metadata.managed_fields_bytes == 0 {
            None
        } else {
            #[derive(Deserialize)]
            struct Managed {
                #[serde(rename = "managedFields", default)]
                managed_fields: Vec<Entry>,
            }
            let managed: Managed = serde_json::from_str(text)?;
            Some(
                managed
                    .managed_fields
                    .iter()
                    .any(|entry| entry.subresource.as_deref() == Some("status")),
            )
        };
        Ok(WatchedMeta {
            fields: metadata.fields,
            managed_fields_bytes: metadata.managed_fields_bytes,
            status_writer,
        })
    }

    /// Whether a controller wrote the run's status, as its managedFields say (which the API
    /// server keeps for every write); `false` without managedFields, where nothing tells
    /// (the run is then read, as any other).
    fn status_written(&self) -> bool {
        self.status_writer == Some(true)
    }
}

impl WatchedRun {
    /// The run of `parts`: its metadata; its status's phase, holder and observedGeneration
    /// ([`SeenStatus`], the record skipped); and, while no controller wrote its status
    /// (its managedFields name no writer of the status subresource) and the status is absent or the CRD's default, the whole object
    /// as a [`FreshRun`]. A part that does not parse or decode makes the run
    /// [`WatchedRun::undecodable`] instead of failing the watch.
    fn from_parts(parts: RawRun) -> WatchedRun {
        match Self::decode(&parts) {
            Ok(run) => run,
            Err(cause) => WatchedRun::undecodable(parts.metadata.as_deref(), cause),
        }
    }

    fn decode(parts: &RawRun) -> Result<WatchedRun, String> {
        let bounded = |what: &str, err: &serde_json::Error| {
            format!("{what}: {}", super::cluster::bounded_cause(err))
        };
        let meta = match &parts.metadata {
            Some(raw) => Some(WatchedMeta::parse(raw.get()).map_err(|e| bounded("metadata", &e))?),
            None => None,
        };
        let metadata = match &parts.metadata {
            Some(raw) => watched_metadata(raw.get()).map_err(|e| bounded("metadata", &e))?,
            None => ObjectMeta::default(),
        };
        let status: Option<SeenStatus> = match &parts.status {
            Some(raw) => serde_json::from_str::<Option<SeenStatus>>(raw.get())
                .map_err(|e| bounded("status", &e))?,
            None => None,
        };
        let may_be_new = meta
            .as_ref()
            .is_some_and(|meta| meta.status_writer == Some(false));
        let spec = match (&parts.spec, may_be_new) {
            (Some(raw), true) => {
                Some(serde_json::from_str::<Value>(raw.get()).map_err(|e| bounded("spec", &e))?)
            }
            _ => None,
        };
        // New: no status, or one no controller wrote (the CRD's default), which is then kept
        // as it came.
        let (new, unwritten) = match &status {
            None => (true, None),
            Some(SeenStatus {
                unwritten: Some(fields),
                ..
            }) => (true, Some(fields.clone())),
            Some(_) => (false, None),
        };
        let fresh = match (new, spec, meta) {
            (true, Some(spec), Some(meta)) => {
                let mut kept = serde_json::Map::new();
                for (key, raw) in [("apiVersion", &parts.api_version), ("kind", &parts.kind)] {
                    if let Some(value) = raw
                        .as_deref()
                        .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
                    {
                        kept.insert(key.into(), value);
                    }
                }
                kept.insert("metadata".into(), Value::Object(meta.fields));
                kept.insert("spec".into(), spec);
                if let Some(fields) = unwritten {
                    kept.insert("status".into(), Value::Object(fields));
                }
                FreshRun::keep(
                    Value::Object(kept),
                    meta.managed_fields_bytes,
                    &FRESH_BYTES,
                    FRESH_BUDGET_BYTES,
                )
            }
            _ => None,
        };
        Ok(WatchedRun {
            metadata,
            status: status.map(|seen| seen.watched).unwrap_or_default(),
            wakes: false,
            fresh,
            undecodable: None,
        })
    }

    /// A run whose object does not decode (`cause`, bounded): only its identity is kept,
    /// read from `metadata` as far as it can be, so the watch goes on serving every other run
    /// and its reconcile reads it and sets it aside (issue 34; `invalid_spec` when the spec is
    /// what does not decode).
    pub fn undecodable(metadata: Option<&RawValue>, cause: String) -> WatchedRun {
        let metadata = metadata
            .and_then(|raw| watched_metadata(raw.get()).ok())
            .unwrap_or_default();
        WatchedRun {
            metadata,
            status: WatchedStatus::default(),
            wakes: false,
            fresh: None,
            undecodable: Some(Arc::from(cause)),
        }
    }

    /// `metadata.uid` (empty when absent, which the API server never leaves it).
    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }
}

/// The part of a run's status a watch keeps.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchedStatus {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
    /// `status.lease`.
    #[serde(default)]
    pub lease: Option<WatchedLease>,
    /// `status.observedGeneration`.
    #[serde(default, rename = "observedGeneration")]
    pub observed_generation: Option<i64>,
}

/// A watched run's status as parsed: what is kept, and the whole status as a value while it
/// may still be one no controller wrote (the CRD's default, `{phase: Pending, ...}` with its
/// nested defaults: scalars and empty lists, never `observedGeneration`). A written status
/// always has `observedGeneration` and mostly non-empty lists (the journal); those are skipped
/// unbuilt, as is everything after the status is known to be written.
struct SeenStatus {
    watched: WatchedStatus,
    /// The status as it came, while it may be a default one (`None` once it cannot be).
    unwritten: Option<serde_json::Map<String, Value>>,
}

impl<'de> Deserialize<'de> for SeenStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = SeenStatus;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an AgentRun status")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SeenStatus, A::Error> {
                let mut watched = WatchedStatus::default();
                let mut unwritten = Some(serde_json::Map::new());
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "phase" => {
                            watched.phase = map.next_value()?;
                            if let (Some(fields), Some(phase)) = (&mut unwritten, &watched.phase) {
                                fields.insert(key.into_owned(), Value::String(phase.clone()));
                            }
                        }
                        "lease" => {
                            watched.lease = map.next_value()?;
                            unwritten = None;
                        }
                        "observedGeneration" => {
                            watched.observed_generation = map.next_value()?;
                            unwritten = None;
                        }
                        _ if unwritten.is_some() => match map.next_value_seed(Unlisted)? {
                            Some(value) => {
                                if let Some(fields) = &mut unwritten {
                                    fields.insert(key.into_owned(), value);
                                }
                            }
                            None => unwritten = None,
                        },
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                if !crate::engine::is_new_run(watched.phase.as_deref(), watched.observed_generation)
                {
                    unwritten = None;
                }
                Ok(SeenStatus { watched, unwritten })
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// Parses a value as JSON unless it holds a non-empty list anywhere (`None`: skipped unbuilt).
/// A default status has none; a written one has its journal.
struct Unlisted;

impl<'de> serde::de::DeserializeSeed<'de> for Unlisted {
    type Value = Option<Value>;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Unlisted {
    type Value = Option<Value>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Some(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Some(
            serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Some(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Some(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Some(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Some(Value::Null))
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        if seq.next_element::<serde::de::IgnoredAny>()?.is_none() {
            return Ok(Some(Value::Array(Vec::new())));
        }
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = Some(serde_json::Map::new());
        while let Some(key) = map.next_key::<String>()? {
            if fields.is_none() {
                map.next_value::<serde::de::IgnoredAny>()?;
                continue;
            }
            match map.next_value_seed(Unlisted)? {
                Some(value) => {
                    if let Some(fields) = &mut fields {
                        fields.insert(key, value);
                    }
                }
                None => fields = None,
            }
        }
        Ok(fields.map(Value::Object))
    }
}

/// The part of `status.lease` a watch keeps.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct WatchedLease {
    /// `status.lease.holder`.
    #[serde(default)]
    pub holder: Option<String>,
}

/// The AgentRun's own group, version, kind and plural, known at compile time: a watched run's
/// keys ([`ObjectRef`], held by the store, the Controller's queue and its scheduler) then carry
/// no copy of an [`ApiResource`] (five strings) each, which at 100,000 watched runs is most of
/// what a replica holds per run (issue 15).
impl Resource for WatchedRun {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn group(dt: &()) -> Cow<'_, str> {
        AgentRun::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        AgentRun::version(dt)
    }

    fn kind(dt: &()) -> Cow<'_, str> {
        AgentRun::kind(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        AgentRun::plural(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        AgentRun::api_version(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The metadata fields a replica reads of a watched run (and kube-runtime's keys: name,
/// namespace, uid, resourceVersion); labels, annotations, managedFields, ownerReferences and
/// the rest are skipped while parsing, so they are never built: each label or annotation map
/// alone costs about half a KiB per run (issue 15: memory per waiting run).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WatchedMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

fn watched_metadata(text: &str) -> Result<ObjectMeta, serde_json::Error> {
    let meta: WatchedMetadata = serde_json::from_str(text)?;
    Ok(ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        generation: meta.generation,
        deletion_timestamp: meta.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

/// The first wait after a watch fails (200 ms), doubled after each failure in a row.
pub const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
/// The longest wait between a watch's attempts (4 s), so it recovers within this of the API
/// server answering again (issue 16: within a few seconds).
pub const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// The backoff of one watch (kube-runtime's [`Backoff`], applied with
/// [`WatchStreamExt::backoff`]): [`BACKOFF_INITIAL`] doubling up to [`BACKOFF_MAX`], each wait
/// drawn between half and all of that (jitter, so replicas do not retry in step); back to
/// the start once the watch has worked again; none after a 410 Gone unless the error before it
/// was a 410 answered at once too.
///
/// kube-runtime resets a backoff on any item the stream yields, but a relisting `watcher`
/// yields `Event::Init` before asking the API server anything; the reset here follows
/// [`WatchHealth::successes`] instead (a list completed, a change arrived), and
/// [`Backoff::reset`] does nothing (except in [`WatchBackoff::for_triggers`]).
pub struct WatchBackoff {
    health: Arc<WatchHealth>,
    seen_successes: u64,
    next: Duration,
    last_was_immediate: bool,
    /// Whether [`Backoff::reset`] (any item yielded) resets it, as kube-runtime's backoffs do:
    /// for the Controller's merged triggers, whose items are real objects.
    reset_on_items: bool,
}

impl WatchBackoff {
    /// The backoff of the watch whose health is `health`.
    pub fn new(health: Arc<WatchHealth>) -> WatchBackoff {
        WatchBackoff {
            seen_successes: health.successes(),
            health,
            next: BACKOFF_INITIAL,
            last_was_immediate: false,
            reset_on_items: false,
        }
    }

    /// The same bounded backoff for the Controller's merged trigger stream, reset by any item
    /// it yields.
    pub fn for_triggers() -> WatchBackoff {
        WatchBackoff {
            reset_on_items: true,
            ..WatchBackoff::new(Arc::new(WatchHealth::unreported("triggers")))
        }
    }

    /// The wait before the next attempt, without jitter.
    fn step(&mut self) -> Duration {
        let successes = self.health.successes();
        if successes != self.seen_successes {
            self.seen_successes = successes;
            self.next = BACKOFF_INITIAL;
        }
        if self.health.last_error_was_gone() && !self.last_was_immediate {
            self.last_was_immediate = true;
            return Duration::ZERO;
        }
        self.last_was_immediate = false;
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.step();
        Some(wait.mul_f64(rand::random_range(0.5..=1.0)))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        if self.reset_on_items {
            self.next = BACKOFF_INITIAL;
        }
    }
}

/// Whether a watch error is the API server's 410 Gone (the resourceVersion asked for is older
/// than its history), as a watch event or as the answer to the list or watch request.
fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// A watch as the Controller gets it: `start` (a kube-runtime `watcher`) begun afresh after
/// every error so it relists, its health kept in `health`, backed off with [`WatchBackoff`],
/// and its errors logged and dropped.
fn recovering<K, F, S>(
    health: Arc<WatchHealth>,
    start: F,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    F: Fn() -> S + Send + Sync + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let start = Arc::new(start);
    let first: BoxStream<'static, Result<Event<K>, watcher::Error>> = start().boxed();
    let observed = health.clone();
    futures::stream::unfold((first, start), |(mut inner, start)| async move {
        let item = inner.next().await?;
        if item.is_err() {
            // Relist: a fresh watcher starts with a list.
            inner = start().boxed();
        }
        Some((item, (inner, start)))
    })
    .inspect(move |item| match item {
        Ok(Event::Init) => observed.relisting(),
        Ok(Event::InitApply(_)) => {}
        Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => observed.worked(),
        Err(err) => observed.failed(is_gone(err), err),
    })
    .backoff(WatchBackoff::new(health))
    .filter(|item| futures::future::ready(item.is_ok()))
}

/// Whether this replica keeps the new run `uid` as a [`FreshRun`], with `alive` bytes of them
/// alive (its own counted): below [`FRESH_OTHERS_BYTES`], or when its uid ranks this replica
/// first among the replicas seen lately ([`Context::place_for`]; any run when the spread is
/// off). Never with `AGENTRT_SAVINGS_OFF=watched-spec`.
pub(super) fn keeps_fresh(ctx: &Context, uid: &str, alive: usize) -> bool {
    if !ctx.settings.savings.watched_spec {
        return false;
    }
    alive <= FRESH_OTHERS_BYTES || ctx.place_for(uid) == 0
}

/// Runs the Controller for `scope` (a namespace; `None` for all) until shutdown.
pub async fn controller(
    client: Client,
    scope: Option<String>,
    ctx: Arc<Context>,
    kicks: UnboundedReceiver<RunKey>,
) {
    let approvals_type = ApiResource::erase::<Approval>(&());
    let (runs, approvals, leases): (
        Api<WatchedRun>,
        Api<PartialObjectMeta<DynamicObject>>,
        Api<Lease>,
    ) = match &scope {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced_with(client.clone(), ns, &approvals_type),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all_with(client.clone(), &approvals_type),
            Api::all(client.clone()),
        ),
    };
    let writer = reflector::store::Writer::new(());
    let reader = writer.as_reader();
    ctx.metrics.watch_runs(reader.clone());
    let scope_name = scope.as_deref();
    let run_watch = recovering(ctx.metrics.watch("agentruns", scope_name), move || {
        watcher(runs.clone(), watcher::Config::default())
    })
    .map({
        // The watch's predicate, judged against the run as the store holds it before this
        // event is applied, so that a run costs no second cache entry (issue 15: memory per
        // waiting run).
        let store = reader.clone();
        let ctx = ctx.clone();
        move |mut event| {
            if let Ok(Event::Init) = &event {
                ctx.watch_lag.relisting();
            }
            if let Ok(Event::Apply(run) | Event::InitApply(run)) = &mut event {
                run.wakes = wakes(store.get(&key_of_run(run)).as_deref(), run);
                if run.fresh.is_some() && !keeps_fresh(&ctx, run.uid(), FreshRun::bytes_alive()) {
                    run.fresh = None;
                }
                // How far behind this watch runs, timed on this replica's own writes.
                if let Some(version) = run.metadata.resource_version.as_deref() {
                    ctx.watch_lag.delivered(version, std::time::Instant::now());
                }
                // The watcher took the resourceVersion to resume from when it made this
                // event; nothing reads it from the store, which would keep it twice (in the
                // run and in its key).
                run.metadata.resource_version = None;
            }
            event
        }
    });
    let run_stream = reflector::reflector(writer, run_watch)
        .applied_objects()
        .try_filter(|run| std::future::ready(run.wakes));
    let lease_config = watcher::Config::default().labels(&format!(
        "{}={}",
        lease::MANAGED_BY_LABEL,
        lease::MANAGED_BY
    ));
    let lease_stream = recovering(ctx.metrics.watch("leases", scope_name), move || {
        // A Lease kept in the observations is written back on acquiring it (its
        // resourceVersion is the CAS), so only managedFields go: an update without them keeps
        // the stored ones.
        watcher(leases.clone(), lease_config.clone())
            .modify(|lease: &mut Lease| lease.metadata.managed_fields = None)
    })
    .filter_map({
        // Every renewal is seen here: the observation of each Lease (what it is and since
        // when) stays current without a reconcile per renewal; only a Lease whose holder is new
        // to this replica goes on to wake its run (the observation is the predicate).
        let ctx = ctx.clone();
        let scope = scope.clone();
        move |event| {
            let woken = match event {
                Ok(event) => {
                    let wakes =
                        ctx.leases
                            .watched(scope.as_deref(), &event, std::time::Instant::now());
                    match event {
                        Event::Apply(lease) | Event::InitApply(lease) if wakes => Some(Ok(lease)),
                        _ => None,
                    }
                }
                Err(err) => Some(Err(err)),
            };
            std::future::ready(woken)
        }
    });
    // An Approval wakes the run that owns it (what `Controller::owns` does, here with the
    // recovering watch).
    let approval_stream = recovering(ctx.metrics.watch("approvals", scope_name), move || {
        watcher(approvals.clone(), watcher::Config::default())
    })
    .touched_objects();
    let kicks = tokio_stream::wrappers::UnboundedReceiverStream::new(kicks)
        .map(move |key: RunKey| ObjectRef::new(&key.name).within(&key.namespace));
    let kicks = futures::stream::select(kicks, resync_sweep(reader.clone(), RESYNC, RESYNC_TICK));
    let shutdown = ctx.executors.shutdown.clone();
    let deadline = ctx.executors.shutdown.clone();
    let controller = Controller::for_stream_with(run_stream, reader, ())
        .watches_stream_with(
            approval_stream,
            move |approval: PartialObjectMeta<DynamicObject>| {
                let namespace = approval.metadata.namespace.clone().unwrap_or_default();
                let owners: Vec<ObjectRef<WatchedRun>> = approval
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|owner| {
                        owner.kind == AgentRun::kind(&())
                            && owner.api_version == AgentRun::api_version(&())
                    })
                    .map(|owner| ObjectRef::new(&owner.name).within(&namespace))
                    .collect();
                owners
            },
            approvals_type,
        )
        .watches_stream_with(
            lease_stream,
            move |lease: Lease| {
                let owned_by_run = lease
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|owner| owner.kind == AgentRun::kind(&()));
                let name = lease.metadata.name.clone().unwrap_or_default();
                let namespace = lease.metadata.namespace.clone().unwrap_or_default();
                owned_by_run.then(|| ObjectRef::new(&name).within(&namespace))
            },
            (),
        )
        .reconcile_on(kicks)
        // The watches above back off on their own and pass no errors on; this only guards
        // the Controller's other triggers, with the same bounded backoff.
        .trigger_backoff(WatchBackoff::for_triggers())
        .with_config(
            kube::runtime::Config::default().concurrency(ctx.settings.reconcile_concurrency),
        )
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(failures::reconcile, failures::error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "controller stream");
            }
        });
    // A watch stuck in its backoff (e.g. the CRDs are not installed) never lets the
    // Controller's graceful shutdown finish; after shutdown it gets a few seconds, then it is
    // dropped. Executors are not part of it: they stop and release their leases on their own.
    tokio::select! {
        () = controller => {}
        () = async move {
            deadline.cancelled().await;
            tokio::time::sleep(WATCH_SHUTDOWN_GRACE).await;
        } => {
            tracing::warn!("the watches did not stop within {WATCH_SHUTDOWN_GRACE:?} of shutdown; dropping them");
        }
    }
}

/// How long a run the engine has nothing to do for (waiting for a person without an expiry) is
/// left before it is looked at again; its own changes, its Approvals' and its Lease's wake it
/// sooner. Only a safety net against a missed watch event, kept by one sweep over the watched
/// runs rather than a timer per run ([`resync_sweep`]).
pub const RESYNC: Duration = Duration::from_secs(3600);

/// How often the resync sweep ([`resync_sweep`]) looks at its next share of the runs.
const RESYNC_TICK: Duration = Duration::from_secs(10);

/// The safety net against a missed watch event (docs/design.md section 7): every run that is not
/// terminal is reconciled once per `period` ([`RESYNC`]), whatever woke it meanwhile. One sweep
/// over the watch's store does it, a share of the runs each `tick` (the runs whose uid hashes
/// into that tick's bucket of `period / tick`), so the reconciles spread evenly over the
/// period and no run carries a timer of its own: a scheduled requeue per waiting run kept
/// about 1.2 KiB in the Controller's scheduler (issue 15: memory per waiting run, measured with
/// heaptrack). A terminal run is left out (its reconcile has nothing to do).
fn resync_sweep(
    store: reflector::Store<WatchedRun>,
    period: Duration,
    tick: Duration,
) -> impl Stream<Item = ObjectRef<WatchedRun>> + Send {
    let buckets = u64::try_from(period.as_millis() / tick.as_millis().max(1))
        .unwrap_or(u64::MAX)
        .max(1);
    futures::stream::unfold(0_u64, move |bucket| {
        let store = store.clone();
        async move {
            tokio::time::sleep(tick).await;
            let due = resync_due(&store.state(), bucket % buckets, buckets);
            Some((futures::stream::iter(due), bucket.wrapping_add(1)))
        }
    })
    .flatten()
}

/// The runs of `runs` that are not terminal and whose uid hashes into `bucket` of `buckets`:
/// what the resync sweep reconciles at that tick ([`resync_sweep`]).
fn resync_due(runs: &[Arc<WatchedRun>], bucket: u64, buckets: u64) -> Vec<ObjectRef<WatchedRun>> {
    runs.iter()
        .filter(|run| crate::engine::observe_needed(run.status.phase.as_deref()))
        .filter(|run| hash_of(&[run.metadata.uid.as_deref()]) % buckets.max(1) == bucket)
        .filter_map(|run| {
            let name = run.metadata.name.as_deref()?;
            let namespace = run.metadata.namespace.as_deref().unwrap_or_default();
            Some(ObjectRef::new(name).within(namespace))
        })
        .collect()
}

/// How long the watches may take to stop after shutdown begins.
const WATCH_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn hash_of(parts: &[Option<&str>]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    parts.hash(&mut hasher);
    hasher.finish()
}

/// The store's key of `run`.
fn key_of_run(run: &WatchedRun) -> ObjectRef<WatchedRun> {
    ObjectRef::new(run.metadata.name.as_deref().unwrap_or_default())
        .within(run.metadata.namespace.as_deref().unwrap_or_default())
}

/// Whether a watch event that shows `run` must wake its reconcile, given the run as the watch
/// last showed it (`before`, `None` when it had not): a new run (or a new one of the same name),
/// a new generation (a spec change: cancel, policy), phase or recorded holder. Nothing else a
/// status write changes wakes it.
fn wakes(before: Option<&WatchedRun>, run: &WatchedRun) -> bool {
    let Some(before) = before else {
        return true;
    };
    fn holder(run: &WatchedRun) -> Option<&str> {
        run.status
            .lease
            .as_ref()
            .and_then(|lease| lease.holder.as_deref())
    }
    before.metadata.uid != run.metadata.uid
        || before.metadata.generation != run.metadata.generation
        || before.status.phase != run.status.phase
        || holder(before) != holder(run)
}

#[cfg(test)]
mod intake_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_is_bounded_resets_once_the_watch_works_and_skips_a_410() {
        let health = Arc::new(WatchHealth::unreported("agentruns"));
        let mut backoff = WatchBackoff::new(health.clone());
        let waits: Vec<Duration> = (0..10)
            .map(|_| {
                health.failed(false, &"connection refused");
                backoff.step()
            })
            .collect();
        assert_eq!(waits[0], BACKOFF_INITIAL);
        assert_eq!(waits[1], BACKOFF_INITIAL * 2);
        assert!(waits.iter().all(|w| *w <= BACKOFF_MAX), "{waits:?}");
        assert_eq!(waits[9], BACKOFF_MAX);
        // Jittered waits stay within half and all of the step.
        let jittered = backoff.next().unwrap_or_default();
        assert!(
            jittered >= BACKOFF_MAX / 2 && jittered <= BACKOFF_MAX,
            "{jittered:?}"
        );

        health.worked();
        health.failed(false, &"connection refused");
        assert_eq!(
            backoff.step(),
            BACKOFF_INITIAL,
            "reset once the watch worked"
        );
        health.failed(true, &"410 Gone");
        assert_eq!(backoff.step(), Duration::ZERO, "a 410 relists at once");
        health.failed(true, &"410 Gone");
        assert!(backoff.step() > Duration::ZERO, "but not twice in a row");
    }

    #[tokio::test]
    async fn the_resync_sweep_visits_every_waiting_run_once_per_period_and_no_ended_one() {
        let mut writer = reflector::store::Writer::<WatchedRun>::new(());
        let phases = ["WaitingForApproval", "Running", "Completed", "Failed"];
        for i in 0..200 {
            let run: WatchedRun = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("run-{i}"), "namespace": "ns",
                             "uid": format!("uid-{i}")},
                "status": {"phase": phases[i % phases.len()]},
            }))
            .expect("a run decodes");
            writer.apply_watcher_event(&Event::Apply(run));
        }
        let runs = writer.as_reader().state();
        let buckets = 6;
        let mut seen: Vec<String> = (0..buckets)
            .flat_map(|bucket| resync_due(&runs, bucket, buckets))
            .map(|run| run.name)
            .collect();
        let mut expected: Vec<String> = (0..200)
            .filter(|i| i % phases.len() < 2)
            .map(|i| format!("run-{i}"))
            .collect();
        seen.sort();
        expected.sort();
        assert_eq!(
            seen, expected,
            "each waiting or running run once, no ended one"
        );
        assert!(
            (0..buckets).all(|bucket| resync_due(&runs, bucket, buckets).len() < 50),
            "the runs spread over the buckets"
        );
        // The stream: the first tick's share after one tick.
        let tick = Duration::from_millis(20);
        let mut sweep = Box::pin(resync_sweep(writer.as_reader(), tick * 6, tick));
        let first = tokio::time::timeout(Duration::from_secs(30), sweep.next())
            .await
            .expect("the sweep yields within a tick or so")
            .expect("the sweep never ends");
        assert!(expected.contains(&first.name));
    }

    #[test]
    fn a_watched_run_keeps_metadata_phase_holder_and_observed_generation_only() {
        let run: WatchedRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u", "generation": 2},
            "spec": {"goal": "g", "agent": {"scripted": {"decisions": []}}},
            "status": {"phase": "Running", "lease": {"holder": "a-1", "epoch": 3},
                       "observedGeneration": 2,
                       "steps": [{"index": 0}], "events": [{"seq": 1}]},
        }))
        .expect("a run decodes");
        assert_eq!(run.metadata.uid.as_deref(), Some("u"));
        assert_eq!(run.status.phase.as_deref(), Some("Running"));
        // Only the metadata a replica reads is kept.
        let labelled: WatchedRun = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                         "generation": 3, "labels": {"team": "a"},
                         "annotations": {"agentrt.dev/created-by": "alice"},
                         "managedFields": [{"manager": "kubectl"}],
                         "creationTimestamp": "2026-12-01T00:00:00Z"},
        }))
        .expect("a run decodes");
        assert_eq!(
            labelled.metadata,
            ObjectMeta {
                name: Some("r".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                generation: Some(3),
                ..ObjectMeta::default()
            }
        );
        assert_eq!(run.status.observed_generation, Some(2));
        let moved = WatchedRun {
            status: WatchedStatus {
                phase: Some("Running".into()),
                lease: Some(WatchedLease {
                    holder: Some("b-2".into()),
                }),
                observed_generation: Some(2),
            },
            ..run.clone()
        };
        assert!(wakes(Some(&run), &moved), "a new holder wakes");
        assert!(wakes(None, &run), "a run not seen before wakes");
        let mut rewritten = run.clone();
        rewritten.metadata.resource_version = Some("8".into());
        rewritten.status.observed_generation = Some(3);
        assert!(
            !wakes(Some(&run), &rewritten),
            "a status write that moves nothing"
        );
        let mut cancelled = run.clone();
        cancelled.metadata.generation = Some(4);
        assert!(wakes(Some(&run), &cancelled), "a spec change");
        let mut ended = run.clone();
        ended.status.phase = Some("Completed".into());
        assert!(wakes(Some(&run), &ended), "a phase change");
        let mut again = run.clone();
        again.metadata.uid = Some("u2".into());
        assert!(wakes(Some(&run), &again), "a new run of the same name");
        // A new run without a status yet decodes too.
        let fresh: WatchedRun =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "spec": {}}))
                .expect("a new run decodes");
        assert!(fresh.status.phase.is_none());
        assert!(run.fresh.is_none(), "a run with a status is not kept whole");
    }

    #[test]
    fn a_new_run_is_kept_whole_as_stored_and_within_the_budget() {
        let object = serde_json::json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                         "generation": 1, "labels": {"team": "a"},
                         "annotations": {"agentrt.dev/created-by": "alice"},
                         "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
            "spec": {"goal": "g", "agent": {"scripted": {"decisions": []}}},
        });
        let run: WatchedRun = serde_json::from_value(object.clone()).expect("a run decodes");
        let fresh = run.fresh.as_ref().expect("a run without a status is kept");
        let stored = fresh.stored().expect("it decodes as a stored run");
        // What a GET would have returned, labels and annotations included, but without the
        // managedFields, whose bytes the object budget counts all the same.
        let read = StoredRun::from_object(object.clone()).expect("the object decodes");
        let mut unmanaged = object.clone();
        unmanaged["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        let mut expected = StoredRun::from_object(unmanaged).expect("the object decodes");
        assert!(expected.snapshot.metadata_bytes < read.snapshot.metadata_bytes);
        expected.snapshot.metadata_bytes = read.snapshot.metadata_bytes;
        assert_eq!(stored, expected);
        assert_eq!(stored.resource_version, "7");
        assert_eq!(stored.snapshot.created_by.as_deref(), Some("alice"));
        // The CRD's default status of a run no controller has written is kept as it came.
        let mut defaulted = object.clone();
        defaulted["status"] = serde_json::json!({"phase": "Pending", "activeSeconds": 0.0,
            "stepCount": 0, "usage": {"modelCalls": 0}, "toolPins": []});
        let run: WatchedRun = serde_json::from_value(defaulted.clone()).expect("a run decodes");
        let stored = run
            .fresh
            .expect("a defaulted status is new")
            .stored()
            .unwrap();
        assert_eq!(stored.snapshot.status, defaulted["status"]);
        assert_eq!(
            stored.snapshot.metadata_bytes,
            StoredRun::from_object(defaulted.clone())
                .unwrap()
                .snapshot
                .metadata_bytes
        );
        assert_eq!(stored.snapshot.status["usage"]["modelCalls"], 0);
        // Anything a controller writes is not new.
        for written in [
            serde_json::json!({"phase": "Pending", "observedGeneration": 1}),
            serde_json::json!({"phase": "Pending", "events": [{"seq": 1}]}),
            serde_json::json!({"archive": {"segments": [{"index": 0}]}, "phase": "Pending"}),
            serde_json::json!({"phase": "Running", "lease": {"holder": "a"}}),
        ] {
            let mut object = object.clone();
            object["status"] = written.clone();
            let run: WatchedRun = serde_json::from_value(object).expect("a run decodes");
            assert!(run.fresh.is_none(), "{written}");
        }
        // A status some controller wrote (its managedFields say so) is never taken for new,
        // whatever it holds now, and the spec is then not built at all.
        let mut rewritten = defaulted.clone();
        rewritten["metadata"]["managedFields"] = serde_json::json!([
            {"manager": "kubectl", "operation": "Update"},
            {"manager": "agentrt", "operation": "Update", "subresource": "status"}]);
        let run: WatchedRun = serde_json::from_value(rewritten).expect("a run decodes");
        assert!(run.fresh.is_none());
        // Without managedFields nothing tells: not kept (read live).
        let mut bare = object.clone();
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        let run: WatchedRun = serde_json::from_value(bare).expect("a run decodes");
        assert!(run.fresh.is_none());
        // `status: null` is no status either.
        let mut nulled = object.clone();
        nulled["status"] = Value::Null;
        let nulled: WatchedRun = serde_json::from_value(nulled).expect("a run decodes");
        assert!(nulled.fresh.is_some());

        // The budget: a run that does not fit is not kept; dropping one gives its bytes back.
        static ACCOUNT: AtomicUsize = AtomicUsize::new(0);
        let len = serde_json::to_string(&object).unwrap().len()
            - r#","managedFields":[{"manager":"kubectl","operation":"Update"}]"#.len();
        let first = FreshRun::keep(object.clone(), 0, &ACCOUNT, len + len / 2).expect("fits");
        assert_eq!(ACCOUNT.load(Ordering::Relaxed), len);
        assert!(FreshRun::keep(object.clone(), 0, &ACCOUNT, len + len / 2).is_none());
        assert_eq!(
            ACCOUNT.load(Ordering::Relaxed),
            len,
            "a refused one is not counted"
        );
        let shared = first.clone();
        drop(first);
        assert_eq!(
            ACCOUNT.load(Ordering::Relaxed),
            len,
            "a clone shares the text"
        );
        drop(shared);
        assert_eq!(ACCOUNT.load(Ordering::Relaxed), 0);
        assert!(FreshRun::keep(object.clone(), 0, &ACCOUNT, len + len / 2).is_some());
    }
}
