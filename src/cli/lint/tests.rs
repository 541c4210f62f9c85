//! `agentrt lint`'s rules, offline: runs, admin policies and their ceilings.

use super::*;

const RUN: &str = r#"
apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {name: weather, namespace: demo}
spec:
  goal: Say the weather.
  agent: {scripted: {decisions: [{kind: complete, result: {}}]}}
  tools:
  - name: get weather!
    sideEffect: ReadOnly
    inputSchema: {type: objekt}
    http: {url: "ftp://x/y"}
"#;

#[test]
fn every_problem_of_every_run_is_a_line_and_other_kinds_are_skipped_with_a_note() {
    let text = format!("{RUN}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n");
    let mut report = Report::default();
    lint_text("a.yaml", &text, &mut report).expect("lints");
    assert_eq!(report.runs, 1);
    assert_eq!(report.problems.len(), 3, "{:?}", report.problems);
    assert!(report.problems[0].starts_with(
        "a.yaml: demo/weather: spec.tools[0].name: \"get weather!\" is not a valid function name"
    ));
    assert!(report.problems[1].starts_with("a.yaml: demo/weather: spec.tools[0].http.url: "));
    assert!(report.problems[2].starts_with("a.yaml: demo/weather: spec.tools[0].inputSchema: "));
    assert_eq!(
        report.notes,
        vec!["a.yaml: document 2 (ConfigMap c) is not an AgentRun; skipped"]
    );
}

#[test]
fn a_spec_that_does_not_decode_is_a_problem_naming_the_field_by_its_path() {
    let mut report = Report::default();
    let text = RUN.replace("sideEffect: ReadOnly", "sideEffect: Harmless");
    lint_text("b.yaml", &text, &mut report).expect("lints");
    assert_eq!(report.problems.len(), 1);
    assert!(
        report.problems[0].starts_with("b.yaml: demo/weather: spec.tools[0].sideEffect: "),
        "{:?}",
        report.problems
    );
    let mut report = Report::default();
    let text = RUN.replace("  tools:\n", "  limits: {maxSteps: ten}\n  tools:\n");
    lint_text("c.yaml", &text, &mut report).expect("lints");
    assert_eq!(report.problems.len(), 1);
    assert!(
        report.problems[0].starts_with(
            "c.yaml: demo/weather: spec.limits.maxSteps: invalid type: string \"ten\", \
                 expected an integer"
        ),
        "{:?}",
        report.problems
    );
}

const STRICT: &str = r#"
apiVersion: agentrt.dev/v1alpha1
kind: AgentPolicy
metadata: {name: strict, namespace: demo}
spec:
  sideEffects: {RemoteMutation: RequireApproval}
  limits: {maxSteps: 20}
"#;

fn documents(text: &str, policies: &str) -> Report {
    let mut documents = Documents::default();
    read_text("run.yaml", text, false, &mut documents).expect("reads");
    read_text("policy.yaml", policies, true, &mut documents).expect("reads");
    check(documents, "default")
}

#[test]
fn a_run_over_an_admin_ceiling_is_refused_naming_the_field_and_the_policy() {
    let run = RUN
        .replace("get weather!", "get_weather")
        .replace("objekt", "object")
        .replace("ftp://x/y", "http://x/y");
    // The defaults count: maxSteps is 50 when left out.
    let report = documents(&run, STRICT);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].contains("spec.limits.maxSteps 50 is over the ceiling 20"));
    let under = run.replace("  tools:\n", "  limits: {maxSteps: 20}\n  tools:\n");
    assert_eq!(documents(&under, STRICT).problems, Vec::<String>::new());
    let over = run.replace("  tools:\n", "  limits: {maxSteps: 80}\n  tools:\n");
    let report = documents(&over, STRICT);
    assert_eq!(
        report.problems,
        [
            "run.yaml: demo/weather: spec.limits.maxSteps 80 is over the ceiling 20 of \
              AgentPolicy demo/strict (spec.limits); set spec.limits.maxSteps to at most 20"
        ]
    );
    assert_eq!((report.runs, report.policies), (1, 1));
    // Another namespace's policy does not select the run; a runSelector decides too.
    let elsewhere = STRICT.replace("namespace: demo", "namespace: other");
    assert!(documents(&over, &elsewhere).problems.is_empty());
    let labelled = STRICT.replace(
        "  limits:",
        "  runSelector: {matchLabels: {risk: high}}\n  limits:",
    );
    assert!(documents(&over, &labelled).problems.is_empty());
    let risky = over.replace("namespace: demo}", "namespace: demo, labels: {risk: high}}");
    assert_eq!(documents(&risky, &labelled).problems.len(), 1);
    // A policy in the linted files applies as one given with --policy.
    let mut report = Report::default();
    lint_text("both.yaml", &format!("{over}---{STRICT}"), &mut report).expect("lints");
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
}

#[test]
fn a_cluster_policy_selects_namespaces_by_the_labels_of_a_namespace_among_the_files() {
    let run = RUN
        .replace("get weather!", "get_weather")
        .replace("objekt", "object")
        .replace("ftp://x/y", "http://x/y")
        .replace("  tools:\n", "  limits: {maxSteps: 80}\n  tools:\n");
    let cluster = r#"
apiVersion: agentrt.dev/v1alpha1
kind: ClusterAgentPolicy
metadata: {name: prod}
spec:
  namespaceSelector: {matchLabels: {env: prod}}
  limits: {maxSteps: 10}
"#;
    let report = documents(&run, cluster);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    assert!(report.notes[0].contains("the labels of namespace demo are not among the files"));
    let namespace =
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo, labels: {env: prod}}\n";
    let report = documents(&format!("{namespace}---{run}"), cluster);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(report.problems[0].contains("ceiling 10 of ClusterAgentPolicy prod"));
    assert!(report.notes.is_empty(), "{:?}", report.notes);
    // kubernetes.io/metadata.name is every namespace's own label.
    let by_name = cluster.replace("{env: prod}", "{kubernetes.io/metadata.name: demo}");
    assert_eq!(documents(&run, &by_name).problems.len(), 1);
}

#[test]
fn an_admin_policy_is_linted_naming_the_field() {
    let bad = r#"
apiVersion: agentrt.dev/v1alpha1
kind: AgentPolicy
metadata: {name: broken, namespace: demo}
spec:
  sideEffects: {RemoteMutations: Deny}
  rules:
  - {name: big, when: "args.amount <=> 100", outcome: Deny}
"#;
    let report = documents("", bad);
    assert_eq!(report.policies, 1);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(
        report.problems[0],
        "policy.yaml: AgentPolicy demo/broken: spec.sideEffects.RemoteMutations: unknown \
             side-effect class; use ReadOnly, LocalMutation, RemoteMutation or Destructive"
    );
    let report = documents("", &bad.replace("RemoteMutations", "RemoteMutation"));
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert!(
        report.problems[0]
            .starts_with("policy.yaml: AgentPolicy demo/broken: spec.rules[0].when: "),
        "{:?}",
        report.problems
    );
    let wrong = bad
        .replace("RemoteMutations: Deny", "RemoteMutation: Maybe")
        .replace("kind: AgentPolicy", "kind: ClusterAgentPolicy");
    let report = documents("", &wrong);
    assert!(
            report.problems[0]
                .starts_with("policy.yaml: ClusterAgentPolicy broken: spec.sideEffects.RemoteMutation: unknown variant `Maybe`"),
            "{:?}",
            report.problems
        );
    // An AgentRun in a --policy file is skipped with a note.
    let report = documents("", RUN);
    assert_eq!(report.runs, 0);
    assert!(report.notes[0].contains("is not an AgentPolicy or ClusterAgentPolicy"));
}

#[test]
fn a_field_no_agentrun_has_is_a_problem_as_kubectl_apply_refuses_it() {
    let mut report = Report::default();
    let text = RUN.replace("  tools:\n", "  limit: {maxSteps: 3}\n  tools:\n");
    lint_text("d.yaml", &text, &mut report).expect("lints");
    assert!(
        report.problems[0].starts_with("d.yaml: demo/weather: spec.limit: unknown field"),
        "{:?}",
        report.problems
    );
    // The other problems are still reported.
    assert_eq!(report.problems.len(), 4, "{:?}", report.problems);
}

#[test]
fn every_field_the_schema_refuses_is_a_problem_not_only_the_first() {
    let text = RUN
        .replace("name: weather,", "name: Weather_Run,")
        .replace(
            "decisions: [{kind: complete, result: {}}]",
            "decisions: [\"just a string\", 3, null]",
        )
        .replace(
            "  tools:\n",
            "  limits: {maxSteps: ten, maxModelCalls: many}\n  leaseDurationSeconds: long\n  tools:\n",
        )
        .replace("sideEffect: ReadOnly", "sideEffect: Harmless");
    let mut report = Report::default();
    lint_text("d.yaml", &text, &mut report).expect("lints");
    let problems = report.problems.join("\n");
    for field in [
        "metadata.name: \"Weather_Run\" is not a valid name",
        "spec.limits.maxSteps: ",
        "spec.limits.maxModelCalls: ",
        "spec.leaseDurationSeconds: ",
        "spec.tools[0].sideEffect: ",
        "spec.agent.scripted.decisions[0]: ",
        "spec.agent.scripted.decisions[1]: ",
        "spec.agent.scripted.decisions[2]: ",
    ] {
        assert!(
            problems.contains(&format!("d.yaml: demo/Weather_Run: {field}")),
            "{field} is not said:\n{problems}"
        );
    }
    // A spec whose only fault is its decisions' types decodes, and is still refused.
    let text = RUN.replace(
        "decisions: [{kind: complete, result: {}}]",
        "decisions: [\"just a string\"]",
    );
    let mut report = Report::default();
    lint_text("e.yaml", &text, &mut report).expect("lints");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.starts_with("e.yaml: demo/weather: spec.agent.scripted.decisions[0]: ")),
        "{:?}",
        report.problems
    );
}
