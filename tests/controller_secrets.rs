//! Issue 34 item 2: creating an AgentRun gives no read access to the namespace's Secrets
//! (docs/design.md section 6, "Secrets"; docs/behaviours.md 87, 103).
//!
//! - On both servers: a run whose http tool header names a Secret its owner did not label
//!   `agentrt.dev/usable-by-runs: "true"` fails the call with an error naming the Secret and the
//!   label fix, and the tool server never receives the value; once labelled, the same Secret
//!   works (the tool receives it).
//! - On kube-apiserver only (the embedded server has no authorization): the webhook refuses a
//!   run created by a user who may create AgentRuns but not `get` the Secret it names, naming
//!   the field; a user who may get it is admitted and the run completes. The controller serving
//!   the webhook runs as the chart's ServiceAccount with the chart's RBAC.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::controller::*;
use support::toolserver::ToolServer;

const PASSWORD: &str = "db-admin-password-7f3a";

fn run(name: &str, tools: &ToolServer) -> String {
    RunFixture::new("secret-header", &tools.base(), name)
        .set("SECRET", "db-admin")
        .yaml()
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_without_its_owners_label_is_never_sent_and_works_once_labelled() {
    let cluster = agentrt_cluster().await;
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    create_secret_with(
        &client,
        json!({"name": "db-admin", "namespace": ns}),
        "password",
        PASSWORD,
    )
    .await;
    let controller = start_controller(&cluster, "secrets");

    cluster.create_run(&run("unconsented", &tools)).await;
    let status = cluster
        .wait_phase("unconsented", "Completed", Duration::from_secs(60))
        .await;
    let said = status.to_string();
    assert!(
        said.contains("header_unavailable")
            && said.contains(&format!("Secret {ns}/db-admin is not usable by runs"))
            && said.contains(&format!(
                "kubectl label secret db-admin -n {ns} agentrt.dev/usable-by-runs=true"
            )),
        "the call fails naming the Secret and the label fix: {said}\n{}",
        controller.log()
    );
    assert!(!said.contains(PASSWORD), "the record carries the value");
    assert!(
        tools
            .calls()
            .iter()
            .all(|call| !call.authorization.contains(PASSWORD)),
        "the tool server received the value"
    );
    assert!(
        tools.calls_of_run(&format!("{ns}/unconsented")).is_empty(),
        "the call was sent"
    );

    cluster.kubectl_ok(&[
        "label",
        "secret",
        "db-admin",
        "agentrt.dev/usable-by-runs=true",
    ]);
    cluster.create_run(&run("consented", &tools)).await;
    let status = cluster
        .wait_phase("consented", "Completed", Duration::from_secs(60))
        .await;
    assert!(
        !status.to_string().contains("header_unavailable"),
        "{status}"
    );
    let calls = tools.calls_of_run(&format!("{ns}/consented"));
    assert_eq!(calls.len(), 1, "{calls:?}\n{}", controller.log());
    assert_eq!(calls[0].authorization, PASSWORD);
    assert!(
        !controller.log().contains(PASSWORD),
        "a log line carries the value"
    );
}

/// The Roles of the webhook scenario: `author` may create runs; `reader` may too, and may get
/// Secret db-admin.
const USERS: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: run-author}
rules:
- apiGroups: ["agentrt.dev"]
  resources: ["agentruns"]
  verbs: ["create", "get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: db-reader}
rules:
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["db-admin"]
  verbs: ["get"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: run-authors}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: run-author}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: secrets-author}
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: secrets-reader}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: db-readers}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: db-reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: secrets-reader}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_a_run_naming_a_secret_its_creator_may_not_get() {
    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        eprintln!(
            "the_webhook_refuses_a_run_naming_a_secret_its_creator_may_not_get: not run on the \
             embedded server (it has no authorization and asks no SubjectAccessReview); \
             scripts/test runs it on the real control plane"
        );
        return;
    }
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    create_secret(&client, &ns, "db-admin", "password", PASSWORD).await;
    let out = cluster.kubectl_stdin(&["apply", "-f", "-"], USERS);
    assert!(out.status.success(), "{}", text(&out));
    // The controller serving the webhook runs with exactly the chart's RBAC (per-namespace
    // mode): its ServiceAccount may create the SubjectAccessReviews.
    let release = support::chart::release();
    let rbac = support::chart::render(
        &release,
        &ns,
        &[format!("watchNamespaces={{{ns}}}")],
        &[
            "--show-only",
            "templates/serviceaccount.yaml",
            "--show-only",
            "templates/rbac.yaml",
        ],
    );
    let out = cluster.kubectl_stdin(&["apply", "-f", "-"], &rbac);
    assert!(out.status.success(), "{}", text(&out));
    let _installed = support::chart::Installed {
        cluster: &cluster,
        yaml: rbac,
    };
    let controller_kubeconfig = support::chart::service_account_kubeconfig(&cluster, &release);
    let served = support::webhook::serve(&cluster, &controller_kubeconfig, "secrets-webhook");

    let as_author = ["--as=secrets-author", "create", "-f", "-"];
    let manifest = run("leak", &tools);
    // kube-apiserver loads a new webhook configuration on its own time.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut probe = as_author.to_vec();
    probe.push("--dry-run=server");
    while cluster.kubectl_stdin(&probe, &manifest).status.success() {
        assert!(
            Instant::now() < deadline,
            "the webhook never refused:\n{}",
            served.controller.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let out = cluster.kubectl_stdin(&as_author, &manifest);
    let said = text(&out);
    assert!(
        !out.status.success(),
        "the author's run was admitted: {said}"
    );
    assert!(
        said.contains(&format!(
            "Error from server (Forbidden): error when creating \"STDIN\": admission webhook \
             \"agentruns.agentrt.dev\" denied the request: AgentRun {ns}/leak: \
             spec.tools[0].http.headers[0].secretKeyRef.name: secrets-author may not get Secret \
             {ns}/db-admin"
        )) && said.contains("ask for get on that Secret or use one you can read"),
        "{said}"
    );

    let out = cluster.kubectl_stdin(
        &["--as=secrets-reader", "create", "-f", "-"],
        &run("allowed", &tools),
    );
    assert!(
        out.status.success(),
        "the reader's run was refused: {}",
        text(&out)
    );
    cluster
        .wait_phase("allowed", "Completed", Duration::from_secs(60))
        .await;
    let calls = tools.calls_of_run(&format!("{ns}/allowed"));
    assert_eq!(calls.len(), 1, "{calls:?}\n{}", served.controller.log());
    assert_eq!(calls[0].authorization, PASSWORD);
    assert!(
        tools.calls_of_run(&format!("{ns}/leak")).is_empty(),
        "the refused run was called"
    );
}
