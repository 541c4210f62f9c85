//! An in-memory [`ClusterApi`] for unit tests: compare-and-set on resourceVersion like the API
//! server, and scripted failures.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;

use super::cluster::{ApiError, ClusterApi, Landed, RunError, StoredRun, RUN_UID_LABEL};
use crate::api::SecretKeyRef;
use crate::engine::ApprovalSnapshot;

/// A test's callback on a run status that landed.
pub type AfterWrite = Box<dyn Fn(&Value) + Send>;

#[derive(Default)]
pub struct State {
    pub version: u64,
    pub runs: BTreeMap<(String, String), Value>,
    pub approvals: BTreeMap<(String, String), Value>,
    pub segments: BTreeMap<(String, String), Value>,
    /// Segment creates that reached the store (AlreadyExists ones included).
    pub segment_creates: u64,
    pub leases: BTreeMap<(String, String), Lease>,
    /// The Leases deleted, as they were stored when deleted.
    pub deleted_leases: BTreeMap<(String, String), Lease>,
    /// Errors the next run-status writes return, in order.
    pub fail_status_writes: Vec<ApiError>,
    /// Errors the next lease writes return, in order.
    pub fail_lease_writes: Vec<ApiError>,
    pub status_writes: u64,
    /// Runs read (`get_run`).
    pub run_reads: u64,
    /// Lease creates sent (`create_lease`), whatever their outcome.
    pub lease_creates: u64,
    /// Called with each run status that lands, after it is stored (a test's way to act at
    /// the moment a given record is written).
    pub after_status_write: Option<AfterWrite>,
    /// Jobs by (namespace, name), as stored.
    pub jobs: BTreeMap<(String, String), Value>,
    /// Job creates sent, whatever their outcome.
    pub job_creates: u64,
    /// Jobs deleted (names).
    pub deleted_jobs: Vec<String>,
    /// Pods, each with its log (a test puts them, as the Job controller and a kubelet would).
    pub pods: Vec<(Value, String)>,
}

#[derive(Default)]
pub struct FakeApi {
    pub state: Mutex<State>,
}

impl FakeApi {
    pub fn with_run(object: Value) -> FakeApi {
        let api = FakeApi::default();
        api.put_run(object);
        api
    }

    pub fn put_run(&self, mut object: Value) {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        object["metadata"]["resourceVersion"] = Value::String(state.version.to_string());
        let key = key_of(&object);
        state.runs.insert(key, object);
    }

    pub fn run(&self, namespace: &str, name: &str) -> Value {
        self.state.lock().unwrap().runs[&(namespace.to_string(), name.to_string())].clone()
    }

    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.state
            .lock()
            .unwrap()
            .leases
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The Lease `namespace/name` as it was stored when it was deleted (the holder of a run that
    /// ended deletes it).
    pub fn deleted_lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.state
            .lock()
            .unwrap()
            .deleted_leases
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

fn key_of(object: &Value) -> (String, String) {
    (
        object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    )
}

#[async_trait]
impl ClusterApi for FakeApi {
    async fn get_run(&self, namespace: &str, name: &str) -> Result<Option<StoredRun>, RunError> {
        let mut state = self.state.lock().unwrap();
        state.run_reads += 1;
        match state.runs.get(&(namespace.to_string(), name.to_string())) {
            None => Ok(None),
            Some(object) => Ok(Some(StoredRun::from_object(object.clone())?)),
        }
    }

    async fn list_approvals(
        &self,
        namespace: &str,
        run_uid: &str,
    ) -> Result<Vec<ApprovalSnapshot>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .approvals
            .iter()
            .filter(|((ns, _), object)| {
                ns == namespace && object["metadata"]["labels"][RUN_UID_LABEL] == run_uid
            })
            .map(|((_, name), object)| ApprovalSnapshot {
                name: name.clone(),
                object: object.clone(),
            })
            .collect())
    }

    async fn get_approval(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ApprovalSnapshot>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .approvals
            .get(&(namespace.to_string(), name.to_string()))
            .map(|object| ApprovalSnapshot {
                name: name.to_string(),
                object: object.clone(),
            }))
    }

    async fn replace_run_status(
        &self,
        run: &StoredRun,
        status: &Value,
    ) -> Result<Landed, RunError> {
        let mut state = self.state.lock().unwrap();
        if !state.fail_status_writes.is_empty() {
            return Err(state.fail_status_writes.remove(0).into());
        }
        let key = (run.snapshot.namespace.clone(), run.snapshot.name.clone());
        let Some(current) = state.runs.get(&key) else {
            return Err(ApiError::NotFound(run.key()).into());
        };
        if current["metadata"]["resourceVersion"] != run.resource_version.as_str() {
            return Err(ApiError::Conflict(format!("{} was modified", run.key())).into());
        }
        let mut object = current.clone();
        object["status"] = status.clone();
        state.version += 1;
        state.status_writes += 1;
        object["metadata"]["resourceVersion"] = Value::String(state.version.to_string());
        state.runs.insert(key, object.clone());
        if let Some(after) = &state.after_status_write {
            after(status);
        }
        // Answered as the API server answers: the object's text, read as the client reads it.
        let text = serde_json::to_string(&object).expect("a stored run encodes");
        Ok(run.landed(&text, status)?)
    }

    async fn create_approval(&self, namespace: &str, approval: &Value) -> Result<Value, ApiError> {
        let mut state = self.state.lock().unwrap();
        let key = (
            namespace.to_string(),
            approval["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        if state.approvals.contains_key(&key) {
            return Err(ApiError::Conflict("already exists".into()));
        }
        state.version += 1;
        let mut approval = approval.clone();
        approval["metadata"]["resourceVersion"] = Value::String(state.version.to_string());
        state.approvals.insert(key, approval.clone());
        Ok(approval)
    }

    async fn create_segment(&self, namespace: &str, segment: &Value) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        state.segment_creates += 1;
        let name = segment["metadata"]["name"].as_str().unwrap_or("");
        let key = (namespace.to_string(), name.to_string());
        if state.segments.contains_key(&key) {
            return Err(ApiError::Conflict("already exists".into()));
        }
        state.version += 1;
        let mut segment = segment.clone();
        segment["metadata"]["resourceVersion"] = Value::String(state.version.to_string());
        state.segments.insert(key, segment);
        Ok(())
    }

    async fn get_segment(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .segments
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }

    async fn patch_run_status(
        &self,
        run: &super::cluster::HeldRun,
        status: &Value,
    ) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        let version = state.version.to_string();
        let Some(object) = state
            .runs
            .get_mut(&(run.namespace.clone(), run.name.clone()))
        else {
            return Err(ApiError::NotFound(format!("{} not found", run.name)));
        };
        if object["metadata"]["resourceVersion"].as_str() != Some(&run.resource_version) {
            return Err(ApiError::Conflict(format!(
                "{}: stale resourceVersion",
                run.name
            )));
        }
        object["status"] = status.clone();
        object["metadata"]["resourceVersion"] = Value::String(version);
        Ok(())
    }

    async fn patch_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: &str,
    ) -> Result<Value, ApiError> {
        let mut state = self.state.lock().unwrap();
        let Some(object) = state
            .approvals
            .get_mut(&(namespace.to_string(), name.to_string()))
        else {
            return Err(ApiError::NotFound(format!(
                "approvals.agentrt.dev \"{name}\" not found"
            )));
        };
        let stored = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !stored.is_empty() && stored != resource_version {
            return Err(ApiError::Conflict(format!("{name}: stale resourceVersion")));
        }
        object["status"] = status.clone();
        state.version += 1;
        let version = state.version.to_string();
        if let Some(object) = state
            .approvals
            .get_mut(&(namespace.to_string(), name.to_string()))
        {
            object["metadata"]["resourceVersion"] = Value::String(version);
            return Ok(object.clone());
        }
        Ok(Value::Null)
    }

    async fn get_lease(&self, namespace: &str, name: &str) -> Result<Option<Lease>, ApiError> {
        Ok(self.lease(namespace, name))
    }

    async fn create_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError> {
        let mut state = self.state.lock().unwrap();
        state.lease_creates += 1;
        if !state.fail_lease_writes.is_empty() {
            return Err(state.fail_lease_writes.remove(0));
        }
        let key = (
            namespace.to_string(),
            lease.metadata.name.clone().unwrap_or_default(),
        );
        if state.leases.contains_key(&key) {
            return Err(ApiError::Conflict("already exists".into()));
        }
        state.version += 1;
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(state.version.to_string());
        state.leases.insert(key, lease.clone());
        Ok(lease)
    }

    async fn replace_lease(&self, namespace: &str, lease: &Lease) -> Result<Lease, ApiError> {
        let mut state = self.state.lock().unwrap();
        if !state.fail_lease_writes.is_empty() {
            return Err(state.fail_lease_writes.remove(0));
        }
        let key = (
            namespace.to_string(),
            lease.metadata.name.clone().unwrap_or_default(),
        );
        let Some(current) = state.leases.get(&key) else {
            return Err(ApiError::NotFound("lease".into()));
        };
        if current.metadata.resource_version != lease.metadata.resource_version {
            return Err(ApiError::Conflict("lease was modified".into()));
        }
        state.version += 1;
        let mut lease = lease.clone();
        lease.metadata.resource_version = Some(state.version.to_string());
        state.leases.insert(key, lease.clone());
        Ok(lease)
    }

    async fn delete_lease(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        resource_version: &str,
    ) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        let key = (namespace.to_string(), name.to_string());
        let Some(current) = state.leases.get(&key) else {
            return Err(ApiError::NotFound("lease".into()));
        };
        if current.metadata.uid.as_deref().is_some_and(|u| u != uid)
            || current.metadata.resource_version.as_deref() != Some(resource_version)
        {
            return Err(ApiError::Conflict("lease precondition failed".into()));
        }
        if let Some(deleted) = state.leases.remove(&key) {
            state.deleted_leases.insert(key, deleted);
        }
        Ok(())
    }

    async fn create_job(&self, namespace: &str, job: &Value) -> Result<Value, ApiError> {
        let mut state = self.state.lock().unwrap();
        state.job_creates += 1;
        let name = job["metadata"]["name"].as_str().unwrap_or("").to_string();
        let key = (namespace.to_string(), name.clone());
        if state.jobs.contains_key(&key) {
            return Err(ApiError::Conflict(format!(
                "jobs.batch {name:?} already exists"
            )));
        }
        state.version += 1;
        let mut stored = job.clone();
        stored["metadata"]["namespace"] = Value::String(namespace.to_string());
        stored["metadata"]["uid"] = Value::String(format!("job-uid-{}", state.version));
        stored["metadata"]["resourceVersion"] = Value::String(state.version.to_string());
        state.jobs.insert(key, stored.clone());
        Ok(stored)
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .jobs
            .get(&(namespace.to_string(), name.to_string()))
            .cloned())
    }

    async fn patch_job(&self, namespace: &str, name: &str, patch: &Value) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        state.version += 1;
        let version = state.version;
        let Some(job) = state
            .jobs
            .get_mut(&(namespace.to_string(), name.to_string()))
        else {
            return Err(ApiError::NotFound(format!("jobs.batch {name:?} not found")));
        };
        if let Some(expected) = patch.pointer("/metadata/resourceVersion") {
            if job["metadata"]["resourceVersion"] != *expected {
                return Err(ApiError::Conflict("the object has been modified".into()));
            }
        }
        json_patch::merge(job, patch);
        job["metadata"]["resourceVersion"] = Value::String(version.to_string());
        let finalizers_left = job["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if job["metadata"]["deletionTimestamp"].is_string() && !finalizers_left {
            state
                .jobs
                .remove(&(namespace.to_string(), name.to_string()));
        }
        Ok(())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        let key = (namespace.to_string(), name.to_string());
        let Some(job) = state.jobs.get_mut(&key) else {
            return Err(ApiError::NotFound(format!("jobs.batch {name:?} not found")));
        };
        let held = job["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if held {
            job["metadata"]["deletionTimestamp"] = Value::String("2026-01-01T00:00:00Z".into());
        } else {
            state.jobs.remove(&key);
        }
        state.deleted_jobs.push(name.to_string());
        Ok(())
    }

    async fn list_jobs(&self, namespace: &str, run_uid: &str) -> Result<Vec<Value>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .jobs
            .iter()
            .filter(|((ns, _), job)| {
                ns == namespace && job["metadata"]["labels"][RUN_UID_LABEL] == run_uid
            })
            .map(|(_, job)| job.clone())
            .collect())
    }

    async fn list_run_jobs(&self, namespace: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .jobs
            .iter()
            .filter(|((ns, _), job)| {
                namespace.is_none_or(|n| n == ns)
                    && job["metadata"]["labels"].get(RUN_UID_LABEL).is_some()
            })
            .map(|((ns, _), job)| {
                let mut job = job.clone();
                job["metadata"]["namespace"] = serde_json::json!(ns);
                job
            })
            .collect())
    }

    async fn list_job_pods(&self, namespace: &str, job_uid: &str) -> Result<Vec<Value>, ApiError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .pods
            .iter()
            .filter(|(pod, _)| {
                pod["metadata"]["namespace"] == namespace
                    && pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] == job_uid
            })
            .map(|(pod, _)| pod.clone())
            .collect())
    }

    async fn pod_log(
        &self,
        namespace: &str,
        pod: &str,
        _container: &str,
        _limit_bytes: i64,
    ) -> Result<String, ApiError> {
        let state = self.state.lock().unwrap();
        state
            .pods
            .iter()
            .find(|(p, _)| p["metadata"]["namespace"] == namespace && p["metadata"]["name"] == pod)
            .map(|(_, log)| log.clone())
            .ok_or_else(|| ApiError::NotFound(format!("pods {pod:?} not found")))
    }

    async fn secret_value(
        &self,
        _namespace: &str,
        _run: &str,
        secret: &SecretKeyRef,
    ) -> Result<String, String> {
        Err(format!("no Secret {}", secret.name))
    }
}

/// A minimal AgentRun object for tests.
pub fn run_object(namespace: &str, name: &str, lease_seconds: i64) -> Value {
    serde_json::json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"namespace": namespace, "name": name, "uid": format!("uid-{name}"), "generation": 1,
                     "managedFields": [{"manager": "kubectl", "operation": "Update",
                                        "apiVersion": "agentrt.dev/v1alpha1"}]},
        "spec": {
            "goal": "test",
            "agent": {"scripted": {"decisions": [{"kind": "complete", "result": {}}]}},
            "tools": [{
                "name": "lookup", "sideEffect": "ReadOnly", "timeoutSeconds": 5,
                "inputSchema": {"type": "object"},
                "http": {"url": "http://127.0.0.1:1/lookup"}
            }],
            "leaseDurationSeconds": lease_seconds
        }
    })
}
