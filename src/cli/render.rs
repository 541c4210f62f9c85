//! Text rendering of runs, approvals and events for the operator CLI. Every string that a
//! model, a tool or a manifest author chose passes through [`super::escape`].

use std::fmt::Write as _;

use serde_json::Value;

use crate::api::{AgentRun, Approval, PolicyRecord, RunEvent, Verdict};

use super::escape::{escape_bounded, render_json, render_json_line, DEFAULT_MAX_CHARS};

/// `text` escaped and bounded for a terminal ([`super::escape`]).
pub(super) fn esc(text: &str) -> String {
    escape_bounded(text, DEFAULT_MAX_CHARS)
}

fn short(text: &str, max: usize) -> String {
    escape_bounded(text, max)
}

fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] + 3 - cell.chars().count();
                text.push_str(cell);
                text.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.iter().map(|h| h.to_string()).collect(), &mut out);
    for row in rows {
        line(row, &mut out);
    }
    out
}

fn or_dash(value: Option<String>) -> String {
    value
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

fn wire<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_string(),
    }
}

/// `NAME PHASE STEPS TOOL REASON` (with `NAMESPACE` first for all namespaces).
pub fn runs_table(runs: &[AgentRun], with_namespace: bool) -> String {
    let mut header = vec!["NAME", "PHASE", "STEPS", "TOOL", "REASON"];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let rows = runs
        .iter()
        .map(|run| {
            let status = run.status.clone().unwrap_or_default();
            let mut row = vec![
                esc(run.metadata.name.as_deref().unwrap_or("")),
                wire(&status.phase),
                status.step_count.to_string(),
                or_dash(status.current_tool.map(|t| short(&t, 40))),
                or_dash(status.reason.map(|r| wire(&r))),
            ];
            if with_namespace {
                row.insert(0, esc(run.metadata.namespace.as_deref().unwrap_or("")));
            }
            row
        })
        .collect();
    table(&header, rows)
}

/// A duration as kubectl prints an age: `45s`, `5m30s`, `42m`, `3h25m`, `30h`, `4d`.
pub fn human_duration(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..28_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28_800..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// `NAME RUN STEP KIND TOOL PHASE HASH AGE EXPIRES`: AGE since `metadata.creationTimestamp`,
/// EXPIRES the time left before `status.expiresAt` of a Pending Approval (`expired` once past;
/// `-` for a decided one or one without expiry), both at `now`.
pub fn approvals_table(
    approvals: &[Approval],
    with_namespace: bool,
    now: jiff::Timestamp,
) -> String {
    let mut header = vec![
        "NAME", "RUN", "STEP", "KIND", "TOOL", "PHASE", "HASH", "AGE", "EXPIRES",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let rows = approvals
        .iter()
        .map(|a| {
            let phase = a
                .status
                .as_ref()
                .map(|s| wire(&s.phase))
                .unwrap_or_else(|| "Pending".into());
            let mut row = vec![
                esc(a.metadata.name.as_deref().unwrap_or("")),
                esc(&a.spec.run_name),
                a.spec.step_index.to_string(),
                short(&a.spec.kind, 40),
                short(&a.spec.request.tool.name, 40),
                phase,
                esc(&a
                    .spec
                    .hash
                    .trim_start_matches("sha256:")
                    .chars()
                    .take(12)
                    .collect::<String>()),
                or_dash(
                    a.metadata
                        .creation_timestamp
                        .as_ref()
                        .map(|t| human_duration(now.duration_since(t.0).as_secs())),
                ),
                expires_in(a, now),
            ];
            if with_namespace {
                row.insert(0, esc(a.metadata.namespace.as_deref().unwrap_or("")));
            }
            row
        })
        .collect();
    table(&header, rows)
}

/// The EXPIRES cell of [`approvals_table`].
fn expires_in(approval: &Approval, now: jiff::Timestamp) -> String {
    let Some(status) = approval.status.as_ref() else {
        return "-".to_string();
    };
    match (status.phase, &status.expires_at) {
        (crate::api::ApprovalPhase::Pending, Some(at)) => {
            let left = at.0.duration_since(now).as_secs();
            if left <= 0 {
                "expired".to_string()
            } else {
                human_duration(left)
            }
        }
        _ => "-".to_string(),
    }
}

/// A run: its state, its steps, and its events timeline.
pub fn run_details(run: &AgentRun) -> String {
    let mut out = String::new();
    let status = run.status.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "AgentRun {}/{}",
        esc(run.metadata.namespace.as_deref().unwrap_or("")),
        esc(run.metadata.name.as_deref().unwrap_or(""))
    );
    let _ = writeln!(out, "  Goal:    {}", esc(&run.spec.goal));
    let _ = writeln!(out, "  Phase:   {}", wire(&status.phase));
    if let Some(reason) = status.reason {
        let _ = writeln!(out, "  Reason:  {}", wire(&reason));
    }
    if let Some(detail) = &status.reason_detail {
        let _ = writeln!(out, "  Detail:  {}", esc(detail));
    }
    if let Some(result) = &status.result {
        let _ = writeln!(
            out,
            "  Result:  {}",
            render_json(result, 200).replace('\n', "\n           ")
        );
    }
    if let Some(lease) = &status.lease {
        let _ = writeln!(
            out,
            "  Holder:  {} (epoch {})",
            esc(&lease.holder),
            lease.epoch
        );
    }
    let _ = writeln!(out, "Steps:");
    if status.steps.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    // Columns as wide as their widest cell, so they line up past step 9 (and 99, ...).
    let rows: Vec<(String, String, String, String)> = status
        .steps
        .iter()
        .map(|step| {
            let decision = step
                .decision
                .as_ref()
                .map(|d| {
                    let kind = d.kind.clone().unwrap_or_else(|| "?".into());
                    match &d.tool {
                        Some(tool) => format!("{} {}", short(&kind, 40), short(tool, 60)),
                        None => short(&kind, 40),
                    }
                })
                .unwrap_or_else(|| "-".into());
            let observation = step
                .observation
                .as_ref()
                .map(|o| format!("{}: {}", wire(&o.kind), short(&o.summary, 120)))
                .unwrap_or_else(|| "-".into());
            (
                format!("[{}]", step.index),
                wire(&step.status),
                decision,
                observation,
            )
        })
        .collect();
    let width = |cell: fn(&(String, String, String, String)) -> &String| {
        rows.iter()
            .map(|r| cell(r).chars().count())
            .max()
            .unwrap_or(0)
    };
    let (w_index, w_status, w_decision) = (width(|r| &r.0), width(|r| &r.1), width(|r| &r.2));
    let events = &status.events;
    for ((index, status, decision, observation), step) in rows.iter().zip(&status.steps) {
        let _ = writeln!(
            out,
            "  {index:>w_index$} {status:<w_status$} {decision:<w_decision$}  → {observation}"
        );
        if let Some(policy) = &step.policy {
            let _ = writeln!(
                out,
                "  {:w_index$} policy: {} by {}",
                "",
                wire(&policy.decision),
                decided_by(policy)
            );
        }
        if step.attempts > 1 {
            let _ = writeln!(
                out,
                "  {:w_index$} attempts: {} (re-run with the first attempt's idempotency key)",
                "", step.attempts
            );
        }
        for approval in &step.approvals {
            let _ = writeln!(
                out,
                "  {:w_index$} approval {} ({}): {}",
                "",
                esc(&approval.name),
                esc(&approval.kind),
                approval_outcome(approval, events)
            );
        }
    }
    let _ = writeln!(out, "Events:");
    out.push_str(&events_timeline(&status.events));
    out
}

/// How a step's approval ended, as `show run` says it: `Approved by alice@example.com
/// (executed)`, `Rejected by bob: "too much"`, or `pending` (docs/design.md section 2,
/// "Approval"); who decided comes from the record's `approval.decided` event.
fn approval_outcome(approval: &crate::api::StepApproval, events: &[RunEvent]) -> String {
    let Some(verdict) = &approval.verdict else {
        return "pending".to_string();
    };
    let decided = events.iter().rev().find(|e| {
        e.type_ == crate::api::EventType::ApprovalDecided
            && e.data
                .as_ref()
                .and_then(|d| d.get("approval"))
                .and_then(|a| a.as_str())
                == Some(approval.name.as_str())
    });
    let data = decided.and_then(|e| e.data.as_ref());
    let approver = data
        .and_then(|d| d.get("approver"))
        .and_then(|a| a.as_str())
        .map_or("(unknown: sealed or not recorded)".to_string(), esc);
    let note = data
        .and_then(|d| d.get("note"))
        .and_then(|n| n.as_str())
        .map(|n| format!(": {:?}", short(n, 120)))
        .unwrap_or_default();
    let executed = if approval.executed { " (executed)" } else { "" };
    format!("{} by {approver}{note}{executed}", wire(verdict))
}

/// Which policy decided a step (docs/design.md section 6, admin policies): `AgentPolicy
/// team-a/strict rule spec.rules[2] "no-mail" (generation 3)`, `ClusterAgentPolicy base, its
/// sideEffects outcome (generation 1)`, or `the run's own policy` (with its rule when one
/// matched), from the step's `policy.source`.
pub fn decided_by(policy: &PolicyRecord) -> String {
    let rule = policy.rule.as_deref().map(|r| short(r, 80));
    match &policy.source {
        Some(source) => {
            let which = match (source.rule_index, rule) {
                (Some(index), Some(name)) => format!(" rule spec.rules[{index}] \"{name}\""),
                (Some(index), None) => format!(" rule spec.rules[{index}]"),
                (None, _) => ", its sideEffects outcome".to_string(),
            };
            format!(
                "{}{which} (generation {})",
                esc(&source.display_name()),
                source.generation
            )
        }
        None => match rule {
            Some(name) => format!("the run's own policy, rule \"{name}\""),
            None => "the run's own policy".to_string(),
        },
    }
}

/// An Approval's `presentation.policy` (the admin policy that required it) as one line:
/// `AgentPolicy team-a/strict rule spec.rules[0] "needs-ok"`; `None` when the presentation
/// names no admin policy.
pub fn approval_policy(presentation: &serde_json::Value) -> Option<String> {
    let policy = presentation.get("policy")?.as_object()?;
    let text = |key: &str| policy.get(key).and_then(|v| v.as_str()).map(esc);
    let kind = text("kind")?;
    let name = text("name").unwrap_or_else(|| "-".into());
    let mut line = match text("namespace") {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    };
    match (
        policy.get("ruleIndex").and_then(|v| v.as_i64()),
        text("rule"),
    ) {
        (Some(index), Some(rule)) => {
            let _ = write!(line, " rule spec.rules[{index}] \"{rule}\"");
        }
        (Some(index), None) => {
            let _ = write!(line, " rule spec.rules[{index}]");
        }
        (None, _) => line.push_str(", its sideEffects outcome"),
    }
    Some(line)
}

/// One line per event: `seq time type [step] data`.
pub fn events_timeline(events: &[RunEvent]) -> String {
    let mut out = String::new();
    // Columns as wide as their widest cell, so they line up past seq 9999.
    let w_seq = events
        .iter()
        .map(|e| e.seq.to_string().len())
        .max()
        .unwrap_or(0)
        .max(4);
    let w_type = events
        .iter()
        .map(|e| wire(&e.type_).chars().count())
        .max()
        .unwrap_or(0);
    for event in events {
        let step = event.step.map(|s| format!(" step {s}")).unwrap_or_default();
        let data = event
            .data
            .as_ref()
            .map(|d| format!(" {}", render_json_line(d, DEFAULT_MAX_CHARS, 160)))
            .unwrap_or_default();
        let line = format!(
            "  {:>w_seq$} {} {:<w_type$}{}{}",
            event.seq,
            event.time,
            wire(&event.type_),
            step,
            data
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if events.is_empty() {
        out.push_str("  (none)\n");
    }
    out
}

/// An Approval as a person deciding it should see it.
pub fn approval_details(approval: &Approval) -> String {
    let spec = &approval.spec;
    let tool = &spec.request.tool;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Approval {}/{}",
        esc(approval.metadata.namespace.as_deref().unwrap_or("")),
        esc(approval.metadata.name.as_deref().unwrap_or(""))
    );
    let _ = writeln!(
        out,
        "  Run:          {}/{} (uid {}), step {}",
        esc(&spec.request.run.namespace),
        esc(&spec.request.run.name),
        esc(&spec.request.run.uid),
        spec.request.step
    );
    let _ = writeln!(out, "  Kind:         {}", esc(&spec.kind));
    if let Some(reason) = &spec.reason {
        let _ = writeln!(out, "  Reason:       {}", esc(reason));
    }
    if let Some(policy) = spec.presentation.as_ref().and_then(approval_policy) {
        let _ = writeln!(out, "  Required by:  {policy} (an admin policy)");
    }
    let _ = writeln!(
        out,
        "  Tool:         {} ({}, timeout {}s{})",
        esc(&tool.name),
        tool.side_effect.as_str(),
        tool.timeout_seconds,
        if tool.terminal { ", terminal" } else { "" }
    );
    let _ = writeln!(out, "  Description:  {}", esc(&tool.description));
    let _ = writeln!(
        out,
        "  Args:         {}",
        indent(&render_json(&spec.request.args, DEFAULT_MAX_CHARS))
    );
    if let Some(capability) = &spec.capability {
        let _ = writeln!(
            out,
            "  Capability:   {}",
            indent(&render_json(capability, DEFAULT_MAX_CHARS))
        );
    }
    if let Some(presentation) = &spec.presentation {
        let _ = writeln!(
            out,
            "  Presentation: {}",
            indent(&render_json(presentation, DEFAULT_MAX_CHARS))
        );
    }
    if let Some(first) = spec
        .presentation
        .as_ref()
        .and_then(|p| p.get("firstAttempt"))
    {
        let text = |k: &str| first.get(k).and_then(Value::as_str).map(esc);
        if let (Some(started), Some(until)) = (text("startedAt"), text("mayRunUntil")) {
            let _ = writeln!(
                out,
                "  First run:    started {started}; it may still be running until {until}, and an \
                 approved re-run waits until then"
            );
        }
        if let Some(key) = text("idempotencyKey") {
            let _ = writeln!(
                out,
                "  Re-run key:   Idempotency-Key {key} (the first attempt's)"
            );
        }
    }
    let _ = writeln!(out, "  Hash:         {}", esc(&spec.hash));
    let phase = approval
        .status
        .as_ref()
        .map(|s| wire(&s.phase))
        .unwrap_or_else(|| "Pending".into());
    let _ = writeln!(out, "  Phase:        {phase}");
    if let Some(decision) = &spec.decision {
        let _ = writeln!(
            out,
            "  Decision:     {} by {}{}",
            wire(&decision.verdict),
            esc(decision.approver.as_deref().unwrap_or("(unknown)")),
            decision
                .note
                .as_deref()
                .map(|n| format!(": {}", esc(n)))
                .unwrap_or_default()
        );
    }
    out
}

fn indent(text: &str) -> String {
    text.replace('\n', "\n                ")
}

/// The closing line the CLI writes itself, naming what is being decided.
pub fn decision_line(approval: &Approval, verdict: Verdict, result: Option<&Value>) -> String {
    let action = match verdict {
        Verdict::Approved => "APPROVE (run the tool with exactly these args)".to_string(),
        Verdict::Rejected => "REJECT (the run will be cancelled)".to_string(),
        Verdict::TookEffect => format!(
            "SETTLE AS TOOK EFFECT (run nothing; record this result as the call's outcome: {})",
            render_json_line(result.unwrap_or(&Value::Null), DEFAULT_MAX_CHARS, 400)
        ),
        Verdict::DidNotTakeEffect => {
            "SETTLE AS DID NOT TAKE EFFECT (run nothing; record the step not executed, the agent \
             decides again)"
                .to_string()
        }
    };
    format!(
        "==> agentrt: you are about to {action}: Approval {}/{} for tool {} on run {}, step {}, hash {}",
        esc(approval.metadata.namespace.as_deref().unwrap_or("")),
        esc(approval.metadata.name.as_deref().unwrap_or("")),
        short(&approval.spec.request.tool.name, 80),
        esc(&approval.spec.run_name),
        approval.spec.step_index,
        esc(&approval.spec.hash),
    )
}

#[cfg(test)]
#[path = "render/approvals_tests.rs"]
mod approvals_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AgentRunSpec, AgentRunStatus, DecisionRecord, EventType, Observation, ObservationKind,
        Step, StepIndex, StepStatus, Time,
    };

    fn step(index: i64, status: StepStatus) -> Step {
        Step {
            index: StepIndex(index),
            status,
            decision: Some(DecisionRecord {
                kind: Some("tool_call".into()),
                tool: Some(if index % 2 == 0 { "a" } else { "lookup_order" }.into()),
                ..DecisionRecord::default()
            }),
            policy: None,
            observation: Some(Observation {
                kind: ObservationKind::ToolResult,
                content: None,
                summary: format!("step {index}"),
                content_hash: String::new(),
                truncated: None,
            }),
            approvals: Vec::new(),
            attempts: 1,
            started_at: None,
            finished_at: None,
        }
    }

    #[test]
    fn the_steps_columns_line_up_past_step_9() {
        let spec: AgentRunSpec = serde_json::from_value(serde_json::json!({
            "goal": "g", "agent": {"scripted": {"decisions": []}}
        }))
        .expect("a spec");
        let mut run = AgentRun::new("r", spec);
        run.status = Some(AgentRunStatus {
            steps: (0..12)
                .map(|i| {
                    step(
                        i,
                        if i == 11 {
                            StepStatus::Executing
                        } else {
                            StepStatus::Done
                        },
                    )
                })
                .collect(),
            ..AgentRunStatus::default()
        });
        let text = run_details(&run);
        let arrows: Vec<usize> = text
            .lines()
            .filter(|l| l.trim_start().starts_with('['))
            .map(|l| l.chars().position(|c| c == '→').expect("an arrow"))
            .collect();
        assert_eq!(arrows.len(), 12, "{text}");
        assert!(arrows.iter().all(|a| *a == arrows[0]), "{text}");
        let statuses: Vec<usize> = text
            .lines()
            .filter(|l| l.trim_start().starts_with('['))
            .map(|l| l.find("] ").expect("an index"))
            .collect();
        assert!(statuses.iter().all(|a| *a == statuses[0]), "{text}");
    }

    #[test]
    fn each_step_says_which_policy_decided_it() {
        use crate::api::{PolicyDecisionKind, PolicyRecord, PolicySource};
        let spec: AgentRunSpec = serde_json::from_value(serde_json::json!({
            "goal": "g", "agent": {"scripted": {"decisions": []}}
        }))
        .expect("a spec");
        let mut run = AgentRun::new("r", spec);
        let mut admin = step(0, StepStatus::AwaitingApproval);
        admin.policy = Some(PolicyRecord {
            decision: PolicyDecisionKind::RequireApproval,
            rule: Some("needs-ok".into()),
            reason: None,
            source: Some(PolicySource {
                kind: "AgentPolicy".into(),
                namespace: Some("team-a".into()),
                name: "strict".into(),
                generation: 3,
                rule_index: Some(2),
            }),
        });
        let mut class = step(1, StepStatus::Failed);
        class.policy = Some(PolicyRecord {
            decision: PolicyDecisionKind::Deny,
            rule: None,
            reason: None,
            source: Some(PolicySource {
                kind: "ClusterAgentPolicy".into(),
                namespace: None,
                name: "base".into(),
                generation: 1,
                rule_index: None,
            }),
        });
        let mut own = step(2, StepStatus::Done);
        own.policy = Some(PolicyRecord {
            decision: PolicyDecisionKind::Allow,
            rule: Some("cheap".into()),
            reason: None,
            source: None,
        });
        run.status = Some(AgentRunStatus {
            steps: vec![admin, class, own, step(3, StepStatus::Done)],
            ..AgentRunStatus::default()
        });
        let text = run_details(&run);
        let policies: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("policy: "))
            .map(str::trim)
            .collect();
        assert_eq!(
            policies,
            [
                "policy: require_approval by AgentPolicy team-a/strict rule spec.rules[2] \
                 \"needs-ok\" (generation 3)",
                "policy: deny by ClusterAgentPolicy base, its sideEffects outcome (generation 1)",
                "policy: allow by the run's own policy, rule \"cheap\"",
            ],
            "{text}"
        );
    }

    #[test]
    fn an_approval_names_the_admin_policy_that_required_it() {
        let presentation = serde_json::json!({"tool": "send", "policy": {
            "kind": "AgentPolicy", "namespace": "team-a", "name": "strict",
            "rule": null, "ruleIndex": null}});
        assert_eq!(
            approval_policy(&presentation).as_deref(),
            Some("AgentPolicy team-a/strict, its sideEffects outcome")
        );
        let presentation = serde_json::json!({"policy": {
            "kind": "ClusterAgentPolicy", "name": "base\u{1b}[2J", "rule": "no-mail",
            "ruleIndex": 0}});
        assert_eq!(
            approval_policy(&presentation).as_deref(),
            Some("ClusterAgentPolicy base\\u{001B}[2J rule spec.rules[0] \"no-mail\"")
        );
        assert_eq!(approval_policy(&serde_json::json!({"tool": "x"})), None);
    }

    #[test]
    fn the_events_columns_line_up_past_seq_9999() {
        let events: Vec<RunEvent> = [9_999, 10_000]
            .into_iter()
            .map(|seq| RunEvent {
                seq,
                time: Time::from_millis(1_767_225_600_000),
                type_: if seq % 2 == 0 {
                    EventType::RunCreated
                } else {
                    EventType::StepToolFinished
                },
                step: Some(StepIndex(seq)),
                data: None,
            })
            .collect();
        let text = events_timeline(&events);
        let steps: Vec<usize> = text
            .lines()
            .map(|l| l.find(" step ").expect("a step"))
            .collect();
        assert_eq!(steps[0], steps[1], "{text}");
        let times: Vec<usize> = text
            .lines()
            .map(|l| l.find("2026").expect("a time"))
            .collect();
        assert_eq!(times[0], times[1], "{text}");
    }

    /// Issue 14: `agentrt events` showed a tool error body that is JSON text with its
    /// backslashes doubled (`{\\"err\\": …}`).
    #[test]
    fn an_events_data_string_of_json_text_is_escaped_once() {
        let event: RunEvent = serde_json::from_value(serde_json::json!({
            "seq": 7, "time": "2026-01-01T00:00:00Z", "type": "step.tool_finished", "step": 1,
            "data": {"error": "{\"err\": \"boom\"}\u{1b}[2J"},
        }))
        .expect("an event");
        let line = events_timeline(&[event]);
        assert!(
            line.contains(r#"{"error":"{\"err\": \"boom\"}\u{001B}[2J"}"#),
            "{line}"
        );
        assert!(!line.contains("\\\\"), "{line}");
    }
}
