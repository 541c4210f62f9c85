//! What a replica keeps of each watched run ([`WatchedRun`]): every replica receives every
//! write of every run it watches, so what it keeps of one is small (metadata, phase, holder);
//! the record is skipped while the event is parsed, without being built. A reconcile reads the
//! run live before it decides, except a new run's ([`FreshRun`], in `fresh`).

use std::borrow::Cow;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::api::AgentRun;

mod fresh;

use fresh::FRESH_BYTES;

/// `impl kube::Resource for $watched` with `$kind`'s group, version, kind and plural, known at
/// compile time, and the object's own `metadata`: a watched object of a kind the controller
/// owns ([`WatchedRun`], `watches::approvals::WatchedApproval`).
macro_rules! resource_as {
    ($watched:ty, $kind:ty) => {
        impl kube::Resource for $watched {
            type DynamicType = ();
            type Scope = kube::core::NamespaceResourceScope;

            fn group(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::group(dt)
            }

            fn version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::version(dt)
            }

            fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::kind(dt)
            }

            fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::plural(dt)
            }

            fn api_version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::api_version(dt)
            }

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub use fresh::{FreshRun, FRESH_BUDGET_BYTES, FRESH_OTHERS_BYTES};
pub(crate) use resource_as;

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
    /// Whether the watch event that delivered it wakes its reconcile ([`super::watches::wakes`]); not part of
    /// the object.
    #[serde(skip)]
    pub wakes: bool,
    /// A new run's object as this event showed it, but for its managedFields ([`FreshRun`]:
    /// no controller has written its status yet), so the reconcile that starts it needs no
    /// read; `None` for every other run, and when the replica's budget for them
    /// ([`FRESH_BUDGET_BYTES`], [`super::watches::keeps_fresh`]) is spent.
    #[serde(skip)]
    pub fresh: Option<FreshRun>,
    /// Why the watched object does not decode (a part nested past serde_json's 128 levels, or
    /// of a type the schema lets through; at most [`super::cluster::CAUSE_CHARS`] characters
    /// and never the object's text), `None` for a run that does: the run is kept with its
    /// identity only and its reconcile sets it aside (issue 34).
    #[serde(skip)]
    pub undecodable: Option<Arc<str>>,
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

// The AgentRun's own group, version, kind and plural, known at compile time: a watched run's
// keys ([`kube::runtime::reflector::ObjectRef`], held by the store, the Controller's queue and its scheduler) then carry
// no copy of an [`kube::api::ApiResource`] (five strings) each, which at 100,000 watched runs is most of
// what a replica holds per run (issue 15).
resource_as!(WatchedRun, AgentRun);

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::controller::cluster::StoredRun;
    use crate::controller::watches::wakes;

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
