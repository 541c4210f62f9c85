//! `kubectl agentrt approvals`' AGE and EXPIRES columns (issue 39 item 3).

use super::*;
use crate::api::{ApprovalPhase, ApprovalStatus, Time};

fn approval(
    name: &str,
    phase: ApprovalPhase,
    expires_in_seconds: i64,
    now: jiff::Timestamp,
) -> Approval {
    let mut approval: Approval = serde_json::from_value(serde_json::json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {"name": name, "namespace": "ns",
                     "creationTimestamp": (now - jiff::SignedDuration::from_secs(330)).to_string()},
        "spec": {"runName": "r", "runUID": "u", "stepIndex": 0, "kind": "policy",
                 "hash": format!("sha256:{}", "a".repeat(64)),
                 "request": {"run": {"namespace": "ns", "name": "r", "uid": "u"}, "step": 0,
                             "tool": {"name": "t", "inputSchema": {}, "sideEffect": "RemoteMutation",
                                      "timeoutSeconds": 30},
                             "args": {}}}
    }))
    .expect("an Approval");
    approval.status = Some(ApprovalStatus {
        phase,
        expires_at: Some(Time(
            now + jiff::SignedDuration::from_secs(expires_in_seconds),
        )),
        ..ApprovalStatus::default()
    });
    approval
}

#[test]
fn approvals_show_their_age_and_the_time_left_before_expiry() {
    let now: jiff::Timestamp = "2026-12-06T12:00:00Z".parse().expect("time");
    let table = approvals_table(
        &[
            approval("waiting", ApprovalPhase::Pending, 3_000, now),
            approval("late", ApprovalPhase::Pending, -5, now),
            approval("done", ApprovalPhase::Approved, 3_000, now),
        ],
        false,
        now,
    );
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0][7..], ["AGE", "EXPIRES"], "{table}");
    assert_eq!(lines[1][0], "waiting");
    assert_eq!(lines[1][7..], ["5m30s", "50m"], "{table}");
    assert_eq!(lines[2][7..], ["5m30s", "expired"], "{table}");
    assert_eq!(lines[3][7..], ["5m30s", "-"], "{table}");
}

#[test]
fn durations_read_as_kubectl_prints_an_age() {
    for (seconds, text) in [
        (0, "0s"),
        (119, "119s"),
        (330, "5m30s"),
        (3_000, "50m"),
        (12_300, "3h25m"),
        (108_000, "30h"),
        (400_000, "4d"),
        (-3, "0s"),
    ] {
        assert_eq!(human_duration(seconds), text, "{seconds}");
    }
}
