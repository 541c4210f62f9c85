//! A record that will not decode (docs/design.md section 3 guarantee 7, docs/behaviours.md 41): it is
//! never rewritten. Any continuation fails the run `internal_error` by patching only `phase`,
//! `reason`, `reasonDetail` and `finishedAt` into the stored status JSON as it is (and a
//! `run.finished` event only when the journal itself decodes); cancel still works the same way.
//! Steps, approvals and everything else stay exactly as stored.

use serde_json::{json, Value};

use super::lease::{lease_liveness, LeaseLiveness};
use super::{
    Bookkeeping, Caller, Input, LeaseView, Next, ObserveNext, Observed, RunSnapshot, Transition,
};
use crate::api::{EventType, RunEvent, RunPhase, TerminalReason, Time};

/// What the stored status says of itself, as far as it can be read.
struct Readable<'a> {
    phase: Option<RunPhase>,
    holder: Option<&'a str>,
}

fn readable(run: &RunSnapshot) -> Readable<'_> {
    Readable {
        phase: run
            .status
            .get("phase")
            .and_then(|p| serde_json::from_value(p.clone()).ok()),
        holder: run
            .status
            .get("lease")
            .and_then(|l| l.get("holder"))
            .and_then(Value::as_str),
    }
}

/// The write that ends a run whose record will not decode: cancelled when asked, else
/// `internal_error` naming what did not decode. `None` for a run already terminal.
fn ending(
    run: &RunSnapshot,
    caller: &Caller,
    phase: Option<RunPhase>,
    detail: &str,
) -> Option<Value> {
    if phase.is_some_and(RunPhase::is_terminal) {
        return None;
    }
    if run.spec.cancel {
        return Some(patch(
            &run.status,
            TerminalReason::OperatorCancelled,
            None,
            caller.now,
        ));
    }
    let detail = format!(
        "AgentRun {}/{}: {detail}; the record is left as stored (fix or delete the run)",
        run.namespace, run.name
    );
    Some(patch(
        &run.status,
        TerminalReason::InternalError,
        Some(detail),
        caller.now,
    ))
}

/// What [`super::step`] does with a run whose status does not decode: a holder (or a replica
/// that just won the lease) ends it, releases the lease and stops; anyone else stops.
pub(crate) fn undecodable_step(
    run: &RunSnapshot,
    caller: &Caller,
    input: &Input,
    detail: String,
) -> Transition {
    let Readable { phase, holder } = readable(run);
    match input {
        Input::LeaseLost => return Transition::stop(),
        Input::LeaseAcquired { .. } => {}
        _ if holder != Some(caller.holder.as_str()) => return Transition::stop(),
        _ => {}
    }
    Transition {
        seal: None,
        write: ending(run, caller, phase, &detail),
        record: None,
        bookkeeping: vec![Bookkeeping::ReleaseLease],
        next: Next::Stop,
    }
}

/// What [`super::observe`] does with a run whose status does not decode: a run that is
/// `Running` under a live lease is left to its holder (looked at again when the lease could
/// have expired); otherwise it ends as [`undecodable_step`] ends it (cancel needs no lease).
pub(crate) fn undecodable_observe(
    run: &RunSnapshot,
    caller: &Caller,
    lease: &LeaseView,
    detail: String,
) -> Observed {
    let Readable { phase, .. } = readable(run);
    if !run.spec.cancel && phase == Some(RunPhase::Running) {
        if let LeaseLiveness::Live { millis } =
            lease_liveness(lease, run.spec.lease_duration_seconds)
        {
            return Observed {
                next: ObserveNext::RequeueAfter { millis },
                ..Observed::default()
            };
        }
    }
    Observed {
        write: ending(run, caller, phase, &detail),
        ..Observed::default()
    }
}

/// The status that ends a run whose spec does not decode (issue 34: nested past the JSON
/// parser's limit, or of a type the schema lets through; docs/design.md section 2, admission):
/// `status` as stored (`Value::Null` when absent) with only the terminal fields set, failed
/// `invalid_spec` naming `cause`, and `run.finished` when the journal decodes. `None` for a
/// run already terminal. The spec is not needed: the controller writes this by name on the
/// run's uid and resourceVersion.
pub fn spec_undecodable(
    status: &Value,
    namespace: &str,
    name: &str,
    cause: &str,
    now: Time,
) -> Option<Value> {
    let phase: Option<RunPhase> = status
        .get("phase")
        .and_then(|p| serde_json::from_value(p.clone()).ok());
    if phase.is_some_and(RunPhase::is_terminal) {
        return None;
    }
    let detail = format!(
        "AgentRun {namespace}/{name}: spec does not decode: {cause}; fix the manifest and create the run again"
    );
    Some(patch(
        status,
        TerminalReason::InvalidSpec,
        Some(detail),
        now,
    ))
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
