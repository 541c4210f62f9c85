//! Approvals (docs/design.md sections 2, 4, 5; docs/behaviours.md 19, 21-26, 34-35): the record is the
//! source of truth, the Approval object its projection. This room asks for Approvals and
//! projects the record onto them.
//!
//! - [`pause`]: `approval.requested` {approval, kind, reason, capability, presentation, hash},
//!   step `awaiting_approval` and run `WaitingForApproval` in one write, then the Approval is
//!   created (Pending, shortHash, expiresAt when approvalTTLSeconds is set) and the lease
//!   released. The hash is computed over the request as it will be stored and read back.
//! - [`write_status`]: an Approval's status only moves forward and is written only on the run's
//!   own object; [`cancel_spent`]: Approvals that can no longer grant end `Cancelled`.
//! - [`record_decision`]: a person's decision copied into the record (`approval.decided`).
//!
//! What a waiting run does with its latest Approval is [`super::waiting`]'s room; executing a
//! grant is [`super::grants`]'s.

use serde_json::{json, Value};

use super::hash::approval_hash;
use super::loop_::Flow;
use super::record::{to_value, Txn};
use super::ApprovalWrite;
use crate::api::{
    Approval, ApprovalDecision, ApprovalPhase, ApprovalRequest, ApprovalSpec, ApprovalStatus,
    EventType, RunPhase, RunRef, StepApproval, StepIndex, StepStatus, TerminalReason, ToolRef,
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
    /// A followed MCP task asked for input (`input_required`).
    TaskInput,
}

impl Origin {
    fn as_str(self) -> &'static str {
        match self {
            Origin::Policy => "policy",
            Origin::Interruption => "interruption",
            Origin::Reconcile => "reconcile",
            Origin::TaskInput => "task_input",
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
/// (docs/design.md section 4), and one named but missing is created again.
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
pub(crate) fn request_for(
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
        step: txn.index_at(index),
        tool: tool_ref(
            spec_tool,
            super::calls::pin_of(txn, &spec_tool.name, spec_tool.mcp.is_some()),
        ),
        args: args.clone(),
    };
    serde_json::from_value(to_value(&request)).map_err(|e| format!("approval request: {e}"))
}

fn tool_ref(tool: &crate::api::ToolSpec, pin: Option<crate::api::ToolPin>) -> ToolRef {
    ToolRef {
        pin_sha256: pin.map(|p| p.sha256),
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
    hash_of(requirement, &request_for(txn, index, tool, args)?)
}

/// The hash an approval for `requirement` over `request` carries (docs/design.md section 2,
/// the hash).
pub(crate) fn hash_of(
    requirement: &Requirement,
    request: &ApprovalRequest,
) -> Result<String, String> {
    approval_hash(
        &requirement.kind,
        requirement.capability.as_ref(),
        requirement.presentation.as_ref(),
        request,
    )
    .map_err(|e| format!("approval hash: {e}"))
}

/// Pauses step `index` on a new Approval (docs/behaviours.md 19, 34).
pub(crate) fn pause(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    requirement: Requirement,
) -> Flow {
    let built = request_for(txn, index, tool, &args)
        .and_then(|request| hash_of(&requirement, &request).map(|hash| (request, hash)));
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
    let name = approval_name(&run.name, txn.index_at(index), n);
    let expires_at = run
        .spec
        .limits
        .approval_ttl_seconds
        .map(|s| now.plus_seconds(s));
    let spec = ApprovalSpec {
        run_name: run.name.clone(),
        run_uid: run.uid.clone(),
        step_index: txn.index_at(index),
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
        Some(txn.index_at(index)),
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
pub(crate) fn approval_object(txn: &Txn, name: &str, spec: &ApprovalSpec) -> Value {
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

pub(crate) fn pending_status(
    txn: &mut Txn,
    name: &str,
    hash: &str,
    expires_at: Option<crate::api::Time>,
) {
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

/// Asks for Approval `name`'s status to become `status` (docs/design.md section 2: an Approval's
/// phase only moves forward). Nothing is asked when the phase read cannot become
/// `status.phase` (an Executed Approval never goes back to Approved); the write carries the
/// resourceVersion read, so a stale read changes nothing.
pub(crate) fn write_status(txn: &mut Txn, name: &str, status: ApprovalStatus) {
    if !own(txn, name) {
        // Another run's object (or another request's) is never written to (issue 16).
        return;
    }
    let (resource_version, allowed, read_phase) = match stored_phase(txn, name) {
        Some((phase, rv)) => (rv, phase.may_become(status.phase), Some(phase)),
        None => (None, true, None),
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
            read_phase,
            hash,
        });
    }
}

/// Approvals the record names that can no longer grant but stand `Pending` or `Approved` end
/// `Cancelled` with the reason (docs/design.md section 2; issue 16): the run ended
/// ([`run_end_reason`]), the step's call
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
                .map(|r| run_end_reason(txn.status.phase, r));
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

/// Why an Approval of a run that ended can no longer grant, as its `status.reason` says it
/// (docs/design.md section 2): `run completed`, `run cancelled` (by an operator), `run
/// cancelled: approval_rejected`, `run failed: limit_steps`, ... (the terminal reason as the
/// record spells it).
pub(crate) fn run_end_reason(phase: RunPhase, reason: TerminalReason) -> String {
    let word = to_value(&reason).as_str().unwrap_or_default().to_string();
    match (phase, reason) {
        (RunPhase::Completed, _) => "run completed".to_string(),
        (RunPhase::Cancelled, TerminalReason::OperatorCancelled) => "run cancelled".to_string(),
        (RunPhase::Cancelled, _) => format!("run cancelled: {word}"),
        _ => format!("run failed: {word}"),
    }
}

/// The stored Approval object named `name`, as read.
pub(crate) fn stored_object<'a>(txn: &'a Txn, name: &str) -> Option<&'a serde_json::Value> {
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

/// Whether the stored Approval `name` is this run's own (or not read): only such an object's
/// status is ever written ([`not_made_for`]).
fn own(txn: &Txn, name: &str) -> bool {
    let Some(object) = stored_object(txn, name) else {
        return true;
    };
    let recorded = txn.status.steps.iter().find_map(|s| {
        s.approvals
            .iter()
            .find(|a| a.name == name)
            .map(|a| (s.index, a))
    });
    match recorded {
        Some((step, approval)) => not_made_for(txn, object, step, &approval.hash).is_none(),
        None => {
            object.pointer("/spec/runUID").and_then(Value::as_str) == Some(txn.run.uid.as_str())
        }
    }
}

/// Why the stored Approval `object` was not made by this run for step `step`'s request with
/// hash `hash` (docs/design.md section 2, issue 14): another run's uid (in `spec.runUID`, its
/// controller ownerReference or its `agentrt.dev/run-uid` label), another run's name (in
/// `spec.runName` or the `agentrt.dev/run` label), another step, another run or step in
/// `spec.request`, or another hash. `None` when it is exactly what this run creates. Such an
/// object is never adopted, decided on or written to.
pub(crate) fn not_made_for(
    txn: &Txn,
    object: &Value,
    step: StepIndex,
    hash: &str,
) -> Option<String> {
    let run = txn.run;
    let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str);
    let spec_uid = text("/spec/runUID").unwrap_or_default();
    if spec_uid != run.uid {
        return Some(format!(
            "belongs to another run named {} (uid {spec_uid})",
            text("/spec/runName").unwrap_or_default()
        ));
    }
    let owned = object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|owners| {
            owners.iter().any(|o| {
                o["kind"] == "AgentRun"
                    && o["uid"].as_str() == Some(run.uid.as_str())
                    && o["controller"] == true
            })
        });
    if !owned {
        return Some(format!(
            "is not owned by this run (no controller ownerReference to AgentRun {} uid {})",
            run.name, run.uid
        ));
    }
    let labels = (
        text("/metadata/labels/agentrt.dev~1run"),
        text("/metadata/labels/agentrt.dev~1run-uid"),
    );
    if labels != (Some(run.name.as_str()), Some(run.uid.as_str())) {
        return Some(format!(
            "carries other labels (agentrt.dev/run {:?}, agentrt.dev/run-uid {:?}; this run is {} uid {})",
            labels.0.unwrap_or_default(),
            labels.1.unwrap_or_default(),
            run.name,
            run.uid
        ));
    }
    let request_run = object.pointer("/spec/request/run");
    let same_run = request_run.is_some_and(|r| {
        r["namespace"].as_str() == Some(run.namespace.as_str())
            && r["name"].as_str() == Some(run.name.as_str())
            && r["uid"].as_str() == Some(run.uid.as_str())
    });
    let steps = (
        object.pointer("/spec/stepIndex").and_then(Value::as_i64),
        object.pointer("/spec/request/step").and_then(Value::as_i64),
    );
    if text("/spec/runName") != Some(run.name.as_str())
        || !same_run
        || steps != (Some(step.get()), Some(step.get()))
    {
        return Some(format!(
            "carries another request (for run {}, step {:?}; this run asked for step {step})",
            request_run.map(Value::to_string).unwrap_or_default(),
            steps.1
        ));
    }
    let stored_hash = text("/spec/hash").unwrap_or_default();
    if stored_hash != hash {
        return Some(format!(
            "carries another request (hash {stored_hash}, this run asked for {hash})"
        ));
    }
    None
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
        Some(txn.index_at(index)),
        json!({
            "approval": latest.name,
            "verdict": decision.verdict,
            "approver": decision.approver,
            "note": decision.note,
        }),
    );
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

    #[test]
    fn an_approval_of_a_run_that_ended_says_how_it_ended() {
        use TerminalReason as R;
        let cases = [
            (RunPhase::Completed, R::GoalCompleted, "run completed"),
            (RunPhase::Cancelled, R::OperatorCancelled, "run cancelled"),
            (
                RunPhase::Cancelled,
                R::ApprovalExpired,
                "run cancelled: approval_expired",
            ),
            (RunPhase::Failed, R::LimitSteps, "run failed: limit_steps"),
            (
                RunPhase::Failed,
                R::InternalError,
                "run failed: internal_error",
            ),
        ];
        for (phase, reason, said) in cases {
            assert_eq!(run_end_reason(phase, reason), said);
        }
    }
}
