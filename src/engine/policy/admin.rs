//! The admins' policies combined with the run's own (docs/design.md section 6, admin policies;
//! docs/behaviours.md 83-86; issue 34): each `AgentPolicy` and `ClusterAgentPolicy` that
//! selects the run decides the call as a run's policy would (its rules in order, first match
//! wins, else its side-effect class outcome; a class it leaves out has no opinion), and of those
//! outcomes and the run's own the most restrictive wins: abort over deny over require approval
//! over allow. So a run's `spec.policy` can only tighten what an admin decided. On a tie an
//! admin policy decides (its approval kind, capability and presentation), cluster policies
//! before namespaced ones, each by name, and the run's own last.
//!
//! An admin rule whose `when` fails (on these args, or at all) pauses the call on a
//! `policy_error` Approval naming the admin policy. When the controller could not read the
//! admin policies ([`AdminPolicies::Unavailable`]) every call pauses on an
//! `admin_policy_unavailable` Approval, or is denied or aborted if the run's own policy says so:
//! nothing proceeds as if there were no admin policy (fail closed).
//!
//! Ceilings: a run's effective limits are its own, each lowered to the smallest ceiling of the
//! policies that select it; an optional limit the run left out takes the ceiling
//! ([`effective_limits`]). [`ceiling_refusals`] is what admission and `agentrt lint` refuse.
//!
//! Owns: the combination and the ceilings. Must not: read the policies (the controller hands in
//! those that select the run, with their generation, on each call).

use std::borrow::Cow;

use serde_json::{json, Value};

use super::{first_match, outcome_decision, PolicyDecision, PolicyError};
use crate::api::{
    AdminSideEffects, AgentPolicy, ClusterAgentPolicy, LimitCeilings, Limits, PolicyDecisionKind,
    PolicyOutcome, PolicyRule, PolicySource, ToolSpec, POLICY_ERROR,
};

/// The approval kind of a call paused because the admin policies could not be read.
pub const ADMIN_POLICY_UNAVAILABLE: &str = "admin_policy_unavailable";

/// Which of the two admin objects a policy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AdminKind {
    /// A cluster-scoped `ClusterAgentPolicy` (sorts first).
    ClusterAgentPolicy,
    /// A namespaced `AgentPolicy`.
    AgentPolicy,
}

impl AdminKind {
    /// The kind as Kubernetes spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminKind::ClusterAgentPolicy => "ClusterAgentPolicy",
            AdminKind::AgentPolicy => "AgentPolicy",
        }
    }
}

/// One admin policy that selects the run, as the controller read it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdminPolicy {
    /// Which object.
    pub kind: AdminKind,
    /// The AgentPolicy's namespace; `None` for a ClusterAgentPolicy.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.generation` (recorded in the step's `policy.source`).
    pub generation: i64,
    /// Its outcome per side-effect class.
    pub side_effects: AdminSideEffects,
    /// Its rules, in order.
    pub rules: Vec<PolicyRule>,
    /// Its ceilings.
    pub limits: LimitCeilings,
}

impl AdminPolicy {
    /// From a ClusterAgentPolicy as read.
    pub fn from_cluster(policy: &ClusterAgentPolicy) -> AdminPolicy {
        AdminPolicy {
            kind: AdminKind::ClusterAgentPolicy,
            namespace: None,
            name: policy.metadata.name.clone().unwrap_or_default(),
            generation: policy.metadata.generation.unwrap_or(0),
            side_effects: policy.spec.side_effects.clone(),
            rules: policy.spec.rules.clone(),
            limits: policy.spec.limits.clone(),
        }
    }

    /// From an AgentPolicy as read.
    pub fn from_namespaced(policy: &AgentPolicy) -> AdminPolicy {
        AdminPolicy {
            kind: AdminKind::AgentPolicy,
            namespace: policy.metadata.namespace.clone(),
            name: policy.metadata.name.clone().unwrap_or_default(),
            generation: policy.metadata.generation.unwrap_or(0),
            side_effects: policy.spec.side_effects.clone(),
            rules: policy.spec.rules.clone(),
            limits: policy.spec.limits.clone(),
        }
    }

    /// The record's name for it, with the rule that decided.
    pub fn source(&self, rule_index: Option<usize>) -> PolicySource {
        PolicySource {
            kind: self.kind.as_str().to_string(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            generation: self.generation,
            rule_index: rule_index.and_then(|i| i64::try_from(i).ok()),
        }
    }

    /// `AgentPolicy ns/name` or `ClusterAgentPolicy name`.
    pub fn display_name(&self) -> String {
        self.source(None).display_name()
    }
}

/// The admin policies that apply to a run, as the controller hands them to the engine with
/// each call (on [`crate::engine::Caller::admin`]).
#[derive(Debug, Clone, PartialEq)]
pub enum AdminPolicies {
    /// Read, and these select the run (cluster policies first, then namespaced, each by name).
    Known(Vec<AdminPolicy>),
    /// They could not be read (not listed yet, RBAC, the API server down): why. Every call
    /// pauses on an [`ADMIN_POLICY_UNAVAILABLE`] Approval (fail closed).
    Unavailable(String),
}

impl Default for AdminPolicies {
    /// None selects the run.
    fn default() -> Self {
        AdminPolicies::Known(Vec::new())
    }
}

/// A decision and, when an admin policy made it, which.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The decision.
    pub decision: PolicyDecision,
    /// The admin policy that decided; `None` for the run's own `spec.policy`.
    pub source: Option<PolicySource>,
}

/// How restrictive a decision is: allow 0, require approval 1, deny 2, abort 3.
pub fn restrictiveness(kind: PolicyDecisionKind) -> u8 {
    match kind {
        PolicyDecisionKind::Allow => 0,
        PolicyDecisionKind::RequireApproval => 1,
        PolicyDecisionKind::Deny => 2,
        PolicyDecisionKind::Abort => 3,
    }
}

/// What one admin policy decides for the call: its first matching rule, else its class
/// outcome, else `None` (no opinion). A rule that cannot be evaluated gives a `policy_error`
/// requirement naming the policy and the rule.
pub fn admin_decision(policy: &AdminPolicy, tool: &ToolSpec, args: &Value) -> Option<Decided> {
    match first_match(&policy.rules, tool, args) {
        Ok(Some((index, decision))) => Some(Decided {
            decision,
            source: Some(policy.source(Some(index))),
        }),
        Ok(None) => policy
            .side_effects
            .outcome(tool.side_effect)
            .map(|outcome| {
                // The reason names the admin policy, not a default (docs/design.md section 6).
                let mut decision = outcome_decision(outcome, tool.side_effect);
                decision.reason = Some(format!(
                    "{} sets sideEffects.{}: {}",
                    policy.display_name(),
                    tool.side_effect.as_str(),
                    outcome_word(outcome)
                ));
                Decided {
                    decision,
                    source: Some(policy.source(None)),
                }
            }),
        Err(err) => Some(admin_error(policy, tool, args, err)),
    }
}

/// `outcome` as a manifest spells it.
pub(super) fn outcome_word(outcome: PolicyOutcome) -> &'static str {
    match outcome {
        PolicyOutcome::Allow => "Allow",
        PolicyOutcome::Deny => "Deny",
        PolicyOutcome::Abort => "Abort",
        PolicyOutcome::RequireApproval => "RequireApproval",
    }
}

fn admin_error(policy: &AdminPolicy, tool: &ToolSpec, args: &Value, err: PolicyError) -> Decided {
    let (index, name, detail) = match err {
        PolicyError::Eval {
            index,
            name,
            detail,
        }
        | PolicyError::When {
            index,
            name,
            detail,
        }
        | PolicyError::Glob {
            index,
            name,
            detail,
        } => (index, name, detail),
    };
    let who = policy.display_name();
    let when = policy.rules.get(index).and_then(|r| r.when.clone());
    let reason = format!(
        "{who}: rule {name} (spec.rules[{index}]) could not be evaluated on these args \
         ({detail}); decide the call yourself, or ask an admin to fix the rule"
    );
    Decided {
        decision: PolicyDecision {
            decision: PolicyDecisionKind::RequireApproval,
            rule: Some(name.clone()),
            reason: Some(reason.clone()),
            approval_kind: Some(POLICY_ERROR.to_string()),
            capability: None,
            presentation: Some(json!({
                "tool": tool.name,
                "args": args,
                "sideEffect": tool.side_effect,
                "rule": {"index": index, "name": name, "when": when},
                "error": detail,
                "reason": reason,
            })),
        },
        source: Some(policy.source(Some(index))),
    }
}

/// The decision for a call: `own` (the run's `spec.policy`) combined with every admin policy
/// in `admins` (module doc): the most restrictive wins, an admin policy on a tie.
pub fn combine(
    own: PolicyDecision,
    admins: &AdminPolicies,
    tool: &ToolSpec,
    args: &Value,
) -> Decided {
    let candidates: Vec<Decided> = match admins {
        AdminPolicies::Known(policies) => policies
            .iter()
            .filter_map(|p| admin_decision(p, tool, args))
            .collect(),
        AdminPolicies::Unavailable(_) => vec![unavailable()],
    };
    let mut best: Option<Decided> = None;
    for candidate in candidates.into_iter().chain(std::iter::once(Decided {
        decision: own,
        source: None,
    })) {
        let better = best.as_ref().is_none_or(|b| {
            restrictiveness(candidate.decision.decision) > restrictiveness(b.decision.decision)
        });
        if better {
            best = Some(candidate);
        }
    }
    best.unwrap_or_else(unavailable)
}

/// The requirement of a call while the admin policies cannot be read. Its reason is the same
/// sentence whatever went wrong, so its Approval's hash does not depend on the error (the
/// controller logs the error).
fn unavailable() -> Decided {
    Decided {
        decision: PolicyDecision {
            decision: PolicyDecisionKind::RequireApproval,
            rule: None,
            reason: Some(
                "the admin policies (AgentPolicy, ClusterAgentPolicy) could not be read, so \
                 this call waits for a person; approve it only if no admin policy forbids it"
                    .to_string(),
            ),
            approval_kind: Some(ADMIN_POLICY_UNAVAILABLE.to_string()),
            capability: None,
            presentation: None,
        },
        source: None,
    }
}

/// What the record shows of the admin policy that decided, on an Approval's presentation
/// (`presentation.policy`): kind, namespace, name and rule, not the generation (an admin's
/// edit of another rule must not change the Approval's hash).
pub fn presentation_of(source: &PolicySource, rule: Option<&str>) -> Value {
    json!({
        "kind": source.kind,
        "namespace": source.namespace,
        "name": source.name,
        "rule": rule,
        "ruleIndex": source.rule_index,
    })
}

/// One limit of a run above a ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CeilingViolation {
    /// The field path, `spec.limits.maxSteps`.
    pub field: String,
    /// The run's value.
    pub value: i64,
    /// The ceiling.
    pub max: i64,
    /// `AgentPolicy ns/name` or `ClusterAgentPolicy name`.
    pub policy: String,
}

impl std::fmt::Display for CeilingViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{field} {value} is over the ceiling {max} of {policy} (spec.limits); set {field} \
             to at most {max}",
            field = self.field,
            value = self.value,
            max = self.max,
            policy = self.policy,
        )
    }
}

type Getter = fn(&Limits) -> Option<i64>;
type Setter = fn(&mut Limits, i64);
type Ceiling = fn(&LimitCeilings) -> Option<i64>;

/// Each limit: its field name, the run's value, the ceiling, and how to lower the run's.
const LIMITS: [(&str, Getter, Ceiling, Setter); 11] = [
    (
        "maxSteps",
        |l| Some(l.max_steps),
        |c| c.max_steps,
        |l, v| l.max_steps = v,
    ),
    (
        "maxConsecutiveToolFailures",
        |l| Some(l.max_consecutive_tool_failures),
        |c| c.max_consecutive_tool_failures,
        |l, v| l.max_consecutive_tool_failures = v,
    ),
    (
        "loopThreshold",
        |l| Some(l.loop_threshold),
        |c| c.loop_threshold,
        |l, v| l.loop_threshold = v,
    ),
    (
        "maxModelCalls",
        |l| l.max_model_calls,
        |c| c.max_model_calls,
        |l, v| l.max_model_calls = Some(v),
    ),
    (
        "maxTotalTokens",
        |l| l.max_total_tokens,
        |c| c.max_total_tokens,
        |l, v| l.max_total_tokens = Some(v),
    ),
    (
        "maxOutputTokensPerCall",
        |l| l.max_output_tokens_per_call,
        |c| c.max_output_tokens_per_call,
        |l, v| l.max_output_tokens_per_call = Some(v),
    ),
    (
        "maxEstimatedCostMicros",
        |l| l.max_estimated_cost_micros,
        |c| c.max_estimated_cost_micros,
        |l, v| l.max_estimated_cost_micros = Some(v),
    ),
    (
        "maxActiveSeconds",
        |l| l.max_active_seconds,
        |c| c.max_active_seconds,
        |l, v| l.max_active_seconds = Some(v),
    ),
    (
        "maxElapsedSeconds",
        |l| l.max_elapsed_seconds,
        |c| c.max_elapsed_seconds,
        |l, v| l.max_elapsed_seconds = Some(v),
    ),
    (
        "approvalTTLSeconds",
        |l| l.approval_ttl_seconds,
        |c| c.approval_ttl_seconds,
        |l, v| l.approval_ttl_seconds = Some(v),
    ),
    (
        "grantTTLSeconds",
        |l| l.grant_ttl_seconds,
        |c| c.grant_ttl_seconds,
        |l, v| l.grant_ttl_seconds = Some(v),
    ),
];

/// The run's effective limits under `admins`: each lowered to the smallest ceiling, an
/// optional limit left out set to it. Borrowed when no ceiling lowers anything (and when the
/// policies are unavailable: the run's own limits hold, and every call waits for a person).
pub fn effective_limits<'a>(limits: &'a Limits, admins: &AdminPolicies) -> Cow<'a, Limits> {
    let AdminPolicies::Known(policies) = admins else {
        return Cow::Borrowed(limits);
    };
    let mut out = Cow::Borrowed(limits);
    for policy in policies {
        for (_, get, ceiling, set) in LIMITS {
            let Some(max) = ceiling(&policy.limits) else {
                continue;
            };
            if get(&out).is_none_or(|value| value > max) {
                set(out.to_mut(), max);
            }
        }
    }
    out
}

/// Each limit of `limits` above a ceiling of `policy` (an optional limit left out is not: it
/// takes the ceiling).
pub fn ceiling_violations(limits: &Limits, policy: &AdminPolicy) -> Vec<CeilingViolation> {
    LIMITS
        .iter()
        .filter_map(|(field, get, ceiling, _)| {
            let max = ceiling(&policy.limits)?;
            let value = get(limits)?;
            (value > max).then(|| CeilingViolation {
                field: format!("spec.limits.{field}"),
                value,
                max,
                policy: policy.display_name(),
            })
        })
        .collect()
}

/// Each limit of `limits` above a ceiling of the admin policies that select the run: what the
/// admission webhook refuses at apply and `agentrt lint --policy` refuses offline (one rule for
/// both; docs/design.md section 6, admin policies). Policies that could not be read
/// ([`AdminPolicies::Unavailable`]) refuse nothing here: the ceilings still lower the run's
/// limits at each decision ([`effective_limits`]).
pub fn ceiling_refusals(limits: &Limits, admins: &AdminPolicies) -> Vec<CeilingViolation> {
    match admins {
        AdminPolicies::Known(policies) => policies
            .iter()
            .flat_map(|policy| ceiling_violations(limits, policy))
            .collect(),
        AdminPolicies::Unavailable(_) => Vec::new(),
    }
}

/// Every problem of an admin policy's own spec, each named by its path from the object's root
/// (`spec.rules[1].when: ...`): its rules checked as a run's `spec.policy.rules` are
/// ([`crate::engine::validate::spec::policy_rules`]: a `when` that is not CEL, an empty tool
/// glob, a capability or presentation that is not a storable object). `agentrt lint` reports
/// them; an unknown side-effect class or outcome is a decoding problem its caller reports.
pub fn policy_problems(policy: &AdminPolicy) -> Vec<crate::engine::validate::spec::Problem> {
    crate::engine::validate::spec::policy_rules("spec.rules", &policy.rules)
}

#[cfg(test)]
mod tests;
