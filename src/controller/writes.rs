//! The helpers that perform the engine's bookkeeping effects for reconciles and executors
//! alike (docs/design.md section 7): reading a run with its Approvals live, the run's status
//! written by compare-and-set on the resourceVersion last read (a 409 is never retried blind;
//! the caller reads again and decides again), Approval creation and Approval status writes.
//! The create that landed, and each status write that won its compare-and-set and changed the
//! phase, is the single writer of that transition: it alone queues its notification and times a
//! decision (`controller::notify`, `metrics/approvals`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::cluster::{same_json, ApiError, RunError, RunKey, RunState, StoredRun, Written};
use super::context::Context;
use super::fault;
use super::notify::NoticeKind;
use crate::api::ApprovalPhase;
use crate::engine::ApprovalWrite;

/// Up to this many Approvals named by a record are read one by one; more, by label.
const MAX_APPROVAL_GETS: usize = 8;

/// Most compare-and-set conflicts in a row before a reconcile or executor gives up and looks
/// again later.
pub const MAX_CONFLICTS: u32 = 16;

impl Context {
    /// Reads the run and its Approvals live; `None` when the run is gone.
    ///
    /// The Approvals read are those the record names (the only ones the engine looks at): none
    /// for most runs, each by name for a few (a GET is O(1) on the API server, where a label
    /// LIST scans every Approval of the namespace), by label when it names many.
    ///
    /// # Errors
    /// When the API server fails, or the run's spec does not decode.
    pub async fn read_state(&self, key: &RunKey) -> Result<Option<RunState>, RunError> {
        let Some(run) = self.api.get_run(&key.namespace, &key.name).await? else {
            return Ok(None);
        };
        self.ended.note(&run);
        let names = crate::engine::recorded_approvals(&run.snapshot.status);
        let approvals = if names.len() > MAX_APPROVAL_GETS {
            let mut listed = self
                .api
                .list_approvals(&key.namespace, &run.snapshot.uid)
                .await?;
            // A recorded name the label LIST does not return may be held by another run's
            // object: read it by name so the engine sees it (issue 16).
            for name in &names {
                if !listed.iter().any(|a| &a.name == name) {
                    if let Some(approval) = self.api.get_approval(&key.namespace, name).await? {
                        listed.push(approval);
                    }
                }
            }
            listed
        } else {
            let mut approvals = Vec::with_capacity(names.len());
            for name in &names {
                // Every object under a recorded name, also one an earlier run of the same name
                // left behind: the engine tells whose it is and never adopts another run's
                // (issue 16).
                if let Some(approval) = self.api.get_approval(&key.namespace, name).await? {
                    approvals.push(approval);
                }
            }
            approvals.sort_by(|a, b| a.name.cmp(&b.name));
            approvals.dedup_by(|a, b| a.name == b.name);
            approvals
        };
        Ok(Some(RunState { run, approvals }))
    }

    /// Replaces the run's status by compare-and-set on the version in `state`. A failure that
    /// leaves it unknown whether the write landed is settled by reading the run back: the same
    /// status → landed; otherwise → [`Written::Conflict`] (decide again from what is stored).
    /// Never retries the write itself. `record` is `status` decoded when the caller holds it
    /// (an executor's [`crate::engine::Transition::record`]); the run that landed keeps it
    /// ([`super::cluster::Landed::into_run`]).
    ///
    /// # Errors
    /// When the API server cannot be reached to settle an unknown write.
    pub async fn write_status(
        &self,
        state: &RunState,
        status: Value,
        record: Option<Arc<crate::api::AgentRunStatus>>,
    ) -> Result<Written, RunError> {
        let before = &state.run.snapshot.status;
        let sent = std::time::Instant::now();
        let written = self.api.replace_run_status(&state.run, &status).await;
        // A conflict, a gone run or a refusal is an answer; any other error is a failed write.
        let failed = matches!(&written, Err(err)
            if !matches!(err, RunError::Api(ApiError::Conflict(_) | ApiError::NotFound(_) | ApiError::Refused { .. })));
        let took = sent.elapsed();
        self.executors.record_write(took, !failed);
        self.metrics.status_write_took(took.as_secs_f64());
        match written {
            Ok(landed) => {
                let run = landed.into_run(status, record);
                // A write that changed nothing keeps its version and makes no event.
                if run.resource_version != state.run.resource_version {
                    self.watch_lag
                        .wrote(&run.resource_version, std::time::Instant::now());
                }
                self.metrics.status_write("ok");
                self.failures
                    .write_landed(&run.snapshot.namespace, &run.snapshot.name);
                self.landed(before, &run);
                Ok(Written::Landed(Box::new(run)))
            }
            Err(RunError::Api(ApiError::Conflict(detail))) => {
                self.metrics.status_write("conflict");
                tracing::debug!(run = %state.run.key(), %detail, "status write conflicted");
                Ok(Written::Conflict)
            }
            Err(RunError::Api(ApiError::NotFound(_))) => Ok(Written::Gone),
            Err(RunError::Api(ApiError::Refused { reason, message })) => {
                // Issue 34 item 6: RBAC or an admission policy refused the write. It did not
                // land, and is not a conflict: said once per attempt (a Warning Event on the
                // run, one log line, a metric), and the next attempt waits for the run's own
                // bounded backoff instead of reading and writing again at once.
                self.metrics.status_write("refused");
                self.metrics.status_write_refused(&reason);
                let key = RunKey {
                    namespace: state.run.snapshot.namespace.clone(),
                    name: state.run.snapshot.name.clone(),
                };
                let (row, wait) = self.failures.refused(&key);
                tracing::warn!(run = %key, %reason, %message, refused_in_a_row = row, retry_in = ?wait, "status write refused by the API server");
                self.events.warn(
                    &state.run.snapshot,
                    "StatusWriteRefused",
                    format!(
                        "the API server refused the status write ({reason}): {message}; next attempt in {}s",
                        wait.as_secs()
                    ),
                );
                tokio::time::sleep(wait).await;
                Err(RunError::Api(ApiError::Refused { reason, message }))
            }
            Err(err) => {
                self.metrics.status_write("error");
                tracing::warn!(run = %state.run.key(), %err, "status write failed; reading the run back to see whether it landed");
                let key = RunKey {
                    namespace: state.run.snapshot.namespace.clone(),
                    name: state.run.snapshot.name.clone(),
                };
                let mut last = err;
                for attempt in 0..5u32 {
                    tokio::time::sleep(Duration::from_millis(100 * (1 << attempt))).await;
                    match self.api.get_run(&key.namespace, &key.name).await {
                        Ok(Some(fresh)) => {
                            if same_json(&fresh.snapshot.status, &status) {
                                self.landed(before, &fresh);
                                return Ok(Written::Landed(Box::new(fresh)));
                            }
                            return Ok(Written::Conflict);
                        }
                        Ok(None) => return Ok(Written::Gone),
                        Err(err) => last = err,
                    }
                }
                Err(last)
            }
        }
    }

    fn landed(&self, before: &Value, after: &StoredRun) {
        self.ended.note(after);
        self.events.write_landed(before, after);
        self.metrics.observe_write(before, &after.snapshot.status);
        fault::after_write(before, &after.snapshot.status);
    }

    /// Creates an Approval the record names. One that exists already is this run's own (a
    /// create that landed before) or an object left by someone else; the run is reconciled
    /// again at once so that the engine reads it and tells which (issue 16: another run's
    /// Approval is never adopted).
    pub async fn create_approval(&self, key: &RunKey, approval: &Value) {
        match self.api.create_approval(&key.namespace, approval).await {
            // This replica's create landed: it alone notifies the creation.
            Ok(created) => self
                .settings
                .notifier
                .approval_written(NoticeKind::Created, &created),
            Err(ApiError::Conflict(_)) => self.executors.kick(key),
            Err(err) => {
                // The record names it; the next reconcile finds it missing and creates it.
                tracing::warn!(approval = ?approval["metadata"]["name"], %err, "cannot create the Approval; a later reconcile will");
            }
        }
    }

    /// Writes an Approval's status (a projection of the record), conditional on
    /// `resource_version` (the Approval as the engine read it). Without one (an Approval created
    /// in this transition) the Approval is read first and the status written only when its
    /// phase may follow the one stored (`ApprovalPhase::may_become`, docs/design.md section 2).
    /// A 409 means the Approval changed since it was read (a person's decision landing as the
    /// run ends, another replica's write): it is read again and the same check decides whether
    /// the status still applies, up to [`APPROVAL_STATUS_TRIES`] times. A run that ended is
    /// never reconciled again, so its Approvals' `Cancelled` must land here (docs/behaviours.md
    /// 67).
    pub async fn write_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: Option<String>,
        read_phase: Option<ApprovalPhase>,
        hash: &str,
    ) {
        let mut resource_version = resource_version;
        let mut from = read_phase;
        for _ in 0..APPROVAL_STATUS_TRIES {
            let rv = match resource_version.take() {
                Some(rv) => rv,
                None => match self.api.get_approval(namespace, name).await {
                    Ok(Some(current)) => {
                        from = Some(phase_of(current.object.pointer("/status/phase")));
                        match crate::engine::status_write_version(&current.object, status, hash) {
                            Some(rv) => rv,
                            None => {
                                // Another request's object, or a phase already past this one.
                                tracing::debug!(approval = %name, "the Approval is not this write's to change; left as it is");
                                return;
                            }
                        }
                    }
                    Ok(None) => return,
                    Err(err) => {
                        tracing::warn!(approval = %name, %err, "cannot read the Approval to write its status");
                        return;
                    }
                },
            };
            match self
                .api
                .patch_approval_status(namespace, name, status, &rv)
                .await
            {
                Ok(written) => {
                    if let Some(from) = from {
                        self.approval_status_landed(from, &written);
                    }
                    return;
                }
                Err(ApiError::Conflict(_)) => {
                    tracing::debug!(approval = %name, "the Approval changed since it was read; reading it again");
                }
                Err(err) => {
                    tracing::warn!(approval = %name, %err, "cannot write the Approval's status");
                    return;
                }
            }
        }
        tracing::warn!(approval = %name, "the Approval kept changing; its status is left to the next reconcile");
    }

    /// Performs one Approval write the engine asked for (an executor's bookkeeping or an
    /// observer's): creation (AlreadyExists is success) or a conditional status write.
    pub async fn write_approval(&self, key: &RunKey, write: ApprovalWrite) {
        match write {
            ApprovalWrite::Create { approval } => self.create_approval(key, &approval).await,
            ApprovalWrite::Status {
                name,
                status,
                resource_version,
                read_phase,
                hash,
            } => {
                self.write_approval_status(
                    &key.namespace,
                    &name,
                    &status,
                    resource_version,
                    read_phase,
                    &hash,
                )
                .await;
            }
        }
    }

    /// An Approval status write that won its compare-and-set from phase `from` (this replica
    /// is the only writer of this change): the time to a decision when it ended `Pending`, and
    /// the notification of the change (issue 39).
    fn approval_status_landed(&self, from: ApprovalPhase, written: &Value) {
        let to = phase_of(written.pointer("/status/phase"));
        if from == ApprovalPhase::Pending && to != ApprovalPhase::Pending {
            let at = |p: &str| {
                written
                    .pointer(p)
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let decided =
                at("/status/decidedAt").unwrap_or_else(|| self.settings.clock.now().to_string());
            if let Some(seconds) = at("/metadata/creationTimestamp")
                .and_then(|created| super::notify::seconds_between(&created, &decided))
            {
                let outcome = serde_json::to_value(to)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_lowercase))
                    .unwrap_or_default();
                let kind = at("/spec/kind").unwrap_or_default();
                self.metrics.approvals.decided(&kind, &outcome, seconds);
            }
        }
        if let Some(kind) = super::notify::transition(from, to) {
            self.settings.notifier.approval_written(kind, written);
        }
    }
}

/// An Approval's `status.phase` as stored (absent or unknown: `Pending`).
fn phase_of(phase: Option<&Value>) -> ApprovalPhase {
    phase
        .and_then(|p| serde_json::from_value::<ApprovalPhase>(p.clone()).ok())
        .unwrap_or_default()
}

/// How often an Approval's status write is tried when the Approval keeps changing under it.
pub const APPROVAL_STATUS_TRIES: usize = 3;
