//! [`ClusterApi`] over a kube client: every call of the trait as one request, its errors
//! sorted by [`ApiError`]'s kinds.

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, Preconditions};
use kube::{Api, Client};
use serde_json::Value;

use super::*;
use crate::api::{AgentRun, AgentRunSegment, Approval, SecretKeyRef};
use crate::engine::ApprovalSnapshot;

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

fn to_value<T: serde::Serialize>(object: &T) -> Result<Value, ApiError> {
    serde_json::to_value(object).map_err(ApiError::json("encode an object"))
}

fn from_value<T: serde::de::DeserializeOwned>(object: Value) -> Result<T, ApiError> {
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

    async fn create_approval(&self, namespace: &str, approval: &Value) -> Result<Value, ApiError> {
        let created = self
            .approval_api(namespace)
            .create(&write_params(), &from_value(approval.clone())?)
            .await?;
        Ok(to_value(&created)?)
    }

    async fn patch_approval_status(
        &self,
        namespace: &str,
        name: &str,
        status: &Value,
        resource_version: &str,
    ) -> Result<Value, ApiError> {
        let written = self
            .approval_api(namespace)
            .patch_status(
                name,
                &patch_params(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"resourceVersion": resource_version},
                    "status": status,
                })),
            )
            .await?;
        Ok(to_value(&written)?)
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

    async fn create_job(&self, namespace: &str, job: &Value) -> Result<Value, ApiError> {
        let job: Job = from_value(job.clone())?;
        let created = Api::<Job>::namespaced(self.client.clone(), namespace)
            .create(&write_params(), &job)
            .await?;
        to_value(&created)
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<Value>, ApiError> {
        match Api::<Job>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await?
        {
            Some(job) => Ok(Some(to_value(&job)?)),
            None => Ok(None),
        }
    }

    async fn patch_job(&self, namespace: &str, name: &str, patch: &Value) -> Result<(), ApiError> {
        Api::<Job>::namespaced(self.client.clone(), namespace)
            .patch(name, &patch_params(), &Patch::Merge(patch))
            .await?;
        Ok(())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        Api::<Job>::namespaced(self.client.clone(), namespace)
            .delete(name, &DeleteParams::foreground())
            .await?;
        Ok(())
    }

    async fn list_jobs(&self, namespace: &str, run_uid: &str) -> Result<Vec<Value>, ApiError> {
        let params = ListParams::default().labels(&format!("{RUN_UID_LABEL}={run_uid}"));
        Api::<Job>::namespaced(self.client.clone(), namespace)
            .list(&params)
            .await?
            .items
            .iter()
            .map(to_value)
            .collect()
    }

    async fn list_run_jobs(&self, namespace: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let params = ListParams::default().labels(RUN_UID_LABEL);
        let api = match namespace {
            Some(namespace) => Api::<Job>::namespaced(self.client.clone(), namespace),
            None => Api::<Job>::all(self.client.clone()),
        };
        api.list(&params)
            .await?
            .items
            .iter()
            .map(to_value)
            .collect()
    }

    async fn list_job_pods(&self, namespace: &str, job_uid: &str) -> Result<Vec<Value>, ApiError> {
        let params =
            ListParams::default().labels(&format!("batch.kubernetes.io/controller-uid={job_uid}"));
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .list(&params)
            .await?
            .items
            .iter()
            .map(to_value)
            .collect()
    }

    async fn pod_log(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        limit_bytes: i64,
    ) -> Result<String, ApiError> {
        let params = kube::api::LogParams {
            container: Some(container.to_string()),
            limit_bytes: Some(limit_bytes),
            ..kube::api::LogParams::default()
        };
        Ok(Api::<Pod>::namespaced(self.client.clone(), namespace)
            .logs(pod, &params)
            .await?)
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
