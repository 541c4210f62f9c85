//! The Helm chart on a real API server (issue 10, item 3): every object the chart renders is
//! accepted by kube-apiserver (server-side dry run), a controller authenticated as the chart's
//! ServiceAccount (a token from `kubectl create token`) completes runs with zero `forbidden`
//! answers in both cluster-wide and per-namespace modes, and the optional
//! ValidatingAdmissionPolicies are enforced by the API server itself: the run's creator cannot
//! decide its Approval, a decision must name the user making it, and only the controller
//! creates Approvals and AgentRunSegments.
//!
//! These tests need what only a real API server has (RBAC, ServiceAccount tokens, apps and
//! admissionregistration APIs, ValidatingAdmissionPolicy): on the embedded `agentrt dev`, which
//! authenticates one all-powerful user, each prints one line saying so and checks nothing.
//! `scripts/test` runs them in its real-control-plane half.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::chart::{release, render, service_account_kubeconfig};
use support::cli::text;
use support::cluster::TestCluster;
use support::controller::*;
use support::helm::helm;
use support::toolserver::ToolServer;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A real cluster with the agentrt CRDs applied, or `None` (and one line saying why) on the
/// embedded server.
async fn real_cluster(test: &str) -> Option<TestCluster> {
    std::env::set_var("AGENTRT_DEV_NO_CONTROLLER", "1");
    let cluster = TestCluster::start().await;
    if cluster.is_embedded() {
        eprintln!(
            "{test}: not run on the embedded server (it has no RBAC, ServiceAccount tokens or \
             admission policies); scripts/test runs it on the real control plane"
        );
        return None;
    }
    cluster.apply_agentrt_crds();
    Some(cluster)
}

/// kubectl as the user of `kubeconfig`, in the test's namespace.
fn kubectl_as(cluster: &TestCluster, kubeconfig: &Path, args: &[&str], stdin: &str) -> Output {
    cluster.kubectl_as(kubeconfig, args, stdin)
}

/// The requests of `user` the API server answered 403, from the audit log named by
/// `AGENTRT_TEST_AUDIT_LOG` (scripts/test starts the control plane with AUDIT=1), with the
/// number of that user's requests seen; `None` when there is no audit log.
fn forbidden_in_audit_log(user: &str) -> Option<(Vec<String>, usize)> {
    let path = std::env::var("AGENTRT_TEST_AUDIT_LOG").ok()?;
    let log = std::fs::read_to_string(path).ok()?;
    let mut seen = 0;
    let mut forbidden = Vec::new();
    for line in log.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if event["user"]["username"] != user || event["stage"] != "ResponseComplete" {
            continue;
        }
        seen += 1;
        if event["responseStatus"]["code"] == 403 {
            forbidden.push(format!(
                "{} {}",
                event["verb"].as_str().unwrap_or_default(),
                event["requestURI"].as_str().unwrap_or_default()
            ));
        }
    }
    Some((forbidden, seen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_the_chart_renders_is_accepted_by_the_api_server() {
    let Some(cluster) =
        real_cluster("every_object_the_chart_renders_is_accepted_by_the_api_server").await
    else {
        return;
    };
    let ns = cluster.namespace().to_string();
    let modes: Vec<Vec<String>> = vec![
        vec![],
        vec![format!("watchNamespaces={{{ns}}}")],
        vec![
            "admissionPolicies.enabled=true".into(),
            "admissionPolicies.fourEyes=true".into(),
        ],
        vec![
            format!("watchNamespaces={{{ns}}}"),
            "admissionPolicies.enabled=true".into(),
            "admissionPolicies.fourEyes=true".into(),
            "admissionPolicies.validationActions={Warn,Audit}".into(),
            "podDisruptionBudget.enabled=false".into(),
            "metrics.service.enabled=false".into(),
        ],
    ];
    for sets in modes {
        let yaml = render(&release(), &ns, &sets, &["--include-crds"]);
        let out = cluster.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &yaml);
        assert!(
            out.status.success(),
            "the API server refused the chart rendered with {sets:?}:\n{}",
            text(&out)
        );
        let applied = String::from_utf8_lossy(&out.stdout);
        for kind in ["customresourcedefinition", "serviceaccount", "deployment"] {
            assert!(
                applied.contains(kind),
                "no {kind} in the dry run of {sets:?}:\n{applied}"
            );
        }
        assert!(
            applied.contains("validatingwebhookconfiguration"),
            "no webhook configuration (webhook.enabled defaults to true) in {sets:?}:\n{applied}"
        );
        if sets.iter().any(|s| s == "admissionPolicies.enabled=true") {
            assert!(
                applied.contains("validatingadmissionpolicybinding"),
                "no admission policy bindings in {sets:?}:\n{applied}"
            );
        }
    }
}

/// `helm` against the test cluster (its kubeconfig), in the test's namespace.
fn helm_on(cluster: &TestCluster, args: &[&str]) -> Output {
    Command::new(helm())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["--namespace", cluster.namespace()])
        .args(args)
        .current_dir(root())
        .output()
        .expect("helm runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_and_uninstall_of_the_chart_succeed() {
    let Some(cluster) = real_cluster("helm_install_and_uninstall_of_the_chart_succeed").await
    else {
        return;
    };
    let release = release();
    let ns = cluster.namespace().to_string();
    // With the admission policies (bound to this namespace only, so other tests sharing the
    // cluster are not subject to them) and no user ClusterRoles (their names are fixed).
    let watch = format!("watchNamespaces={{{ns}}}");
    let install = helm_on(
        &cluster,
        &[
            "install",
            &release,
            "charts/agentrt",
            "--set",
            &watch,
            "--set",
            "userRoles.create=false",
            "--set",
            "admissionPolicies.enabled=true",
        ],
    );
    assert!(
        install.status.success(),
        "helm install failed on the real API server: {}",
        text(&install)
    );
    let status = helm_on(&cluster, &["status", &release, "-o", "json"]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("helm status JSON");
    assert_eq!(status["info"]["status"], "deployed", "{status}");
    let deployed = cluster.kubectl_ok(&[
        "get",
        "deployment,serviceaccount,role,rolebinding",
        "-o",
        "name",
    ]);
    for object in [
        format!("deployment.apps/{release}"),
        format!("serviceaccount/{release}"),
        format!("role.rbac.authorization.k8s.io/{release}-controller"),
    ] {
        assert!(deployed.contains(&object), "{object} not in:\n{deployed}");
    }
    // The webhook's certificate: generated into a Secret, its CA the configuration's caBundle,
    // and kept by an upgrade (lookup), so the caBundle never goes stale.
    let webhook = format!("{release}-agentruns");
    let ca_bundle = || {
        cluster.kubectl_ok(&[
            "get",
            "validatingwebhookconfiguration",
            &webhook,
            "-o",
            "jsonpath={.webhooks[0].clientConfig.caBundle}",
        ])
    };
    let secret_ca = || {
        cluster.kubectl_ok(&[
            "get",
            "secret",
            &format!("{release}-webhook-tls"),
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ])
    };
    let before = ca_bundle();
    assert!(!before.is_empty(), "no caBundle");
    assert_eq!(before, secret_ca());
    let selector = cluster.kubectl_ok(&[
        "get",
        "validatingwebhookconfiguration",
        &webhook,
        "-o",
        "jsonpath={.webhooks[0].namespaceSelector.matchExpressions[0].values}",
    ]);
    assert!(selector.contains(&ns), "{selector}");
    let upgrade = helm_on(
        &cluster,
        &[
            "upgrade",
            &release,
            "charts/agentrt",
            "--set",
            &watch,
            "--set",
            "userRoles.create=false",
            "--set",
            "admissionPolicies.enabled=true",
        ],
    );
    assert!(upgrade.status.success(), "helm upgrade: {}", text(&upgrade));
    assert_eq!(
        ca_bundle(),
        before,
        "an upgrade keeps the webhook's certificate"
    );
    let uninstall = helm_on(&cluster, &["uninstall", &release, "--wait"]);
    assert!(
        uninstall.status.success(),
        "helm uninstall: {}",
        text(&uninstall)
    );
    let webhooks = cluster.kubectl_ok(&["get", "validatingwebhookconfigurations", "-o", "name"]);
    assert!(
        !webhooks.contains(&release),
        "the release's webhook configuration outlives it: {webhooks}"
    );
    let policies = cluster.kubectl_ok(&["get", "validatingadmissionpolicies", "-o", "name"]);
    assert!(
        !policies.contains(&release),
        "the release's admission policies outlive it: {policies}"
    );
}

/// Installs the chart's ServiceAccount and RBAC (release `release`, in the test namespace, with
/// `sets`), starts a controller authenticated as that ServiceAccount, and drives the RBAC
/// fixture's runs to their ends: one reads with a Secret header, one is approved, one is
/// cancelled. Asserts the controller saw no `forbidden` answer.
async fn runs_complete_as_the_charts_service_account(cluster: &TestCluster, sets: &[String]) {
    let ns = cluster.namespace().to_string();
    let release = release();
    let mut sets = sets.to_vec();
    sets.push("userRoles.create=false".into());
    let rbac = render(
        &release,
        &ns,
        &sets,
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
    );
    cluster.apply(&rbac);
    let user = format!("system:serviceaccount:{ns}:{release}");
    let kubeconfig = service_account_kubeconfig(cluster, &release);
    for (verb, resource, subresource) in [
        ("watch", "agentruns.agentrt.dev", ""),
        ("update", "agentruns.agentrt.dev", "status"),
        ("create", "approvals.agentrt.dev", ""),
        ("patch", "approvals.agentrt.dev", "status"),
        ("create", "agentrunsegments.agentrt.dev", ""),
        ("get", "agentrunsegments.agentrt.dev", ""),
        ("update", "leases.coordination.k8s.io", ""),
        ("delete", "leases.coordination.k8s.io", ""),
        ("create", "events.events.k8s.io", ""),
        ("get", "secrets", ""),
    ] {
        let subresource = format!("--subresource={subresource}");
        let mut args = vec!["auth", "can-i", verb, resource];
        if subresource != "--subresource=" {
            args.push(&subresource);
        }
        let out = kubectl_as(cluster, &kubeconfig, &args, "");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "yes",
            "{user} may not {verb} {resource} {subresource}: {}",
            text(&out)
        );
    }
    let cluster_wide = kubectl_as(
        cluster,
        &kubeconfig,
        &[
            "auth",
            "can-i",
            "list",
            "agentruns.agentrt.dev",
            "--all-namespaces",
        ],
        "",
    );
    let per_namespace = sets.iter().any(|s| s.starts_with("watchNamespaces="));
    assert_eq!(
        String::from_utf8_lossy(&cluster_wide.stdout).trim(),
        if per_namespace { "no" } else { "yes" },
        "listing runs in every namespace as {user} (per-namespace mode: {per_namespace})"
    );

    let tools = ToolServer::start().await;
    let manifests = RunFixture::at("rbac/runs.yaml")
        .set("TOOLS", tools.base())
        .yaml();
    // The controller watches only the test's namespace even with the ClusterRole, so that it
    // never picks up the runs of other tests sharing this cluster; the ClusterRole's cluster-wide
    // reach is checked above with `auth can-i --all-namespaces`.
    let mut controller = ControllerProcess::spawn(
        &kubeconfig,
        &ns,
        ControllerSpec::named("chart-sa").sealing(),
    );
    drive_rbac_runs(cluster, &manifests).await;
    assert_eq!(calls_of(&tools, "issue_refund"), 1);
    controller.signal(libc::SIGTERM);
    assert!(
        controller.wait_exit(Duration::from_secs(30)).is_some(),
        "the controller stops on SIGTERM"
    );
    let log = controller.log().to_lowercase();
    assert!(
        !log.contains("forbidden"),
        "the controller running as {user} was refused something:\n{}",
        controller.log()
    );
    if let Some((forbidden, seen)) = forbidden_in_audit_log(&user) {
        assert!(seen > 0, "the audit log has no request of {user}");
        assert!(
            forbidden.is_empty(),
            "the API server answered {user} 403 to: {forbidden:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_complete_as_the_charts_service_account_cluster_wide() {
    let Some(cluster) =
        real_cluster("runs_complete_as_the_charts_service_account_cluster_wide").await
    else {
        return;
    };
    runs_complete_as_the_charts_service_account(&cluster, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_complete_as_the_charts_service_account_per_namespace() {
    let Some(cluster) =
        real_cluster("runs_complete_as_the_charts_service_account_per_namespace").await
    else {
        return;
    };
    let ns = cluster.namespace().to_string();
    runs_complete_as_the_charts_service_account(&cluster, &[format!("watchNamespaces={{{ns}}}")])
        .await;
}

/// How many calls `tool` got.
fn calls_of(tools: &ToolServer, tool: &str) -> usize {
    tools.calls().iter().filter(|c| c.tool == tool).count()
}

/// The kubectl arguments that patch `approval`'s decision.
fn decision_patch(approval: &str, hash: &str, approver: &str) -> Vec<String> {
    let patch = serde_json::json!({"spec": {"decision": {
        "verdict": "Approved", "hash": hash, "approver": approver
    }}});
    ["patch", "approval", approval, "--type", "merge", "-p"]
        .iter()
        .map(|s| s.to_string())
        .chain([patch.to_string()])
        .collect()
}

/// Patches `approval`'s decision as the user of `kubeconfig`.
fn decide_as(
    cluster: &TestCluster,
    kubeconfig: &Path,
    approval: &str,
    hash: &str,
    approver: &str,
) -> Output {
    let args = decision_patch(approval, hash, approver);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kubectl_as(cluster, kubeconfig, &args, "")
}

/// Runs `args` as the user of `kubeconfig` (`None`: the cluster's admin) once the admission
/// policy that should refuse it is in force, and returns that run's output.
///
/// kube-apiserver loads each ValidatingAdmissionPolicy and its binding on its own, moments after
/// they are created, so one policy in force says nothing of another. Admission runs on
/// `--dry-run=server` requests too, so those probe (for up to 60 s) without changing anything;
/// the request itself is sent once a probe is refused.
async fn once_refused_by_dry_run(
    cluster: &TestCluster,
    kubeconfig: Option<&Path>,
    args: &[&str],
    stdin: &str,
) -> Output {
    let send = |args: &[&str]| match kubeconfig {
        Some(kubeconfig) => kubectl_as(cluster, kubeconfig, args, stdin),
        None => cluster.kubectl_stdin(args, stdin),
    };
    let mut probe = args.to_vec();
    probe.push("--dry-run=server");
    let deadline = Instant::now() + Duration::from_secs(60);
    while send(&probe).status.success() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    send(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_policies_refuse_a_decision_by_the_runs_creator() {
    let Some(cluster) =
        real_cluster("admission_policies_refuse_a_decision_by_the_runs_creator").await
    else {
        return;
    };
    let ns = cluster.namespace().to_string();
    let release = release();
    // Per-namespace mode: the policies' bindings hold only in this namespace, so the other tests
    // sharing the cluster are not subject to them.
    let sets = vec![
        format!("watchNamespaces={{{ns}}}"),
        "userRoles.create=false".to_string(),
        "admissionPolicies.enabled=true".to_string(),
        "admissionPolicies.fourEyes=true".to_string(),
    ];
    let objects = render(
        &release,
        &ns,
        &sets,
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
            "--show-only",
            "templates/admission.yaml",
        ],
    );
    cluster.apply(&objects);
    let users =
        std::fs::read_to_string(support::fixtures::path("rbac/users.yaml")).expect("fixture");
    cluster.apply(&users);
    let alice = service_account_kubeconfig(&cluster, "alice");
    let bob = service_account_kubeconfig(&cluster, "bob");
    let alice_name = format!("system:serviceaccount:{ns}:alice");
    let bob_name = format!("system:serviceaccount:{ns}:bob");
    let tools = ToolServer::start().await;
    let run = |creator: &str| {
        RunFixture::at("rbac/four-eyes-run.yaml")
            .set("TOOLS", tools.base())
            .set("CREATOR", creator)
            .yaml()
    };

    let out = once_refused_by_dry_run(
        &cluster,
        Some(&alice),
        &["create", "-f", "-"],
        &run(&bob_name),
    )
    .await;
    let message = text(&out);
    assert!(
        !out.status.success()
            && message.contains("agentrt.dev/created-by")
            && message.contains("must be set to the creating user"),
        "a run claiming another creator is refused for that reason: {message}"
    );
    let out = kubectl_as(&cluster, &alice, &["create", "-f", "-"], &run(&alice_name));
    assert!(
        out.status.success(),
        "alice creates her run: {}",
        text(&out)
    );

    let controller_kubeconfig = service_account_kubeconfig(&cluster, &release);
    let _controller = ControllerProcess::spawn(
        &controller_kubeconfig,
        &ns,
        ControllerSpec::named("four-eyes"),
    );
    let client = cluster.client();
    let approval = wait_approval(&client, &ns, "refund", "policy", Duration::from_secs(60)).await;
    let name = approval.metadata.name.clone().expect("name");
    let hash = approval.data["spec"]["hash"]
        .as_str()
        .expect("hash")
        .to_string();
    let annotations = approval.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("agentrt.dev/run-created-by"),
        Some(&alice_name),
        "the controller copies the run's creator onto its Approval"
    );

    let creator_decides = decision_patch(&name, &hash, &alice_name);
    let creator_decides: Vec<&str> = creator_decides.iter().map(String::as_str).collect();
    let by_creator = once_refused_by_dry_run(&cluster, Some(&alice), &creator_decides, "").await;
    assert!(
        !by_creator.status.success(),
        "the creator decided her own approval"
    );
    assert!(
        text(&by_creator).contains("may not decide its approvals (four eyes)"),
        "refused for four eyes: {}",
        text(&by_creator)
    );
    let as_someone_else = once_refused_by_dry_run(&cluster, Some(&bob), &creator_decides, "").await;
    assert!(
        !as_someone_else.status.success(),
        "bob decided in alice's name"
    );
    assert!(
        text(&as_someone_else).contains("spec.decision.approver must be the user deciding"),
        "refused for the approver's name: {}",
        text(&as_someone_else)
    );
    let mut forged = approval.clone();
    forged.metadata = kube::api::ObjectMeta {
        name: Some(format!("{name}-forged")),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let forged_yaml = serde_json::to_string(&forged).expect("JSON");
    let by_admin =
        once_refused_by_dry_run(&cluster, None, &["create", "-f", "-"], &forged_yaml).await;
    assert!(
        !by_admin.status.success(),
        "a user other than the controller created an Approval"
    );
    assert!(
        text(&by_admin).contains("only the agentrt controller"),
        "refused as not the controller: {}",
        text(&by_admin)
    );
    let segment = std::fs::read_to_string(support::fixtures::path("archive/segment.yaml"))
        .expect("segment fixture");
    let segment_by_admin =
        once_refused_by_dry_run(&cluster, None, &["create", "-f", "-"], &segment).await;
    assert!(
        !segment_by_admin.status.success()
            && text(&segment_by_admin).contains("only the agentrt controller"),
        "a user other than the controller created an AgentRunSegment: {}",
        text(&segment_by_admin)
    );
    assert_eq!(
        status(&client, &ns, "refund").await["phase"],
        "WaitingForApproval"
    );
    assert!(
        tools.calls().is_empty(),
        "nothing ran before a valid decision"
    );

    let by_bob = decide_as(&cluster, &bob, &name, &hash, &bob_name);
    assert!(by_bob.status.success(), "bob decides: {}", text(&by_bob));
    let done = wait_phase(&client, &ns, "refund", "Completed", Duration::from_secs(60)).await;
    assert_eq!(calls_of(&tools, "issue_refund"), 1);
    let decided = events_of(&done, "approval.decided");
    assert_eq!(decided.len(), 1, "one decision recorded: {done}");
    assert!(
        decided[0].to_string().contains(&bob_name),
        "the recorded decision names bob: {}",
        decided[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_policies_hold_a_segments_labels_immutable() {
    let Some(cluster) = real_cluster("admission_policies_hold_a_segments_labels_immutable").await
    else {
        return;
    };
    let ns = cluster.namespace().to_string();
    let release = release();
    // The segment is created first: the policies let only the controller create one.
    let segment =
        std::fs::read_to_string(support::fixtures::path("archive/segment.yaml")).expect("fixture");
    let out = cluster.kubectl_stdin(&["create", "-f", "-"], &segment);
    assert!(out.status.success(), "{}", text(&out));
    let sets = vec![
        format!("watchNamespaces={{{ns}}}"),
        "userRoles.create=false".to_string(),
        "admissionPolicies.enabled=true".to_string(),
    ];
    let objects = render(
        &release,
        &ns,
        &sets,
        &["--show-only", "templates/admission.yaml"],
    );
    cluster.apply(&objects);
    let out = once_refused_by_dry_run(
        &cluster,
        None,
        &[
            "label",
            "--overwrite",
            "arseg",
            "refund-1042-0-0123456789",
            "agentrt.dev/run-uid=another",
        ],
        "",
    )
    .await;
    let message = text(&out);
    assert!(
        !out.status.success()
            && message.contains("metadata.labels of an AgentRunSegment are immutable"),
        "a segment's label cannot be changed: {message}"
    );
    let out = cluster.kubectl(&["label", "arseg", "refund-1042-0-0123456789", "extra=1"]);
    assert!(!out.status.success(), "nor a label added: {}", text(&out));
    cluster.kubectl_stdin(&["delete", "-f", "-"], &objects);
}
