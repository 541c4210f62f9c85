//! docs/behaviours.md 83-86: the admin policies combined with the run's own: the most
//! restrictive wins, so a run's policy can never loosen an admin decision; ceilings lower the
//! run's limits.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{PolicyOutcome, PolicySpec, SideEffect, SideEffectPolicy};
use crate::engine::policy::evaluate;

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

fn admin(kind: AdminKind, name: &str, rules: Vec<PolicyRule>) -> AdminPolicy {
    AdminPolicy {
        kind,
        namespace: (kind == AdminKind::AgentPolicy).then(|| "shop".to_string()),
        name: name.into(),
        generation: 3,
        side_effects: AdminSideEffects::default(),
        rules,
        limits: LimitCeilings::default(),
    }
}

fn allow_everything() -> PolicySpec {
    PolicySpec {
        side_effects: SideEffectPolicy {
            read_only: PolicyOutcome::Allow,
            local_mutation: PolicyOutcome::Allow,
            remote_mutation: PolicyOutcome::Allow,
            destructive: PolicyOutcome::Allow,
        },
        rules: vec![],
    }
}

fn decide(own: &PolicySpec, admins: &AdminPolicies, t: &ToolSpec) -> Decided {
    let mine = evaluate(own, t, &json!({})).expect("decides");
    combine(mine, admins, t, &json!({}))
}

#[test]
fn an_admin_requirement_holds_over_a_run_that_allows_remote_mutation() {
    let mut p = admin(AdminKind::AgentPolicy, "four-eyes", vec![]);
    p.side_effects.remote_mutation = Some(PolicyOutcome::RequireApproval);
    let admins = AdminPolicies::Known(vec![p]);
    let email = tool("send_email", SideEffect::RemoteMutation);
    let d = decide(&allow_everything(), &admins, &email);
    assert_eq!(d.decision.decision, PolicyDecisionKind::RequireApproval);
    assert_eq!(d.decision.approval_kind.as_deref(), Some("policy"));
    assert_eq!(
        d.decision.reason.as_deref(),
        Some("AgentPolicy shop/four-eyes sets sideEffects.RemoteMutation: RequireApproval")
    );
    assert_eq!(
        d.source,
        Some(PolicySource {
            kind: "AgentPolicy".into(),
            namespace: Some("shop".into()),
            name: "four-eyes".into(),
            generation: 3,
            rule_index: None,
        })
    );
    // A class the admin policy leaves out is the run's to decide.
    let lookup = tool("lookup", SideEffect::ReadOnly);
    let d = decide(&allow_everything(), &admins, &lookup);
    assert_eq!(d.decision.decision, PolicyDecisionKind::Allow);
    assert_eq!(d.source, None);
}

#[test]
fn the_most_restrictive_wins_and_an_admin_policy_decides_a_tie() {
    let email = tool("send_email", SideEffect::RemoteMutation);
    let deny = admin(
        AdminKind::ClusterAgentPolicy,
        "no-email",
        vec![rule("no-email", &["send_*"], None, PolicyOutcome::Deny)],
    );
    let mut approve = admin(AdminKind::AgentPolicy, "approve", vec![]);
    approve.side_effects.remote_mutation = Some(PolicyOutcome::RequireApproval);
    let admins = AdminPolicies::Known(vec![deny, approve.clone()]);
    let d = decide(&allow_everything(), &admins, &email);
    assert_eq!(d.decision.decision, PolicyDecisionKind::Deny);
    assert_eq!(d.decision.rule.as_deref(), Some("no-email"));
    let source = d.source.expect("an admin policy decided");
    assert_eq!(
        (source.kind.as_str(), source.rule_index),
        ("ClusterAgentPolicy", Some(0))
    );
    // The run's own abort is stricter than any admin outcome.
    let mut own = allow_everything();
    own.rules = vec![rule("stop", &[], None, PolicyOutcome::Abort)];
    let d = decide(&own, &admins, &email);
    assert_eq!(d.decision.decision, PolicyDecisionKind::Abort);
    assert_eq!(d.source, None);
    // A tie: both require approval; the admin's requirement is the one asked.
    let mut own = allow_everything();
    own.rules = vec![PolicyRule {
        kind: Some("mine".into()),
        ..rule("mine", &[], None, PolicyOutcome::RequireApproval)
    }];
    let d = decide(&own, &AdminPolicies::Known(vec![approve]), &email);
    assert_eq!(d.decision.approval_kind.as_deref(), Some("policy"));
    assert_eq!(d.source.map(|s| s.name), Some("approve".to_string()));
}

#[test]
fn an_admin_rule_that_cannot_be_evaluated_pauses_on_a_policy_error_naming_it() {
    let broken = admin(
        AdminKind::AgentPolicy,
        "broken",
        vec![rule(
            "big",
            &[],
            Some("args.amount > 100"),
            PolicyOutcome::Deny,
        )],
    );
    let t = tool("refund", SideEffect::RemoteMutation);
    let mine = evaluate(&allow_everything(), &t, &json!({})).expect("decides");
    let d = combine(mine, &AdminPolicies::Known(vec![broken]), &t, &json!({}));
    assert_eq!(d.decision.decision, PolicyDecisionKind::RequireApproval);
    assert_eq!(d.decision.approval_kind.as_deref(), Some(POLICY_ERROR));
    let reason = d.decision.reason.expect("reason");
    assert!(
        reason.starts_with("AgentPolicy shop/broken: rule big (spec.rules[0])"),
        "{reason}"
    );
    assert_eq!(d.source.and_then(|s| s.rule_index), Some(0));
}

#[test]
fn unreadable_admin_policies_fail_closed() {
    let admins = AdminPolicies::Unavailable("the AgentPolicy watch failed: 403".into());
    let lookup = tool("lookup", SideEffect::ReadOnly);
    let d = decide(&allow_everything(), &admins, &lookup);
    assert_eq!(d.decision.decision, PolicyDecisionKind::RequireApproval);
    assert_eq!(
        d.decision.approval_kind.as_deref(),
        Some(ADMIN_POLICY_UNAVAILABLE)
    );
    // The run's own deny still denies.
    let mut own = allow_everything();
    own.side_effects.read_only = PolicyOutcome::Deny;
    let d = decide(&own, &admins, &lookup);
    assert_eq!(d.decision.decision, PolicyDecisionKind::Deny);
}

#[test]
fn ceilings_lower_the_effective_limits_and_name_what_admission_refuses() {
    let mut tight = admin(AdminKind::ClusterAgentPolicy, "tight", vec![]);
    tight.limits.max_steps = Some(10);
    tight.limits.max_model_calls = Some(5);
    let mut tighter = admin(AdminKind::AgentPolicy, "tighter", vec![]);
    tighter.limits.max_steps = Some(8);
    let limits = Limits {
        max_model_calls: Some(3),
        ..Limits::default()
    };
    let admins = AdminPolicies::Known(vec![tight.clone(), tighter]);
    let effective = effective_limits(&limits, &admins);
    assert_eq!(effective.max_steps, 8);
    assert_eq!(effective.max_model_calls, Some(3));
    assert_eq!(effective.max_total_tokens, None);
    // Left out: takes the ceiling.
    let defaults = Limits::default();
    let effective = effective_limits(&defaults, &admins);
    assert_eq!(effective.max_model_calls, Some(5));
    // Nothing to lower: borrowed.
    let small = Limits {
        max_steps: 2,
        max_model_calls: Some(1),
        ..Limits::default()
    };
    assert!(matches!(
        effective_limits(&small, &admins),
        Cow::Borrowed(_)
    ));
    let violations = ceiling_violations(&limits, &tight);
    assert_eq!(violations.len(), 1);
    assert_eq!(
        violations[0].to_string(),
        "spec.limits.maxSteps 50 is over the ceiling 10 of ClusterAgentPolicy tight \
         (spec.limits); set spec.limits.maxSteps to at most 10"
    );
    assert!(ceiling_violations(&small, &tight).is_empty());
}

fn outcome() -> impl Strategy<Value = PolicyOutcome> {
    prop_oneof![
        Just(PolicyOutcome::Allow),
        Just(PolicyOutcome::Deny),
        Just(PolicyOutcome::Abort),
        Just(PolicyOutcome::RequireApproval),
    ]
}

fn side_effect() -> impl Strategy<Value = SideEffect> {
    prop_oneof![
        Just(SideEffect::ReadOnly),
        Just(SideEffect::LocalMutation),
        Just(SideEffect::RemoteMutation),
        Just(SideEffect::Destructive),
    ]
}

/// Rules over two tools, `a` and `b`, with `when`s on `args.n`.
fn rules() -> impl Strategy<Value = Vec<PolicyRule>> {
    proptest::collection::vec(
        (
            prop_oneof![
                Just(vec![]),
                Just(vec!["a"]),
                Just(vec!["b"]),
                Just(vec!["*"])
            ],
            prop_oneof![
                Just(None),
                Just(Some("args.n > 2")),
                Just(Some("args.n <= 2"))
            ],
            outcome(),
        )
            .prop_map(|(tools, when, outcome)| rule("r", &tools, when, outcome)),
        0..4,
    )
}

fn admin_policy() -> impl Strategy<Value = AdminPolicy> {
    (
        proptest::option::of(outcome()),
        proptest::option::of(outcome()),
        proptest::option::of(outcome()),
        proptest::option::of(outcome()),
        rules(),
        any::<bool>(),
    )
        .prop_map(|(ro, lm, rm, d, rules, cluster)| AdminPolicy {
            kind: if cluster {
                AdminKind::ClusterAgentPolicy
            } else {
                AdminKind::AgentPolicy
            },
            namespace: None,
            name: "p".into(),
            generation: 1,
            side_effects: AdminSideEffects {
                read_only: ro,
                local_mutation: lm,
                remote_mutation: rm,
                destructive: d,
            },
            rules,
            limits: LimitCeilings::default(),
        })
}

fn run_policy() -> impl Strategy<Value = PolicySpec> {
    (outcome(), outcome(), outcome(), outcome(), rules()).prop_map(|(ro, lm, rm, d, rules)| {
        PolicySpec {
            side_effects: SideEffectPolicy {
                read_only: ro,
                local_mutation: lm,
                remote_mutation: rm,
                destructive: d,
            },
            rules,
        }
    })
}

proptest! {
    /// docs/behaviours.md 83: whatever the run's own policy says, the outcome is exactly the
    /// most restrictive of it and every admin policy's, never looser than any admin decision;
    /// and when an admin policy is at least as strict as the run's own, an admin policy is named.
    #[test]
    fn a_runs_policy_can_never_loosen_an_admin_decision(
        own in run_policy(),
        admins in proptest::collection::vec(admin_policy(), 0..4),
        tool_name in prop_oneof![Just("a"), Just("b"), Just("c")],
        class in side_effect(),
        n in 0..5i64,
    ) {
        let t = tool(tool_name, class);
        let args = json!({"n": n});
        let mine = evaluate(&own, &t, &args).expect("rules over n evaluate");
        let theirs: Vec<Decided> = admins
            .iter()
            .filter_map(|p| admin_decision(p, &t, &args))
            .collect();
        let strictest_admin = theirs
            .iter()
            .map(|d| restrictiveness(d.decision.decision))
            .max();
        let own_rank = restrictiveness(mine.decision);
        let got = combine(mine, &AdminPolicies::Known(admins.clone()), &t, &args);
        let got_rank = restrictiveness(got.decision.decision);
        prop_assert_eq!(got_rank, own_rank.max(strictest_admin.unwrap_or(0)));
        for d in &theirs {
            prop_assert!(got_rank >= restrictiveness(d.decision.decision));
        }
        match strictest_admin {
            Some(rank) if rank >= own_rank => prop_assert!(got.source.is_some()),
            _ => prop_assert!(got.source.is_none()),
        }
        // An admin policy alone (the run allowing everything) decides at least as strictly as
        // with any run policy on top: tightening only.
        let alone = combine(
            evaluate(&allow_everything(), &t, &args).expect("allows"),
            &AdminPolicies::Known(admins),
            &t,
            &args,
        );
        prop_assert!(got_rank >= restrictiveness(alone.decision.decision));
    }
}
