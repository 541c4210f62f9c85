//! A record that will not decode (DESIGN.md section 3 guarantee 7, BEHAVIOURS.md 41): it is
//! never rewritten. Any continuation fails the run `internal_error` by patching only `phase`,
//! `reason`, `reasonDetail` and `finishedAt` into the stored status JSON as it is (and a
//! `run.finished` event only when the journal itself decodes); cancel still works the same way.
//! Steps, approvals and everything else stay exactly as stored.

use serde_json::{json, Value};

use super::lease::{lease_liveness, LeaseLiveness};
use super::{Caller, Effect, Input, RunSnapshot, Transition};
use crate::api::{EventType, RunEvent, RunPhase, TerminalReason, Time};

/// What `step` does with a run whose status does not decode.
pub(crate) fn undecodable(
    run: &RunSnapshot,
    caller: &Caller,
    input: &Input,
    detail: String,
) -> Transition {
    let phase: Option<RunPhase> = run
        .status
        .get("phase")
        .and_then(|p| serde_json::from_value(p.clone()).ok());
    let holder = run
        .status
        .get("lease")
        .and_then(|l| l.get("holder"))
        .and_then(Value::as_str);
    let executor = !matches!(input, Input::Observe { .. });
    let stop = |mut effects: Vec<Effect>| {
        if executor {
            effects.push(Effect::ReleaseLease);
        }
        effects.push(Effect::Stop);
        Transition { effects }
    };
    match input {
        Input::LeaseLost => {
            return Transition {
                effects: vec![Effect::Stop],
            }
        }
        Input::Observe { .. } | Input::LeaseAcquired { .. } => {}
        _ if holder != Some(caller.holder.as_str()) => {
            return Transition {
                effects: vec![Effect::Stop],
            }
        }
        _ => {}
    }
    if phase.is_some_and(RunPhase::is_terminal) {
        return if executor {
            stop(Vec::new())
        } else {
            Transition::default()
        };
    }
    if run.spec.cancel {
        let status = patch(
            &run.status,
            TerminalReason::OperatorCancelled,
            None,
            caller.now,
        );
        return stop(vec![Effect::WriteStatus { status }]);
    }
    if let Input::Observe { lease } = input {
        if phase == Some(RunPhase::Running) {
            if let LeaseLiveness::Live { millis } =
                lease_liveness(lease, run.spec.lease_duration_seconds)
            {
                return Transition {
                    effects: vec![Effect::RequeueAfter { millis }],
                };
            }
        }
    }
    let detail = format!(
        "AgentRun {}/{}: {detail}; the record is left as stored (fix or delete the run)",
        run.namespace, run.name
    );
    let status = patch(
        &run.status,
        TerminalReason::InternalError,
        Some(detail),
        caller.now,
    );
    stop(vec![Effect::WriteStatus { status }])
}

/// The stored status with only the terminal fields set, plus `run.finished` when the journal
/// decodes.
fn patch(status: &Value, reason: TerminalReason, detail: Option<String>, now: Time) -> Value {
    let mut object = status.as_object().cloned().unwrap_or_default();
    let phase = json!(reason.phase());
    object.insert("phase".into(), phase.clone());
    object.insert("reason".into(), json!(reason));
    match &detail {
        Some(detail) => object.insert("reasonDetail".into(), json!(detail)),
        None => object.remove("reasonDetail"),
    };
    object.insert("finishedAt".into(), json!(now));
    let journal: Option<Vec<RunEvent>> = match object.get("events") {
        None => Some(Vec::new()),
        Some(events) => serde_json::from_value(events.clone()).ok(),
    };
    if let Some(journal) = journal {
        let seq = journal.last().map_or(0, |e| e.seq).saturating_add(1);
        let mut data = json!({"phase": phase, "reason": reason});
        if let Some(detail) = detail {
            data["detail"] = json!(detail);
        }
        let event = RunEvent {
            seq,
            time: now,
            type_: EventType::RunFinished,
            step: None,
            data: Some(data),
        };
        let mut events = object
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        events.push(serde_json::to_value(event).unwrap_or(Value::Null));
        object.insert("events".into(), Value::Array(events));
    }
    Value::Object(object)
}
