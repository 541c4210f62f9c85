//! A run as read ([`StoredRun`]): the object and the engine's view of it, decoded from the API
//! server's answer one field at a time so an object that does not decode fails only itself
//! ([`DecodeError`], issue 34); the metadata kept of it (`managedFields` only measured), and
//! what a landed status write returns ([`Landed`]).

use std::sync::Arc;

use serde_json::Value;

use super::bounded_cause;
use crate::api::AgentRunSpec;
use crate::engine::RunSnapshot;

/// A run as read: the whole object and the engine's view of it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRun {
    /// The object as the API server returned it, without its status (which is
    /// `snapshot.status`: the record is held once, not twice), without its spec (which is
    /// [`StoredRun::spec`]) and without `metadata.managedFields` (counted in
    /// `snapshot.metadata_bytes`, never sent back).
    pub object: Value,
    /// `spec` as the API server returned it, shared by every [`StoredRun`] of the same
    /// generation ([`StoredRun::landed`]): a status write leaves the spec as it was, so the
    /// answer to one is not decoded again (issue 15; a scripted spec of 2,000 decisions is
    /// about 117 KiB).
    pub spec: Arc<Value>,
    /// What the engine sees.
    pub snapshot: RunSnapshot,
    /// `metadata.resourceVersion`: the compare-and-set token of the next status write.
    pub resource_version: String,
}

/// The answer to a status write, read without building the spec, nor the status when it is
/// the one sent ([`StoredRun::answer`]).
#[derive(serde::Deserialize)]
struct Written<S> {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<Value>,
    #[serde(default)]
    kind: Option<Value>,
    #[serde(default)]
    metadata: Metadata,
    /// Only whether there is one: its text is skipped, not built.
    #[serde(default)]
    spec: Option<serde::de::IgnoredAny>,
    /// `Value`, or [`serde::de::IgnoredAny`] (skipped, not built).
    #[serde(default)]
    status: S,
}

/// A run's `metadata` as a status write's answer shows it, without its `managedFields`: they
/// are kept neither in [`StoredRun::object`] nor sent back with the next status write (a write
/// without them leaves the stored ones as they are, on both API servers), only their length
/// is, for the object budget. No JSON tree is built of them: they are most of a run's metadata
/// (2,024 of 2,219 bytes for a finished `wide` run on kube-apiserver), and were decoded,
/// measured, sent back and parsed again by the server on every step (issue 15;
/// docs/performance.md, session 19).
#[derive(Default)]
pub(crate) struct Metadata {
    /// Every field but `managedFields`.
    pub(crate) fields: serde_json::Map<String, Value>,
    /// The bytes `"managedFields":[...],` took in the answer (0 without them).
    pub(crate) managed_fields_bytes: usize,
}

impl<'de> serde::Deserialize<'de> for Metadata {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Metadata, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = Metadata;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object's metadata")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Metadata, A::Error> {
                let mut metadata = Metadata::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == MANAGED_FIELDS {
                        let raw = map.next_value::<Box<serde_json::value::RawValue>>()?;
                        metadata.managed_fields_bytes = managed_fields_entry_bytes(raw.get().len());
                    } else {
                        let value = map.next_value::<Value>()?;
                        metadata.fields.insert(key, value);
                    }
                }
                Ok(metadata)
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

/// `metadata.managedFields`.
const MANAGED_FIELDS: &str = "managedFields";

/// The bytes a `managedFields` entry of a metadata object takes in compact JSON when its value
/// takes `value_bytes`: the quoted key, its colon and the comma that separates it from the
/// other fields (metadata always has others: name, uid, resourceVersion).
fn managed_fields_entry_bytes(value_bytes: usize) -> usize {
    MANAGED_FIELDS.len() + 3 + value_bytes + 1
}

/// Takes `metadata.managedFields` out of `object`, returning the bytes they took in its compact
/// JSON (the key, the value and a comma; 0 without them).
pub(crate) fn take_managed_fields(object: &mut Value) -> usize {
    object
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .and_then(|meta| meta.remove(MANAGED_FIELDS))
        .map_or(0, |fields| {
            managed_fields_entry_bytes(crate::engine::encoded_len(&fields))
        })
}

/// A status write's answer as [`StoredRun::answer`] reads it.
#[derive(Debug)]
enum Answer<S> {
    /// The same run and generation as held: the spec kept, shared; `run.snapshot.status` is
    /// `Value::Null` and the answer's status is `status`.
    Same { run: StoredRun, status: S },
    /// Another uid or generation: the whole answer, decoded as [`StoredRun::from_object`] does.
    Whole(StoredRun),
}

/// What a status write landed ([`super::ClusterApi::replace_run_status`]): the run as stored now,
/// whose status the caller that sent it hands back ([`Landed::into_run`]). Its answer was read
/// with the status skipped unread when it is of the same run (uid) and generation.
#[derive(Debug)]
pub struct Landed(Answer<serde::de::IgnoredAny>);

impl Landed {
    /// The run as stored now, `sent` being the status the write sent. A status write of the
    /// same run and generation stores the status as sent (the engine writes every field the
    /// CRD's schema defaults, and the schema prunes none of them; the settling of an unknown
    /// write, `Context::write_status`, holds the same), so the answer's copy of the record is
    /// not decoded again on each step (issue 15; docs/performance.md, session 16). Debug builds
    /// check it against the answer: every test scenario, on both API servers. An answer of
    /// another uid or generation was read whole, its status as stored.
    ///
    /// `record` is `sent` decoded, when the caller holds it (the engine's
    /// [`crate::engine::Transition::record`]): kept as the snapshot's
    /// [`crate::engine::RunSnapshot::record`] with the status sent, so the next step does not
    /// decode it again; dropped with it when the answer was read whole.
    pub fn into_run(
        self,
        sent: Value,
        record: Option<Arc<crate::api::AgentRunStatus>>,
    ) -> StoredRun {
        match self.0 {
            Answer::Same { mut run, .. } => {
                run.snapshot.status = sent;
                run.snapshot.record = record;
                run
            }
            Answer::Whole(run) => run,
        }
    }
}

impl StoredRun {
    /// Reads identity, spec and status out of a whole AgentRun object. Its
    /// `metadata.managedFields` are not kept, only counted in `snapshot.metadata_bytes` (as a
    /// status write's answer is read, [`StoredRun::landed`]).
    ///
    /// # Errors
    /// A [`DecodeError`] naming the run and the field when the metadata is incomplete or the
    /// spec does not decode (such a run is logged and left alone).
    pub fn from_object(mut object: Value) -> Result<StoredRun, DecodeError> {
        let meta = &object["metadata"];
        let text = |field: &str| meta.get(field).and_then(Value::as_str).map(str::to_string);
        let namespace = text("namespace").unwrap_or_default();
        let name = text("name").ok_or(DecodeError::NoName)?;
        let missing = |field: &'static str| DecodeError::Missing {
            run: format!("{namespace}/{name}"),
            field,
        };
        let uid = text("uid").ok_or_else(|| missing("uid"))?;
        let resource_version = text("resourceVersion").ok_or_else(|| missing("resourceVersion"))?;
        let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
        let spec_json = object
            .as_object_mut()
            .and_then(|fields| fields.remove("spec"))
            .unwrap_or(Value::Null);
        let spec = match <AgentRunSpec as serde::Deserialize>::deserialize(&spec_json) {
            Ok(spec) => spec,
            Err(source) => {
                let status = object
                    .as_object_mut()
                    .and_then(|fields| fields.remove("status"))
                    .unwrap_or(Value::Null);
                return Err(DecodeError::spec(
                    HeldRun {
                        namespace,
                        name,
                        uid,
                        resource_version,
                    },
                    &source,
                    status,
                ));
            }
        };
        let created_by = created_by(&object["metadata"]);
        let status = object
            .as_object_mut()
            .and_then(|fields| fields.remove("status"))
            .unwrap_or(Value::Null);
        let managed_fields_bytes = take_managed_fields(&mut object);
        let metadata_bytes = crate::engine::encoded_len(&object) + managed_fields_bytes;
        Ok(StoredRun {
            snapshot: RunSnapshot {
                namespace,
                name,
                uid,
                generation,
                spec: Arc::new(spec),
                spec_bytes: Some(crate::engine::encoded_len(&spec_json)),
                metadata_bytes,
                status,
                record: None,
                created_by,
                sealed: Default::default(),
            },
            resource_version,
            spec: Arc::new(spec_json),
            object,
        })
    }

    /// Reads a run from the API server's answer `text` (a GET) as [`StoredRun::from_object`]
    /// does, but each part on its own (issue 34): the top-level fields are skipped over as raw
    /// text first (serde_json skips iteratively, without its recursion limit of 128), the
    /// metadata is read without building its `managedFields` (which mirror the spec's shape),
    /// and the spec and the status are each parsed from their own text. A spec that does not
    /// parse (nested deeper than serde_json's 128 levels, say) or does not decode is a
    /// [`DecodeError::Spec`] holding what is needed to end the run without it
    /// ([`HeldRun`], and the status when that parses).
    ///
    /// # Errors
    /// [`DecodeError::Text`] when `text` is not a JSON object; what
    /// [`StoredRun::from_object`] returns for incomplete metadata or a spec that does not
    /// decode.
    pub fn from_text(text: &str) -> Result<StoredRun, DecodeError> {
        let parts: RawObject = serde_json::from_str(text).map_err(|source| DecodeError::Text {
            run: String::from("(read)"),
            cause: bounded_cause(&source),
        })?;
        let metadata: Metadata = match &parts.metadata {
            Some(raw) => serde_json::from_str(raw.get()).map_err(|source| DecodeError::Text {
                run: String::from("(read)"),
                cause: format!("metadata: {}", bounded_cause(&source)),
            })?,
            None => Metadata::default(),
        };
        let managed_fields_bytes = metadata.managed_fields_bytes;
        let mut object = serde_json::Map::new();
        if let Some(api_version) = parts.api_version {
            object.insert("apiVersion".into(), api_version);
        }
        if let Some(kind) = parts.kind {
            object.insert("kind".into(), kind);
        }
        let meta = &metadata.fields;
        let text_of = |field: &str| meta.get(field).and_then(Value::as_str).map(str::to_string);
        let namespace = text_of("namespace").unwrap_or_default();
        let name = text_of("name").ok_or(DecodeError::NoName)?;
        let held = || -> Result<HeldRun, DecodeError> {
            let missing = |field: &'static str| DecodeError::Missing {
                run: format!("{namespace}/{name}"),
                field,
            };
            Ok(HeldRun {
                namespace: namespace.clone(),
                name: name.clone(),
                uid: text_of("uid").ok_or_else(|| missing("uid"))?,
                resource_version: text_of("resourceVersion")
                    .ok_or_else(|| missing("resourceVersion"))?,
            })
        };
        let status = match &parts.status {
            Some(raw) => match serde_json::from_str::<Value>(raw.get()) {
                Ok(status) => Some(status),
                Err(source) => {
                    return Err(DecodeError::Status {
                        run: format!("{namespace}/{name}"),
                        cause: bounded_cause(&source),
                    })
                }
            },
            None => None,
        };
        if let Some(raw) = &parts.spec {
            match serde_json::from_str::<Value>(raw.get()) {
                Ok(spec) => {
                    object.insert("spec".into(), spec);
                }
                Err(source) => {
                    return Err(DecodeError::spec(
                        held()?,
                        &source,
                        status.unwrap_or(Value::Null),
                    ))
                }
            }
        }
        object.insert("metadata".into(), Value::Object(metadata.fields));
        if let Some(status) = status {
            object.insert("status".into(), status);
        }
        let mut run = StoredRun::from_object(Value::Object(object))?;
        run.snapshot.metadata_bytes += managed_fields_bytes;
        Ok(run)
    }

    /// The run as the answer `text` to a status write of `self` shows it, read as
    /// [`StoredRun::landed`] reads it but with the answer's status decoded too: for a caller
    /// that no longer holds the status it sent.
    ///
    /// # Errors
    /// As [`StoredRun::landed`].
    pub fn written(&self, text: &str) -> Result<StoredRun, DecodeError> {
        Ok(match self.answer::<Value>(text)? {
            Answer::Same { mut run, status } => {
                run.snapshot.status = status;
                run
            }
            Answer::Whole(run) => run,
        })
    }

    /// What a status write of `sent` landed, from its answer `text`. When the answer is of the
    /// same run (uid) and the same `metadata.generation`, its spec is the one `self` holds (a
    /// status write never changes the spec, and the spec changes only with the generation), so
    /// the spec is kept, shared, instead of decoded again, and its status is the one sent, so
    /// it is skipped unread ([`Landed`]); otherwise the whole answer is decoded as
    /// [`StoredRun::from_object`] does.
    ///
    /// A CRD upgrade that adds a `default:` to a spec field changes what the API server shows
    /// without moving the generation; the held spec keeps the controller's own serde default
    /// for that field until the run is read again (a GET after a 409, or a restart, which a
    /// Helm upgrade of the CRDs and the controller together makes).
    ///
    /// # Errors
    /// [`DecodeError::Answer`] when `text` is not JSON of an object; what
    /// [`StoredRun::from_object`] returns for incomplete metadata or a spec that does not
    /// decode.
    pub fn landed(&self, text: &str, sent: &Value) -> Result<Landed, DecodeError> {
        let answer = self.answer::<serde::de::IgnoredAny>(text)?;
        #[cfg(debug_assertions)]
        if matches!(answer, Answer::Same { .. }) {
            let stored: Written<Value> =
                serde_json::from_str(text).map_err(|source| DecodeError::Answer {
                    run: self.key(),
                    source,
                })?;
            debug_assert!(
                super::same_json(&stored.status, sent),
                "{}: the API server stored another status than the one sent:\nsent   {sent}\nstored {}",
                self.key(),
                stored.status
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = sent;
        Ok(Landed(answer))
    }

    /// Reads a status write's answer `text`, its status as `S`.
    fn answer<S>(&self, text: &str) -> Result<Answer<S>, DecodeError>
    where
        S: serde::de::DeserializeOwned + Default,
    {
        let run = || self.key();
        let written: Written<S> = serde_json::from_str(text)
            .map_err(|source| DecodeError::Answer { run: run(), source })?;
        let meta = &written.metadata.fields;
        let same_spec = meta.get("uid").and_then(Value::as_str) == Some(&self.snapshot.uid)
            && meta.get("generation").and_then(Value::as_i64) == Some(self.snapshot.generation)
            && written.spec.is_some();
        if !same_spec {
            return StoredRun::from_text(text).map(Answer::Whole);
        }
        let text_of = |field: &str| meta.get(field).and_then(Value::as_str).map(str::to_string);
        let missing = |field: &'static str| DecodeError::Missing { run: run(), field };
        let resource_version =
            text_of("resourceVersion").ok_or_else(|| missing("resourceVersion"))?;
        let mut object = serde_json::Map::new();
        if let Some(api_version) = written.api_version {
            object.insert("apiVersion".to_string(), api_version);
        }
        if let Some(kind) = written.kind {
            object.insert("kind".to_string(), kind);
        }
        let managed_fields_bytes = written.metadata.managed_fields_bytes;
        let metadata = Value::Object(written.metadata.fields);
        let created_by = created_by(&metadata);
        object.insert("metadata".to_string(), metadata);
        let object = Value::Object(object);
        let metadata_bytes = crate::engine::encoded_len(&object) + managed_fields_bytes;
        Ok(Answer::Same {
            run: StoredRun {
                snapshot: RunSnapshot {
                    namespace: self.snapshot.namespace.clone(),
                    name: self.snapshot.name.clone(),
                    uid: self.snapshot.uid.clone(),
                    generation: self.snapshot.generation,
                    spec: self.snapshot.spec.clone(),
                    spec_bytes: self.snapshot.spec_bytes,
                    metadata_bytes,
                    status: Value::Null,
                    record: None,
                    created_by,
                    sealed: Default::default(),
                },
                resource_version,
                spec: self.spec.clone(),
                object,
            },
            status: written.status,
        })
    }

    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.snapshot.namespace, self.snapshot.name)
    }
}

/// The run's creator, from its annotation [`crate::engine::CREATED_BY_ANNOTATION`].
fn created_by(meta: &Value) -> Option<String> {
    meta.get("annotations")
        .and_then(|a| a.get(crate::engine::CREATED_BY_ANNOTATION))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// An AgentRun that exists but cannot be used: the boundary that decodes a run
/// ([`StoredRun::from_object`]) says which field is wrong. Such a run is logged and left alone
/// (it can still be listed and cancelled).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The object has no `metadata.name`.
    #[error("an AgentRun without metadata.name")]
    NoName,
    /// A metadata field every stored object has is missing.
    #[error("AgentRun {run}: no metadata.{field}")]
    Missing {
        /// `<namespace>/<name>`.
        run: String,
        /// The field under `metadata`: `uid` or `resourceVersion`.
        field: &'static str,
    },
    /// The API server's answer to a write is not JSON of an object ([`StoredRun::landed`]).
    #[error("AgentRun {run}: the answer to the status write does not decode: {}", bounded_cause(.source))]
    Answer {
        /// `<namespace>/<name>`.
        run: String,
        /// What serde found.
        source: serde_json::Error,
    },
    /// `spec` does not parse or does not decode as an [`AgentRunSpec`]: the run is set aside
    /// and ended `invalid_spec` without its spec ([`crate::engine::spec_undecodable`], issue
    /// 34).
    #[error("AgentRun {}/{}: spec does not decode: {cause}", .held.namespace, .held.name)]
    Spec {
        /// The run, as far as it is needed to end it.
        held: Box<HeldRun>,
        /// What serde found, at most [`super::CAUSE_CHARS`] characters (a wrong type's message
        /// quotes the value, which can be any size).
        cause: String,
        /// The stored status as JSON (`Value::Null` when absent).
        status: Value,
    },
    /// `status` does not parse as JSON (nested deeper than serde_json's 128 levels).
    #[error("AgentRun {run}: status does not decode: {cause}")]
    Status {
        /// `<namespace>/<name>`.
        run: String,
        /// What serde found, bounded as [`DecodeError::Spec`]'s.
        cause: String,
    },
    /// The object's text is not JSON of an object with readable metadata.
    #[error("AgentRun {run}: does not decode: {cause}")]
    Text {
        /// `<namespace>/<name>`, or where it was read when the name is not known.
        run: String,
        /// What serde found, bounded as [`DecodeError::Spec`]'s.
        cause: String,
    },
}

impl DecodeError {
    fn spec(held: HeldRun, source: &serde_json::Error, status: Value) -> DecodeError {
        DecodeError::Spec {
            held: Box::new(held),
            cause: bounded_cause(source),
            status,
        }
    }
}

/// An AgentRun whose spec does not decode, as far as it can be used: enough to write its
/// status by name, on its uid and resourceVersion ([`super::ClusterApi::patch_run_status`]).
#[derive(Debug, Clone, PartialEq)]
pub struct HeldRun {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

/// An object's top-level fields as raw text: skipping over them needs no recursion, so an
/// object nested past serde_json's limit still yields its parts ([`StoredRun::from_text`]).
#[derive(serde::Deserialize)]
struct RawObject {
    #[serde(rename = "apiVersion", default)]
    api_version: Option<Value>,
    #[serde(default)]
    kind: Option<Value>,
    #[serde(default)]
    metadata: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    spec: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    status: Option<Box<serde_json::value::RawValue>>,
}
