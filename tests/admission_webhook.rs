//! The controller's validating admission webhook on a real kube-apiserver (issue 14,
//! docs/behaviours.md 1): with `--webhook-addr` and a certificate, registered by a
//! ValidatingWebhookConfiguration (its `clientConfig.url` on loopback and its caBundle), a
//! `kubectl apply` of an AgentRun with a tool name a model API refuses, a `when` that is not
//! CEL, an `inputSchema` that is not a JSON Schema or a tool URL that is not http(s) is refused
//! with kube-apiserver's `admission webhook "..." denied the request: ...` naming the field; a
//! good one is accepted.
//!
//! Only a real API server calls admission webhooks: on the embedded server that test prints
//! one line and checks nothing; `scripts/test` runs it on the real control plane. The second
//! test holds `agentrt dev`'s in-process admission to the same refusals and the same message
//! shape (400, `admission webhook "agentruns.agentrt.dev" denied the request: ...`).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::cli::text;
use support::cluster::{Options, TestCluster};

const GOOD: &str = r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {name: weather}
spec:
  goal: Say the weather.
  agent:
    scripted:
      decisions:
      - {kind: complete, result: {}}
  tools:
  - name: get_weather
    sideEffect: ReadOnly
    inputSchema: {type: object, properties: {city: {type: string}}}
    http: {url: "http://127.0.0.1:1/weather"}
  policy:
    rules:
    - {name: cheap, when: "has(args.city)", outcome: Allow}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_apply_of_a_run_with_problems_is_refused_by_the_webhook_naming_the_field() {
    std::env::set_var("AGENTRT_DEV_NO_CONTROLLER", "1");
    let cluster = TestCluster::start().await;
    if cluster.is_embedded() {
        eprintln!(
            "kubectl_apply_of_a_run_with_problems_is_refused_by_the_webhook_naming_the_field: \
             not run on the embedded server (only kube-apiserver calls admission webhooks); \
             scripts/test runs it on the real control plane"
        );
        return;
    }
    cluster.apply_agentrt_crds();
    let ns = cluster.namespace().to_string();
    let served = support::webhook::serve(&cluster, cluster.kubeconfig(), "webhook");
    let bad = bad_runs();
    // kube-apiserver loads a new webhook configuration on its own time: the first refusal may
    // take a moment.
    let (first, field) = &bad[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], first);
        if !out.status.success() {
            let said = text(&out);
            assert!(said.contains(field), "{said}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook never refused: {}\n{}",
            text(&out),
            served.controller.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The differential half: agentrt dev refuses each with the very same words.
    let embedded = embedded_with_its_webhook().await;
    for (manifest, field) in &bad {
        let out = cluster.apply(manifest);
        let said = text(&out);
        let there = text(&embedded.apply(manifest));
        assert_eq!(
            said.replace(&ns, "NS"),
            there.replace(embedded.namespace(), "NS"),
            "kube-apiserver and agentrt dev refuse {field} differently"
        );
        assert!(!out.status.success(), "applied: {said}");
        assert!(
            said.contains(&format!(
                "Error from server (BadRequest): error when creating \"STDIN\": admission \
                 webhook \"agentruns.agentrt.dev\" denied the request: AgentRun {ns}/weather: "
            )),
            "{said}"
        );
        assert!(said.contains(field), "{field} not in: {said}");
    }
    let out = cluster.apply(GOOD);
    assert!(
        out.status.success(),
        "the good run was refused: {}",
        text(&out)
    );
    let names = cluster.kubectl_ok(&["get", "agentruns", "-o", "name"]);
    assert_eq!(names.trim(), "agentrun.agentrt.dev/weather");
}

/// `agentrt dev` (even when `AGENTRT_TEST_KUBECONFIG` names a real cluster) with agentrt's
/// CRDs and its in-process admission webhook on.
async fn embedded_with_its_webhook() -> TestCluster {
    TestCluster::start_with(Options {
        crds_dir: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")),
        embedded_only: true,
        webhook: true,
        ..Options::default()
    })
    .await
}

/// Each bad run with the start of the problem the refusal must name.
fn bad_runs() -> Vec<(String, &'static str)> {
    vec![
        (
            GOOD.replace("name: get_weather", "name: get weather!"),
            "spec.tools[0].name: \"get weather!\" is not a valid function name",
        ),
        (
            GOOD.replace("has(args.city)", "args.amount <=> 100 &&"),
            "spec.policy.rules[0].when: ",
        ),
        (
            GOOD.replace("{type: object, properties", "{type: objekt, properties"),
            "spec.tools[0].inputSchema: is not a valid JSON Schema",
        ),
        (
            GOOD.replace("http://127.0.0.1:1/weather", "ftp://127.0.0.1/weather"),
            "spec.tools[0].http.url: ",
        ),
    ]
}

/// docs/design.md section 8: `agentrt dev` refuses the same runs at `kubectl apply`, with the
/// message kube-apiserver gives for a webhook's denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agentrt_dev_refuses_the_same_runs_at_kubectl_apply() {
    let cluster = embedded_with_its_webhook().await;
    for (manifest, field) in bad_runs() {
        for dry_run in [true, false] {
            let mut args = vec!["apply", "-f", "-"];
            if dry_run {
                args.push("--dry-run=server");
            }
            let out = cluster.kubectl_stdin(&args, &manifest);
            let said = text(&out);
            assert!(!out.status.success(), "applied: {said}");
            assert!(
                said.contains(&format!(
                    "Error from server (BadRequest): error when creating \"STDIN\": admission \
                     webhook \"agentruns.agentrt.dev\" denied the request: AgentRun {}/weather: ",
                    cluster.namespace()
                )),
                "{said}"
            );
            assert!(said.contains(field), "{field} not in: {said}");
        }
    }
    let out = cluster.apply(GOOD);
    assert!(
        out.status.success(),
        "the good run was refused: {}",
        text(&out)
    );
    // An update is asked too: a policy edited into a `when` that is not CEL.
    let edited = GOOD.replace("has(args.city)", "args.city ==");
    let out = cluster.apply(&edited);
    let said = text(&out);
    assert!(!out.status.success(), "applied: {said}");
    assert!(said.contains("spec.policy.rules[0].when: "), "{said}");
}
