//! Kubernetes Events on the AgentRun (events.k8s.io/v1, through kube-runtime's `Recorder`):
//! a projection of what one status write added to the record (DESIGN.md section 4: Events are
//! projections of the record). Phase changes, approvals requested and decided, takeovers and
//! interruptions each become one Event. Nothing here is asked of the engine beyond what it
//! recorded, and a failure to publish never touches the run.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;

use super::cluster::StoredRun;
use super::fault::added_events;

/// The Events one write deserves, from the status before and after it.
pub fn events_for_write(old_status: &Value, new_status: &Value) -> Vec<Event> {
    let mut out = Vec::new();
    let text = |status: &Value, field: &str| {
        status
            .get(field)
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let new_events = new_status.get("events").and_then(Value::as_array);
    let find = |kind: &str, step: Option<i64>| {
        new_events.and_then(|events| {
            events.iter().rev().find(|event| {
                event.get("type").and_then(Value::as_str) == Some(kind)
                    && event.get("step").and_then(Value::as_i64) == step
            })
        })
    };
    for (kind, step) in added_events(old_status, new_status) {
        let data = find(&kind, step)
            .and_then(|event| event.get("data"))
            .cloned()
            .unwrap_or(Value::Null);
        let field = |name: &str| {
            data.get(name)
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let step_text = step.map(|s| s.to_string()).unwrap_or_else(|| "?".into());
        let (type_, reason, note) = match kind.as_str() {
            "approval.requested" => (
                EventType::Normal,
                "ApprovalRequested",
                format!(
                    "step {step_text} waits for Approval {} ({})",
                    field("approval"),
                    field("kind")
                ),
            ),
            "approval.decided" => (
                EventType::Normal,
                "ApprovalDecided",
                format!("Approval {} was {}", field("approval"), field("verdict")),
            ),
            "lease.taken_over" => (
                EventType::Warning,
                "TakenOver",
                format!(
                    "{} took the run over from {}",
                    field("holder"),
                    data.get("previousHolder")
                        .and_then(Value::as_str)
                        .unwrap_or("nobody")
                ),
            ),
            "step.interrupted" => (
                EventType::Warning,
                "Interrupted",
                format!(
                    "step {step_text} was interrupted while {}",
                    field("previousStatus")
                ),
            ),
            _ => continue,
        };
        out.push(Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        });
    }
    let old_phase = text(old_status, "phase");
    let new_phase = text(new_status, "phase");
    if new_phase.is_some() && new_phase != old_phase {
        let phase = new_phase.unwrap_or_default();
        let reason = text(new_status, "reason");
        let detail = text(new_status, "reasonDetail");
        let mut note = format!("phase {phase}");
        if let Some(reason) = &reason {
            note.push_str(&format!(", reason {reason}"));
        }
        if let Some(detail) = detail {
            let cut: String = detail.chars().take(200).collect();
            note.push_str(&format!(": {cut}"));
        }
        let warning = phase == "Failed";
        out.push(Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: phase,
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        });
    }
    out
}

/// The reference an Event about `run` names.
pub fn reference(run: &StoredRun) -> ObjectReference {
    ObjectReference {
        api_version: Some("agentrt.dev/v1alpha1".into()),
        kind: Some("AgentRun".into()),
        name: Some(run.snapshot.name.clone()),
        namespace: Some(run.snapshot.namespace.clone()),
        uid: Some(run.snapshot.uid.clone()),
        resource_version: None,
        field_path: None,
    }
}

/// Where Events go: a channel to one publishing task, so a slow events endpoint never slows a
/// run down.
#[derive(Clone)]
pub struct EventSink {
    tx: Option<mpsc::Sender<(ObjectReference, Event)>>,
}

impl EventSink {
    /// A sink that drops everything (unit tests).
    pub fn disabled() -> EventSink {
        EventSink { tx: None }
    }

    /// A sink publishing through a `Recorder` as `agentrt-controller` (instance: the holder).
    pub fn start(client: kube::Client, instance: String) -> EventSink {
        let (tx, mut rx) = mpsc::channel::<(ObjectReference, Event)>(4096);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "agentrt-controller".into(),
                instance: Some(instance),
            },
        );
        tokio::spawn(async move {
            while let Some((reference, event)) = rx.recv().await {
                if let Err(err) = recorder.publish(&event, &reference).await {
                    tracing::debug!(%err, reason = %event.reason, "cannot publish a Kubernetes Event");
                }
            }
        });
        EventSink { tx: Some(tx) }
    }

    /// Queues the Events of one write (dropped when the queue is full).
    pub fn write_landed(&self, before: &Value, after: &StoredRun) {
        let Some(tx) = &self.tx else { return };
        let events = events_for_write(before, &after.snapshot.status);
        if events.is_empty() {
            return;
        }
        let reference = reference(after);
        for event in events {
            let _ = tx.try_send((reference.clone(), event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_write_projects_its_phase_change_takeover_and_interruption() {
        let old = json!({"phase": "Running", "events": [{"seq": 1, "type": "run.created"}]});
        let new = json!({"phase": "WaitingForApproval", "events": [
            {"seq": 1, "type": "run.created"},
            {"seq": 2, "type": "step.interrupted", "step": 1, "data": {"previousStatus": "executing"}},
            {"seq": 3, "type": "lease.taken_over", "data": {"previousHolder": "a-1", "holder": "b-2"}},
            {"seq": 4, "type": "approval.requested", "step": 1, "data": {"approval": "r-1-1", "kind": "interrupted_side_effect"}}
        ]});
        let events = events_for_write(&old, &new);
        let reasons: Vec<_> = events.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "Interrupted",
                "TakenOver",
                "ApprovalRequested",
                "WaitingForApproval"
            ]
        );
        assert_eq!(
            events[1].note.as_deref(),
            Some("b-2 took the run over from a-1")
        );
    }

    #[test]
    fn a_write_that_changes_nothing_visible_projects_nothing() {
        let old = json!({"phase": "Running", "events": [{"seq": 1, "type": "run.created"}]});
        let new = json!({"phase": "Running", "events": [
            {"seq": 1, "type": "run.created"}, {"seq": 2, "type": "step.tool_finished", "step": 0}
        ]});
        assert!(events_for_write(&old, &new).is_empty());
    }
}
