//! The operator CLI against an API server (issue 6, docs/behaviours.md 51-53): approve and reject
//! print first and decide only when told to, patch the hash they printed (a change in between
//! is refused), escape what a model or a tool chose, and exit 0/1/2.

mod support;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use support::cluster::{Options, TestCluster};

async fn cluster() -> TestCluster {
    let c = TestCluster::start_with(Options {
        crds_dir: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")),
        ..Options::default()
    })
    .await;
    if !c.is_embedded() {
        c.apply_agentrt_crds();
    }
    c
}

fn agentrt(c: &TestCluster, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentrt"));
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(c.kubeconfig())
        .arg("-n")
        .arg(c.namespace())
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("agentrt runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const HASH: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// The fixture Approval with `args` replacing its args and `hash` its hash.
fn approval(args: &str, hash: &str) -> String {
    let yaml =
        std::fs::read_to_string(support::fixtures::path("api/approval.yaml")).expect("fixture");
    yaml.replace("args: {order: 1042, amount: 250}", &format!("args: {args}"))
        .replace(HASH, hash)
}

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
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 250}", HASH),
    );
    let out = agentrt(&c, &["approve", "refund-1042-1-1"], &[]);
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
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 250}", HASH),
    );
    let out = agentrt(
        &c,
        &[
            "approve",
            "refund-1042-1-1",
            "--yes",
            "--note",
            "checked the photos",
        ],
        &[],
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
    let out = agentrt(&c, &["reject", "refund-1042-1-1", "--yes"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("already decided"), "{}", text(&out));
}

#[tokio::test]
async fn an_approval_changed_between_print_and_patch_is_refused() {
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 250}", HASH),
    );
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
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 25000}", other),
    );
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
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval(
            r#"{order: 1042, note: "ok\u202e0001\u200b\u001b[2J"}"#,
            HASH,
        ),
    );
    let out = agentrt(&c, &["show", "approval", "refund-1042-1-1"], &[]);
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
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 250}", HASH),
    );
    let out = agentrt(&c, &["approvals", "-o", "json"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    assert_eq!(list[0]["spec"]["hash"], HASH);
    let out = agentrt(&c, &["show", "approval", "no-such-approval"], &[]);
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
    let c = cluster().await;
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        &approval("{order: 1042, amount: 250}", HASH),
    );
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
