//! `agentrt console` in a headless chromium (issue 39, docs/design.md section 2 "Console"),
//! driven over WebDriver: the inbox lists a pending Approval (found by `data-approval`), its
//! page shows the args (and, for an `interrupted_side_effect` Approval, that the outcome is
//! unknown), a request changed after the page was loaded is refused by the API server and the
//! page says so, approving finishes the run, and a user without `patch approvals` sees the API
//! server's refusal (real kube-apiserver only: the embedded one does not authorize). Screenshots
//! of the inbox and an Approval page are kept under `target/console-screenshots/`.

mod support;

use std::time::Duration;

use support::cluster::TestCluster;
use support::console::{Browser, ConsoleProcess};
use support::controller::*;
use support::runs::name_of;
use support::toolserver::ToolServer;

fn approval_page(console: &ConsoleProcess, ns: &str, name: &str) -> String {
    format!("{}/approvals/{ns}/{name}", console.origin())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_decided_in_the_console_finishes_the_run_and_a_changed_one_is_refused() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let approval = cluster
        .run_awaiting_approval(
            &fixture("needs-approval", &tools.base(), "ask"),
            "ask",
            "policy",
        )
        .await;
    let name = name_of(&approval);
    let key = format!("{ns}/{name}");
    let console = ConsoleProcess::start(&cluster);
    let browser = Browser::start().await;

    // The printed URL opens the inbox (the token exchanged for a cookie), which lists it.
    browser.goto(&console.url).await;
    let row = format!("tr[data-approval=\"{key}\"]");
    let text = browser.text(&row).await;
    assert!(
        text.contains("Pending") && text.contains("change"),
        "{text}"
    );
    assert!(text.contains("RemoteMutation"), "{text}");
    assert!(
        !browser.url().await.contains("token="),
        "the token left the URL"
    );
    let shot = browser.screenshot("inbox").await;
    eprintln!("screenshot: {}", shot.display());

    // Its page shows the exact request: the args as JSON and the hash.
    browser.click(&format!("{row} a[data-link=detail]")).await;
    let args = browser.text("#args").await;
    assert!(args.contains("\"item\": 1"), "{args}");
    let hash = approval.data["spec"]["hash"].as_str().expect("hash");
    assert_eq!(browser.text("#hash").await, hash);
    assert!(browser.text("#timeline").await.contains("AgentRun"));
    let shot = browser.screenshot("approval").await;
    eprintln!("screenshot: {}", shot.display());

    // The Approval changes after the page was loaded: the API server refuses the decision.
    cluster.kubectl_ok(&["annotate", "approval", &name, "touched=after-the-page"]);
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome]").await;
    assert!(
        outcome.contains("refused by the API server") && outcome.contains("changed"),
        "{outcome}"
    );
    let now = approvals_api(&cluster.client(), &ns)
        .get(&name)
        .await
        .expect("get");
    assert!(
        now.data["spec"]["decision"].is_null(),
        "nothing was decided"
    );
    browser.screenshot("refused").await;

    // Loaded again, it is approved with a reason, and the run finishes.
    browser.goto(&approval_page(&console, &ns, &name)).await;
    browser
        .type_into("textarea[name=note]", "looks right")
        .await;
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome=decided]").await;
    assert!(outcome.contains("approved"), "{outcome}");
    let done = cluster
        .wait_phase("ask", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(events_of(&done, "approval.decided").len(), 1);
    let decided = approvals_api(&cluster.client(), &ns)
        .get(&name)
        .await
        .expect("get");
    assert_eq!(decided.data["spec"]["decision"]["hash"], hash);
    assert_eq!(decided.data["spec"]["decision"]["note"], "looks right");
    assert_eq!(tools.calls().len(), 1, "the tool ran once");
}

/// A hand-made `interrupted_side_effect` Approval as the controller words one (no controller:
/// only its page is under test).
fn interrupted(ns: &str) -> String {
    let yaml =
        std::fs::read_to_string(support::fixtures::path("api/approval.yaml")).expect("fixture");
    yaml.replace("  kind: policy", "  kind: interrupted_side_effect")
        .replace("{namespace: default,", &format!("{{namespace: {ns},"))
        .replace(
            "  hash: sha256:",
            "  presentation:\n    notice: The call was interrupted; whether it took effect is unknown.\n    \
             firstAttempt: {attempt: 1, startedAt: \"2026-01-02T03:04:05Z\", mayRunUntil: \"2026-01-02T03:04:35Z\", \
             idempotencyKey: refund-1042-key-1}\n  hash: sha256:",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_side_effect_page_says_the_outcome_is_unknown() {
    let cluster = agentrt_cluster().await;
    let ns = cluster.namespace().to_string();
    cluster.apply(&interrupted(&ns));
    let console = ConsoleProcess::start(&cluster);
    let browser = Browser::start().await;
    browser.goto(&console.url).await;
    browser
        .find(&format!("tr[data-approval=\"{ns}/refund-1042-1-1\"]"))
        .await;
    // Live: an Approval created after the inbox was loaded appears without a reload (the
    // watch the console holds, as server-sent events).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !browser.text("#live").await.contains("Live") {
        assert!(
            std::time::Instant::now() < deadline,
            "the watch never said it was ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.apply(&interrupted(&ns).replace("name: refund-1042-1-1", "name: refund-1042-1-2"));
    browser
        .find(&format!("tr[data-approval=\"{ns}/refund-1042-1-2\"]"))
        .await;
    assert!(browser.url().await.ends_with('/'), "no navigation");
    browser
        .goto(&approval_page(&console, &ns, "refund-1042-1-1"))
        .await;
    let notice = browser.text("#interrupted").await;
    assert!(notice.contains("Outcome unknown"), "{notice}");
    assert!(
        notice.contains("whether it took effect is unknown"),
        "{notice}"
    );
    assert!(notice.contains("refund-1042-key-1"), "{notice}");
    assert!(notice.contains("2026-01-02T03:04:05Z"), "{notice}");
    assert!(browser.text("#args").await.contains("\"amount\": 250"));
    browser.screenshot("interrupted").await;
    // From the inbox by keyboard: `a` approves the current (first) row; its run is gone, so
    // the console refuses before sending anything, in the CLI's words.
    browser.goto(&format!("{}/", console.origin())).await;
    browser.find("tr.current").await;
    browser.press("a").await;
    // A keystroke asks first (the inbox does not show the args).
    browser.accept_alert().await;
    let outcome = browser.text("[data-outcome=refused]").await;
    assert!(outcome.contains("can no longer grant"), "{outcome}");
    assert!(outcome.contains("refund-1042-1-1"), "{outcome}");
    // Several at once: `x` selects the current row, `j` moves, `x` selects the next, `r`
    // rejects the selected ones; each gets its own outcome.
    browser.goto(&format!("{}/", console.origin())).await;
    browser.find("tr.current").await;
    for key in ["x", "j", "x", "r"] {
        browser.press(key).await;
    }
    browser.accept_alert().await;
    let outcomes = browser.text("#outcomes").await;
    for name in ["refund-1042-1-1", "refund-1042-1-2"] {
        assert!(outcomes.contains(name), "{outcomes}");
    }
    assert_eq!(
        outcomes.matches("can no longer grant").count(),
        2,
        "{outcomes}"
    );
}

/// A ServiceAccount that may read Approvals and runs but not patch them, and its kubeconfig.
fn reader(cluster: &TestCluster) -> std::path::PathBuf {
    let ns = cluster.namespace();
    cluster.kubectl_ok(&["create", "serviceaccount", "reader"]);
    cluster.kubectl_ok(&[
        "create",
        "role",
        "approval-reader",
        "--verb=get,list,watch",
        "--resource=approvals.agentrt.dev,agentruns.agentrt.dev,agentrunsegments.agentrt.dev",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "rolebinding",
        "approval-reader",
        "--role=approval-reader",
        &format!("--serviceaccount={ns}:reader"),
    ]);
    support::chart::service_account_kubeconfig(cluster, "reader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_patch_approvals_sees_the_api_servers_refusal() {
    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        eprintln!(
            "skipped: the embedded API server does not authorize (RBAC); this runs on the real \
             kube-apiserver (scripts/test)"
        );
        return;
    }
    let ns = cluster.namespace().to_string();
    let tools = ToolServer::start().await;
    let _controller = start_controller(&cluster, "c");
    let approval = cluster
        .run_awaiting_approval(
            &fixture("needs-approval", &tools.base(), "ro"),
            "ro",
            "policy",
        )
        .await;
    let name = name_of(&approval);
    let console = ConsoleProcess::start_as(&cluster, &reader(&cluster));
    let browser = Browser::start().await;
    browser.goto(&console.url).await;
    browser.goto(&approval_page(&console, &ns, &name)).await;
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome=refused]").await;
    assert!(outcome.contains("forbidden"), "{outcome}");
    let now = approvals_api(&cluster.client(), &ns)
        .get(&name)
        .await
        .expect("get");
    assert!(
        now.data["spec"]["decision"].is_null(),
        "nothing was decided"
    );
}

/// With the chart's admission policies and four eyes on (real kube-apiserver), the run's
/// creator cannot approve its Approval in the console (the API server's refusal is shown) and
/// another approver can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_four_eyes_the_runs_creator_is_refused_in_the_console_and_another_approves() {
    let cluster = agentrt_cluster().await;
    if cluster.is_embedded() {
        eprintln!(
            "skipped: the embedded API server has no admission policies or RBAC; this runs on the \
             real kube-apiserver (scripts/test)"
        );
        return;
    }
    let ns = cluster.namespace().to_string();
    let release = support::chart::release();
    let sets = vec![
        format!("watchNamespaces={{{ns}}}"),
        "userRoles.create=false".to_string(),
        "admissionPolicies.enabled=true".to_string(),
        "admissionPolicies.fourEyes=true".to_string(),
    ];
    let objects = support::chart::render(
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
    let _installed = support::chart::Installed {
        cluster: &cluster,
        yaml: objects,
    };
    let users =
        std::fs::read_to_string(support::fixtures::path("rbac/users.yaml")).expect("fixture");
    cluster.apply(&users);
    // Whoever decides reads the run too (the console checks it still awaits the Approval).
    cluster.kubectl_ok(&[
        "create",
        "role",
        "run-reader",
        "--verb=get,list,watch",
        "--resource=agentruns.agentrt.dev,agentrunsegments.agentrt.dev",
    ]);
    cluster.kubectl_ok(&[
        "create",
        "rolebinding",
        "run-readers",
        "--role=run-reader",
        &format!("--serviceaccount={ns}:alice"),
        &format!("--serviceaccount={ns}:bob"),
    ]);
    let alice = support::chart::service_account_kubeconfig(&cluster, "alice");
    let bob = support::chart::service_account_kubeconfig(&cluster, "bob");
    let tools = ToolServer::start().await;
    let run = RunFixture::at("rbac/four-eyes-run.yaml")
        .set("TOOLS", tools.base())
        .set("CREATOR", format!("system:serviceaccount:{ns}:alice"))
        .yaml();
    let created = std::process::Command::new("kubectl")
        .args([
            "--kubeconfig",
            &alice.display().to_string(),
            "-n",
            &ns,
            "create",
            "-f",
            "-",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(run.as_bytes())?;
            child.wait_with_output()
        })
        .expect("kubectl runs");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let controller_kubeconfig = support::chart::service_account_kubeconfig(&cluster, &release);
    let _controller = ControllerProcess::spawn(
        &controller_kubeconfig,
        &ns,
        ControllerSpec::named("four-eyes"),
    );
    let approval = cluster
        .wait_approval("refund", "policy", Duration::from_secs(60))
        .await;
    let name = name_of(&approval);

    let browser = Browser::start().await;
    let as_alice = ConsoleProcess::start_as(&cluster, &alice);
    browser.goto(&as_alice.url).await;
    browser.goto(&approval_page(&as_alice, &ns, &name)).await;
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome=refused]").await;
    assert!(outcome.contains("four eyes"), "{outcome}");
    drop(as_alice);

    let as_bob = ConsoleProcess::start_as(&cluster, &bob);
    browser.goto(&as_bob.url).await;
    browser.goto(&approval_page(&as_bob, &ns, &name)).await;
    browser.click("[data-approval] [data-action=approve]").await;
    let outcome = browser.text("[data-outcome=decided]").await;
    assert!(outcome.contains("approved"), "{outcome}");
    cluster
        .wait_phase("refund", "Completed", Duration::from_secs(60))
        .await;
    assert_eq!(tools.calls().len(), 1, "the refund ran once");
}
