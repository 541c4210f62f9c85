//! The policy (docs/design.md section 2 `spec.policy`, docs/behaviours.md 11-14): rules in order (tool
//! globs, then a CEL `when` over `tool`, `args`, `sideEffect`), first match wins, else the
//! side-effect class default. The admins' `AgentPolicy` and `ClusterAgentPolicy` combine with
//! it in `policy/admin.rs` (the most restrictive outcome wins); which of them apply to a run is
//! `policy/select.rs`.
//!
//! Owns: what a rule matches and what the policy decides. Must not: see anything but the tool,
//! the args and the policies (no clock, no record), or depend on how a number was spelled (see
//! `policy/when.rs` for how args enter CEL: `250.0` and `250` are the same `int`).

pub mod admin;
mod glob;
pub mod select;
mod when;

use serde_json::Value;

use crate::api::{
    PolicyDecisionKind, PolicyOutcome, PolicyRule, PolicySpec, SideEffect, SideEffectPolicy,
    ToolSpec,
};
pub use glob::glob_matches;
pub use when::{check_when, MAX_WHEN_CHARS};
use when::{eval_when, WhenError};

/// The approval kind when a rule names none, and for a class default.
pub const DEFAULT_APPROVAL_KIND: &str = "policy";

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
    /// A rule's CEL `when` failed on these args: a missing key, a wrong type, a result that
    /// is not a bool (docs/behaviours.md 12: the call pauses on a `policy_error` Approval).
    #[error("spec.policy.rules[{index}] ({name}).when: {detail}")]
    Eval {
        /// Rule index.
        index: usize,
        /// Rule name.
        name: String,
        /// What went wrong and the fix.
        detail: String,
    },
    /// A rule's CEL `when` cannot be evaluated on any args: too long, not CEL, nested too
    /// deeply (what [`check_when`] refuses; the spec is wrong).
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
/// Rules are tried in order. A rule matches when one of its `tools` globs matches `tool.name`
/// (no globs: every tool; see [`glob_matches`]) and its `when` (absent: true) evaluates to
/// `true` over `tool` (the name, a string), `args` (see the module doc for the JSON → CEL
/// mapping) and `sideEffect` (e.g. `"RemoteMutation"`). A rule whose globs do not match never
/// has its `when` evaluated. The first match decides with its outcome, name and reason; for
/// `RequireApproval` also its `kind` (default [`DEFAULT_APPROVAL_KIND`]; an empty kind counts as
/// absent), `capability` and `presentation` (for other outcomes those three are `None`).
///
/// No match: the class default of `policy.sideEffects`, with `rule: None`, a reason such as
/// `RemoteMutation tools require approval by default`, and for `RequireApproval` the kind
/// `policy` and no capability or presentation (the state machine fills the presentation).
///
/// # Errors
/// [`PolicyError::Glob`] for an empty glob; [`PolicyError::When`] when a `when` does not
/// compile, fails at run time (e.g. `args.nope` on args without `nope`), returns a non-bool,
/// or `args` nest deeper than 256 levels. The error names the rule by index and name.
pub fn evaluate(
    policy: &PolicySpec,
    tool: &ToolSpec,
    args: &Value,
) -> Result<PolicyDecision, PolicyError> {
    match first_match(&policy.rules, tool, args)? {
        Some((_, decision)) => Ok(decision),
        None => Ok(class_default(policy, tool.side_effect)),
    }
}

/// The first of `rules` that matches the call, with its index, as [`evaluate`] tries them;
/// `None` when none matches.
///
/// # Errors
/// As [`evaluate`].
pub fn first_match(
    rules: &[PolicyRule],
    tool: &ToolSpec,
    args: &Value,
) -> Result<Option<(usize, PolicyDecision)>, PolicyError> {
    for (index, rule) in rules.iter().enumerate() {
        if !rule_tools_match(index, rule, &tool.name)? {
            continue;
        }
        let matched = match rule.when.as_deref() {
            None => true,
            Some(expression) => eval_when(expression, &tool.name, args, tool.side_effect)
                .map_err(|err| when_error(index, rule, err))?,
        };
        if matched {
            return Ok(Some((index, rule_decision(rule))));
        }
    }
    Ok(None)
}

fn rule_tools_match(index: usize, rule: &PolicyRule, name: &str) -> Result<bool, PolicyError> {
    if rule.tools.is_empty() {
        return Ok(true);
    }
    let mut any = false;
    for glob in &rule.tools {
        if glob.is_empty() {
            return Err(PolicyError::Glob {
                index,
                name: rule.name.clone(),
                detail: "an empty glob matches no tool; remove it, or write \"*\" for every tool"
                    .into(),
            });
        }
        any = any || glob_matches(glob, name);
    }
    Ok(any)
}

fn when_error(index: usize, rule: &PolicyRule, err: WhenError) -> PolicyError {
    let name = rule.name.clone();
    match err {
        WhenError::Compile(detail) => PolicyError::When {
            index,
            name,
            detail,
        },
        WhenError::Eval(detail) => PolicyError::Eval {
            index,
            name,
            detail,
        },
    }
}

fn rule_decision(rule: &PolicyRule) -> PolicyDecision {
    let approval = rule.outcome == PolicyOutcome::RequireApproval;
    PolicyDecision {
        decision: rule.outcome.into(),
        rule: Some(rule.name.clone()),
        reason: rule.reason.clone(),
        approval_kind: approval.then(|| {
            rule.kind
                .as_deref()
                .filter(|k| !k.is_empty())
                .unwrap_or(DEFAULT_APPROVAL_KIND)
                .to_string()
        }),
        capability: if approval {
            rule.capability.clone()
        } else {
            None
        },
        presentation: if approval {
            rule.presentation.clone()
        } else {
            None
        },
    }
}

/// The decision of the run's own `spec.policy.sideEffects` for `class`: its reason says "by
/// default" only when the outcome is the built-in default, and names the run's own setting
/// when the run's author chose another.
fn class_default(policy: &PolicySpec, class: SideEffect) -> PolicyDecision {
    let outcome = policy.side_effects.outcome(class);
    let mut decision = outcome_decision(outcome, class);
    if outcome != SideEffectPolicy::default().outcome(class) {
        decision.reason = Some(format!(
            "the run's spec.policy.sideEffects.{}: {}",
            class.as_str(),
            admin::outcome_word(outcome)
        ));
    }
    decision
}

/// The decision of a side-effect class outcome (no rule matched): a reason naming the class.
fn outcome_decision(outcome: PolicyOutcome, class: SideEffect) -> PolicyDecision {
    let class_name = class.as_str();
    let reason = match outcome {
        PolicyOutcome::Allow => format!("{class_name} tools are allowed by default"),
        PolicyOutcome::Deny => format!("{class_name} tools are denied by default"),
        PolicyOutcome::Abort => format!("{class_name} tools abort the run by default"),
        PolicyOutcome::RequireApproval => {
            format!("{class_name} tools require approval by default")
        }
    };
    PolicyDecision {
        decision: outcome.into(),
        rule: None,
        reason: Some(reason),
        approval_kind: (outcome == PolicyOutcome::RequireApproval)
            .then(|| DEFAULT_APPROVAL_KIND.to_string()),
        capability: None,
        presentation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SideEffectPolicy, ToolSpec};
    use crate::engine::canonical::canonical_json;
    use serde_json::json;

    fn tool(name: &str, side_effect: SideEffect) -> ToolSpec {
        ToolSpec {
            job: None,
            name: name.into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            side_effect,
            timeout_seconds: 30,
            terminal: false,
            http: None,
            mcp: None,
        }
    }

    fn rule(name: &str, tools: &[&str], when: Option<&str>, outcome: PolicyOutcome) -> PolicyRule {
        PolicyRule {
            name: name.into(),
            tools: tools.iter().map(|s| s.to_string()).collect(),
            when: when.map(str::to_string),
            outcome,
            reason: Some(format!("because {name}")),
            kind: None,
            capability: None,
            presentation: None,
        }
    }

    fn policy(rules: Vec<PolicyRule>) -> PolicySpec {
        PolicySpec {
            side_effects: SideEffectPolicy::default(),
            rules,
        }
    }

    fn refund() -> ToolSpec {
        tool("issue_refund", SideEffect::RemoteMutation)
    }

    /// The docs/design.md section 2 example policy.
    fn small_refunds() -> PolicySpec {
        policy(vec![rule(
            "small-refunds",
            &["issue_refund"],
            Some("args.amount <= 100"),
            PolicyOutcome::Allow,
        )])
    }

    fn decide(p: &PolicySpec, t: &ToolSpec, args: Value) -> PolicyDecision {
        evaluate(p, t, &args).expect("decides")
    }

    #[test]
    fn a_class_outcome_the_run_chose_is_named_as_the_run_s_not_as_a_default() {
        let mut p = policy(vec![]);
        p.side_effects.remote_mutation = PolicyOutcome::Allow;
        let d = decide(&p, &refund(), json!({}));
        assert_eq!(d.decision, PolicyDecisionKind::Allow);
        assert_eq!(
            d.reason.as_deref(),
            Some("the run's spec.policy.sideEffects.RemoteMutation: Allow")
        );
        // The built-in default is still said to be one.
        let d = decide(&p, &tool("t", SideEffect::LocalMutation), json!({}));
        assert_eq!(
            d.reason.as_deref(),
            Some("LocalMutation tools are allowed by default")
        );
    }

    #[test]
    fn each_side_effect_class_has_its_default() {
        let p = policy(vec![]);
        let cases = [
            (SideEffect::ReadOnly, PolicyDecisionKind::Allow),
            (SideEffect::LocalMutation, PolicyDecisionKind::Allow),
            (
                SideEffect::RemoteMutation,
                PolicyDecisionKind::RequireApproval,
            ),
            (SideEffect::Destructive, PolicyDecisionKind::Deny),
        ];
        for (class, want) in cases {
            let d = decide(&p, &tool("t", class), json!({}));
            assert_eq!(d.decision, want, "{class:?}");
            assert_eq!(d.rule, None);
        }
        let d = decide(&p, &refund(), json!({}));
        assert_eq!(
            d,
            PolicyDecision {
                decision: PolicyDecisionKind::RequireApproval,
                rule: None,
                reason: Some("RemoteMutation tools require approval by default".into()),
                approval_kind: Some("policy".into()),
                capability: None,
                presentation: None,
            }
        );
    }

    #[test]
    fn a_configured_class_default_replaces_the_built_in_one() {
        let mut p = policy(vec![]);
        p.side_effects.read_only = PolicyOutcome::Abort;
        let d = decide(&p, &tool("t", SideEffect::ReadOnly), json!({}));
        assert_eq!(d.decision, PolicyDecisionKind::Abort);
        assert_eq!(d.approval_kind, None);
    }

    #[test]
    fn small_refunds_are_allowed_and_large_ones_fall_to_the_class_default() {
        let p = small_refunds();
        let d = decide(&p, &refund(), json!({"order": 1042, "amount": 50}));
        assert_eq!(d.decision, PolicyDecisionKind::Allow);
        assert_eq!(d.rule.as_deref(), Some("small-refunds"));
        assert_eq!(d.reason.as_deref(), Some("because small-refunds"));
        assert_eq!(d.approval_kind, None);
        let d = decide(&p, &refund(), json!({"order": 1042, "amount": 250}));
        assert_eq!(d.decision, PolicyDecisionKind::RequireApproval);
        assert_eq!(d.rule, None);
    }

    #[test]
    fn int_and_double_amounts_compare_numerically() {
        let p = small_refunds();
        for (amount, want) in [
            (json!(99.5), PolicyDecisionKind::Allow),
            (json!(100), PolicyDecisionKind::Allow),
            (json!(100.0), PolicyDecisionKind::Allow),
            (json!(100.5), PolicyDecisionKind::RequireApproval),
            (json!(250), PolicyDecisionKind::RequireApproval),
            (json!(-1e300), PolicyDecisionKind::Allow),
            (json!(1e300), PolicyDecisionKind::RequireApproval),
        ] {
            let d = decide(&p, &refund(), json!({ "amount": amount }));
            assert_eq!(d.decision, want, "amount {amount}");
        }
        let eq = policy(vec![rule(
            "exact",
            &[],
            Some("args.amount == 250"),
            PolicyOutcome::Deny,
        )]);
        assert_eq!(
            decide(&eq, &refund(), json!({"amount": 250.0})).decision,
            PolicyDecisionKind::Deny
        );
        let dbl = policy(vec![rule(
            "d",
            &[],
            Some("double(args.amount) * 1.5 > 300.0"),
            PolicyOutcome::Deny,
        )]);
        assert_eq!(
            decide(&dbl, &refund(), json!({"amount": 250})).decision,
            PolicyDecisionKind::Deny
        );
    }

    #[test]
    fn a_float_spelled_integer_gets_the_same_decision_as_the_integer() {
        let p = policy(vec![rule(
            "is-int",
            &[],
            Some("type(args.amount) == int && args.amount == 250"),
            PolicyOutcome::Deny,
        )]);
        let as_int = decide(&p, &refund(), json!({"amount": 250}));
        let as_float = decide(&p, &refund(), json!({"amount": 250.0}));
        assert_eq!(as_int, as_float);
        assert_eq!(as_int.decision, PolicyDecisionKind::Deny);
        // And as the canonical bytes read back.
        let text = canonical_json(&json!({"amount": 250.0})).expect("canonical");
        let read_back: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(decide(&p, &refund(), read_back), as_int);
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let p = policy(vec![
            rule("never", &[], Some("false"), PolicyOutcome::Abort),
            rule("first", &["issue_*"], None, PolicyOutcome::Deny),
            rule("second", &[], None, PolicyOutcome::Allow),
        ]);
        let d = decide(&p, &refund(), json!({}));
        assert_eq!(d.decision, PolicyDecisionKind::Deny);
        assert_eq!(d.rule.as_deref(), Some("first"));
        let d = decide(&p, &tool("lookup_order", SideEffect::ReadOnly), json!({}));
        assert_eq!(d.rule.as_deref(), Some("second"));
    }

    #[test]
    fn deny_and_abort_rules_decide_with_their_reason() {
        let p = policy(vec![
            rule("no-deletes", &["delete_*"], None, PolicyOutcome::Abort),
            rule("no-email", &["send_email"], None, PolicyOutcome::Deny),
        ]);
        let d = decide(&p, &tool("delete_all", SideEffect::Destructive), json!({}));
        assert_eq!(d.decision, PolicyDecisionKind::Abort);
        assert_eq!(d.reason.as_deref(), Some("because no-deletes"));
        let d = decide(
            &p,
            &tool("send_email", SideEffect::RemoteMutation),
            json!({}),
        );
        assert_eq!(d.decision, PolicyDecisionKind::Deny);
        assert_eq!(d.capability, None);
    }

    #[test]
    fn a_require_approval_rule_carries_kind_capability_and_presentation() {
        let mut r = rule(
            "big",
            &["issue_refund"],
            Some("args.amount > 100"),
            PolicyOutcome::RequireApproval,
        );
        r.kind = Some("finance".into());
        r.capability = Some(json!({"maxAmount": 1000}));
        r.presentation = Some(json!({"title": "Refund"}));
        let d = decide(&policy(vec![r.clone()]), &refund(), json!({"amount": 250}));
        assert_eq!(
            d,
            PolicyDecision {
                decision: PolicyDecisionKind::RequireApproval,
                rule: Some("big".into()),
                reason: Some("because big".into()),
                approval_kind: Some("finance".into()),
                capability: Some(json!({"maxAmount": 1000})),
                presentation: Some(json!({"title": "Refund"})),
            }
        );
        r.kind = None;
        let d = decide(&policy(vec![r]), &refund(), json!({"amount": 250}));
        assert_eq!(d.approval_kind.as_deref(), Some("policy"));
    }

    #[test]
    fn when_sees_tool_and_side_effect() {
        let p = policy(vec![rule(
            "remote-refund",
            &[],
            Some("tool == 'issue_refund' && sideEffect == 'RemoteMutation' && has(args.order)"),
            PolicyOutcome::Allow,
        )]);
        assert_eq!(
            decide(&p, &refund(), json!({"order": 1})).decision,
            PolicyDecisionKind::Allow
        );
        assert_eq!(
            decide(&p, &refund(), json!({})).decision,
            PolicyDecisionKind::RequireApproval
        );
    }

    #[test]
    fn an_empty_glob_is_a_policy_error() {
        let p = policy(vec![rule("bad", &[""], None, PolicyOutcome::Allow)]);
        let err = evaluate(&p, &refund(), &json!({})).expect_err("error");
        assert!(matches!(err, PolicyError::Glob { index: 0, .. }));
        assert!(err
            .to_string()
            .starts_with("spec.policy.rules[0] (bad).tools: an empty glob"));
    }

    #[test]
    fn a_when_that_does_not_compile_names_the_rule() {
        let p = policy(vec![
            rule("ok", &["other"], None, PolicyOutcome::Allow),
            rule("broken", &[], Some("args.amount <="), PolicyOutcome::Allow),
        ]);
        let err = evaluate(&p, &refund(), &json!({"amount": 1})).expect_err("error");
        let PolicyError::When {
            index,
            name,
            detail,
        } = &err
        else {
            panic!("{err:?}");
        };
        assert_eq!((*index, name.as_str()), (1, "broken"));
        assert!(detail.contains("does not compile"), "{detail}");
        assert!(err
            .to_string()
            .starts_with("spec.policy.rules[1] (broken).when: "));
    }

    #[test]
    fn a_missing_field_is_a_policy_error_with_the_fix() {
        let p = policy(vec![rule(
            "nope",
            &[],
            Some("args.nope > 1"),
            PolicyOutcome::Allow,
        )]);
        let err = evaluate(&p, &refund(), &json!({"amount": 1})).expect_err("error");
        let text = err.to_string();
        assert!(
            text.starts_with("spec.policy.rules[0] (nope).when: "),
            "{text}"
        );
        assert_eq!(
            text,
            "spec.policy.rules[0] (nope).when: No such key: nope; guard fields the args may lack \
             with has(), e.g. `has(args.x) && args.x > 0`"
        );
    }

    #[test]
    fn a_type_error_or_unknown_variable_is_a_policy_error_with_the_fix() {
        let p = policy(vec![rule(
            "mix",
            &[],
            Some("args.amount * 1.5 > 10.0"),
            PolicyOutcome::Allow,
        )]);
        let err = evaluate(&p, &refund(), &json!({"amount": 250})).expect_err("error");
        assert!(
            err.to_string().contains("write `double(args.x) * 1.5`"),
            "{err}"
        );
        let p = policy(vec![rule(
            "var",
            &[],
            Some("amount > 1"),
            PolicyOutcome::Allow,
        )]);
        let err = evaluate(&p, &refund(), &json!({"amount": 250})).expect_err("error");
        assert!(
            err.to_string()
                .contains("only `tool`, `args` and `sideEffect`"),
            "{err}"
        );
    }

    #[test]
    fn a_when_that_is_not_a_bool_is_a_policy_error() {
        let p = policy(vec![rule(
            "num",
            &[],
            Some("args.amount + 1"),
            PolicyOutcome::Allow,
        )]);
        let err = evaluate(&p, &refund(), &json!({"amount": 1})).expect_err("error");
        assert_eq!(
            err.to_string(),
            "spec.policy.rules[0] (num).when: returned an int instead of a bool; make the \
             expression a condition (e.g. `args.amount <= 100`)"
        );
    }

    #[test]
    fn a_when_of_a_rule_for_other_tools_is_not_evaluated() {
        let p = policy(vec![rule(
            "other",
            &["lookup_*"],
            Some("args.nope"),
            PolicyOutcome::Allow,
        )]);
        assert_eq!(
            decide(&p, &refund(), json!({})).decision,
            PolicyDecisionKind::RequireApproval
        );
    }

    #[test]
    fn deeply_nested_or_long_expressions_decide_or_fail_without_a_crash() {
        let cases = [
            format!("{}true{}", "(".repeat(90), ")".repeat(90)),
            format!("{}true{}", "(".repeat(2000), ")".repeat(2000)),
            format!("{}1{} == [1]", "[".repeat(1000), "]".repeat(1000)),
            format!("{} == 2048", vec!["1"; 2045].join("+")),
            vec!["true"; 500].join(" && "),
            format!("{}true", "!".repeat(4000)),
            format!("{}true", "true ? true : ".repeat(300)),
        ];
        for expression in cases {
            let p = policy(vec![rule(
                "deep",
                &[],
                Some(&expression),
                PolicyOutcome::Deny,
            )]);
            let _ = evaluate(&p, &refund(), &json!({}));
        }
        let long = format!("{} == 2049", vec!["1"; 2049].join("+"));
        let p = policy(vec![rule("long", &[], Some(&long), PolicyOutcome::Deny)]);
        let err = evaluate(&p, &refund(), &json!({})).expect_err("too long");
        assert!(
            err.to_string().contains("at most 4096 are evaluated"),
            "{err}"
        );
    }

    #[test]
    fn args_nested_past_256_levels_are_a_policy_error() {
        let deep = crate::engine::validate::tests_support::nested_arrays(300);
        let p = policy(vec![rule("any", &[], Some("true"), PolicyOutcome::Allow)]);
        let err = evaluate(&p, &refund(), &json!({ "d": deep })).expect_err("too deep");
        assert!(err.to_string().contains("nest deeper than 256"), "{err}");
    }
}
