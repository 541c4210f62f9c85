//! A tool call's way from the policy to the tool (docs/design.md sections 3-4; docs/behaviours.md 11-14,
//! 21-22): the policy sees the canonical args; `allow` writes the step `executing`,
//! `step.policy` and `step.tool_started` in one write and only then asks for
//! [`ExternalCall::Tool`]; `deny` fails the step `policy_denied` with `step.policy` in the same
//! write and the loop goes on; `abort` ends the run `policy_abort`; `require_approval` pauses
//! ([`approvals::pause`]). A `when` that fails on these args pauses on a `policy_error`
//! Approval (docs/behaviours.md 12); any other policy error (a `when` that cannot compile, an
//! empty glob: a policy edited on a live run past admission), or a capability or presentation
//! the record cannot store, fails the run `internal_error` before anything executes or any
//! Approval exists.
//!
//! The run's own decision is combined with the admin policies that select it
//! ([`admin::combine`]: the most restrictive wins); `step.policy.source` names the admin policy
//! that decided, and so does its Approval's `presentation.policy`.
//!
//! Re-evaluating for a grant: `allow`, or `require_approval` with the grant's own hash,
//! executes the grant. An approval the policy did not ask for (an `interrupted_side_effect`
//! Approval, or a pause the reconcile hook asked for) was given for this exact request by a
//! person who saw it, so a policy that requires approval is satisfied by it.

use serde_json::{json, Value};

use super::approvals::{self, Origin, Requirement};
use super::loop_::Flow;
use super::policy::admin::{self, Decided};
use super::policy::{self, PolicyDecision, PolicyError};
use super::record::{observation, Txn};
use super::validate::check_storable;
use super::{ExternalCall, ToolCall};
use crate::api::{
    EventType, ObservationKind, PolicyDecisionKind, PolicyRecord, StepStatus, TerminalReason,
    POLICY_ERROR,
};

/// The approval a re-evaluation is for.
pub(crate) struct Grant {
    /// The Approval's name.
    pub name: String,
    /// Its hash.
    pub hash: String,
    /// Who asked for it.
    pub origin: Origin,
    /// The Approval object's status as read, for the `Executed` projection.
    pub status: crate::api::ApprovalStatus,
}

/// Evaluates the policy for step `index` calling `spec.tools[tool]` with the canonical `args`
/// and acts on it.
pub(crate) fn evaluate(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    grant: Option<Grant>,
) -> Flow {
    let spec = &txn.run.spec;
    let decided = match policy::evaluate(&spec.policy, &spec.tools[tool], &args) {
        Err(PolicyError::Eval {
            index: rule_index,
            name,
            detail,
        }) => Ok(policy_error_decision(
            txn, tool, &args, rule_index, name, detail,
        )),
        other => other.map_err(|err| format!("policy error: {err}")),
    }
    .map(|own| admin::combine(own, &txn.caller.admin, &spec.tools[tool], &args))
    .and_then(|d| check_policy_json(&d.decision).map(|()| d));
    let Decided { decision, source } = match decided {
        Ok(decided) => decided,
        Err(detail) => {
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            return Flow::Continue;
        }
    };
    let record = PolicyRecord {
        decision: decision.decision,
        rule: decision.rule.clone(),
        reason: decision.reason.clone(),
        source: source.clone(),
    };
    let mut data = json!({
        "decision": record.decision,
        "rule": record.rule,
        "reason": record.reason,
    });
    if let Some(source) = &record.source {
        data["source"] = json!(source);
    }
    txn.step_mut(index).policy = Some(record);
    txn.event(EventType::StepPolicy, Some(txn.index_at(index)), data);
    match decision.decision {
        PolicyDecisionKind::Allow => start_tool(txn, index, tool, args, grant),
        PolicyDecisionKind::Deny => {
            let mut content = json!({
                "tool": txn.run.spec.tools[tool].name,
                "rule": decision.rule,
                "reason": decision.reason,
            });
            // docs/design.md section 6, admin policies: an admin's denial names its policy.
            let who = match &source {
                Some(source) => {
                    content["policy"] = json!(source.display_name());
                    format!("the admin policy {}", source.display_name())
                }
                None => "the policy".to_string(),
            };
            let summary = match &decision.reason {
                Some(reason) => format!("{who} denied this call: {reason}"),
                None => format!("{who} denied this call"),
            };
            txn.add_active_time(index);
            txn.fail_step(
                index,
                observation(ObservationKind::PolicyDenied, content, summary),
            );
            Flow::Continue
        }
        PolicyDecisionKind::Abort => {
            let detail = decision
                .reason
                .clone()
                .or_else(|| decision.rule.as_ref().map(|r| format!("policy rule {r}")));
            // An admin's abort names its policy (docs/design.md section 6, admin policies).
            let detail = match (&source, detail) {
                (Some(source), Some(detail)) => {
                    Some(format!("{}: {detail}", source.display_name()))
                }
                (Some(source), None) => Some(format!("{} aborts this call", source.display_name())),
                (None, detail) => detail,
            };
            txn.add_active_time(index);
            let now = txn.now();
            let step = txn.step_mut(index);
            step.status = StepStatus::Failed;
            step.finished_at = Some(now);
            txn.event(
                EventType::StepFailed,
                Some(txn.index_at(index)),
                json!({"reason": TerminalReason::PolicyAbort}),
            );
            txn.end_run(TerminalReason::PolicyAbort, detail, None);
            Flow::Continue
        }
        PolicyDecisionKind::RequireApproval => {
            let requirement = Requirement {
                kind: decision
                    .approval_kind
                    .clone()
                    .unwrap_or_else(|| "policy".to_string()),
                reason: decision.reason.clone(),
                capability: decision.capability.clone(),
                // A requirement with no presentation of its own (a class default) shows the
                // call itself.
                presentation: decision.presentation.clone().or_else(|| {
                    let tool = &txn.run.spec.tools[tool];
                    let mut shown = json!({
                        "tool": tool.name,
                        "args": args,
                        "sideEffect": tool.side_effect,
                        "reason": decision.reason,
                    });
                    if let Some(mcp) = mcp_presentation(txn, tool) {
                        shown["mcp"] = mcp;
                    }
                    Some(shown)
                }),
                origin: Origin::Policy,
            };
            // docs/design.md section 6, admin policies: the Approval names the admin policy
            // that required it.
            let mut requirement = requirement;
            if let (Some(source), Some(Value::Object(shown))) =
                (&source, requirement.presentation.as_mut())
            {
                shown.insert(
                    "policy".into(),
                    admin::presentation_of(source, decision.rule.as_deref()),
                );
            }
            if let Some(grant) = grant {
                let satisfied = grant.origin != Origin::Policy
                    || approvals::requirement_hash(txn, index, tool, &args, &requirement)
                        .is_ok_and(|hash| hash == grant.hash);
                if satisfied {
                    return start_tool(txn, index, tool, args, Some(grant));
                }
            }
            approvals::pause(txn, index, tool, args, requirement)
        }
    }
}

/// docs/behaviours.md 12: a rule whose `when` failed on these args (a missing key, a wrong
/// type) neither allows nor denies: the call pauses on a `policy_error` Approval presenting the
/// rule, its expression, the error and the args, so a person decides (nothing runs, the run is
/// kept). The same error on re-evaluation gives the same requirement, hence the same hash, so
/// an approved `policy_error` Approval executes its call.
fn policy_error_decision(
    txn: &Txn,
    tool: usize,
    args: &Value,
    rule_index: usize,
    name: String,
    detail: String,
) -> PolicyDecision {
    let spec = &txn.run.spec;
    let tool = &spec.tools[tool];
    let when = spec
        .policy
        .rules
        .get(rule_index)
        .and_then(|r| r.when.clone());
    let reason = format!(
        "policy rule {name} could not be evaluated on these args ({detail}); decide the call \
         yourself, or fix the rule"
    );
    PolicyDecision {
        decision: PolicyDecisionKind::RequireApproval,
        rule: Some(name.clone()),
        reason: Some(reason.clone()),
        approval_kind: Some(POLICY_ERROR.to_string()),
        capability: None,
        presentation: Some(json!({
            "tool": tool.name,
            "args": args,
            "sideEffect": tool.side_effect,
            "rule": {"index": rule_index, "name": name, "when": when},
            "error": detail,
            "reason": reason,
        })),
    }
}

/// docs/behaviours.md 12: a capability or presentation must be JSON the record can store.
fn check_policy_json(decision: &PolicyDecision) -> Result<(), String> {
    for (field, value) in [
        ("capability", &decision.capability),
        ("presentation", &decision.presentation),
    ] {
        if let Some(value) = value {
            let checked = if value.is_object() {
                check_storable(value)
            } else {
                Err(format!(
                    "it must be a JSON object, got {}",
                    super::validate::json_kind(value)
                ))
            };
            checked.map_err(|err| {
                let rule = decision.rule.as_deref().unwrap_or("(class default)");
                format!("policy rule {rule}: {field} is not storable JSON: {err}")
            })?;
        }
    }
    Ok(())
}

/// Starts the tool: step `executing`, `attempts` + 1, `step.tool_started` (with the approval
/// when a grant executes, marked executed in the same write), then [`ExternalCall::Tool`].
pub(crate) fn start_tool(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    grant: Option<Grant>,
) -> Flow {
    start(txn, index, tool, args, grant, None)
}

/// Starts the interrupted step `index`'s call again with the same idempotency key, as its tool
/// allows (docs/design.md section 5, "a tool that answers by key"): as [`start_tool`], the
/// attempt's `step.tool_started` carrying `resent` (`why`), the call sent after `delay_millis`.
pub(crate) fn start_tool_again(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    why: Value,
    delay_millis: u64,
) -> Flow {
    start(txn, index, tool, args, None, Some((why, delay_millis)))
}

fn start(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    grant: Option<Grant>,
    resent: Option<(Value, u64)>,
) -> Flow {
    if txn.caller.draining {
        // Never record a start the replica will not make: the step stays `deciding`, and the
        // next holder asks the agent again.
        txn.release_and_stop();
        return Flow::Halt;
    }
    let now = txn.now();
    let spec_tool = txn.run.spec.tools[tool].clone();
    let step = txn.step_mut(index);
    step.status = StepStatus::Executing;
    step.attempts = step.attempts.saturating_add(1);
    let attempt = step.attempts;
    let mut data = json!({"tool": spec_tool.name, "args": args, "attempt": attempt});
    if let Some(grant) = &grant {
        // docs/behaviours.md 22: the wait was not active time; the grant is spent in this write.
        step.started_at = Some(now);
        if let Some(approval) = step.approvals.iter_mut().find(|a| a.name == grant.name) {
            approval.executed = true;
        }
        data["approval"] = json!(grant.name);
    }
    let delay_millis = match resent {
        Some((why, delay_millis)) => {
            data["resent"] = why;
            if delay_millis > 0 {
                // Sent no earlier than this: what bounds the attempt's end is from here on
                // (takeover::first_attempt).
                let millis = i64::try_from(delay_millis).unwrap_or(i64::MAX);
                data["notBefore"] = json!(crate::api::Time::from_millis(
                    now.as_millis().saturating_add(millis)
                ));
            }
            delay_millis
        }
        None => 0,
    };
    txn.event(EventType::StepToolStarted, Some(txn.index_at(index)), data);
    if let Some(grant) = grant {
        let mut status = grant.status;
        status.phase = crate::api::ApprovalPhase::Executed;
        status.executed_at = Some(now);
        super::approvals::write_status(txn, &grant.name, status);
    }
    let pin = pin_of(txn, &spec_tool.name, spec_tool.mcp.is_some()).map(Box::new);
    let job = spec_tool.job.is_some().then_some(super::JobStage::Create);
    txn.call(ExternalCall::Tool(ToolCall {
        step: txn.index_at(index),
        attempt,
        tool: spec_tool,
        args,
        idempotency_key: format!("{}/{}", txn.run.uid, txn.index_at(index)),
        pin,
        delay_millis,
        job,
        task: None,
    }));
    Flow::Halt
}

/// The pin of the run's tool `name` when it is an `mcp` tool (docs/design.md section 6).
pub(crate) fn pin_of(txn: &Txn, name: &str, mcp: bool) -> Option<crate::api::ToolPin> {
    if !mcp {
        return None;
    }
    txn.status
        .tool_pins
        .iter()
        .find(|p| p.tool == name)
        .cloned()
}

/// What an Approval of a call of `tool` shows of its MCP server (docs/behaviours.md 65): the
/// server, the server's tool, the pin's hash and the server's annotations (shown, never
/// trusted); `None` for a tool that is not an `mcp` one.
pub(crate) fn mcp_presentation(txn: &Txn, tool: &crate::api::ToolSpec) -> Option<Value> {
    pin_of(txn, &tool.name, tool.mcp.is_some()).map(|pin| {
        json!({
            "server": pin.server,
            "tool": pin.server_tool,
            "pinSha256": pin.sha256,
            "annotations": pin.definition.annotations,
        })
    })
}
