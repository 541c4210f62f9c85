//! `agentrt lint --policies-from-cluster` (docs/design.md section 6, admin policies): the admin
//! policies a run would meet at apply, read from the cluster the kubeconfig names: every
//! `ClusterAgentPolicy`, the `AgentPolicy` objects and the labels of each namespace the runs
//! are in. Read-only; a read that fails is an error naming the object and the fix (lint never
//! checks a run against fewer policies than asked).
//!
//! Owns: those reads. Must not: write anything, or judge a run (that is [`super::check`]).

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};

use super::Documents;
use crate::api::{AgentPolicy, ClusterAgentPolicy};

/// Adds to `documents` the admin policies and namespace labels of the cluster `target` names;
/// returns the namespace of a run that names none (as `kubectl apply`: `-n`, else the
/// context's).
///
/// # Errors
/// The cluster cannot be reached, or a list or get is refused (RBAC): the message names what
/// could not be read.
pub async fn add_from_cluster(
    target: &crate::cli::Target,
    documents: &mut Documents,
) -> anyhow::Result<String> {
    let session = crate::cli::connect(target).await?;
    let client = session.client;
    let fix = "--policies-from-cluster needs list on clusteragentpolicies (cluster-wide), \
               list on the runs' namespaces' agentpolicies and get on those namespaces; ask \
               for them, or leave the flag out and pass --policy FILE";
    let cluster = Api::<ClusterAgentPolicy>::all(client.clone())
        .list(&ListParams::default())
        .await
        .with_context(|| format!("cannot list ClusterAgentPolicies; {fix}"))?
        .items;
    let mut namespaced = Vec::new();
    let mut labels = BTreeMap::new();
    for namespace in documents.run_namespaces(&session.namespace) {
        namespaced.extend(
            Api::<AgentPolicy>::namespaced(client.clone(), &namespace)
                .list(&ListParams::default())
                .await
                .with_context(|| {
                    format!("cannot list the AgentPolicies of namespace {namespace}; {fix}")
                })?
                .items,
        );
        let found = Api::<Namespace>::all(client.clone())
            .get_metadata_opt(&namespace)
            .await
            .with_context(|| format!("cannot read namespace {namespace}; {fix}"))?;
        if let Some(found) = found {
            labels.insert(namespace, found.metadata.labels.unwrap_or_default());
        }
    }
    documents.add_from_cluster(cluster, namespaced, labels);
    Ok(session.namespace)
}
