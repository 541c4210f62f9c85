//! Kubernetes Events on the AgentRun (events.k8s.io/v1): a projection of what one status write
//! added to the record (docs/design.md section 4: Events are projections of the record). Which
//! journal entries become which Event is the engine's projection (`engine::kube_events`): the
//! run started and finished, approvals requested and decided, takeovers, interruptions,
//! resumptions, limits. Publishing is best effort: a failure never touches the run.
//!
//! Each Event is created as kube-runtime's `Recorder` would create a new one, but without its
//! series cache: a journal entry is projected once, so there is no repeat to count, and that
//! cache (every Event of the last six minutes, scanned on each publish) would cost memory and
//! time in proportion to the runs a replica works on.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType};
use kube::Api;
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

/// The events.k8s.io/v1 Event for `event` about `reference`, as reported by `instance`.
pub fn k8s_event(event: &Event, reference: ObjectReference, instance: &str) -> K8sEvent {
    let now = jiff::Timestamp::now();
    K8sEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        event_time: Some(MicroTime(now)),
        note: event.note.clone(),
        metadata: ObjectMeta {
            namespace: reference.namespace.clone(),
            name: Some(format!(
                "{}.{:x}",
                reference.name.as_deref().unwrap_or(REPORTER),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        regarding: Some(reference),
        reporting_controller: Some(REPORTER.into()),
        reporting_instance: Some(instance.to_string()),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .into(),
        ),
        related: event.secondary.clone(),
        ..K8sEvent::default()
    }
}

/// The reporting controller named on every Event.
const REPORTER: &str = "agentrt-controller";

/// The reference an Event about `run` names.
pub fn reference(run: &StoredRun) -> ObjectReference {
    snapshot_reference(&run.snapshot)
}

fn snapshot_reference(run: &crate::engine::RunSnapshot) -> ObjectReference {
    ObjectReference {
        api_version: Some("agentrt.dev/v1alpha1".into()),
        kind: Some("AgentRun".into()),
        name: Some(run.name.clone()),
        namespace: Some(run.namespace.clone()),
        uid: Some(run.uid.clone()),
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

    /// A sink publishing as `agentrt-controller` (instance: the holder).
    pub fn start(client: kube::Client, instance: String) -> EventSink {
        let (tx, mut rx) = mpsc::channel::<(ObjectReference, Event)>(4096);
        tokio::spawn(async move {
            while let Some((reference, event)) = rx.recv().await {
                let namespace = reference.namespace.clone().unwrap_or_default();
                let api: Api<K8sEvent> = Api::namespaced(client.clone(), &namespace);
                let object = k8s_event(&event, reference, &instance);
                if let Err(err) = api.create(&PostParams::default(), &object).await {
                    tracing::debug!(%err, reason = %event.reason, "cannot publish a Kubernetes Event");
                }
            }
        });
        EventSink { tx: Some(tx) }
    }

    /// Queues a Warning Event about `run` that no write projects (a sealed segment the
    /// executor could not read; dropped when the queue is full).
    pub fn warn(&self, run: &crate::engine::RunSnapshot, reason: &str, note: String) {
        let Some(tx) = &self.tx else { return };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        let _ = tx.try_send((snapshot_reference(run), event));
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

    #[test]
    fn an_event_names_the_run_and_the_reporting_replica() {
        let event = Event {
            type_: EventType::Warning,
            reason: "TakenOver".into(),
            note: Some("taken over".into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            name: Some("r".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        let object = k8s_event(&event, reference, "holder-1");
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        assert!(object.metadata.name.as_deref().unwrap().starts_with("r."));
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reporting_controller.as_deref(), Some(REPORTER));
        assert_eq!(object.reporting_instance.as_deref(), Some("holder-1"));
        assert_eq!(object.regarding.and_then(|r| r.name).as_deref(), Some("r"));
    }
}
