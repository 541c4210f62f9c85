//! The `AgentRun`, `Approval` and `AgentRunSegment` custom resources (docs/design.md section 2): the
//! contract, nothing else. `agentrt crds` prints what [`crds_yaml`] returns; `crds/` holds that output and a test
//! fails when they differ.

mod agentrun;
mod approval;
mod mcp;
mod reference;
mod schema;
mod segment;
mod status;
mod step_index;
mod time;
pub mod vocab;

pub use agentrun::*;
pub use approval::*;
pub use mcp::*;
pub use reference::reference_markdown;
pub use segment::*;
pub use status::*;
pub use step_index::StepIndex;
pub use time::Time;
pub use vocab::*;

use kube::CustomResourceExt;

/// The file names under `crds/` and the YAML each holds, in order.
///
/// # Errors
/// When a CRD cannot be serialized (never expected; reported rather than unwrapped).
pub fn crd_files() -> Result<Vec<(&'static str, String)>, serde_yaml::Error> {
    Ok(vec![
        ("agentruns.yaml", serde_yaml::to_string(&AgentRun::crd())?),
        (
            "agentrunsegments.yaml",
            serde_yaml::to_string(&AgentRunSegment::crd())?,
        ),
        ("approvals.yaml", serde_yaml::to_string(&Approval::crd())?),
    ])
}

/// The CRDs as JSON values, in `crds/` order (agentruns, agentrunsegments, approvals).
///
/// # Errors
/// When a CRD cannot be serialized (never expected; reported rather than unwrapped).
pub fn crd_values() -> Result<Vec<serde_json::Value>, serde_json::Error> {
    Ok(vec![
        serde_json::to_value(AgentRun::crd())?,
        serde_json::to_value(AgentRunSegment::crd())?,
        serde_json::to_value(Approval::crd())?,
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
