//! A new run's first write (docs/behaviours.md 1-3): the spec is checked before any step by
//! [`validate::spec`](super::validate::spec) (the rules `kubectl apply` and `agentrt lint`
//! apply too); a run that slipped past them fails `invalid_spec` with every problem, each
//! naming its field, before `run.started` (the spec as written before an MCP listing, the
//! pinned one again after it). Then phase `Running`, the lease record, `startedAt`,
//! `run.created` {goal, limits, toolSpecHashes} and `run.started`, merged with the first
//! step's start (docs/design.md section 4).
//!
//! A spec with MCP tools or toolsets is listed first (docs/design.md section 6, pinning;
//! docs/behaviours.md 60): the first transition writes nothing and asks for
//! [`ExternalCall::ListTools`]; the listing's transition pins every MCP tool (`status.toolPins`,
//! one `tool.pinned` {tool, sha256} per tool between `run.created` and `run.started`) in the
//! same write that starts the run. A server that cannot be listed, or that lists no tool a
//! spec'd `mcp` tool names, fails the run `tool_unavailable` naming it; a toolset that cannot be
//! expanded (an invalid or repeated name, an unused override) fails it `invalid_spec`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::canonical::content_hash;
use super::loop_::drive;
use super::pins::{self, PinError};
use super::record::{to_value, Txn};
use super::validate::spec as validate_spec;
use super::{ExternalCall, ServerListing};
use crate::api::{AgentRunSpec, EventType, RunPhase, TerminalReason, ToolDefinition, ToolPin};

/// [`super::Input::LeaseAcquired`] for a `Pending` run.
pub(crate) fn begin(txn: &mut Txn) {
    if refuse_invalid_spec(txn) {
        return;
    }
    if pins::needs_pins(&txn.run.spec) && txn.status.tool_pins.is_empty() {
        if txn.caller.draining {
            txn.release_and_stop();
        } else {
            let servers = pins::servers(&txn.run.spec);
            txn.call(ExternalCall::ListTools { servers });
        }
        return;
    }
    start(txn);
}

/// [`super::Input::ToolsListed`] for a `Pending` run: the pins are already in the working
/// record when they could be made ([`pin_listings`], applied before the transaction so that
/// every rule sees the pinned tools); otherwise the run fails naming why.
pub(crate) fn listed(txn: &mut Txn, listings: Vec<ServerListing>) {
    // Without pins the run's spec is still the one written (with pins it is the effective
    // one, already pinned by the same pure function); no pins and no error: toolsets whose
    // globs match nothing, and the run starts with no MCP tool.
    if txn.status.tool_pins.is_empty() {
        if let Err((reason, detail)) = pin_listings(&txn.run.spec, &listings) {
            let detail = format!("AgentRun {}/{}: {detail}", txn.run.namespace, txn.run.name);
            txn.end_run(reason, Some(detail), None);
            drive(txn);
            return;
        }
    }
    start(txn);
}

/// The pins of every MCP tool of `spec` from the servers' listings.
///
/// # Errors
/// `tool_unavailable` with a sentence naming the server (it could not be listed, its listing
/// holds something that is not a tool definition, or it lists no tool a spec'd `mcp` tool
/// names); `invalid_spec` for a toolset that cannot be expanded.
pub(crate) fn pin_listings(
    spec: &AgentRunSpec,
    listings: &[ServerListing],
) -> Result<Vec<ToolPin>, (TerminalReason, String)> {
    let mut read: Vec<(String, Vec<ToolDefinition>)> = Vec::new();
    for server in pins::servers(spec) {
        let unavailable = |detail: String| (TerminalReason::ToolUnavailable, detail);
        let listing = listings
            .iter()
            .find(|l| l.url == server.url)
            .ok_or_else(|| unavailable(format!("the MCP server {} was not listed", server.url)))?;
        let entries = listing.tools.as_ref().map_err(|err| {
            unavailable(format!(
                "the MCP server {} cannot be listed: {err}",
                server.url
            ))
        })?;
        let definitions =
            pins::definitions(&server.url, entries).map_err(|err| unavailable(err.to_string()))?;
        read.push((server.url, definitions));
    }
    pins::pin_all(spec, |url| {
        read.iter()
            .find(|(u, _)| u == url)
            .map_or(&[][..], |(_, d)| d.as_slice())
    })
    .map(|pins| {
        // Each pin records the revision its server spoke and who it said it was (docs/design.md
        // section 6, "MCP revisions").
        pins.into_iter()
            .map(|mut pin| {
                let listing = listings.iter().find(|l| l.url == pin.server);
                pin.protocol_version = listing.and_then(|l| l.protocol.clone());
                pin.server_info = listing.and_then(|l| l.server_info.clone());
                pin
            })
            .collect()
    })
    .map_err(|err| {
        let reason = match err {
            PinError::NotListed { .. } | PinError::InvalidDefinition { .. } => {
                TerminalReason::ToolUnavailable
            }
            _ => TerminalReason::InvalidSpec,
        };
        (reason, err.to_string())
    })
}

/// The first write of a run whose tools are known (pinned, when it has MCP tools).
fn start(txn: &mut Txn) {
    // The pinned tools' schemas are the servers': checked like the manifest's.
    if !txn.status.tool_pins.is_empty() && refuse_invalid_spec(txn) {
        return;
    }
    let spec = &txn.run.spec;
    let hashes = match tool_spec_hashes(spec) {
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
    // docs/behaviours.md 64: a pin whose annotations claim more danger than the manifest says
    // so in its event (projected as a Warning Event) and in the `ToolHintsDisagree` condition.
    let pinned: Vec<Value> = txn
        .status
        .tool_pins
        .iter()
        .map(|p| {
            let class = spec
                .tools
                .iter()
                .find(|t| t.name == p.tool)
                .map(|t| t.side_effect);
            let disagree: Vec<Value> = class
                .map(|class| pins::hint_disagreements(p.definition.annotations.as_ref(), class))
                .unwrap_or_default()
                .iter()
                .map(|d| json!({"hint": d.hint, "claim": d.claim, "manifest": d.manifest}))
                .collect();
            let mut data = json!({"tool": p.tool, "sha256": p.sha256});
            if !disagree.is_empty() {
                data["hintsDisagree"] = json!(disagree);
            }
            data
        })
        .collect();
    for data in pinned {
        txn.event(EventType::ToolPinned, None, data);
    }
    let epoch = txn.status.lease.as_ref().map_or(0, |l| l.epoch);
    let started = json!({"holder": txn.caller.holder, "epoch": epoch});
    txn.event(EventType::RunStarted, None, started);
    drive(txn);
}

/// docs/behaviours.md 1 and 80: a spec (or a name) with problems ends the run `invalid_spec`
/// before any step, its detail every problem (`field: message; ...`). Whether it did.
fn refuse_invalid_spec(txn: &mut Txn) -> bool {
    let problems = validate_spec::run(&txn.run.name, &txn.run.spec);
    if problems.is_empty() {
        return false;
    }
    let detail = format!(
        "AgentRun {}/{}: {}",
        txn.run.namespace,
        txn.run.name,
        validate_spec::render(&problems)
    );
    txn.end_run(TerminalReason::InvalidSpec, Some(detail), None);
    drive(txn);
    true
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
