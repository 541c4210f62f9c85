//! Policies the admins own, end to end (issue 34 item 3, docs/design.md section 6 "Admin
//! policies", docs/behaviours.md 98-102): an `AgentPolicy` requiring approval for
//! `RemoteMutation` pauses a run whose own policy allows it, on an Approval naming the
//! AgentPolicy, before the tool server sees any call; a `ClusterAgentPolicy` selecting
//! namespaces by label denies a tool, naming itself; an edit of the admin policy applies at the
//! next decision; a run over a ceiling is refused at apply (the webhook) and by `agentrt lint`
//! in the same words; admin policies that cannot be read pause every call (fail closed).
//!
//! Each runs on the embedded server and on kube-apiserver. The webhook's refusal by
//! kube-apiserver itself needs the real one (the embedded server's in-process webhook is held
//! to the same words in the same test); the fail-closed case makes the policies unreadable by
//! RBAC on the real one and by deleting the AgentPolicy CRD on the embedded one (it has no
//! RBAC, and the real one is shared by the tests running at the same time).

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::{agentrt, table_row, text};
use support::cluster::{wait_until, Options, TestCluster};
use support::controller::*;
use support::toolserver::{Behaviour, ToolServer};

/// `tests/fixtures/admin_policy/{name}.yaml` with its `${VAR}`s filled in from `vars`.
fn manifest(name: &str, vars: &[(&str, &str)]) -> String {
    vars.iter()
        .fold(
            RunFixture::at(&format!("admin_policy/{name}.yaml")),
            |f, (k, v)| f.set(k, v),
        )
        .yaml()
}

/// `kubectl apply -f -` of `yaml` in the test's namespace; panics with kubectl's words.
fn apply(cluster: &TestCluster, yaml: &str) {
    let out = cluster.apply(yaml);
    assert!(out.status.success(), "kubectl apply: {}", text(&out));
}

/// Deletes a cluster-scoped object when the test ends, however it ends.
struct ClusterScoped<'a> {
    cluster: &'a TestCluster,
    kind: &'static str,
    name: String,
}

impl Drop for ClusterScoped<'_> {
    fn drop(&mut self) {
        let _ = self
            .cluster
            .kubectl(&["delete", self.kind, &self.name, "--ignore-not-found"]);
    }
}

/// issue 34 item 3, the reproduction: `spec.policy.sideEffects: {RemoteMutation: Allow}` under
/// an AgentPolicy requiring approval pauses on an Approval whose presentation names the
/// AgentPolicy; nothing reaches the tool before a person approves; `agentrt show` says which
/// policy decided the step and required the Approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_allowing_remote_mutation_waits_for_a_person_under_an_agent_policy() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    apply(&cluster, &manifest("strict", &[]));
    let generation = cluster.kubectl_ok(&[
        "get",
        "agentpolicy",
        "strict",
        "-o",
        "jsonpath={.metadata.generation}",
    ]);
    // kubectl get apol: the RemoteMutation outcome and the maxSteps ceiling.
    let listed = cluster.kubectl_ok(&["get", "apol"]);
    let row = table_row(&listed, 1);
    assert_eq!(
        row.get(..3),
        Some(&["strict", "RequireApproval", "20"][..]),
        "{listed}"
    );
    let controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("c"));
    let run = manifest("own-allow", &[("NAME", "weekly"), ("TOOLS", &tools.base())]).replace(
        "  leaseDurationSeconds:",
        "  limits: {maxSteps: 20}\n  leaseDurationSeconds:",
    );
    let approval = cluster
        .run_awaiting_approval(&run, "weekly", "policy")
        .await;
    let shown = &approval.data["spec"]["presentation"]["policy"];
    assert_eq!(shown["kind"], "AgentPolicy", "{shown}");
    assert_eq!(shown["namespace"], ns.as_str(), "{shown}");
    assert_eq!(shown["name"], "strict", "{shown}");
    assert!(
        tools.calls().is_empty(),
        "the tool ran before approval: {:?}",
        tools.calls()
    );
    let waiting = cluster.run_status("weekly").await;
    let source = &waiting["steps"][0]["policy"]["source"];
    assert_eq!(
        waiting["steps"][0]["policy"]["decision"],
        "require_approval"
    );
    assert_eq!(source["kind"], "AgentPolicy", "{waiting}");
    assert_eq!(source["name"], "strict", "{waiting}");
    assert_eq!(
        source["generation"].to_string(),
        generation.trim(),
        "{waiting}"
    );
    let out = agentrt(&cluster, &["show", "run", "weekly"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(&format!(
            "policy: require_approval by AgentPolicy {ns}/strict, its sideEffects outcome \
             (generation {})",
            generation.trim()
        )),
        "{said}"
    );
    let name = approval.metadata.name.clone().expect("name");
    let out = agentrt(&cluster, &["show", "approval", &name]);
    let said = text(&out);
    assert!(
        said.contains(&format!(
            "Required by:  AgentPolicy {ns}/strict, its sideEffects outcome (an admin policy)"
        )),
        "{said}"
    );
    cluster.decide(&approval, "Approved").await;
    cluster
        .wait_phase("weekly", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(tools.calls().len(), 1, "{}", controller.log());
}

/// A ClusterAgentPolicy selecting the namespace by a label denies the tool: the step fails
/// `policy_denied` naming the ClusterAgentPolicy (the agent reads it), the tool is never called,
/// and the scripted run goes on to complete as the design says of a denied call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_agent_policy_selecting_the_namespace_by_label_denies_a_tool() {
    let cluster = agentrt_cluster().await;
    let (client, ns) = (cluster.client(), cluster.namespace().to_string());
    let tools = ToolServer::start().await;
    cluster.kubectl_ok(&[
        "label",
        "namespace",
        &ns,
        &format!("agentrt.dev/test-tenant={ns}"),
    ]);
    let policy = format!("no-email-{ns}");
    apply(
        &cluster,
        &manifest("no-email", &[("NAME", &policy), ("TENANT", &ns)]),
    );
    let _guard = ClusterScoped {
        cluster: &cluster,
        kind: "clusteragentpolicy",
        name: policy.clone(),
    };
    let _controller = start_controller(&cluster, "c");
    let run = manifest("own-allow", &[("NAME", "weekly"), ("TOOLS", &tools.base())]);
    cluster.create_run(&run).await;
    let done = cluster
        .wait_phase("weekly", "Completed", Duration::from_secs(60))
        .await;
    let step = &done["steps"][0];
    assert_eq!(step["status"], "failed", "{done}");
    assert_eq!(step["policy"]["decision"], "deny", "{done}");
    assert_eq!(step["policy"]["rule"], "no-email", "{done}");
    assert_eq!(
        step["policy"]["source"]["kind"], "ClusterAgentPolicy",
        "{done}"
    );
    assert_eq!(step["policy"]["source"]["name"], policy.as_str(), "{done}");
    assert_eq!(step["policy"]["source"]["ruleIndex"], 0, "{done}");
    assert_eq!(step["observation"]["kind"], "policy_denied", "{done}");
    assert_eq!(
        step["observation"]["summary"],
        format!(
            "the admin policy ClusterAgentPolicy {policy} denied this call: this tenant may not \
             send email"
        )
        .as_str()
    );
    assert!(tools.calls().is_empty(), "{:?}", tools.calls());
    // Another namespace, without the label, is not selected: the same run sends.
    let other = format!("{ns}-other");
    create_namespace(&client, &other).await;
    let _other_controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &other, ControllerSpec::named("o"));
    create_run(&client, &other, &run).await;
    let sent = wait_phase(
        &client,
        &other,
        "weekly",
        "Completed",
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(sent["steps"][0]["status"], "done", "{sent}");
    assert_eq!(tools.calls().len(), 1);
    let _ = cluster.kubectl(&["delete", "namespace", &other, "--wait=false"]);
}

/// Changing the admin policy applies at the next decision: the AgentPolicy is edited while the
/// run's first (slow, allowed) call runs; the second call pauses on an Approval, and the steps
/// record the two generations that decided them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_the_admin_policy_applies_at_the_next_decision() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    tools.set("lookup", Behaviour::sleeping(5_000));
    let lenient = manifest("strict", &[]).replace(
        "sideEffects: {RemoteMutation: RequireApproval}",
        "sideEffects: {ReadOnly: Allow}",
    );
    apply(&cluster, &lenient);
    let controller =
        ControllerProcess::spawn(cluster.kubeconfig(), &ns, ControllerSpec::named("c"));
    let run = manifest(
        "lookup-then-send",
        &[("NAME", "two"), ("TOOLS", &tools.base())],
    )
    .replace(
        "  leaseDurationSeconds:",
        "  limits: {maxSteps: 20}\n  leaseDurationSeconds:",
    );
    cluster.create_run(&run).await;
    wait_until(Duration::from_secs(60), "the lookup is called", || {
        !tools.calls().is_empty()
    })
    .await;
    apply(&cluster, &manifest("strict", &[]));
    let approval = cluster
        .wait_approval("two", "policy", Duration::from_secs(60))
        .await;
    assert_eq!(approval.data["spec"]["request"]["tool"]["name"], "send");
    assert_eq!(
        approval.data["spec"]["presentation"]["policy"]["name"],
        "strict"
    );
    let waiting = cluster.run_status("two").await;
    let generation = |i: usize| waiting["steps"][i]["policy"]["source"]["generation"].as_i64();
    assert_eq!(waiting["steps"][0]["status"], "done", "{waiting}");
    assert_eq!(
        waiting["steps"][0]["policy"]["decision"], "allow",
        "{waiting}"
    );
    let (first, second) = (generation(0), generation(1));
    assert!(
        first.is_some() && second.is_some() && second > first,
        "the edit is a new generation: {waiting}"
    );
    let calls: Vec<String> = tools.calls().iter().map(|c| c.tool.clone()).collect();
    assert_eq!(
        calls.len(),
        1,
        "only the lookup ran: {calls:?}\n{}",
        controller.log()
    );
}

/// A run over an admin ceiling is refused at apply, naming the field and the AgentPolicy:
/// by kube-apiserver calling the controller's webhook (real server), and in the very same words
/// by `agentrt dev`'s in-process webhook and by `agentrt lint --policy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_an_admin_ceiling_is_refused_at_apply_and_by_lint_naming_the_ceiling() {
    let tools = "http://127.0.0.1:1";
    let run = manifest("own-allow", &[("NAME", "big"), ("TOOLS", tools)]).replace(
        "  leaseDurationSeconds:",
        "  limits: {maxSteps: 80}\n  leaseDurationSeconds:",
    );
    let sentence = |ns: &str| {
        format!(
            "AgentRun {ns}/big: spec.limits.maxSteps 80 is over the ceiling 20 of AgentPolicy \
             {ns}/strict (spec.limits); set spec.limits.maxSteps to at most 20"
        )
    };
    // agentrt dev's in-process webhook (the embedded server, whatever the suite runs on).
    std::env::set_var("AGENTRT_DEV_NO_CONTROLLER", "1");
    let embedded = TestCluster::start_with(Options {
        crds_dir: Some(Path::new(env!("CARGO_MANIFEST_DIR")).join("crds")),
        embedded_only: true,
        webhook: true,
        ..Options::default()
    })
    .await;
    apply(&embedded, &manifest("strict", &[]));
    let said = refused_within(&embedded, &run).await;
    assert!(
        said.contains(&format!(
            "admission webhook \"agentruns.agentrt.dev\" denied the request: {}",
            sentence(embedded.namespace())
        )),
        "{said}"
    );
    // Under the ceiling it is admitted.
    let under = run.replace("maxSteps: 80", "maxSteps: 20");
    apply(&embedded, &under);
    // agentrt lint, offline, in the same words.
    let dir = tempfile::tempdir().expect("tempdir");
    let (run_file, policy_file) = (dir.path().join("run.yaml"), dir.path().join("policy.yaml"));
    let in_demo = |yaml: &str| yaml.replacen("metadata:\n", "metadata:\n  namespace: demo\n", 1);
    std::fs::write(&run_file, in_demo(&run)).expect("written");
    std::fs::write(&policy_file, in_demo(&manifest("strict", &[]))).expect("written");
    let out = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .arg("lint")
        .arg(&run_file)
        .arg("--policy")
        .arg(&policy_file)
        .output()
        .expect("agentrt runs");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "{}: {}\n",
            run_file.display(),
            sentence("demo").trim_start_matches("AgentRun ")
        )
    );
    // --policies-from-cluster: the same sentence from the policies the cluster holds.
    let from_cluster = |cluster: &TestCluster| {
        let file = dir.path().join("run-here.yaml");
        std::fs::write(&file, &run).expect("written");
        let out = agentrt(
            cluster,
            &[
                "lint",
                "-f",
                &file.display().to_string(),
                "--policies-from-cluster",
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let ns = cluster.namespace();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "{}: {}\n",
                file.display(),
                sentence(ns).trim_start_matches("AgentRun ")
            )
        );
    };
    from_cluster(&embedded);
    let help = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["lint", "--help"])
        .output()
        .expect("agentrt runs");
    let help = text(&help);
    assert!(
        help.contains("--policy <FILE>") && help.contains("ceiling"),
        "{help}"
    );

    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        eprintln!(
            "a_run_over_an_admin_ceiling_is_refused_at_apply_and_by_lint_naming_the_ceiling: the \
             kube-apiserver half not run on the embedded server (only kube-apiserver calls \
             admission webhooks); scripts/test runs it on the real control plane"
        );
        return;
    }
    let ns = cluster.namespace().to_string();
    apply(&cluster, &manifest("strict", &[]));
    let registered = support::webhook::register(&cluster, "webhook").await;
    let said = refused_within(&cluster, &run).await;
    assert!(
        said.contains(&format!(
            "admission webhook \"agentruns.agentrt.dev\" denied the request: {}",
            sentence(&ns)
        )),
        "{said}\n{}",
        registered.controller.log()
    );
    apply(&cluster, &under);
    from_cluster(&cluster);
}

/// Applies `run` until it is refused (a new policy, or a new webhook configuration, takes a
/// moment to be seen), for at most 30 s; returns what kubectl said.
async fn refused_within(cluster: &TestCluster, run: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], run);
        if !out.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "never refused: {}", text(&out));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let out = cluster.apply(run);
    assert!(!out.status.success(), "applied: {}", text(&out));
    text(&out)
}

/// Admin policies that cannot be read pause every call (fail closed): even a ReadOnly call the
/// run's own policy allows waits on an `admin_policy_unavailable` Approval, and nothing reaches
/// the tool. On kube-apiserver the controller runs as a ServiceAccount with the chart's rules
/// but no list/watch of agentpolicies (RBAC forbids the watch); on the embedded server, which
/// has no RBAC, the AgentPolicy CRD is deleted (the watch fails with 404).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_admin_policies_pause_every_call_on_an_approval() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let mut _guards = Vec::new();
    let kubeconfig = if cluster.is_embedded() {
        cluster.kubectl_ok(&["delete", "crd", "agentpolicies.agentrt.dev", "--wait=true"]);
        cluster.kubeconfig().to_path_buf()
    } else {
        apply(&cluster, &manifest("blind-controller", &[("NS", &ns)]));
        for kind in ["clusterrole", "clusterrolebinding"] {
            _guards.push(ClusterScoped {
                cluster: &cluster,
                kind,
                name: format!("{ns}-blind"),
            });
        }
        let token = cluster.kubectl_ok(&["create", "token", "blind", "--duration=1h"]);
        kubeconfig_with_token(&cluster, token.trim())
    };
    let controller = ControllerProcess::spawn(&kubeconfig, &ns, ControllerSpec::named("c"));
    let run = manifest(
        "lookup-then-send",
        &[("NAME", "blind"), ("TOOLS", &tools.base())],
    );
    let approval = cluster
        .run_awaiting_approval(&run, "blind", "admin_policy_unavailable")
        .await;
    assert_eq!(approval.data["spec"]["request"]["tool"]["name"], "lookup");
    let reason: &Value = &approval.data["spec"]["reason"];
    assert!(
        reason
            .as_str()
            .is_some_and(|r| r.contains("could not be read")),
        "{reason}"
    );
    assert!(tools.calls().is_empty(), "{:?}", tools.calls());
    assert!(
        controller.log().contains("admin policies unavailable"),
        "{}",
        controller.log()
    );
}

/// A kubeconfig for the cluster with `token` as its only credential.
fn kubeconfig_with_token(cluster: &TestCluster, token: &str) -> std::path::PathBuf {
    let admin = std::fs::read_to_string(cluster.kubeconfig()).expect("kubeconfig readable");
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).expect("kubeconfig YAML");
    let users = config["users"].as_sequence_mut().expect("kubeconfig users");
    for user in users.iter_mut() {
        let mut credentials = serde_yaml::Mapping::new();
        credentials.insert("token".into(), token.into());
        user["user"] = serde_yaml::Value::Mapping(credentials);
    }
    let path = cluster.dir().join("blind.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).expect("YAML")).expect("write");
    path
}
