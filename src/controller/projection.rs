//! Kubernetes Events on the AgentRun (events.k8s.io/v1, through kube-runtime's `Recorder`):
//! a projection of what one status write added to the record (DESIGN.md section 4: Events are
//! projections of the record). Which journal entries become which Event is the engine's
//! projection (`engine::kube_events`): the run started and finished, approvals requested and
//! decided, takeovers, interruptions, resumptions, limits. Publishing is best effort: a failure
//! never touches the run.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::Value;
use tokio::sync::mpsc;

use super::cluster::StoredRun;
use crate::engine::KubeEventType;

/// The Events one write deserves, from the status before and after it: the engine's projection
/// of the journal entries the write added (`engine::kube_events`), as kube-runtime Events.
pub fn events_for_write(old_status: &Value, new_status: &Value) -> Vec<Event> {
    crate::engine::kube_events(old_status, new_status)
        .into_iter()
        .map(|projection| Event {
            type_: match projection.type_ {
                KubeEventType::Normal => EventType::Normal,
                KubeEventType::Warning => EventType::Warning,
            },
            reason: projection.reason,
            note: Some(projection.message),
            action: "Reconcile".into(),
            secondary: None,
        })
        .collect()
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
    fn a_write_projects_its_takeover_interruption_and_approval() {
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
            ["StepInterrupted", "TakenOver", "ApprovalRequested"]
        );
        assert!(matches!(events[1].type_, EventType::Warning));
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
