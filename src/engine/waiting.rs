//! A waiting run's latest Approval (docs/design.md sections 2, 5; docs/behaviours.md 23-25, 34-35; issue
//! 16), for an observer or the holder. Only the latest can grant.
//!
//! - Missing → created again from the record (the hash must come out as recorded).
//! - Not the run's own (another run's uid, step or hash) → the run re-homes onto a fresh name
//!   and leaves the object as it is.
//! - Pending → nothing (an observer requeues for its expiry, the holder lets go), or
//!   `approval_expired` once past it.
//! - Rejected → the step fails `policy_denied` and the run ends `Cancelled` `approval_rejected`.
//! - Approved → expired when older than grantTTLSeconds, otherwise the holder executes it
//!   ([`super::grants::execute_grant`]) and an observer asks for the lease; but while the
//!   step's interrupted attempt may still be running ([`super::takeover::first_attempt`]) an
//!   observer writes the Approval `Approved` and requeues for that moment, and a holder lets go
//!   (docs/design.md section 5: a re-run never overlaps the first attempt).
//! - TookEffect → the holder records the given result as the step's outcome at once;
//!   DidNotTakeEffect → once the attempt can no longer run, the holder records the step as
//!   not executed ([`super::grants::settle`]).

use serde_json::{json, Value};

use super::approvals::{
    approval_object, decision_time, hash_of, pending_status, record_decision, request_for,
    requested_event, short_hash, stored_object, write_status, Origin, Requirement,
};
use super::grants;
use super::loop_::{check_call, Flow};
use super::observe::millis_until;
use super::record::{observation, Txn};
use super::ApprovalWrite;
use crate::api::{
    Approval, ApprovalDecision, ApprovalPhase, ApprovalSpec, ApprovalStatus, EventType,
    ObservationKind, StepApproval, StepStatus, TerminalReason, Verdict, INPUT_REQUIRED,
};

/// How the latest Approval object stands.
enum Found {
    Missing,
    Undecodable(String),
    Present(Box<Approval>),
}

fn find(txn: &Txn, name: &str) -> Found {
    match txn.approvals.iter().find(|a| a.name == name) {
        None => Found::Missing,
        Some(snapshot) => match serde_json::from_value::<Approval>(snapshot.object.clone()) {
            Ok(approval) => Found::Present(Box::new(approval)),
            Err(err) => Found::Undecodable(format!("Approval {name} does not decode: {err}")),
        },
    }
}

/// A waiting run's latest Approval, for an observer or the holder (see the module doc).
pub(crate) fn waiting(txn: &mut Txn) {
    settle_waiting(txn);
    if txn.status.phase.is_terminal() {
        txn.release_and_stop();
    }
}

fn settle_waiting(txn: &mut Txn) {
    let awaiting = txn
        .status
        .steps
        .iter()
        .rposition(|s| s.status == StepStatus::AwaitingApproval);
    let latest = awaiting.and_then(|i| txn.status.steps[i].approvals.last().cloned());
    let (Some(index), Some(latest)) = (awaiting, latest) else {
        let detail = "status.phase is WaitingForApproval but no step awaits an approval".into();
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return;
    };
    let now = txn.now();
    let approval = match find(txn, &latest.name) {
        Found::Undecodable(detail) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            return;
        }
        Found::Missing => {
            if latest.expires_at.is_some_and(|e| e <= now) {
                expire(txn, index, &latest, None, None, None);
                return;
            }
            if let Err(detail) = recreate(txn, index, &latest) {
                txn.end_run(TerminalReason::InternalError, Some(detail), None);
                return;
            }
            park(txn, latest.expires_at);
            return;
        }
        Found::Present(approval) => approval,
    };
    if let Some(why) = foreign(txn, index, &latest) {
        rehome(txn, index, &latest, &why);
        return;
    }
    let hash = &approval.spec.hash;
    let decision = approval.spec.decision.clone();
    if *hash != latest.hash || decision.as_ref().is_some_and(|d| d.hash != *hash) {
        let detail = format!(
            "Approval {}: its hash does not match the record's {}; it is never executed",
            latest.name, latest.hash
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return;
    }
    let status = approval.status.clone().unwrap_or_default();
    match decision {
        None => {
            if latest.expires_at.is_some_and(|e| e <= now) {
                expire(txn, index, &latest, Some(&status), None, None);
                return;
            }
            if approval.status.is_none() || status.phase != ApprovalPhase::Pending {
                pending_status(txn, &latest.name, &latest.hash, latest.expires_at);
            }
            park(txn, latest.expires_at);
        }
        Some(decision) if decision.verdict == Verdict::Rejected => {
            reject(txn, index, &latest, &status, &decision);
        }
        Some(decision) => {
            // A decision first seen after the approval's expiry cannot be shown to have come
            // before it (the API server keeps no decision time): it fails closed and expires
            // (docs/behaviours.md 25).
            let decided_at = status
                .decided_at
                .or_else(|| decision_time(stored_object(txn, &latest.name)));
            let undatable_past_expiry =
                decided_at.is_none() && latest.expires_at.is_some_and(|e| e <= now);
            // Undatable: first seen now, which is what `approval.decided` records.
            let decided_at = decided_at.unwrap_or(now);
            let ttl = txn.run.spec.limits.grant_ttl_seconds;
            if undatable_past_expiry || ttl.is_some_and(|ttl| decided_at.plus_seconds(ttl) <= now) {
                expire(
                    txn,
                    index,
                    &latest,
                    Some(&status),
                    Some(&decision),
                    Some(decided_at),
                );
                return;
            }
            let mut status = status;
            status.decided_at = Some(decided_at);
            status.short_hash = Some(short_hash(&latest.hash));
            // docs/design.md section 5: nothing runs (and the agent is not asked again) while
            // the step's interrupted attempt may still be running; a TookEffect decision runs
            // nothing and records the outcome at once.
            let input = approval.spec.kind == INPUT_REQUIRED;
            let wait = (decision.verdict != Verdict::TookEffect && !input)
                .then(|| super::takeover::first_attempt(txn, index))
                .flatten()
                .filter(|first| first.may_run_until > now)
                .map(|first| first.may_run_until);
            if let Some(until) = wait {
                if txn.executor {
                    // An observer requeues for it; the executor holds no lease while it waits.
                    txn.release_and_stop();
                } else {
                    if decision.verdict == Verdict::Approved
                        && approval.status.as_ref().map(|s| s.phase)
                            != Some(ApprovalPhase::Approved)
                    {
                        status.phase = ApprovalPhase::Approved;
                        write_status(txn, &latest.name, status);
                    }
                    txn.requeue_after(millis_until(now, until));
                }
                return;
            }
            if txn.executor {
                let flow = match decision.verdict {
                    Verdict::TookEffect | Verdict::DidNotTakeEffect => {
                        grants::settle(txn, index, &latest, &approval, &decision, status)
                    }
                    Verdict::Approved if input => {
                        super::by_task::answer(txn, index, &latest, &approval, &decision, status)
                    }
                    _ => grants::execute_grant(txn, index, &latest, &approval, &decision, status),
                };
                if flow == Flow::Continue {
                    super::loop_::drive(txn);
                }
            } else {
                let approved = decision.verdict == Verdict::Approved;
                if approved
                    && (approval
                        .status
                        .as_ref()
                        .and_then(|s| s.decided_at)
                        .is_none()
                        || approval.status.as_ref().map(|s| s.phase)
                            != Some(ApprovalPhase::Approved))
                {
                    status.phase = ApprovalPhase::Approved;
                    write_status(txn, &latest.name, status);
                }
                // Executing a grant needs a lease.
                txn.acquire_lease(None);
            }
        }
    }
}

/// Nothing to do while the latest approval is pending: an observer requeues for its expiry,
/// the holder lets go.
fn park(txn: &mut Txn, expires_at: Option<crate::api::Time>) {
    if txn.executor {
        txn.release_and_stop();
    } else if let Some(expiry) = expires_at {
        let millis = millis_until(txn.now(), expiry);
        txn.requeue_after(millis);
    }
}

/// Why the stored Approval named like the record's `latest` is not the one this run asked for
/// for step `index` (issue 16: an object left by a deleted run of the same name, or created by
/// someone else; [`super::approvals::not_made_for`]). `None` when it is this run's.
fn foreign(txn: &Txn, index: usize, latest: &StepApproval) -> Option<String> {
    let object = stored_object(txn, &latest.name)?;
    super::approvals::not_made_for(txn, object, txn.index_at(index), &latest.hash)
}

/// The name a run pauses on when its Approval's name is taken by an object that is not its
/// own: the recorded name with the first 8 characters of the run's uid appended (so another
/// run's leftover cannot hold it); `None` when the recorded name is that already.
fn fresh_name(txn: &Txn, taken: &str) -> Option<String> {
    let uid: String = txn.run.uid.chars().take(8).collect();
    let suffix = format!("-{uid}");
    (!taken.ends_with(&suffix)).then(|| format!("{taken}{suffix}"))
}

/// Never adopts nor writes an Approval that is not the run's own (issue 16): the run records a
/// new `approval.requested` for a fresh name (with `replaces` and `conflict` saying why),
/// which the `ApprovalConflict` condition and a Warning Event show, and creates that Approval.
/// The leftover object is left exactly as it is.
fn rehome(txn: &mut Txn, index: usize, latest: &StepApproval, why: &str) {
    let Some(fresh) = fresh_name(txn, &latest.name) else {
        // Both names are taken (the recorded one and the one it was moved to): the run has
        // no name left to pause on and ends here, saying so truly (nothing of this step ran).
        let first = requested_event(txn, &latest.name)
            .and_then(|data| {
                let replaced = data["replaces"].as_str()?.to_string();
                let conflict = data["conflict"].as_str().unwrap_or("was taken").to_string();
                Some(format!("Approval {replaced} {conflict}, and "))
            })
            .unwrap_or_default();
        let detail = format!(
            "{first}Approval {} {why}: both names this step's approval can take are held by \
             objects not made for this run, so it cannot pause and ends without running step \
             {}; delete those objects, then create the run again",
            latest.name,
            txn.index_at(index)
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return;
    };
    let Some(mut data) = requested_event(txn, &latest.name) else {
        let detail = format!(
            "Approval {} {why}, and the record has no approval.requested for it",
            latest.name
        );
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return;
    };
    data["approval"] = json!(fresh);
    data["replaces"] = json!(latest.name);
    data["conflict"] = json!(why);
    if let Some(entry) = txn
        .status
        .steps
        .get_mut(index)
        .and_then(|s| s.approvals.iter_mut().find(|a| a.name == latest.name))
    {
        entry.name = fresh.clone();
    }
    txn.event(
        EventType::ApprovalRequested,
        Some(txn.index_at(index)),
        data,
    );
    let mut renamed = latest.clone();
    renamed.name = fresh;
    if let Err(detail) = recreate(txn, index, &renamed) {
        txn.end_run(TerminalReason::InternalError, Some(detail), None);
        return;
    }
    park(txn, renamed.expires_at);
}

/// Creates a recorded Approval that is missing, from the record (its `approval.requested`
/// event and the step's decision); the hash must come out as recorded.
fn recreate(txn: &mut Txn, index: usize, latest: &StepApproval) -> Result<(), String> {
    let requested = requested_event(txn, &latest.name)
        .ok_or_else(|| format!("Approval {}: no approval.requested event", latest.name))?;
    let text = |field: &str| {
        requested
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let present = |field: &str| requested.get(field).filter(|v| !v.is_null()).cloned();
    let requirement = Requirement {
        kind: latest.kind.clone(),
        reason: text("reason"),
        capability: present("capability"),
        presentation: present("presentation"),
        origin: Origin::Policy,
    };
    let decision = txn.status.steps[index].decision.clone().ok_or_else(|| {
        format!(
            "step {} awaits {} with no decision",
            txn.index_at(index),
            latest.name
        )
    })?;
    let (tool, args) = check_call(txn, &decision)
        .map_err(|_| format!("Approval {}: the step's call no longer checks", latest.name))?;
    let request = request_for(txn, index, tool, &args)?;
    let hash = hash_of(&requirement, &request)?;
    if hash != latest.hash {
        return Err(format!(
            "Approval {} is missing and the record does not rebuild it (hash {hash}, recorded {})",
            latest.name, latest.hash
        ));
    }
    let run = txn.run;
    let spec = ApprovalSpec {
        run_name: run.name.clone(),
        run_uid: run.uid.clone(),
        step_index: txn.index_at(index),
        kind: requirement.kind,
        request,
        capability: requirement.capability,
        presentation: requirement.presentation,
        reason: requirement.reason,
        hash,
        decision: None,
    };
    let object = approval_object(txn, &latest.name, &spec);
    txn.approval_writes
        .push(ApprovalWrite::Create { approval: object });
    pending_status(txn, &latest.name, &latest.hash, latest.expires_at);
    Ok(())
}

/// docs/behaviours.md 24 (and 35): the step fails `policy_denied`, the run ends `Cancelled`
/// `approval_rejected` with the note as detail.
fn reject(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    status: &ApprovalStatus,
    decision: &ApprovalDecision,
) {
    record_decision(txn, index, latest, decision);
    let content =
        json!({"approval": latest.name, "verdict": Verdict::Rejected, "note": decision.note});
    let summary = format!("Approval {} was rejected", latest.name);
    txn.fail_step(
        index,
        observation(ObservationKind::PolicyDenied, content, summary),
    );
    txn.end_run(
        TerminalReason::ApprovalRejected,
        decision.note.clone(),
        None,
    );
    let mut status = status.clone();
    status.phase = ApprovalPhase::Rejected;
    status.short_hash = Some(short_hash(&latest.hash));
    status.decided_at = Some(status.decided_at.unwrap_or(txn.now()));
    write_status(txn, &latest.name, status);
}

/// docs/behaviours.md 25: a pending approval past expiresAt, or a grant older than
/// grantTTLSeconds, expires; nothing executes. An expired grant's Approval keeps its
/// `decidedAt` (`decided_at`: when it was decided, or first seen when that cannot be dated).
fn expire(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    status: Option<&ApprovalStatus>,
    granted: Option<&ApprovalDecision>,
    decided_at: Option<crate::api::Time>,
) {
    if let Some(decision) = granted {
        record_decision(txn, index, latest, decision);
    }
    let content = json!({"approval": latest.name, "phase": ApprovalPhase::Expired});
    let summary = format!("Approval {} expired", latest.name);
    txn.fail_step(
        index,
        observation(ObservationKind::PolicyDenied, content, summary),
    );
    let detail = match granted {
        Some(_) => format!(
            "the grant of Approval {} expired unexecuted (grantTTLSeconds)",
            latest.name
        ),
        None => format!(
            "Approval {} expired undecided (approvalTTLSeconds)",
            latest.name
        ),
    };
    txn.end_run(TerminalReason::ApprovalExpired, Some(detail), None);
    if let Some(status) = status {
        let mut status = status.clone();
        status.phase = ApprovalPhase::Expired;
        status.short_hash = Some(short_hash(&latest.hash));
        // An expired grant was decided: say when, as the journal's `approval.decided` does.
        if granted.is_some() {
            status.decided_at = status.decided_at.or(decided_at);
        }
        write_status(txn, &latest.name, status);
    }
}
