//! docs/behaviours.md 19, 26 and issue 16: pausing on an Approval, which Approval can grant, and the
//! Approval objects as the record's projection (recreated, never adopted, only moved forward).
//! Grants, rejections and expiry are in [`super::grants`].

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{Approval, PolicyOutcome, PolicyRule, RunPhase, StepStatus, TerminalReason};
use crate::engine::hash::approval_hash;

pub(super) const NAME: &str = "refund-1042-1-1";

/// The refund example up to its pause on the refund's Approval.
pub(super) fn paused() -> Harness {
    let mut h = Harness::new(REFUND);
    h.reconcile("a");
    h.result("a", json!({"order": 1042, "damaged": true}));
    h
}

pub(super) fn rule(name: &str, outcome: PolicyOutcome, kind: Option<&str>) -> PolicyRule {
    PolicyRule {
        name: name.into(),
        tools: vec!["issue_refund".into()],
        when: None,
        outcome,
        reason: Some(format!("rule {name}")),
        kind: kind.map(String::from),
        capability: None,
        presentation: None,
    }
}

#[test]
fn require_approval_pauses_on_a_pending_approval_and_releases_the_lease() {
    let mut h = Harness::new(REFUND);
    h.spec_mut().limits.approval_ttl_seconds = Some(60);
    h.reconcile("a");
    let effects = h.result("a", json!({"order": 1042, "damaged": true}));
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(refund-1042-1-1)",
            "WriteApprovalStatus(refund-1042-1-1:Pending)",
            "ReleaseLease",
            "Stop"
        ]
    );
    assert!(h.lease.is_none(), "the lease was released");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::AwaitingApproval);
    assert_eq!(step.approvals.len(), 1);
    let recorded = &step.approvals[0];
    assert_eq!(recorded.name, NAME);
    assert_eq!(recorded.kind, "policy");
    assert_eq!(recorded.requested_at, h.now);
    assert_eq!(recorded.expires_at, Some(h.now.plus_seconds(60)));
    assert!(!recorded.executed);
    assert_words!(
        h.journal_tail(5),
        [
            "step.tool_finished@0",
            "step.started@1",
            "step.decided@1",
            "step.policy@1",
            "approval.requested@1"
        ]
    );
    let object = h.approval(NAME).clone();
    let presentation = json!({
        "tool": "issue_refund",
        "args": {"amount": 250, "order": 1042},
        "sideEffect": "RemoteMutation",
        "reason": "RemoteMutation tools require approval by default",
    });
    assert_eq!(
        h.last_event("approval.requested"),
        json!({
            "approval": NAME,
            "kind": "policy",
            "reason": "RemoteMutation tools require approval by default",
            "presentation": presentation,
            "hash": recorded.hash,
            "origin": "policy",
        })
    );
    let mut object = object;
    // The harness's API server numbers the object's versions; the engine never sets one.
    object["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    assert_eq!(
        object,
        json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "Approval",
            "metadata": {
                "name": NAME,
                "namespace": "default",
                "labels": {"agentrt.dev/run": "refund-1042", "agentrt.dev/run-uid": "uid-1"},
                "ownerReferences": [{
                    "apiVersion": "agentrt.dev/v1alpha1",
                    "kind": "AgentRun",
                    "name": "refund-1042",
                    "uid": "uid-1",
                    "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "runName": "refund-1042",
                "runUID": "uid-1",
                "stepIndex": 1,
                "kind": "policy",
                "request": {
                    "run": {"namespace": "default", "name": "refund-1042", "uid": "uid-1"},
                    "step": 1,
                    "tool": {
                        "name": "issue_refund",
                        "description": "Refund an order.",
                        "inputSchema": {"type": "object", "required": ["order", "amount"], "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}},
                        "sideEffect": "RemoteMutation",
                        "timeoutSeconds": 30,
                        "terminal": false,
                    },
                    "args": {"amount": 250, "order": 1042},
                },
                "presentation": presentation,
                "reason": "RemoteMutation tools require approval by default",
                "hash": recorded.hash,
            },
            "status": {
                "phase": "Pending",
                "shortHash": recorded.hash["sha256:".len().."sha256:".len() + 12],
                "expiresAt": h.now.plus_seconds(60),
            },
        })
    );
    let stored: Approval = serde_json::from_value(object).expect("the Approval decodes");
    let spec = &stored.spec;
    assert_eq!(
        approval_hash(&spec.kind, None, spec.presentation.as_ref(), &spec.request).unwrap(),
        recorded.hash,
        "the hash covers the request as stored"
    );
    let waiting = &status.conditions[1];
    assert_eq!(
        (waiting.type_.as_str(), waiting.status.as_str()),
        ("WaitingForApproval", "True")
    );
}

#[test]
fn a_different_requirement_pauses_again_on_a_new_approval() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().policy.rules = vec![rule(
        "finance",
        PolicyOutcome::RequireApproval,
        Some("finance"),
    )];
    let before = h.events().len();
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "CreateApproval(refund-1042-1-2)",
            "WriteApprovalStatus(refund-1042-1-2:Pending)",
            "WriteApprovalStatus(refund-1042-1-1:Cancelled)",
            "ReleaseLease",
            "Stop"
        ]
    );
    assert_eq!(h.approval(NAME)["status"]["reason"], "superseded");
    assert_words!(
        h.journal_from(before),
        [
            "approval.decided@1",
            "run.resumed@1",
            "step.policy@1",
            "approval.requested@1"
        ]
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    assert_eq!(
        h.approval("refund-1042-1-2")["spec"]["kind"],
        json!("finance")
    );
    assert_eq!(h.tool_calls.len(), 1);
}

#[test]
fn only_the_latest_approval_can_grant_and_a_pending_one_changes_nothing() {
    let mut h = paused();
    h.approve(NAME);
    h.spec_mut().policy.rules = vec![rule(
        "finance",
        PolicyOutcome::RequireApproval,
        Some("finance"),
    )];
    h.reconcile("b");
    let before = h.run.status.clone();
    let writes = h.writes.len();
    // The older approval is approved, the latest pending: however often it is reconciled,
    // nothing changes and nothing runs.
    for _ in 0..5 {
        let effects = h.reconcile("c");
        assert!(effects.is_empty(), "{effects:?}");
        h.advance(60);
    }
    assert_eq!(h.run.status, before);
    assert_eq!(h.writes.len(), writes);
    assert_eq!(h.tool_calls.len(), 1);
    h.approve("refund-1042-1-2");
    let effects = h.reconcile("c");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-2:Executed)",
            "CallTool(issue_refund#1)"
        ]
    );
}

#[test]
fn an_approval_whose_stored_fields_do_not_hash_to_its_hash_is_never_executed() {
    let mut h = paused();
    let object = h.approvals.get_mut(NAME).unwrap();
    object["spec"]["request"]["args"]["amount"] = json!(25_000);
    h.approve(NAME);
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            "WriteApprovalStatus(refund-1042-1-1:Cancelled)",
            "ReleaseLease",
            "Stop"
        ]
    );
    assert_eq!(
        h.approval(NAME)["status"]["reason"],
        "run failed: internal_error"
    );
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::InternalError));
    assert!(status
        .reason_detail
        .unwrap()
        .contains("do not hash to spec.hash"));
    assert_eq!(h.tool_calls.len(), 1);
    assert!(!status.steps[1].approvals[0].executed);
}

#[test]
fn a_recorded_approval_that_is_missing_is_created_again_from_the_record() {
    let mut h = paused();
    let original = h.approvals.remove(NAME).unwrap();
    let effects = h.reconcile("b");
    assert_effects!(
        effects,
        [
            "CreateApproval(refund-1042-1-1)",
            "WriteApprovalStatus(refund-1042-1-1:Pending)"
        ]
    );
    assert_eq!(h.approval(NAME), &original);
}

#[test]
fn an_approval_carries_its_runs_creator_for_the_four_eyes_policy() {
    let mut h = Harness::new(REFUND);
    h.run.created_by = Some("alice".into());
    h.reconcile("a");
    h.result("a", json!({"order": 1042, "damaged": true}));
    let approval = h.approvals.get(NAME).expect("the Approval was created");
    assert_eq!(
        approval["metadata"]["annotations"][crate::engine::RUN_CREATED_BY_ANNOTATION],
        "alice"
    );
    // Without a recorded creator there is nothing to copy.
    let unannotated = paused();
    let approval = unannotated
        .approvals
        .get(NAME)
        .expect("the Approval was created");
    assert!(
        approval["metadata"].get("annotations").is_none(),
        "{approval}"
    );
}

#[test]
fn an_executed_approval_never_goes_back_to_approved() {
    // A replica whose read of the record is older than its read of the Approval (the grant
    // already executed and the Approval marked Executed) asks for no status write (issue 16:
    // phases only move forward).
    let mut h = paused();
    h.approve(NAME);
    let stale_record = h.run.status.clone();
    h.reconcile("a");
    assert_eq!(h.approval(NAME)["status"]["phase"], "Executed");
    h.run.status = stale_record;
    let effects = h.decide(
        "b",
        Observe {
            lease: h.lease_view(),
        },
    );
    assert!(
        !kinds(&effects)
            .iter()
            .any(|k| k.starts_with("WriteApprovalStatus")),
        "{:?}",
        kinds(&effects)
    );
}

#[test]
fn an_approval_status_write_names_the_version_it_read() {
    let mut h = paused();
    h.approve(NAME);
    let version = h.approval(NAME)["metadata"]["resourceVersion"].clone();
    let effects = h.decide(
        "b",
        Observe {
            lease: h.lease_view(),
        },
    );
    let write = effects
        .iter()
        .find_map(|e| match e {
            Effect::WriteApprovalStatus {
                resource_version, ..
            } => Some(resource_version.clone()),
            _ => None,
        })
        .expect("an Approval status write");
    assert_eq!(write.as_deref(), version.as_str());
}

#[test]
fn approval_phases_only_move_forward() {
    use crate::api::ApprovalPhase::*;
    let all = [Pending, Approved, Rejected, Expired, Executed, Cancelled];
    for from in all {
        for to in all {
            let forward = from == to
                || from == Pending
                || (from == Approved && matches!(to, Executed | Expired | Cancelled));
            assert_eq!(from.may_become(to), forward, "{from:?} -> {to:?}");
        }
    }
}

/// What a deleted run of the same name left behind (issue 16): an Approval named like this
/// run's, for another run uid and another request, with a status of its own.
fn leftover(h: &mut Harness) -> Value {
    let object = h.approvals.get_mut(NAME).unwrap();
    object["spec"]["runUID"] = json!("uid-of-the-deleted-run");
    object["spec"]["request"]["run"]["uid"] = json!("uid-of-the-deleted-run");
    object["spec"]["request"]["args"]["amount"] = json!(999);
    object["spec"]["hash"] = json!(format!("sha256:{}", "e".repeat(64)));
    object["status"] = json!({"phase": "Pending", "shortHash": "eeeeeeeeeeee"});
    object.clone()
}

#[test]
fn an_approval_left_by_another_run_is_never_adopted_and_the_run_pauses_on_a_fresh_name() {
    let mut h = paused();
    let left = leftover(&mut h);
    let before = h.run.status.clone();
    let effects = h.reconcile("b");
    let fresh = format!("{NAME}-uid-1");
    assert_effects!(
        effects,
        [
            "WriteStatus",
            &format!("CreateApproval({fresh})"),
            &format!("WriteApprovalStatus({fresh}:Pending)")
        ]
    );
    assert_eq!(h.approval(NAME), &left, "the leftover is never written to");
    let status = h.status();
    let step = &status.steps[1];
    assert_eq!(step.status, StepStatus::AwaitingApproval);
    assert_eq!(step.approvals.last().unwrap().name, fresh);
    let requested = h.last_event("approval.requested");
    assert_eq!(requested["approval"], json!(fresh));
    assert_eq!(requested["replaces"], json!(NAME));
    assert!(requested["conflict"]
        .as_str()
        .unwrap()
        .contains("belongs to another run"));
    let conflict = status
        .conditions
        .iter()
        .find(|c| c.type_ == "ApprovalConflict")
        .expect("an ApprovalConflict condition");
    assert_eq!(
        (conflict.status.as_str(), conflict.reason.as_str()),
        ("True", "NameTaken")
    );
    assert!(conflict.message.contains(NAME) && conflict.message.contains(&fresh));
    let warnings = crate::engine::projection::kube_events(&before, &h.run.status);
    assert!(
        warnings.iter().any(|e| e.reason == "ApprovalConflict"
            && e.type_ == crate::engine::projection::KubeEventType::Warning
            && e.message.contains(NAME)),
        "{warnings:?}"
    );
    // The fresh Approval is the run's own: it carries the run's request and grants it.
    let created = h.approval(&fresh).clone();
    assert_eq!(created["spec"]["runUID"], json!("uid-1"));
    assert_eq!(created["spec"]["hash"], json!(step.approvals[0].hash));
    h.approve(&fresh);
    h.reconcile("c");
    h.result("c", json!({"refunded": 250}));
    assert_eq!(h.status().phase, RunPhase::Completed);
    assert_eq!(h.approval(NAME), &left, "the leftover is still untouched");
    let conflict = h
        .status()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "ApprovalConflict")
        .expect("the condition stays, resolved");
    assert_eq!(conflict.status, "False");
}

#[test]
fn both_approval_names_taken_ends_the_run_with_a_message_that_is_true() {
    // docs/behaviours.md 82: `<run>-1-1` and `<run>-1-1-<uid8>` both held by objects not made
    // for this run; the run ends, and its detail names both and promises nothing it cannot do.
    let mut h = paused();
    leftover(&mut h);
    h.reconcile("b");
    let fresh = format!("{NAME}-uid-1");
    let squat = h.approvals.get_mut(&fresh).unwrap();
    squat["spec"]["runUID"] = json!("uid-of-someone-else");
    squat["spec"]["request"]["run"]["uid"] = json!("uid-of-someone-else");
    h.reconcile("c");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.reason, Some(TerminalReason::InternalError));
    let detail = status.reason_detail.unwrap_or_default();
    assert!(
        detail.contains(&format!("Approval {NAME} "))
            && detail.contains(&format!("Approval {fresh} ")),
        "{detail}"
    );
    assert!(!detail.contains("let the run go on"), "{detail}");
    assert!(detail.contains("create the run again"), "{detail}");
    assert!(h.tool_calls.iter().all(|c| c.tool.name != "issue_refund"));
}

#[test]
fn an_approval_for_another_request_under_the_runs_name_is_not_adopted_either() {
    let mut h = paused();
    let object = h.approvals.get_mut(NAME).unwrap();
    object["spec"]["hash"] = json!(format!("sha256:{}", "f".repeat(64)));
    let left = object.clone();
    h.reconcile("b");
    assert_eq!(h.approval(NAME), &left);
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    assert!(h.last_event("approval.requested")["conflict"]
        .as_str()
        .unwrap()
        .contains("carries another request"));
}

#[test]
fn a_status_write_lands_only_on_the_runs_own_request_and_only_forward() {
    let stored = json!({
        "metadata": {"resourceVersion": "7"},
        "spec": {"hash": "sha256:aa"},
        "status": {"phase": "Executed"},
    });
    let approved = json!({"phase": "Approved"});
    let cancelled = json!({"phase": "Cancelled"});
    assert_eq!(
        crate::engine::status_write_version(&stored, &approved, "sha256:aa"),
        None
    );
    let mut pending = stored.clone();
    pending["status"]["phase"] = json!("Pending");
    assert_eq!(
        crate::engine::status_write_version(&pending, &cancelled, "sha256:aa").as_deref(),
        Some("7")
    );
    assert_eq!(
        crate::engine::status_write_version(&pending, &cancelled, "sha256:bb"),
        None
    );
}

/// docs/behaviours.md 69: an Approval under the recorded name whose spec names this run and
/// hash but whose owner, labels or request do not is not this run's: it is never adopted, the
/// run pauses on a fresh name with `ApprovalConflict`, and the object is left untouched.
#[test]
fn an_approval_with_another_owner_labels_or_request_is_not_adopted() {
    type Change = fn(&mut Value);
    let cases: [(&str, Change, &str); 5] = [
        (
            "owner uid",
            |o| o["metadata"]["ownerReferences"][0]["uid"] = json!("uid-9"),
            "is not owned by this run",
        ),
        (
            "no owner",
            |o| o["metadata"]["ownerReferences"] = json!([]),
            "is not owned by this run",
        ),
        (
            "run-uid label",
            |o| o["metadata"]["labels"]["agentrt.dev/run-uid"] = json!("uid-9"),
            "carries other labels",
        ),
        (
            "request's run",
            |o| o["spec"]["request"]["run"]["uid"] = json!("uid-9"),
            "carries another request",
        ),
        (
            "request's step",
            |o| o["spec"]["request"]["step"] = json!(7),
            "carries another request",
        ),
    ];
    for (what, change, said) in cases {
        let mut h = paused();
        let object = h.approvals.get_mut(NAME).unwrap();
        change(object);
        let left = object.clone();
        h.reconcile("b");
        let fresh = format!("{NAME}-uid-1");
        assert_eq!(
            h.approval(NAME),
            &left,
            "{what}: the object is never written to"
        );
        let status = h.status();
        assert_eq!(status.phase, RunPhase::WaitingForApproval, "{what}");
        assert_eq!(
            status.steps[1].approvals.last().unwrap().name,
            fresh,
            "{what}"
        );
        let requested = h.last_event("approval.requested");
        assert!(
            requested["conflict"].as_str().unwrap().contains(said),
            "{what}: {requested}"
        );
        let conflict = status
            .conditions
            .iter()
            .find(|c| c.type_ == "ApprovalConflict")
            .expect("an ApprovalConflict condition");
        assert_eq!(conflict.status, "True", "{what}");
        let created = h.approval(&fresh).clone();
        assert_eq!(
            created["metadata"]["ownerReferences"][0]["uid"],
            json!("uid-1")
        );
        assert_eq!(
            created["metadata"]["labels"]["agentrt.dev/run-uid"],
            json!("uid-1")
        );
    }
}
