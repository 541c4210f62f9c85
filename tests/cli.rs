//! The operator CLI against an API server (issue 6, docs/behaviours.md 51-53): approve and reject
//! print first and decide only when told to, patch the hash they printed (a change in between
//! is refused), escape what a model or a tool chose, and exit 0/1/2.
//!
//! No controller runs ([`agentrt_cluster`]): these tests decide fixture Approvals by hand, and a
//! run applied here stays as applied.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use support::cli::{agentrt, text};
use support::cluster::TestCluster;
use support::controller::agentrt_cluster;

const HASH: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// The fixture Approval with `args` replacing its args and `hash` its hash.
fn approval(args: &str, hash: &str) -> String {
    let yaml =
        std::fs::read_to_string(support::fixtures::path("api/approval.yaml")).expect("fixture");
    yaml.replace("args: {order: 1042, amount: 250}", &format!("args: {args}"))
        .replace(HASH, hash)
}

/// [`approval`] for the fixture run, applied first (it stays as applied: no controller), so
/// the Approval's run is there as the CLI reads it live: its runUID and request.run.uid are the
/// run's.
fn approval_of_run(c: &TestCluster, args: &str, hash: &str) -> String {
    let run = std::fs::read_to_string(support::fixtures::path("api/refund-run.yaml")).unwrap();
    c.apply(&run);
    let uid = c.kubectl_ok(&["get", "ar", "refund-1042", "-o", "jsonpath={.metadata.uid}"]);
    approval(args, hash).replace(FIXTURE_RUN_UID, uid.trim())
}

/// A cluster ([`agentrt_cluster`]) holding the fixture run and its Approval `refund-1042-1-1`
/// (args `{order: 1042, amount: 250}`, hash [`HASH`], undecided), as [`approval_of_run`]
/// applies them.
async fn cluster_with_the_fixture_approval() -> TestCluster {
    let c = agentrt_cluster().await;
    c.apply(&approval_of_run(&c, "{order: 1042, amount: 250}", HASH));
    c
}

/// The run uid the fixture Approval names.
const FIXTURE_RUN_UID: &str = "0b6e7f6c-3a57-4a8e-9a39-3f7f2b0c1d42";

fn decision(c: &TestCluster) -> String {
    c.kubectl_ok(&[
        "get",
        "approval",
        "refund-1042-1-1",
        "-o",
        "jsonpath={.spec.decision}",
    ])
}

#[tokio::test]
async fn approve_prints_the_request_and_refuses_without_a_yes_at_no_terminal() {
    let c = cluster_with_the_fixture_approval().await;
    let out = agentrt(&c, &["approve", "refund-1042-1-1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("issue_refund") && stdout.contains("\"amount\": 250"),
        "{stdout}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("==> agentrt: you are about to APPROVE") && last.contains(HASH),
        "the last line is the CLI's own: {last}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pass --yes"),
        "{}",
        text(&out)
    );
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

#[tokio::test]
async fn approve_with_yes_patches_the_printed_hash() {
    let c = cluster_with_the_fixture_approval().await;
    let out = agentrt(
        &c,
        &[
            "approve",
            "refund-1042-1-1",
            "--yes",
            "--note",
            "checked the photos",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let decided: serde_json::Value = serde_json::from_str(&decision(&c)).expect("a decision");
    assert_eq!(decided["verdict"], "Approved");
    assert_eq!(decided["hash"], HASH);
    assert_eq!(decided["note"], "checked the photos");
    // The approver is who the API server says we are (SelfSubjectReview).
    assert!(
        decided["approver"].as_str().is_some_and(|a| !a.is_empty()),
        "{decided}"
    );
    if c.is_embedded() {
        assert_eq!(decided["approver"], "agentrt-dev-admin");
    }
    // A second decision is refused by the API server, and the CLI says so with exit 1.
    let out = agentrt(&c, &["reject", "refund-1042-1-1", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("already decided"), "{}", text(&out));
}

#[tokio::test]
async fn an_approval_changed_between_print_and_patch_is_refused() {
    let c = cluster_with_the_fixture_approval().await;
    let kubeconfig = c.kubeconfig().to_path_buf();
    let namespace = c.namespace().to_string();
    let child = std::thread::spawn(move || {
        Command::new(env!("CARGO_BIN_EXE_agentrt"))
            .args(["reject", "refund-1042-1-1", "--yes", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(["-n", &namespace])
            .env("AGENTRT_TEST_PAUSE_BEFORE_DECIDE_MS", "3000")
            .stdin(Stdio::null())
            .output()
            .expect("agentrt runs")
    });
    // While the CLI waits, the Approval is replaced by one for a bigger refund.
    std::thread::sleep(std::time::Duration::from_millis(1200));
    c.kubectl_ok(&["delete", "approval", "refund-1042-1-1"]);
    let other = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    c.apply(&approval_of_run(&c, "{order: 1042, amount: 25000}", other));
    let out = child.join().expect("thread");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("refused the decision"),
        "{}",
        text(&out)
    );
    assert_eq!(
        decision(&c).trim(),
        "",
        "the replaced Approval stays undecided"
    );
}

#[tokio::test]
async fn model_chosen_strings_are_escaped_in_the_printout() {
    let c = agentrt_cluster().await;
    c.apply(&approval_of_run(
        &c,
        r#"{order: 1042, note: "ok\u202e0001\u200b\u001b[2J"}"#,
        HASH,
    ));
    let out = agentrt(&c, &["show", "approval", "refund-1042-1-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(r"ok\u{202E}0001\u{200B}\u{001B}[2J"),
        "{stdout}"
    );
    assert!(
        !stdout.contains('\u{202e}') && !stdout.contains('\u{1b}'),
        "raw controls reached the terminal"
    );
}

#[tokio::test]
async fn json_output_and_exit_codes() {
    let c = cluster_with_the_fixture_approval().await;
    let out = agentrt(&c, &["approvals", "-o", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(list[0]["spec"]["hash"], HASH);
    let out = agentrt(&c, &["show", "approval", "no-such-approval"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["approve"])
        .output()
        .expect("agentrt runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage error exits 2 before any API call"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["show", "robot", "x", "--kubeconfig", "/nonexistent"])
        .output()
        .expect("agentrt runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "arguments are validated before the kubeconfig is read"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(["approve", "Bad Name!", "--kubeconfig", "/nonexistent"])
        .output()
        .expect("agentrt runs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "an invalid object name is a usage error"
    );
    // A reader that goes away early is not an error (`agentrt crds | head -1`).
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .arg("crds")
        .stdout(Stdio::piped())
        .spawn()
        .expect("agentrt runs");
    drop(child.stdout.take());
    assert_eq!(
        child.wait().expect("exits").code(),
        Some(0),
        "a closed pipe ends the output quietly"
    );
}

#[tokio::test]
async fn the_binary_works_as_the_kubectl_plugin_kubectl_agentrt() {
    let c = cluster_with_the_fixture_approval().await;
    let bin = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_agentrt"),
        bin.path().join("kubectl-agentrt"),
    )
    .expect("symlink");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(support::cluster::KUBECTL)
        .args(["agentrt", "approvals", "-o", "json", "--kubeconfig"])
        .arg(c.kubeconfig())
        .args(["-n", c.namespace()])
        .env("PATH", path)
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "{}", text(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(list[0]["metadata"]["name"], "refund-1042-1-1");
}

/// `agentrt` with `args` and only `--kubeconfig kubeconfig`: no `-n`, so the namespace is the
/// context's (or a `namespace/` prefix).
fn agentrt_in_context(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .stdin(Stdio::null())
        .output()
        .expect("agentrt runs")
}

/// The names in `agentrt approvals -o json` output.
fn listed(out: &Output) -> Vec<String> {
    assert_eq!(out.status.code(), Some(0), "{}", text(out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|a| {
            format!(
                "{}/{}",
                a["metadata"]["namespace"].as_str().unwrap_or_default(),
                a["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// docs/behaviours.md 68: as kubectl, `agentrt approvals` lists the kubeconfig context's
/// namespace by default and every namespace with `-A`; `namespace/name` is accepted wherever a
/// name is, and an `-n` naming another namespace is refused.
#[tokio::test]
async fn approvals_follow_the_contexts_namespace_and_names_take_a_namespace() {
    let c = cluster_with_the_fixture_approval().await;
    let ours = format!("{}/refund-1042-1-1", c.namespace());
    // The test's kubeconfig context has no namespace: `default`, where nothing waits.
    let out = agentrt_in_context(c.kubeconfig(), &["approvals", "-o", "json"]);
    assert!(!listed(&out).contains(&ours), "{}", text(&out));
    let out = agentrt_in_context(c.kubeconfig(), &["approvals", "-A", "-o", "json"]);
    assert!(listed(&out).contains(&ours), "{}", text(&out));
    let out = agentrt_in_context(
        c.kubeconfig(),
        &["approvals", "--all-namespaces", "-o", "json"],
    );
    assert!(listed(&out).contains(&ours), "{}", text(&out));

    // A context whose namespace is the test's: listed without -n.
    let dir = tempfile::tempdir().expect("a temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::copy(c.kubeconfig(), &kubeconfig).expect("copy the kubeconfig");
    let set = Command::new(support::cluster::KUBECTL)
        .args([
            "config",
            "set-context",
            "--current",
            "--namespace",
            c.namespace(),
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .output()
        .expect("kubectl runs");
    assert!(set.status.success(), "{}", text(&set));
    let out = agentrt_in_context(&kubeconfig, &["approvals", "-o", "json"]);
    assert_eq!(listed(&out), vec![ours.clone()], "{}", text(&out));

    // namespace/name, from a context that points elsewhere.
    let out = agentrt_in_context(c.kubeconfig(), &["show", "approval", &ours]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("issue_refund"));
    let out = agentrt_in_context(c.kubeconfig(), &["approve", &ours]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("pass --yes"),
        "found and printed, then not decided without --yes: {}",
        text(&out)
    );
    let out = agentrt_in_context(
        c.kubeconfig(),
        &["show", "approval", &ours, "-n", "elsewhere"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("-n elsewhere"), "{}", text(&out));
    for bad in ["Bad/refund", "/refund", "ns/", "a/b/c"] {
        let out = agentrt_in_context(c.kubeconfig(), &["show", "approval", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out));
    }
    for command in [
        vec!["show", "run"],
        vec!["show", "approval"],
        vec!["events"],
        vec!["verify"],
        vec!["cancel"],
        vec!["reject"],
        vec!["approve"],
    ] {
        let mut args = command.clone();
        let missing = format!("{}/no-such-run", c.namespace());
        args.push(&missing);
        let out = agentrt_in_context(c.kubeconfig(), &args);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{command:?}: {said}");
        assert!(
            said.contains(&missing),
            "{command:?} names {missing}: {said}"
        );
        // The API server's message, said once (issue 14).
        assert_eq!(
            said.matches("\"no-such-run\" not found").count(),
            1,
            "{command:?}: {said}"
        );
        assert!(!said.contains("HTTP 404"), "{command:?}: {said}");
        assert!(!said.contains(": NotFound"), "{command:?}: {said}");
    }
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

/// docs/behaviours.md 67: an Approval whose run (read live) says it can no longer grant is
/// refused before anything is asked: here a run of the same name with another uid.
#[tokio::test]
async fn approve_refuses_an_approval_its_run_no_longer_awaits() {
    let c = agentrt_cluster().await;
    c.apply(&approval("{order: 1042, amount: 250}", HASH));
    let run = std::fs::read_to_string(support::fixtures::path("api/refund-run.yaml")).unwrap();
    c.apply(&run);
    let out = agentrt(&c, &["approve", "refund-1042-1-1", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("can no longer grant") && stderr.contains("earlier run named refund-1042"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("approved"));
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

fn lint(args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt"))
        .arg("lint")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentrt runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("stdin written");
    drop(input);
    child.wait_with_output().expect("agentrt exits")
}

/// docs/behaviours.md 1: `agentrt lint` gives the verdict offline: every problem of every run
/// as `FILE: NAMESPACE/NAME: field: message`, exit 1; otherwise `N runs ok`, exit 0.
#[test]
fn lint_prints_every_problem_naming_file_run_and_field_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        r#"apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {name: weather}
spec:
  goal: Say the weather.
  agent: {scripted: {decisions: []}}
  tools:
  - name: get weather!
    sideEffect: ReadOnly
    inputSchema: {type: objekt}
    http: {url: "ftp://weather/now"}
  policy:
    rules:
    - {name: cheap, when: "args.amount <=> 100 &&", outcome: Allow}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
"#,
    )
    .expect("written");
    let file = bad.display().to_string();
    let out = lint(&["-f", &file], None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let prefix = format!("{file}: default/weather: ");
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(
        lines[0],
        format!(
            "{prefix}spec.tools[0].name: \"get weather!\" is not a valid function name; use \
             letters, digits, _ and - (1-64 characters)"
        )
    );
    assert!(lines[1].starts_with(&format!("{prefix}spec.tools[0].http.url: ")));
    assert!(lines[2].starts_with(&format!("{prefix}spec.tools[0].inputSchema: ")));
    assert!(lines[3].starts_with(&format!("{prefix}spec.policy.rules[0].when: ")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("document 2 (ConfigMap settings) is not an AgentRun; skipped"),
        "{stderr}"
    );
}

#[test]
fn lint_of_the_samples_and_of_stdin_says_how_many_runs_are_ok() {
    let samples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/samples");
    let mut files: Vec<String> = std::fs::read_dir(&samples)
        .expect("samples")
        .map(|e| e.expect("entry").path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut args = vec!["-f"];
    args.extend(files.iter().map(String::as_str));
    let out = lint(&args, None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(stdout.ends_with(" runs ok\n"), "{stdout}");
    // The directory itself, as `kubectl apply -f DIR` takes it: the same runs.
    let out_dir = lint(&["-f", &samples.display().to_string()], None);
    assert_eq!(out_dir.status.code(), Some(0), "{}", text(&out_dir));
    assert_eq!(String::from_utf8_lossy(&out_dir.stdout), stdout);
    let sample = std::fs::read_to_string(samples.join("refund-approval.yaml")).expect("sample");
    let out = lint(&["-f", "-"], Some(&sample));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1 run ok\n");
    let out = lint(&[], None);
    assert_eq!(out.status.code(), Some(2), "-f is required: {}", text(&out));
}

#[test]
fn lint_works_as_kubectl_agentrt_lint() {
    let bin = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_agentrt"),
        bin.path().join("kubectl-agentrt"),
    )
    .expect("symlink");
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sample =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/samples/readonly-lookup.yaml");
    let out = Command::new(support::cluster::KUBECTL)
        .args(["agentrt", "lint", "-f"])
        .arg(&sample)
        .env("PATH", path)
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1 run ok\n");
}

#[test]
fn keep_steps_0_is_a_usage_error_naming_the_flag() {
    for command in ["controller", "dev"] {
        let out = Command::new(env!("CARGO_BIN_EXE_agentrt"))
            .args([command, "--keep-steps", "0"])
            .stdin(Stdio::null())
            .output()
            .expect("agentrt runs");
        assert_eq!(out.status.code(), Some(2), "{command}: {}", text(&out));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--keep-steps") && stderr.contains("1.."),
            "{command}: {stderr}"
        );
    }
}

/// The fixture run applied, its uid read back, and the fixture Approval made its own (runUID,
/// request.run.uid and an ownerReference), as the controller would create it.
fn owned_approval(c: &TestCluster, cancel: bool) -> String {
    let run = std::fs::read_to_string(support::fixtures::path("api/refund-run.yaml")).unwrap();
    let run = if cancel {
        run.replace("spec:\n", "spec:\n  cancel: true\n")
    } else {
        run
    };
    c.apply(&run);
    let uid = c.kubectl_ok(&["get", "ar", "refund-1042", "-o", "jsonpath={.metadata.uid}"]);
    let uid = uid.trim().to_string();
    approval("{order: 1042, amount: 250}", HASH)
        .replace(FIXTURE_RUN_UID, &uid)
        .replace(
            "metadata: {name: refund-1042-1-1}",
            &format!(
                "metadata:\n  name: refund-1042-1-1\n  ownerReferences:\n  - {{apiVersion: agentrt.dev/v1alpha1, kind: AgentRun, name: refund-1042, uid: {uid}}}"
            ),
        )
}

/// docs/behaviours.md 67: an Approval whose owner run is gone (deleted with
/// `--cascade=orphan`) can no longer grant; approve refuses it, writing nothing.
#[tokio::test]
async fn approve_refuses_an_approval_whose_run_is_gone() {
    let c = agentrt_cluster().await;
    let owned = owned_approval(&c, false);
    c.apply(&owned);
    c.kubectl_ok(&["delete", "ar", "refund-1042", "--cascade=orphan"]);
    let out = agentrt(&c, &["approve", "refund-1042-1-1", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("can no longer grant")
            && (stderr.contains("is gone") || stderr.contains("being deleted")),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("approved"));
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

/// docs/behaviours.md 42: a run with `spec.cancel: true` (its controller not yet there to end
/// it) grants nothing: approve refuses before printing the prompt.
#[tokio::test]
async fn approve_refuses_an_approval_whose_run_is_being_cancelled() {
    let c = agentrt_cluster().await;
    let owned = owned_approval(&c, true);
    c.apply(&owned);
    let out = agentrt(&c, &["approve", "refund-1042-1-1", "-y"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.cancel: true"), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("you are about to"),
        "{}",
        text(&out)
    );
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

/// A Cancelled Approval is refused before anything of the prompt is printed.
#[tokio::test]
async fn approve_of_a_cancelled_approval_refuses_before_the_prompt() {
    let c = cluster_with_the_fixture_approval().await;
    c.kubectl_ok(&[
        "patch",
        "approval",
        "refund-1042-1-1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Cancelled","reason":"run cancelled"}}"#,
    ]);
    let out = agentrt(&c, &["approve", "refund-1042-1-1", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "", "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Cancelled"),
        "{}",
        text(&out)
    );
    // Listed only with --all-phases (or its older spelling --all).
    let ours = format!("{}/refund-1042-1-1", c.namespace());
    let out = agentrt(&c, &["approvals", "-o", "json"]);
    assert!(!listed(&out).contains(&ours), "{}", text(&out));
    for every in ["--all-phases", "--all"] {
        let out = agentrt(&c, &["approvals", every, "-o", "json"]);
        assert!(listed(&out).contains(&ours), "{every}: {}", text(&out));
    }
}

/// A `--note` over the schema's limit is a usage error naming the limit, sent nowhere.
#[tokio::test]
async fn a_note_over_the_limit_is_refused_before_sending() {
    let c = cluster_with_the_fixture_approval().await;
    let note = "x".repeat(4097);
    let out = agentrt(&c, &["reject", "refund-1042-1-1", "--yes", "--note", &note]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at most 4096"), "{stderr}");
    assert!(!stderr.contains("did it change"), "{stderr}");
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
}

/// `settle` (docs/design.md section 5): only an `interrupted_side_effect` Approval takes it, and
/// it patches the printed hash with the verdict and the result.
#[tokio::test]
async fn settle_patches_took_effect_with_its_result_and_refuses_another_kind() {
    let c = cluster_with_the_fixture_approval().await;
    // The fixture is a policy Approval: settling it is refused before anything is sent.
    let out = agentrt(
        &c,
        &[
            "settle",
            "refund-1042-1-1",
            "--did-not-take-effect",
            "--yes",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("only an interrupted_side_effect Approval can be settled"),
        "{}",
        text(&out)
    );
    assert_eq!(decision(&c).trim(), "", "nothing was decided");
    // A result that is not a JSON object is a usage error naming the flag.
    let out = agentrt(
        &c,
        &[
            "settle",
            "refund-1042-1-1",
            "--took-effect",
            "--result",
            "[1]",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--result"), "{}", text(&out));

    c.kubectl_ok(&["delete", "approval", "refund-1042-1-1"]);
    let interrupted = approval_of_run(&c, "{order: 1042, amount: 250}", HASH)
        .replace("  kind: policy", "  kind: interrupted_side_effect");
    c.apply(&interrupted);
    let out = agentrt(
        &c,
        &[
            "settle",
            "refund-1042-1-1",
            "--took-effect",
            "--result",
            r#"{"refundId": "r-77"}"#,
            "--yes",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("SETTLE AS TOOK EFFECT"),
        "{}",
        text(&out)
    );
    let decided: serde_json::Value = serde_json::from_str(&decision(&c)).expect("a decision");
    assert_eq!(decided["verdict"], "TookEffect");
    assert_eq!(decided["hash"], HASH);
    assert_eq!(decided["result"], serde_json::json!({"refundId": "r-77"}));
}
