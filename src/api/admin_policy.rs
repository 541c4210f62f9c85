//! The admins' policies (docs/design.md section 2 "AgentPolicy and ClusterAgentPolicy", issue
//! 34): a namespaced `AgentPolicy` and a cluster-scoped `ClusterAgentPolicy`. Each holds the
//! shape of an AgentRun's `spec.policy` (side-effect classes and rules with `when`), ceilings for
//! `spec.limits`, and which runs it applies to (`runSelector` on the run's labels; for the
//! cluster policy also `namespaceSelector` on its namespace's labels).
//!
//! Owns: the two objects' shape and schema. Must not: hold logic (how they combine with a run's
//! own policy is `engine::policy::admin`; which select a run is `engine::policy::select`).
//!
//! Only admins write them: the chart gives the controller and `agentrt-viewer` read access and
//! no run creator's role write access (docs/design.md section 2).

// Each `printcolumn(...)` repeats `type_ = ...`; clippy reads the repeats as duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::agentrun::PolicyRule;
use super::vocab::{PolicyOutcome, SideEffect};

/// An admin policy over the AgentRuns of its namespace (those `runSelector` selects; absent:
/// all of them). It combines with each run's own `spec.policy`: the most restrictive outcome
/// wins, so a run's policy can only tighten it (docs/design.md section 6, admin policies).
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "agentrt.dev",
    version = "v1alpha1",
    kind = "AgentPolicy",
    plural = "agentpolicies",
    singular = "agentpolicy",
    namespaced,
    shortname = "apol",
    category = "agentrt",
    printcolumn(
        name = "RemoteMutation",
        type_ = "string",
        json_path = ".spec.sideEffects.RemoteMutation",
        description = "The outcome for RemoteMutation tools no rule matches"
    ),
    printcolumn(
        name = "MaxSteps",
        type_ = "integer",
        json_path = ".spec.limits.maxSteps",
        description = "The ceiling of spec.limits.maxSteps"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AgentPolicySpec {
    /// The outcome per side-effect class when none of `rules` matches; a class left out has
    /// no admin outcome (the run's own policy decides it).
    #[serde(default, skip_serializing_if = "AdminSideEffects::is_empty")]
    pub side_effects: AdminSideEffects,
    /// Evaluated in order, as a run's `spec.policy.rules`: the first match gives this policy's
    /// outcome.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub rules: Vec<PolicyRule>,
    /// Ceilings for the runs' `spec.limits`.
    #[serde(default, skip_serializing_if = "LimitCeilings::is_empty")]
    pub limits: LimitCeilings,
    /// Which runs of the namespace it applies to, by their labels; absent: every run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_selector: Option<LabelSelector>,
}

/// An admin policy over the AgentRuns of every namespace `namespaceSelector` selects (absent:
/// all), and of those the runs `runSelector` selects (absent: all). Combined as
/// [`AgentPolicy`] is.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "agentrt.dev",
    version = "v1alpha1",
    kind = "ClusterAgentPolicy",
    plural = "clusteragentpolicies",
    singular = "clusteragentpolicy",
    shortname = "capol",
    category = "agentrt",
    printcolumn(
        name = "RemoteMutation",
        type_ = "string",
        json_path = ".spec.sideEffects.RemoteMutation",
        description = "The outcome for RemoteMutation tools no rule matches"
    ),
    printcolumn(
        name = "MaxSteps",
        type_ = "integer",
        json_path = ".spec.limits.maxSteps",
        description = "The ceiling of spec.limits.maxSteps"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAgentPolicySpec {
    /// As [`AgentPolicySpec::side_effects`].
    #[serde(default, skip_serializing_if = "AdminSideEffects::is_empty")]
    pub side_effects: AdminSideEffects,
    /// As [`AgentPolicySpec::rules`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub rules: Vec<PolicyRule>,
    /// As [`AgentPolicySpec::limits`].
    #[serde(default, skip_serializing_if = "LimitCeilings::is_empty")]
    pub limits: LimitCeilings,
    /// Which namespaces it applies to, by their labels; absent: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Which runs it applies to, by their labels; absent: every run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_selector: Option<LabelSelector>,
}

/// An admin policy's outcome per side-effect class; a class left out has none.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
pub struct AdminSideEffects {
    /// For `ReadOnly` tools.
    #[serde(rename = "ReadOnly", default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<PolicyOutcome>,
    /// For `LocalMutation` tools.
    #[serde(
        rename = "LocalMutation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub local_mutation: Option<PolicyOutcome>,
    /// For `RemoteMutation` tools.
    #[serde(
        rename = "RemoteMutation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub remote_mutation: Option<PolicyOutcome>,
    /// For `Destructive` tools.
    #[serde(
        rename = "Destructive",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub destructive: Option<PolicyOutcome>,
}

impl AdminSideEffects {
    /// The outcome for `class`, if the policy gives one.
    pub fn outcome(&self, class: SideEffect) -> Option<PolicyOutcome> {
        match class {
            SideEffect::ReadOnly => self.read_only,
            SideEffect::LocalMutation => self.local_mutation,
            SideEffect::RemoteMutation => self.remote_mutation,
            SideEffect::Destructive => self.destructive,
        }
    }

    /// No class has an outcome.
    pub fn is_empty(&self) -> bool {
        self == &AdminSideEffects::default()
    }
}

/// Ceilings for a run's `spec.limits` (docs/design.md section 6, admin policies): a run that
/// sets a limit above its ceiling (the defaults count: `maxSteps` is 50 when left out) is
/// refused at apply and by `agentrt lint`; an optional limit left out takes the ceiling; a live
/// run's effective limit is the smaller of its own and each ceiling, at its next decision.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LimitCeilings {
    /// Ceiling of `spec.limits.maxSteps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_steps: Option<i64>,
    /// Ceiling of `spec.limits.maxConsecutiveToolFailures`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_consecutive_tool_failures: Option<i64>,
    /// Ceiling of `spec.limits.loopThreshold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub loop_threshold: Option<i64>,
    /// Ceiling of `spec.limits.maxModelCalls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_model_calls: Option<i64>,
    /// Ceiling of `spec.limits.maxTotalTokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_total_tokens: Option<i64>,
    /// Ceiling of `spec.limits.maxOutputTokensPerCall`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_output_tokens_per_call: Option<i64>,
    /// Ceiling of `spec.limits.maxEstimatedCostMicros`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_estimated_cost_micros: Option<i64>,
    /// Ceiling of `spec.limits.maxActiveSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_active_seconds: Option<i64>,
    /// Ceiling of `spec.limits.maxElapsedSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_elapsed_seconds: Option<i64>,
    /// Ceiling of `spec.limits.approvalTTLSeconds`.
    #[serde(
        rename = "approvalTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub approval_ttl_seconds: Option<i64>,
    /// Ceiling of `spec.limits.grantTTLSeconds`.
    #[serde(
        rename = "grantTTLSeconds",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub grant_ttl_seconds: Option<i64>,
}

impl LimitCeilings {
    /// No ceiling is set.
    pub fn is_empty(&self) -> bool {
        self == &LimitCeilings::default()
    }
}
