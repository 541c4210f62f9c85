//! A new run's first write (docs/behaviours.md 1-3): what only the controller can judge about the
//! spec is checked before any step (each tool's inputSchema compiles, refers to nothing outside
//! itself, nests at most 256 levels; otherwise `internal_error` naming the field), then phase
//! `Running`, the lease record, `startedAt`, `run.created` {goal, limits, toolSpecHashes} and
//! `run.started`, merged with the first step's start (docs/design.md section 4).

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::canonical::content_hash;
use super::loop_::drive;
use super::record::{to_value, Txn};
use super::validate::{check_storable_at, ToolSchema};
use crate::api::{AgentRunSpec, EventType, RunPhase, TerminalReason};

/// [`super::Input::LeaseAcquired`] for a `Pending` run.
pub(crate) fn begin(txn: &mut Txn) {
    let spec = &txn.run.spec;
    let checked = check_spec(spec).and_then(|()| tool_spec_hashes(spec));
    let hashes = match checked {
        Ok(hashes) => hashes,
        Err(detail) => {
            let detail = format!("AgentRun {}/{}: {detail}", txn.run.namespace, txn.run.name);
            txn.end_run(TerminalReason::InternalError, Some(detail), None);
            drive(txn);
            return;
        }
    };
    txn.status.phase = RunPhase::Running;
    txn.take_lease();
    txn.status.started_at = Some(txn.now());
    let created = json!({
        "goal": spec.goal,
        "limits": to_value(&spec.limits),
        "toolSpecHashes": hashes,
    });
    txn.event(EventType::RunCreated, None, created);
    let epoch = txn.status.lease.as_ref().map_or(0, |l| l.epoch);
    let started = json!({"holder": txn.caller.holder, "epoch": epoch});
    txn.event(EventType::RunStarted, None, started);
    drive(txn);
}

/// What the API server's schema cannot refuse (docs/behaviours.md 1), checked again here so a run
/// applied to a server without the CRD's validation still fails cleanly.
fn check_spec(spec: &AgentRunSpec) -> Result<(), String> {
    let limits = &spec.limits;
    for (field, value) in [
        ("maxSteps", limits.max_steps),
        (
            "maxConsecutiveToolFailures",
            limits.max_consecutive_tool_failures,
        ),
        ("loopThreshold", limits.loop_threshold),
    ] {
        if value <= 0 {
            return Err(format!("spec.limits.{field} must be > 0 (got {value})"));
        }
    }
    for (index, tool) in spec.tools.iter().enumerate() {
        let field = format!("spec.tools[{index}]");
        if tool.name.is_empty() {
            return Err(format!("{field}.name must not be empty"));
        }
        if let Some(first) = spec.tools[..index].iter().position(|t| t.name == tool.name) {
            return Err(format!(
                "{field}.name {:?} repeats spec.tools[{first}].name; tool names must be unique",
                tool.name
            ));
        }
        if tool.timeout_seconds <= 0 {
            return Err(format!(
                "{field}.timeoutSeconds must be > 0 (got {})",
                tool.timeout_seconds
            ));
        }
        match &tool.input_schema {
            Value::Object(map) if !map.is_empty() => {}
            _ => {
                return Err(format!(
                    "{field}.inputSchema must be a non-empty JSON Schema object"
                ))
            }
        }
        check_storable_at(&tool.input_schema, &format!("{field}.inputSchema"))?;
        ToolSchema::compile(index, tool)?;
    }
    Ok(())
}

/// `{name: sha256 of the tool spec's canonical JSON}` for `run.created`.
fn tool_spec_hashes(spec: &AgentRunSpec) -> Result<BTreeMap<String, String>, String> {
    spec.tools
        .iter()
        .enumerate()
        .map(|(index, tool)| {
            content_hash(&to_value(tool))
                .map(|hash| (tool.name.clone(), hash))
                .map_err(|err| format!("spec.tools[{index}]: {err}"))
        })
        .collect()
}
