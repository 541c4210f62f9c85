//! Approvals (DESIGN.md sections 2, 4, 5; BEHAVIOURS.md 19, 21-26, 34-35): the record is the
//! source of truth, the Approval object its projection.
//!
//! - [`pause`]: `approval.requested` {approval, kind, reason, capability, presentation, hash},
//!   step `awaiting_approval` and run `WaitingForApproval` in one write, then the Approval is
//!   created (Pending, shortHash, expiresAt when approvalTTLSeconds is set) and the lease
//!   released. The hash is computed over the request as it will be stored and read back.
//! - [`waiting`]: a waiting run's latest Approval (only the latest can grant). Missing → created
//!   again from the record; pending → nothing (requeue for its expiry), or `approval_expired`
//!   once past it; rejected → the step fails `policy_denied` and the run ends `Cancelled`
//!   `approval_rejected`; approved → expired when older than grantTTLSeconds, otherwise the
//!   holder executes it ([`grants::execute_grant`]) and an observer asks for the lease.
//!
//! Executing a grant is [`grants`]'s room.

use serde_json::{json, Value};

use super::grants;
use super::hash::approval_hash;
use super::loop_::{check_call, Flow};
use super::observe::millis_until;
use super::record::{observation, to_value, Txn};
use super::ApprovalWrite;
use crate::api::{
    Approval, ApprovalDecision, ApprovalPhase, ApprovalRequest, ApprovalSpec, ApprovalStatus,
    EventType, ObservationKind, RunPhase, RunRef, StepApproval, StepIndex, StepStatus,
    TerminalReason, ToolRef, Verdict,
};

/// Who asked for an approval (recorded in `approval.requested` as `origin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The policy's `require_approval`.
    Policy,
    /// A takeover found a non-ReadOnly call whose outcome is unknown.
    Interruption,
    /// The reconcile hook answered `waiting`.
    Reconcile,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Policy => "policy",
            Origin::Interruption => "interruption",
            Origin::Reconcile => "reconcile",
        }
    }
}

/// What an approval asks for, besides the request.
pub(crate) struct Requirement {
    pub kind: String,
    pub reason: Option<String>,
    pub capability: Option<Value>,
    pub presentation: Option<Value>,
    pub origin: Origin,
}

/// `<run>-<step>-<n>`, n counting from 1 per step.
pub fn approval_name(run: &str, step: StepIndex, n: usize) -> String {
    format!("{run}-{step}-{n}")
}

/// The names of the Approvals a stored record names (`steps[].approvals[].name`), in record
/// order, read leniently. These are the only Approvals the machine looks at: an Approval is
/// created after the write that records it, so every one of a run's Approvals is named here
/// (DESIGN.md section 4), and one named but missing is created again.
pub fn recorded_approvals(status: &Value) -> Vec<String> {
    status["steps"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .flat_map(|step| step["approvals"].as_array().map_or(&[][..], Vec::as_slice))
        .filter_map(|approval| approval["name"].as_str().map(str::to_string))
        .collect()
}

/// The first 12 hex characters after `sha256:` (the printer column).
pub fn short_hash(hash: &str) -> String {
    hash.trim_start_matches("sha256:")
        .chars()
        .take(12)
        .collect()
}

/// The request an approval of step `index` calling `spec.tools[tool]` with `args` covers, as it
/// will be stored and read back.
fn request_for(
    txn: &Txn,
    index: usize,
    tool: usize,
    args: &Value,
) -> Result<ApprovalRequest, String> {
    let run = txn.run;
    let spec_tool = &run.spec.tools[tool];
    let request = ApprovalRequest {
        run: RunRef {
            namespace: run.namespace.clone(),
            name: run.name.clone(),
            uid: run.uid.clone(),
        },
        step: StepIndex::at(index),
        tool: tool_ref(spec_tool),
        args: args.clone(),
    };
    serde_json::from_value(to_value(&request)).map_err(|e| format!("approval request: {e}"))
}

fn tool_ref(tool: &crate::api::ToolSpec) -> ToolRef {
    ToolRef {
        name: tool.name.clone(),
        description: tool.description.clone(),
        input_schema: tool.input_schema.clone(),
        side_effect: tool.side_effect,
        timeout_seconds: tool.timeout_seconds,
        terminal: tool.terminal,
    }
}

/// The hash an approval for `requirement` on this call would carry.
pub(crate) fn requirement_hash(
    txn: &Txn,
    index: usize,
    tool: usize,
    args: &Value,
    requirement: &Requirement,
) -> Result<String, String> {
    let request = request_for(txn, index, tool, args)?;
    approval_hash(
        &requirement.kind,
        requirement.capability.as_ref(),
        requirement.presentation.as_ref(),
        &request,
    )
    .map_err(|e| format!("approval hash: {e}"))
}

/// Pauses step `index` on a new Approval (BEHAVIOURS.md 19, 34).
pub(crate) fn pause(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    requirement: Requirement,
) -> Flow {
    let built = request_for(txn, index, tool, &args).and_then(|request| {
        let hash = approval_hash(
            &requirement.kind,
            requirement.capability.as_ref(),
            requirement.presentation.as_ref(),
            &request,
        )
        .map_err(|e| format!("approval hash: {e}"))?;
        Ok((request, hash))
    });
    let (request, hash) = match built {
        Ok(built) => built,
        Err(detail) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            return Flow::Continue;
        }
    };
    let run = txn.run;
    let now = txn.now();
    let n = txn.status.steps[index].approvals.len() + 1;
    let name = approval_name(&run.name, StepIndex::at(index), n);
    let expires_at = run
        .spec
        .limits
        .approval_ttl_seconds
        .map(|s| now.plus_seconds(s));
    let spec = ApprovalSpec {
        run_name: run.name.clone(),
        run_uid: run.uid.clone(),
        step_index: StepIndex::at(index),
        kind: requirement.kind.clone(),
        request,
        capability: requirement.capability.clone(),
        presentation: requirement.presentation.clone(),
        reason: requirement.reason.clone(),
        hash: hash.clone(),
        decision: None,
    };
    txn.add_active_time(index);
    let step = txn.step_mut(index);
    step.status = StepStatus::AwaitingApproval;
    step.approvals.push(StepApproval {
        name: name.clone(),
        kind: requirement.kind.clone(),
        hash: hash.clone(),
        requested_at: now,
        expires_at,
        verdict: None,
        executed: false,
    });
    txn.event(
        EventType::ApprovalRequested,
        Some(StepIndex::at(index)),
        json!({
            "approval": name,
            "kind": requirement.kind,
            "reason": requirement.reason,
            "capability": requirement.capability,
            "presentation": requirement.presentation,
            "hash": hash,
            "origin": requirement.origin.as_str(),
        }),
    );
    txn.status.phase = RunPhase::WaitingForApproval;
    txn.approval_writes.push(ApprovalWrite::Create {
        approval: approval_object(txn, &name, &spec),
    });
    pending_status(txn, &name, &hash, expires_at);
    txn.release_and_stop();
    Flow::Halt
}

/// The whole Approval object: metadata (name, namespace, labels, ownerReference) and spec.
fn approval_object(txn: &Txn, name: &str, spec: &ApprovalSpec) -> Value {
    let run = txn.run;
    let mut object = json!({
        "apiVersion": "agentrt.dev/v1alpha1",
        "kind": "Approval",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": {"agentrt.dev/run": run.name, "agentrt.dev/run-uid": run.uid},
            "ownerReferences": [{
                "apiVersion": "agentrt.dev/v1alpha1",
                "kind": "AgentRun",
                "name": run.name,
                "uid": run.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": to_value(spec),
    });
    if let Some(creator) = &run.created_by {
        object["metadata"]["annotations"] = json!({ super::RUN_CREATED_BY_ANNOTATION: creator });
    }
    object
}

fn pending_status(txn: &mut Txn, name: &str, hash: &str, expires_at: Option<crate::api::Time>) {
    let status = ApprovalStatus {
        phase: ApprovalPhase::Pending,
        short_hash: Some(short_hash(hash)),
        expires_at,
        ..ApprovalStatus::default()
    };
    write_status(txn, name, status);
}

/// The stored Approval `name`'s phase (`Pending` when it has no status yet) and
/// resourceVersion, when the transition read it.
fn stored_phase(txn: &Txn, name: &str) -> Option<(ApprovalPhase, Option<String>)> {
    let object = stored_object(txn, name)?;
    let phase = object
        .pointer("/status/phase")
        .and_then(|p| serde_json::from_value::<ApprovalPhase>(p.clone()).ok())
        .unwrap_or_default();
    let rv = object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    Some((phase, rv))
}

/// Whether a status write carrying `status` for the Approval whose record hash is `hash` may
/// land on `stored` (the object as just read): only on the run's own request (same
/// `spec.hash`, issue 16) and only moving its phase forward ([`ApprovalPhase::may_become`]).
/// Returns the resourceVersion to write on, or `None` when the write must not happen. The
/// controller asks this before a write the engine could not condition on a read (an Approval
/// created in the same transition).
pub fn status_write_version(stored: &Value, status: &Value, hash: &str) -> Option<String> {
    if stored.pointer("/spec/hash").and_then(Value::as_str) != Some(hash) {
        return None;
    }
    let phase = |v: Option<&Value>| {
        v.and_then(|p| serde_json::from_value::<ApprovalPhase>(p.clone()).ok())
            .unwrap_or_default()
    };
    if !phase(stored.pointer("/status/phase")).may_become(phase(status.get("phase"))) {
        return None;
    }
    stored
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// Asks for Approval `name`'s status to become `status` (DESIGN.md section 2: an Approval's
/// phase only moves forward). Nothing is asked when the phase read cannot become
/// `status.phase` (an Executed Approval never goes back to Approved); the write carries the
/// resourceVersion read, so a stale read changes nothing.
pub(crate) fn write_status(txn: &mut Txn, name: &str, status: ApprovalStatus) {
    if !own(txn, name) {
        // Another run's object (or another request's) is never written to (issue 16).
        return;
    }
    let (resource_version, allowed) = match stored_phase(txn, name) {
        Some((phase, rv)) => (rv, phase.may_become(status.phase)),
        None => (None, true),
    };
    let hash = txn
        .status
        .steps
        .iter()
        .flat_map(|s| s.approvals.iter())
        .find(|a| a.name == name)
        .map(|a| a.hash.clone());
    if let (true, Some(hash)) = (allowed, hash) {
        // Projections come before the transition's release and its next (the shape of
        // `Transition` in engine/mod.rs).
        txn.approval_writes.push(ApprovalWrite::Status {
            name: name.to_string(),
            status: to_value(&status),
            resource_version,
            hash,
        });
    }
}

/// Approvals the record names that can no longer grant but stand `Pending` or `Approved` end
/// `Cancelled` with the reason (DESIGN.md section 2; issue 16): the run ended, the step's call
/// was refused on re-check (its observation kind), or a later Approval of the step superseded
/// it. An Approval the step may still act on (the latest of a step awaiting approval), one
/// that was executed, one this transition already writes, and one not read are left alone.
pub(crate) fn cancel_spent(txn: &mut Txn) {
    let terminal = txn.status.phase.is_terminal();
    let mut spent = Vec::new();
    for step in &txn.status.steps {
        let latest = step.approvals.last().map(|a| a.name.as_str());
        for approval in &step.approvals {
            if approval.executed {
                continue;
            }
            let is_latest = latest == Some(approval.name.as_str());
            let may_grant =
                !terminal && is_latest && step.status == crate::api::StepStatus::AwaitingApproval;
            if may_grant {
                continue;
            }
            // The step's own ending names why (policy_denied, invalid_decision, ...), unless it
            // was only interrupted by the run's end, which then names it (operator_cancelled).
            let observed = step
                .observation
                .as_ref()
                .map(|o| to_value(&o.kind).as_str().unwrap_or_default().to_string())
                .filter(|kind| !kind.is_empty() && kind != "interrupted");
            let run_reason = txn
                .status
                .reason
                .map(|r| to_value(&r).as_str().unwrap_or_default().to_string());
            let reason = if !is_latest {
                "superseded".to_string()
            } else {
                match (observed, run_reason) {
                    (Some(kind), _) if step.status != crate::api::StepStatus::AwaitingApproval => {
                        kind
                    }
                    (_, Some(reason)) if terminal => reason,
                    _ => "step_ended".to_string(),
                }
            };
            spent.push((approval.name.clone(), approval.hash.clone(), reason));
        }
    }
    for (name, hash, reason) in spent {
        let already = txn
            .approval_writes
            .iter()
            .any(|e| matches!(e, ApprovalWrite::Status { name: n, .. } if *n == name));
        // Only an Approval that was read and decodes is projected onto (a record or Approval
        // that will not decode is never rewritten: guarantee 7).
        let decodes = stored_object(txn, &name)
            .is_some_and(|o| serde_json::from_value::<Approval>(o.clone()).is_ok());
        let Some((phase, _)) = stored_phase(txn, &name).filter(|_| decodes) else {
            continue;
        };
        if already || !matches!(phase, ApprovalPhase::Pending | ApprovalPhase::Approved) {
            continue;
        }
        let mut status = stored_object(txn, &name)
            .and_then(|o| o.get("status").cloned())
            .and_then(|s| serde_json::from_value::<ApprovalStatus>(s).ok())
            .unwrap_or_default();
        status.phase = ApprovalPhase::Cancelled;
        status.reason = Some(reason);
        status.short_hash = Some(short_hash(&hash));
        write_status(txn, &name, status);
    }
}

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
                expire(txn, index, &latest, None, None);
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
    if let Some(why) = foreign(txn, &approval, &latest) {
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
                expire(txn, index, &latest, Some(&status), None);
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
            // (BEHAVIOURS.md 25).
            let decided_at = status
                .decided_at
                .or_else(|| decision_time(stored_object(txn, &latest.name)));
            if decided_at.is_none() && latest.expires_at.is_some_and(|e| e <= now) {
                expire(txn, index, &latest, Some(&status), Some(&decision));
                return;
            }
            let decided_at = decided_at.unwrap_or(now);
            let ttl = txn.run.spec.limits.grant_ttl_seconds;
            if ttl.is_some_and(|ttl| decided_at.plus_seconds(ttl) <= now) {
                expire(txn, index, &latest, Some(&status), Some(&decision));
                return;
            }
            let mut status = status;
            status.decided_at = Some(decided_at);
            status.short_hash = Some(short_hash(&latest.hash));
            if txn.executor {
                let flow = grants::execute_grant(txn, index, &latest, &approval, &decision, status);
                if flow == Flow::Continue {
                    super::loop_::drive(txn);
                }
            } else {
                if approval
                    .status
                    .as_ref()
                    .and_then(|s| s.decided_at)
                    .is_none()
                    || approval.status.as_ref().map(|s| s.phase) != Some(ApprovalPhase::Approved)
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

/// The stored Approval object named `name`, as read.
fn stored_object<'a>(txn: &'a Txn, name: &str) -> Option<&'a serde_json::Value> {
    txn.approvals
        .iter()
        .find(|a| a.name == name)
        .map(|a| &a.object)
}

/// When the decision was written, from the API server's `metadata.managedFields` (the entry
/// whose fields include `spec.decision`); `None` when the server keeps no such entry.
pub(crate) fn decision_time(object: Option<&serde_json::Value>) -> Option<crate::api::Time> {
    object?
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .filter(|entry| entry.pointer("/fieldsV1/f:spec/f:decision").is_some())
        .filter_map(|entry| entry.get("time")?.as_str()?.parse::<jiff::Timestamp>().ok())
        .max()
        .map(crate::api::Time)
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
/// (issue 16: an object left by a deleted run of the same name, or created by someone else):
/// another run's uid, another step, or another request's hash. `None` when it is this run's.
fn foreign(txn: &Txn, approval: &Approval, latest: &StepApproval) -> Option<String> {
    let spec = &approval.spec;
    if spec.run_uid != txn.run.uid {
        Some(format!(
            "belongs to another run named {} (uid {})",
            spec.run_name, spec.run_uid
        ))
    } else if spec.hash != latest.hash {
        Some(format!(
            "carries another request (hash {}, this run asked for {})",
            spec.hash, latest.hash
        ))
    } else {
        None
    }
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
        let detail = format!(
            "Approval {} {why}, and the run has no other name to pause on; delete that \
             object to let the run go on",
            latest.name
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
        Some(StepIndex::at(index)),
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

/// Whether the stored Approval `name` is this run's own (or not read): only such an object's
/// status is ever written.
fn own(txn: &Txn, name: &str) -> bool {
    let Some(object) = stored_object(txn, name) else {
        return true;
    };
    let recorded = txn
        .status
        .steps
        .iter()
        .flat_map(|s| s.approvals.iter())
        .find(|a| a.name == name)
        .map(|a| a.hash.as_str());
    object.pointer("/spec/runUID").and_then(Value::as_str) == Some(txn.run.uid.as_str())
        && recorded.is_none_or(|h| object.pointer("/spec/hash").and_then(Value::as_str) == Some(h))
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
    let decision = txn.status.steps[index]
        .decision
        .clone()
        .ok_or_else(|| format!("step {index} awaits {} with no decision", latest.name))?;
    let (tool, args) = check_call(txn, &decision)
        .map_err(|_| format!("Approval {}: the step's call no longer checks", latest.name))?;
    let request = request_for(txn, index, tool, &args)?;
    let hash = approval_hash(
        &requirement.kind,
        requirement.capability.as_ref(),
        requirement.presentation.as_ref(),
        &request,
    )
    .map_err(|e| format!("approval hash: {e}"))?;
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
        step_index: StepIndex::at(index),
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

/// The data of the `approval.requested` event for `name`.
pub(crate) fn requested_event(txn: &Txn, name: &str) -> Option<Value> {
    txn.status
        .events
        .iter()
        .rev()
        .filter(|e| e.type_ == EventType::ApprovalRequested)
        .filter_map(|e| e.data.clone())
        .find(|d| d.get("approval").and_then(Value::as_str) == Some(name))
}

/// Copies a person's decision into the record (`approval.decided`).
pub(crate) fn record_decision(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    decision: &ApprovalDecision,
) {
    if let Some(a) = txn.status.steps[index]
        .approvals
        .iter_mut()
        .find(|a| a.name == latest.name)
    {
        a.verdict = Some(decision.verdict);
    }
    txn.event(
        EventType::ApprovalDecided,
        Some(StepIndex::at(index)),
        json!({
            "approval": latest.name,
            "verdict": decision.verdict,
            "approver": decision.approver,
            "note": decision.note,
        }),
    );
}

/// BEHAVIOURS.md 24 (and 35): the step fails `policy_denied`, the run ends `Cancelled`
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

/// BEHAVIOURS.md 25: a pending approval past expiresAt, or a grant older than
/// grantTTLSeconds, expires; nothing executes.
fn expire(
    txn: &mut Txn,
    index: usize,
    latest: &StepApproval,
    status: Option<&ApprovalStatus>,
    granted: Option<&ApprovalDecision>,
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
        write_status(txn, &latest.name, status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_approvals_a_record_names_are_read_from_its_steps() {
        let status = json!({"steps": [
            {"index": 0, "approvals": [{"name": "r-0-1"}, {"name": "r-0-2"}]},
            {"index": 1},
            {"index": 2, "approvals": [{"name": "r-2-1"}]},
        ]});
        assert_eq!(recorded_approvals(&status), ["r-0-1", "r-0-2", "r-2-1"]);
        assert!(recorded_approvals(&Value::Null).is_empty());
    }
}
