//! The property test over pins (docs/design.md section 6, docs/behaviours.md 60-61): random
//! scripts over an `mcp` tool and a toolset's tool, a server whose definitions change at a
//! random moment (or that cannot be listed at start), a person approving at random, and an
//! executor that does what the controller does: list the server and ask [`pins::check`]
//! before each call.
//!
//! Whatever happens: a call is never sent while the server's definition differs from the pin
//! (a changed pin never calls), every mcp call carries the pin the record holds, the pins are
//! written once (in the write holding `run.started`) and never rewritten, and a run whose
//! server cannot be listed ends `tool_unavailable` without a call.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::super::harness::*;
use super::super::mcp::{listing, mcp_run};
use crate::api::{RunPhase, TerminalReason, ToolFailure};
use crate::engine::pins::{self, PinCheck};
use crate::engine::ToolOutcome;

const ROUNDS: usize = 200;

#[derive(Debug, Clone)]
struct PinCase {
    /// Decisions: 0 search, 1 gh__create_issue, 2 complete.
    decisions: Vec<u8>,
    /// The round from which the server lists changed definitions (`None`: never).
    change_at: Option<usize>,
    /// Which tool's definition changes: 0 search, 1 create_issue.
    changes: u8,
    /// The server cannot be listed at start.
    down: bool,
    entropy: Vec<u8>,
}

fn pin_case() -> impl Strategy<Value = PinCase> {
    (
        prop::collection::vec(0..3u8, 1..10),
        prop::option::of(0..20usize),
        0..2u8,
        prop::bool::weighted(0.1),
        prop::collection::vec(any::<u8>(), ROUNDS),
    )
        .prop_map(|(decisions, change_at, changes, down, entropy)| PinCase {
            decisions,
            change_at,
            changes,
            down,
            entropy,
        })
}

fn served(case: &PinCase, round: usize) -> Vec<Value> {
    let mut listed = listing();
    if case.change_at.is_some_and(|at| round >= at) {
        let index = usize::from(case.changes);
        listed[index]["description"] = json!("Changed behind the run's back.");
    }
    listed
}

/// Plays the case; returns the harness and the pin hash each sent call was checked against.
fn play(case: &PinCase) -> (Harness, Vec<(String, String)>) {
    let decisions = case
        .decisions
        .iter()
        .map(|d| match d {
            0 => call("search", json!({"q": "x"})),
            1 => call("gh__create_issue", json!({"title": "t"})),
            _ => complete(json!({"done": true})),
        })
        .collect();
    let mut h = mcp_run(decisions);
    let mut sent = Vec::new();
    let mut pinned_once: Option<Value> = None;
    let mut entropy = case.entropy.iter().copied().cycle();
    for round in 0..ROUNDS {
        let status = h.status();
        if let Some(first) = &pinned_once {
            assert_eq!(
                &serde_json::to_value(&status.tool_pins).unwrap(),
                first,
                "the pins were rewritten"
            );
        } else if !status.tool_pins.is_empty() {
            pinned_once = Some(serde_json::to_value(&status.tool_pins).unwrap());
        }
        if status.phase.is_terminal() {
            break;
        }
        if status.phase == RunPhase::WaitingForApproval {
            let name = h.approvals.keys().last().cloned().expect("an Approval");
            if entropy.next().unwrap_or(0) % 3 != 0 {
                h.approve(&name);
            } else {
                h.reject(&name, "no");
            }
        }
        h.reconcile("r");
        if h.pending_listing.is_some() {
            let listed = served(case, round);
            h.list_tools("r", |_| {
                if case.down {
                    Err("connection refused".into())
                } else {
                    Ok(listed.clone())
                }
            });
        }
        while let Some(call) = h.pending_tool.clone() {
            let pin = call
                .pin
                .as_deref()
                .expect("an mcp call carries its pin")
                .clone();
            let recorded = h.status().tool_pins;
            assert!(recorded.contains(&pin), "the call's pin is the record's");
            let current = pins::definitions("server", &served(case, round)).expect("definitions");
            let outcome = match pins::check(&pin, &current).expect("check") {
                PinCheck::Unchanged => {
                    sent.push((pin.tool.clone(), pin.sha256.clone()));
                    let hash = pins::definition_sha256(
                        current
                            .iter()
                            .find(|d| d.name == pin.server_tool)
                            .expect("listed"),
                    )
                    .expect("hash");
                    assert_eq!(hash, pin.sha256, "a call sent with its definition changed");
                    ToolOutcome::Result {
                        status: 200,
                        content: json!({"ok": true}),
                        duration_ms: 1,
                    }
                }
                _ => ToolOutcome::Error {
                    failure: ToolFailure::DefinitionChanged,
                    status: None,
                    content: json!({"error": "changed"}),
                    duration_ms: 1,
                },
            };
            h.finish_tool("r", outcome);
        }
    }
    (h, sent)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_changed_pin_never_calls(case in pin_case()) {
        let (h, sent) = play(&case);
        let status = h.status();
        prop_assert!(status.phase.is_terminal(), "the run ends: {:?}", status.phase);
        if case.down {
            prop_assert_eq!(status.reason, Some(TerminalReason::ToolUnavailable));
            prop_assert!(sent.is_empty());
            prop_assert!(h.tool_calls.is_empty());
        }
        // Every refusal is recorded as definition_changed, and nothing was sent for it.
        let refused = h
            .events()
            .iter()
            .filter(|e| {
                e.data.as_ref().is_some_and(|d| d["error"]["failure"] == json!("definition_changed"))
            })
            .count();
        prop_assert_eq!(refused + sent.len(), h.tool_calls.len());
    }
}
