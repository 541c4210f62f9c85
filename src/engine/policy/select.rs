//! Which admin policies apply to a run (docs/design.md section 2, AgentPolicy and
//! ClusterAgentPolicy): an `AgentPolicy` of the run's namespace whose `runSelector` selects the
//! run's labels, and a `ClusterAgentPolicy` whose `namespaceSelector` selects the namespace's
//! labels and whose `runSelector` selects the run's. An absent selector selects everything;
//! `{}` too, as in Kubernetes.
//!
//! A selector that cannot be read (an unknown operator, `In` without values) selects every run:
//! an admin's mistake must not let a run escape the policy (fail closed). When the namespace's
//! labels are unknown and a cluster policy has a `namespaceSelector`, the policies are
//! unavailable ([`AdminPolicies::Unavailable`]).
//!
//! Owns: label selector matching as `metav1.LabelSelector` defines it. Must not: read anything.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::admin::{AdminPolicies, AdminPolicy};
use crate::api::{AgentPolicy, ClusterAgentPolicy};

/// Whether `selector` selects `labels` (absent: yes). `matchLabels` and every
/// `matchExpressions` requirement (`In`, `NotIn`, `Exists`, `DoesNotExist`) must hold; a
/// requirement that cannot be read counts as holding (module doc).
pub fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(key, value)| labels.get(key) == Some(value));
    labels_match
        && selector.match_expressions.iter().flatten().all(|req| {
            let value = labels.get(&req.key);
            let values = req.values.as_deref().unwrap_or_default();
            match req.operator.as_str() {
                "In" if !values.is_empty() => value.is_some_and(|v| values.contains(v)),
                "NotIn" if !values.is_empty() => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => true,
            }
        })
}

/// The admin policies that apply to a run in `namespace` with `run_labels`, cluster policies
/// first, then the namespace's, each by name. `namespace_labels` is `None` when the
/// namespace's labels could not be read.
pub fn select(
    cluster: &[ClusterAgentPolicy],
    namespaced: &[AgentPolicy],
    namespace: &str,
    run_labels: &BTreeMap<String, String>,
    namespace_labels: Option<&BTreeMap<String, String>>,
) -> AdminPolicies {
    let mut chosen = Vec::new();
    for policy in cluster {
        let in_namespace = match (policy.spec.namespace_selector.as_ref(), namespace_labels) {
            (None, _) => true,
            (Some(selector), Some(labels)) => selects(Some(selector), labels),
            (Some(_), None) => {
                return AdminPolicies::Unavailable(format!(
                    "the labels of namespace {namespace} could not be read, and \
                     ClusterAgentPolicy {} selects namespaces by label",
                    policy.metadata.name.as_deref().unwrap_or_default()
                ))
            }
        };
        if in_namespace && selects(policy.spec.run_selector.as_ref(), run_labels) {
            chosen.push(AdminPolicy::from_cluster(policy));
        }
    }
    let mut own: Vec<AdminPolicy> = namespaced
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
        .filter(|p| selects(p.spec.run_selector.as_ref(), run_labels))
        .map(AdminPolicy::from_namespaced)
        .collect();
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    own.sort_by(|a, b| a.name.cmp(&b.name));
    chosen.extend(own);
    AdminPolicies::Known(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    #[test]
    fn label_selectors_match_as_kubernetes_defines_them() {
        let team = labels(&[("team", "payments"), ("tier", "prod")]);
        assert!(selects(None, &team));
        assert!(selects(Some(&LabelSelector::default()), &team));
        let by_label = LabelSelector {
            match_labels: Some(labels(&[("team", "payments")])),
            match_expressions: None,
        };
        assert!(selects(Some(&by_label), &team));
        assert!(!selects(Some(&by_label), &labels(&[("team", "search")])));
        let cases = [
            (expr("tier", "In", &["prod", "staging"]), true),
            (expr("tier", "In", &["dev"]), false),
            (expr("tier", "NotIn", &["dev"]), true),
            (expr("tier", "NotIn", &["prod"]), false),
            (expr("team", "Exists", &[]), true),
            (expr("owner", "Exists", &[]), false),
            (expr("owner", "DoesNotExist", &[]), true),
            (expr("team", "DoesNotExist", &[]), false),
            // Unreadable requirements select (fail closed).
            (expr("team", "Matches", &["x"]), true),
            (expr("team", "In", &[]), true),
        ];
        for (requirement, want) in cases {
            let selector = LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![requirement.clone()]),
            };
            assert_eq!(selects(Some(&selector), &team), want, "{requirement:?}");
        }
    }

    fn cluster(name: &str, ns: Option<LabelSelector>) -> ClusterAgentPolicy {
        let mut p = ClusterAgentPolicy::new(name, Default::default());
        p.spec.namespace_selector = ns;
        p
    }

    fn namespaced(ns: &str, name: &str, runs: Option<LabelSelector>) -> AgentPolicy {
        let mut p = AgentPolicy::new(name, Default::default());
        p.metadata.namespace = Some(ns.into());
        p.spec.run_selector = runs;
        p
    }

    fn names(policies: &AdminPolicies) -> Vec<String> {
        match policies {
            AdminPolicies::Known(list) => list.iter().map(|p| p.display_name()).collect(),
            AdminPolicies::Unavailable(why) => vec![format!("unavailable: {why}")],
        }
    }

    #[test]
    fn a_run_gets_the_cluster_policies_of_its_namespace_then_its_namespaces_own() {
        let prod = LabelSelector {
            match_labels: Some(labels(&[("env", "prod")])),
            match_expressions: None,
        };
        let risky = LabelSelector {
            match_labels: Some(labels(&[("risk", "high")])),
            match_expressions: None,
        };
        let clusters = [cluster("z-all", None), cluster("a-prod", Some(prod))];
        let own = [
            namespaced("shop", "risky", Some(risky)),
            namespaced("shop", "base", None),
            namespaced("other", "theirs", None),
        ];
        let ns = labels(&[("env", "prod")]);
        let chosen = select(&clusters, &own, "shop", &labels(&[]), Some(&ns));
        assert_eq!(
            names(&chosen),
            [
                "ClusterAgentPolicy a-prod",
                "ClusterAgentPolicy z-all",
                "AgentPolicy shop/base"
            ]
        );
        let chosen = select(
            &clusters,
            &own,
            "shop",
            &labels(&[("risk", "high")]),
            Some(&labels(&[("env", "dev")])),
        );
        assert_eq!(
            names(&chosen),
            [
                "ClusterAgentPolicy z-all",
                "AgentPolicy shop/base",
                "AgentPolicy shop/risky"
            ]
        );
        let unknown = select(&clusters, &own, "shop", &labels(&[]), None);
        assert!(matches!(unknown, AdminPolicies::Unavailable(ref why) if why.contains("a-prod")));
        // Without a namespaceSelector the namespace's labels are not needed.
        let chosen = select(&clusters[..1], &own, "other", &labels(&[]), None);
        assert_eq!(
            names(&chosen),
            ["ClusterAgentPolicy z-all", "AgentPolicy other/theirs"]
        );
    }
}
