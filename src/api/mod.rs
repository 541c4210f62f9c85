//! The `AgentRun`, `Approval`, `AgentRunSegment`, `AgentPolicy` and `ClusterAgentPolicy` custom resources (docs/design.md section 2): the
//! contract, nothing else. `agentrt crds` prints what [`crds_yaml`] returns; `crds/` holds that output and a test
//! fails when they differ.
//!
//! Files:
//! - `agentrun`: the AgentRun's spec; `status`: its record; `mcp`: the `mcp` executor,
//!   `spec.toolSets` and `status.toolPins`; `job`: the `job` executor (`spec.tools[].job`).
//! - `approval`: the Approval and its CEL rules (an immutable request, a decision's hash equal
//!   to the request's, verdicts by kind); `segment`: the AgentRunSegment and `status.archive`;
//!   `admin_policy`: AgentPolicy and ClusterAgentPolicy.
//! - `vocab`: the closed sets with their exact spellings; `step_index`, `time`: the newtypes.
//! - `schema`: schema fragments serde's types cannot say; `reference`: `docs/reference.md`.
//! - This file: the CRDs as YAML (`agentrt crds`) and the API server's message of an error.

mod admin_policy;
mod agentrun;
mod approval;
mod job;
mod mcp;
mod reference;
mod schema;
mod segment;
mod status;
mod step_index;
mod time;
pub mod vocab;

pub use admin_policy::*;
pub use agentrun::*;
pub use approval::*;
pub use job::*;
pub use mcp::*;
pub use reference::reference_markdown;
pub use segment::*;
pub use status::*;
pub use step_index::StepIndex;
pub use time::Time;
pub use vocab::*;

use kube::CustomResourceExt;

/// The CEL rule at the AgentRun CRD's root: the run's name fits the label value its Approvals
/// carry (`agentrt.dev/run`, at most 63 characters), so a longer name is refused when the run
/// is created instead of the run waiting for ever at its first Approval (docs/behaviours.md 80).
pub const RUN_NAME_RULE: &str = "size(self.metadata.name) <= 63";

/// The AgentRun CRD: the derived one plus the root rule [`RUN_NAME_RULE`] (a root rule may
/// read `metadata.name`; kube-derive adds root rules only to `KubeSchema` types).
pub fn agentrun_crd(
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
    let mut crd = AgentRun::crd();
    for version in &mut crd.spec.versions {
        if let Some(root) = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
        {
            root.x_kubernetes_validations
                .get_or_insert_with(Vec::new)
                .push(ValidationRule {
                    rule: RUN_NAME_RULE.into(),
                    message: Some(
                        "metadata.name must be no more than 63 characters: it is the value of \
                         the run's Approvals' label agentrt.dev/run; choose a shorter name"
                            .into(),
                    ),
                    ..ValidationRule::default()
                });
        }
    }
    crd
}

/// The file names under `crds/` and the YAML each holds, in order.
///
/// # Errors
/// When a CRD cannot be serialized (never expected; reported rather than unwrapped).
pub fn crd_files() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    Ok(vec![
        (
            "agentpolicies.yaml",
            serde_yaml::to_string(&AgentPolicy::crd())?,
        ),
        ("agentruns.yaml", serde_yaml::to_string(&agentrun_crd())?),
        (
            "agentrunsegments.yaml",
            serde_yaml::to_string(&AgentRunSegment::crd())?,
        ),
        ("approvals.yaml", serde_yaml::to_string(&Approval::crd())?),
        (
            "clusteragentpolicies.yaml",
            serde_yaml::to_string(&ClusterAgentPolicy::crd())?,
        ),
    ])
}

/// The CRDs as JSON values, in `crds/` order (agentpolicies, agentruns, agentrunsegments,
/// approvals, clusteragentpolicies).
///
/// # Errors
/// When a CRD cannot be serialized (never expected; reported rather than unwrapped).
pub fn crd_values() -> Result<Vec<serde_json::Value>, serde_json::Error> {
    Ok(vec![
        serde_json::to_value(AgentPolicy::crd())?,
        serde_json::to_value(agentrun_crd())?,
        serde_json::to_value(AgentRunSegment::crd())?,
        serde_json::to_value(Approval::crd())?,
        serde_json::to_value(ClusterAgentPolicy::crd())?,
    ])
}

/// The CRDs as a multi-document YAML stream: exactly the concatenation of `crds/*.yaml` in
/// name order.
///
/// # Errors
/// When a CRD cannot be serialized.
pub fn crds_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::new();
    for (_, yaml) in crd_files()? {
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

/// What a person should read of a client error: the API server's own message once
/// (`secrets "nope" not found`), with its reason and code when the message is empty, never the
/// `Status` dumped as Rust debug output; any other error as it displays. Shared by the
/// controller's errors and the CLI (docs/behaviours.md 78).
pub fn server_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        kube::Error::Api(status) => format!("{} (HTTP {})", status.reason, status.code),
        other => other.to_string(),
    }
}
