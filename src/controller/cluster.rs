//! What the controller reads and writes on the API server, behind one trait ([`ClusterApi`]) so
//! the effect performer and the lease logic can be tested against a fake.
//!
//! Every write here is a compare-and-set where docs/design.md section 4 asks for one: the run's
//! status is replaced on the `resourceVersion` last read ([`ClusterApi::replace_run_status`]),
//! Leases are created when absent and replaced on their `resourceVersion`; AgentRunSegments
//! are only created (and read back by name), never replaced. A 409 comes back as
//! [`ApiError::Conflict`]; nothing in here retries a write.

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{PatchParams, PostParams};
use serde_json::Value;

use crate::api::SecretKeyRef;
use crate::engine::ApprovalSnapshot;

mod kube_api;
mod stored;

pub use kube_api::KubeApi;
pub(crate) use stored::{take_managed_fields, Metadata};
pub use stored::{DecodeError, HeldRun, Landed, StoredRun};

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

/// Names one run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl RunKey {
    /// The run `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> RunKey {
        RunKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for RunKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A run as the engine needs it: the run and its Approvals, read together.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// The run.
    pub run: StoredRun,
    /// Its Approvals (label `agentrt.dev/run-uid`).
    pub approvals: Vec<ApprovalSnapshot>,
}

/// How a status write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Written {
    /// It landed; the run as stored now.
    Landed(Box<StoredRun>),
    /// Someone else wrote first (or it did not land): re-read and decide again.
    Conflict,
    /// The run is gone.
    Gone,
}

/// JSON equality where numbers compare by value (`1` equals `1.0`), as an API server may
/// re-encode them.
pub fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y || matches!((x.as_f64(), y.as_f64()), (Some(p), Some(q)) if p == q)
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

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
    /// Create an Approval (whole object) and return it as stored (its `uid` and
    /// `creationTimestamp`); [`ApiError::Conflict`] when it exists.
    async fn create_approval(&self, namespace: &str, approval: &Value) -> Result<Value, ApiError>;
    /// Write an Approval's status: a merge patch of the status subresource carrying
    /// `metadata.resourceVersion`, so it applies only to the Approval as read
    /// ([`ApiError::Conflict`] when it changed since). Returns the Approval as written.
    async fn patch_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: &str,
    ) -> Result<Value, ApiError>;
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
    /// CREATE a Job (whole object) and return it as stored (with its `uid`);
    /// [`ApiError::Conflict`] when one of that name exists (docs/design.md section 6, "Job
    /// tools").
    async fn create_job(&self, namespace: &str, job: &Value) -> Result<Value, ApiError>;
    /// GET the Job named `name` (whole object); `None` when absent.
    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError>;
    /// Merge-patch the Job named `name` with `patch` (a finalizer list carrying
    /// `metadata.resourceVersion` applies only to the Job as read: [`ApiError::Conflict`]).
    async fn patch_job(&self, namespace: &str, name: &str, patch: &Value) -> Result<(), ApiError>;
    /// DELETE the Job named `name` with foreground propagation (its Pods go first).
    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ApiError>;
    /// LIST the Jobs of the run with uid `run_uid` (label `agentrt.dev/run-uid`).
    async fn list_jobs(&self, namespace: &str, run_uid: &str) -> Result<Vec<Value>, ApiError>;
    /// LIST every Job of any run (label `agentrt.dev/run-uid` present) in `namespace`, or in
    /// all namespaces when `None`: what [`crate::controller::calls::job::sweep`] looks through.
    async fn list_run_jobs(&self, namespace: Option<&str>) -> Result<Vec<Value>, ApiError>;
    /// LIST the Pods the Job with uid `job_uid` created (label
    /// `batch.kubernetes.io/controller-uid`).
    async fn list_job_pods(&self, namespace: &str, job_uid: &str) -> Result<Vec<Value>, ApiError>;
    /// The last `limit_bytes` bytes of the log of `container` of the Pod `pod`, as text.
    async fn pod_log(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        limit_bytes: i64,
    ) -> Result<String, ApiError>;
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
