//! What the controller reads and writes on the API server, behind one trait ([`ClusterApi`]) so
//! the effect performer and the lease logic can be tested against a fake.
//!
//! Every write here is a compare-and-set where docs/design.md section 4 asks for one: the run's
//! status is replaced on the `resourceVersion` last read ([`ClusterApi::replace_run_status`]),
//! Leases are created when absent and replaced on their `resourceVersion`; AgentRunSegments
//! are only created (and read back by name), never replaced. A 409 comes back as
//! [`ApiError::Conflict`]; nothing in here retries a write.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use kube::{Api, Client};
use serde_json::Value;

use crate::api::{AgentRun, AgentRunSegment, AgentRunSpec, Approval, SecretKeyRef};
use crate::engine::{ApprovalSnapshot, RunSnapshot};

/// The label the engine puts on a run's Approvals: the run's uid.
pub const RUN_UID_LABEL: &str = "agentrt.dev/run-uid";

/// The field manager of every write the controller makes (`metadata.managedFields[].manager`):
/// `agentrt`, so `kubectl get --show-managed-fields` says which fields the controller owns.
pub const FIELD_MANAGER: &str = "agentrt";

/// Create and replace parameters naming [`FIELD_MANAGER`].
pub fn write_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// Patch parameters naming [`FIELD_MANAGER`].
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

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

/// What a status write landed ([`ClusterApi::replace_run_status`]): the run as stored now,
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
                super::context::same_json(&stored.status, sent),
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
        /// What serde found, at most [`CAUSE_CHARS`] characters (a wrong type's message
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
/// status by name, on its uid and resourceVersion ([`ClusterApi::patch_run_status`]).
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

/// The most characters of a decode error's message kept for a log line, an Event or a
/// `reasonDetail` (issue 34: no log line carries an object's body).
pub const CAUSE_CHARS: usize = 240;

/// `err`'s message, at most [`CAUSE_CHARS`] characters (the cut marked with `…`): serde's
/// message for a wrong type quotes the value found, whatever its size.
pub fn bounded_cause(err: &dyn std::fmt::Display) -> String {
    bounded(&err.to_string())
}

/// `text`, at most [`CAUSE_CHARS`] characters, the cut marked with `…`.
pub fn bounded(text: &str) -> String {
    match text.char_indices().nth(CAUSE_CHARS) {
        None => text.to_string(),
        Some((cut, _)) => format!("{}…", &text[..cut]),
    }
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

/// How a call to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 409: the `resourceVersion` was stale, or the object to create already exists.
    #[error("conflict: {0}")]
    Conflict(String),
    /// 404, with the API server's message (which says what was not found).
    #[error("{0}")]
    NotFound(String),
    /// 403 or 422: the API server refused the request (RBAC; a ValidatingAdmissionPolicy, whose
    /// name its message carries and which answers 422 `Invalid` unless its validation sets
    /// another reason; the schema): not a conflict, and sending it again changes nothing until
    /// someone changes the policy (issue 34 item 6). The write did not land.
    #[error("refused ({reason}): {message}")]
    Refused {
        /// The Status `reason` (`Forbidden`, `Invalid`).
        reason: String,
        /// The API server's message, bounded ([`bounded`]).
        message: String,
    },
    /// Any other failure of the client or the API server: the write may or may not have
    /// landed. Shown as the API server's message ([`server_message`]).
    #[error("{}", server_message(.0))]
    Kube(#[source] kube::Error),
    /// The request could not be built.
    #[error("{0}")]
    Request(#[from] kube::core::request::Error),
    /// An object could not be encoded for, or decoded from, the API server (`what`: `encode
    /// an object`, `decode an object`, `encode the status`).
    #[error("cannot {what}: {source}")]
    Json {
        /// What was being done.
        what: &'static str,
        /// What serde found.
        source: serde_json::Error,
    },
}

impl ApiError {
    /// The `kind` label of `agentrt_reconcile_errors_total` for this failure: `conflict`,
    /// `not_found`, `api` (the client or the API server), `encode`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ApiError::Conflict(_) => "conflict",
            ApiError::NotFound(_) => "not_found",
            ApiError::Refused { .. } => "refused",
            ApiError::Kube(_) => "api",
            ApiError::Request(_) | ApiError::Json { .. } => "encode",
        }
    }

    fn json(what: &'static str) -> impl FnOnce(serde_json::Error) -> ApiError {
        move |source| ApiError::Json { what, source }
    }
}

/// Why a run could not be read or written: the API server failed, or the run as stored does
/// not decode.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The API server failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The run exists but cannot be used.
    #[error(transparent)]
    Undecodable(#[from] DecodeError),
}

/// Sorts a kube error: 409 and 404 by their code, the rest kept whole as their source.
impl From<kube::Error> for ApiError {
    fn from(err: kube::Error) -> ApiError {
        classify(err)
    }
}

pub use crate::api::server_message;

fn classify(err: kube::Error) -> ApiError {
    match &err {
        kube::Error::Api(status) if status.code == 409 => {
            ApiError::Conflict(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 404 => {
            ApiError::NotFound(status.message.clone())
        }
        kube::Error::Api(status) if status.code == 403 || status.code == 422 => ApiError::Refused {
            reason: if status.reason.is_empty() {
                if status.code == 403 {
                    "Forbidden"
                } else {
                    "Invalid"
                }
                .into()
            } else {
                status.reason.clone()
            },
            message: bounded(&status.message),
        },
        _ => ApiError::Kube(err),
    }
}

/// The API server, as the controller uses it.
#[async_trait]
pub trait ClusterApi: Send + Sync + 'static {
    /// GET the run; `None` when it is gone.
    async fn get_run(&self, namespace: &str, name: &str) -> Result<Option<StoredRun>, RunError>;
    /// LIST the run's Approvals (label `agentrt.dev/run-uid`).
    async fn list_approvals(
        &self,
        namespace: &str,
        run_uid: &str,
    ) -> Result<Vec<ApprovalSnapshot>, ApiError>;
    /// GET one Approval; `None` when it is absent.
    async fn get_approval(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ApprovalSnapshot>, ApiError>;
    /// Replace the run's status with `status` on `run.resource_version` (compare-and-set);
    /// what landed, whose status the caller hands back ([`Landed::into_run`]).
    async fn replace_run_status(&self, run: &StoredRun, status: &Value)
        -> Result<Landed, RunError>;
    /// Write the status of a run whose spec does not decode ([`HeldRun`], issue 34): a merge
    /// patch of the status subresource by name carrying `metadata.resourceVersion`, so it
    /// applies only to the run as read ([`ApiError::Conflict`] when it changed since); the spec
    /// is neither read nor sent.
    async fn patch_run_status(&self, run: &HeldRun, status: &Value) -> Result<(), ApiError>;
    /// Create an Approval (whole object); [`ApiError::Conflict`] when it exists.
    async fn create_approval(&self, namespace: &str, approval: &Value) -> Result<(), ApiError>;
    /// Write an Approval's status: a merge patch of the status subresource carrying
    /// `metadata.resourceVersion`, so it applies only to the Approval as read
    /// ([`ApiError::Conflict`] when it changed since).
    async fn patch_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: &str,
    ) -> Result<(), ApiError>;
    /// Create an AgentRunSegment (whole object; docs/design.md section 4a);
    /// [`ApiError::Conflict`] when one of that name exists.
    async fn create_segment(&self, namespace: &str, segment: &Value) -> Result<(), ApiError>;
    /// GET the AgentRunSegment named `name` (whole object); `None` when absent.
    async fn get_segment(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError>;
    /// GET the Lease named `name`; `None` when absent.
    async fn get_lease(&self, namespace: &str, name: &str) -> Result<Option<Lease>, ApiError>;
    /// CREATE a Lease; [`ApiError::Conflict`] when it exists.
    async fn create_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError>;
    /// REPLACE a Lease on its `metadata.resourceVersion`.
    async fn replace_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError>;
    /// DELETE the Lease named `name` only while it is the object read: preconditions on its
    /// `uid` and `resourceVersion` ([`ApiError::Conflict`] when it changed, [`ApiError::NotFound`]
    /// when it is gone). Used to replace a Lease another run of the same name left
    /// (docs/design.md section 2, Lease).
    async fn delete_lease(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), ApiError>;
    /// The value of one Secret key, as text, for run `run` of `namespace`: only when the Secret
    /// consents to that run (`tools::consent::check`, docs/design.md section 6 "Secrets"),
    /// checked on the object just read.
    async fn secret_value(
        &self,
        namespace: &str,
        run: &str,
        secret: &SecretKeyRef,
    ) -> Result<String, String>;
}

/// [`ClusterApi`] over a kube client.
#[derive(Clone)]
pub struct KubeApi {
    client: Client,
    runs: ApiResource,
    approvals: ApiResource,
    segments: ApiResource,
}

impl KubeApi {
    /// Wraps a client.
    pub fn new(client: Client) -> KubeApi {
        KubeApi {
            client,
            runs: ApiResource::erase::<AgentRun>(&()),
            approvals: ApiResource::erase::<Approval>(&()),
            segments: ApiResource::erase::<AgentRunSegment>(&()),
        }
    }

    fn approval_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.approvals)
    }

    /// Requests on runs are made raw and read as JSON values: a run's record can be large, and
    /// going through `DynamicObject` (whose flattened fields serde buffers) would copy it
    /// several times more per step.
    fn run_request(&self, namespace: &str) -> kube::core::Request {
        kube::core::Request::new(format!(
            "/apis/{}/namespaces/{namespace}/{}",
            self.runs.api_version, self.runs.plural
        ))
    }
}

/// The body of a status replace: the run's object as held (its metadata with the last-read
/// `resourceVersion`) and the new status, serialized without copying either, and without the
/// spec. A write of the status subresource takes everything but the status from the stored
/// object (kube-apiserver's status strategy copies the old object over the body, and its field
/// manager resets `spec` before comparing, so the spec's managers keep their fields), so the
/// spec, often most of the object (a scripted agent lists every decision), is neither encoded
/// nor sent nor decoded by the server on each step (issue 15; docs/performance.md).
struct StatusReplace<'a> {
    run: &'a StoredRun,
    status: &'a Value,
}

impl serde::Serialize for StatusReplace<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Metadata<'a>(&'a serde_json::Map<String, Value>, &'a str);
        impl serde::Serialize for Metadata<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                for (key, value) in self.0 {
                    if key != "resourceVersion" {
                        map.serialize_entry(key, value)?;
                    }
                }
                map.serialize_entry("resourceVersion", self.1)?;
                map.end()
            }
        }
        let empty = serde_json::Map::new();
        let fields = self.run.object.as_object().unwrap_or(&empty);
        let mut map = serializer.serialize_map(None)?;
        for (key, value) in fields {
            match key.as_str() {
                "status" | "spec" => {}
                "metadata" => map.serialize_entry(
                    key,
                    &Metadata(
                        value.as_object().unwrap_or(&empty),
                        &self.run.resource_version,
                    ),
                )?,
                _ => map.serialize_entry(key, value)?,
            }
        }
        map.serialize_entry("status", self.status)?;
        map.end()
    }
}

fn to_value(object: &DynamicObject) -> Result<Value, ApiError> {
    serde_json::to_value(object).map_err(ApiError::json("encode an object"))
}

fn from_value(object: Value) -> Result<DynamicObject, ApiError> {
    serde_json::from_value(object).map_err(ApiError::json("decode an object"))
}

#[async_trait]
impl ClusterApi for KubeApi {
    async fn get_run(&self, namespace: &str, name: &str) -> Result<Option<StoredRun>, RunError> {
        let request = self
            .run_request(namespace)
            .get(name, &kube::api::GetParams::default())
            .map_err(ApiError::from)?;
        // As text, decoded here part by part: kube's `request` would log the whole body at
        // warn level on a decode failure, and a run nested past serde_json's limit would fail
        // as a whole (issue 34).
        let text = match self.client.request_text(request).await {
            Ok(text) => text,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(err) => return Err(classify(err).into()),
        };
        Ok(Some(StoredRun::from_text(&text)?))
    }

    async fn list_approvals(
        &self,
        namespace: &str,
        run_uid: &str,
    ) -> Result<Vec<ApprovalSnapshot>, ApiError> {
        let list = self
            .approval_api(namespace)
            .list(&ListParams::default().labels(&format!("{RUN_UID_LABEL}={run_uid}")))
            .await?;
        let mut out = Vec::with_capacity(list.items.len());
        for item in list.items {
            let name = item.metadata.name.clone().unwrap_or_default();
            out.push(ApprovalSnapshot {
                name,
                object: to_value(&item)?,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn get_approval(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ApprovalSnapshot>, ApiError> {
        let Some(item) = self.approval_api(namespace).get_opt(name).await? else {
            return Ok(None);
        };
        Ok(Some(ApprovalSnapshot {
            name: name.to_string(),
            object: to_value(&item)?,
        }))
    }

    async fn replace_run_status(
        &self,
        run: &StoredRun,
        status: &Value,
    ) -> Result<Landed, RunError> {
        let body = serde_json::to_vec(&StatusReplace { run, status })
            .map_err(ApiError::json("encode the status"))?;
        let request = self
            .run_request(&run.snapshot.namespace)
            .replace_subresource("status", &run.snapshot.name, &write_params(), body)
            .map_err(ApiError::from)?;
        let written = self.client.request_text(request).await.map_err(classify)?;
        Ok(run.landed(&written, status)?)
    }

    async fn patch_run_status(&self, run: &HeldRun, status: &Value) -> Result<(), ApiError> {
        let patch = Patch::Merge(serde_json::json!({
            "metadata": {"resourceVersion": run.resource_version, "uid": run.uid},
            "status": status,
        }));
        let request = self
            .run_request(&run.namespace)
            .patch_subresource("status", &run.name, &patch_params(), &patch)
            .map_err(ApiError::from)?;
        // The answer holds the spec: it is not decoded.
        self.client.request_text(request).await.map_err(classify)?;
        Ok(())
    }

    async fn create_approval(&self, namespace: &str, approval: &Value) -> Result<(), ApiError> {
        self.approval_api(namespace)
            .create(&write_params(), &from_value(approval.clone())?)
            .await?;
        Ok(())
    }

    async fn patch_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: &str,
    ) -> Result<(), ApiError> {
        self.approval_api(namespace)
            .patch_status(
                name,
                &patch_params(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"resourceVersion": resource_version},
                    "status": status,
                })),
            )
            .await?;
        Ok(())
    }

    async fn create_segment(&self, namespace: &str, segment: &Value) -> Result<(), ApiError> {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &self.segments)
            .create(&write_params(), &from_value(segment.clone())?)
            .await?;
        Ok(())
    }

    async fn get_segment(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError> {
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &self.segments);
        match api.get_opt(name).await? {
            Some(object) => Ok(Some(to_value(&object)?)),
            None => Ok(None),
        }
    }

    async fn get_lease(&self, namespace: &str, name: &str) -> Result<Option<Lease>, ApiError> {
        Ok(Api::<Lease>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?)
    }

    async fn create_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError> {
        Ok(Api::<Lease>::namespaced(self.client.clone(), namespace)
            .create(&write_params(), lease)
            .await?)
    }

    async fn replace_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError> {
        let name = lease.metadata.name.clone().unwrap_or_default();
        Ok(Api::<Lease>::namespaced(self.client.clone(), namespace)
            .replace(&name, &write_params(), lease)
            .await?)
    }

    async fn delete_lease(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), ApiError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: Some(resource_version.to_string()),
            }),
            ..DeleteParams::default()
        };
        Api::<Lease>::namespaced(self.client.clone(), namespace)
            .delete(name, &params)
            .await?;
        Ok(())
    }

    async fn secret_value(
        &self,
        namespace: &str,
        run: &str,
        secret: &SecretKeyRef,
    ) -> Result<String, String> {
        let object = Api::<Secret>::namespaced(self.client.clone(), namespace)
            .get(&secret.name)
            .await
            .map_err(|err| server_message(&err))?;
        crate::tools::consent::check(
            namespace,
            &secret.name,
            object.metadata.labels.as_ref(),
            object.metadata.annotations.as_ref(),
            run,
        )?;
        if let Some(value) = object.data.as_ref().and_then(|data| data.get(&secret.key)) {
            return String::from_utf8(value.0.clone())
                .map_err(|_| format!("key {:?} is not UTF-8", secret.key));
        }
        object
            .string_data
            .as_ref()
            .and_then(|data| data.get(&secret.key))
            .cloned()
            .ok_or_else(|| format!("the Secret has no key {:?}", secret.key))
    }
}
