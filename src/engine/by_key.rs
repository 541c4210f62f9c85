//! Interrupted `http` calls the tool settles itself (docs/design.md section 5, "a tool that
//! answers by key"; docs/behaviours.md 111-114).
//!
//! After a takeover (or an outcome the holder recorded as unknown), a step that was executing
//! an `http` tool with `reconcile` is resolved before anyone is asked:
//! - `statusURL`: the executor asks it ([`ExternalCall::ToolStatus`]); `succeeded` records the
//!   result as the step's, `failed` the error as a `tool_error`; a 404 once the first attempt
//!   can no longer be running (before then it is asked again at that moment) sends the call
//!   again with the same key (it never arrived), at most once per step; anything else, a second
//!   404 included, sends it again by its key when the tool also honours keys, else asks
//!   someone ([`takeover::ask_someone`]: the reconcile hook, else the `interrupted_side_effect`
//!   Approval showing what it said);
//! - else `idempotencyKeys: Honored`: the call is sent again with the same key, no earlier
//!   than the first attempt's `mayRunUntil`, so the two never overlap.
//!
//! A call is never sent again unless the tool's owner said a repeated key is safe, or its
//! status URL said the first never arrived after it could no longer be on its way;
//! `step.tool_started` says which (`resent`).

use serde_json::{json, Value};

use super::loop_::{check_call, drive, Flow};
use super::observe::millis_until;
use super::outcome;
use super::record::Txn;
use super::takeover::{self, first_attempt, idempotency_key};
use super::{EngineError, ExternalCall, StatusAnswer, StatusQuery};
use crate::api::{
    EventType, HttpReconcile, IdempotencyKeys, StepIndex, StepStatus, ToolFailure, ToolSpec,
};

/// Everything but RFC 3986's unreserved characters is percent-encoded in the key, so that the
/// key (`<uid>/<step>`) is one path segment or query value.
const KEY_ENCODED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The tool's `spec.tools[].http.reconcile`, when it has one.
fn reconcile_of(tool: &ToolSpec) -> Option<&HttpReconcile> {
    tool.http.as_ref()?.reconcile.as_ref()
}

/// How the interrupted step `index` is settled by its tool, if it can be: `None` when the step
/// was not executing an `http` tool with `reconcile` (or its call no longer checks: the usual
/// path says so).
pub(crate) fn resume(txn: &mut Txn, index: usize) -> Option<Flow> {
    let (tool, args) = reconcilable(txn, index)?;
    let reconcile = reconcile_of(&txn.run.spec.tools[tool])?;
    if reconcile.status_url.is_some() {
        ask_status(txn, index, tool, 0);
        return Some(Flow::Halt);
    }
    if reconcile.idempotency_keys == Some(IdempotencyKeys::Honored) {
        return Some(send_by_key(txn, index, tool, args, None));
    }
    None
}

/// Asks step `index`'s status URL (tool `tool`), after `delay_millis`.
fn ask_status(txn: &mut Txn, index: usize, tool: usize, delay_millis: u64) {
    let spec_tool = &txn.run.spec.tools[tool];
    let Some(template) = reconcile_of(spec_tool).and_then(|r| r.status_url.as_ref()) else {
        return;
    };
    let key = idempotency_key(txn, index);
    let encoded = percent_encoding::utf8_percent_encode(&key, KEY_ENCODED).to_string();
    let url = template.replace("{key}", &encoded);
    let timeout_millis = u64::try_from(spec_tool.timeout_seconds.max(1))
        .unwrap_or(1)
        .saturating_mul(1000);
    txn.call(ExternalCall::ToolStatus(StatusQuery {
        step: txn.index_at(index),
        tool: spec_tool.clone(),
        url,
        idempotency_key: key,
        timeout_millis,
        delay_millis,
    }));
}

/// Milliseconds until step `index`'s last attempt can no longer be running (0 when it cannot
/// now, or no attempt is in the window).
fn until_first_attempt_ended(txn: &Txn, index: usize) -> u64 {
    let now = txn.now();
    first_attempt(txn, index)
        .filter(|first| first.may_run_until > now)
        .map_or(0, |first| millis_until(now, first.may_run_until))
}

/// Sends the call again by its honoured key, once the first attempt can no longer be running;
/// `said` is what a status URL said before (it could not tell).
fn send_by_key(txn: &mut Txn, index: usize, tool: usize, args: Value, said: Option<Value>) -> Flow {
    let delay_millis = until_first_attempt_ended(txn, index);
    let mut why = json!({"by": "idempotencyKeys", "idempotencyKeys": "Honored"});
    if let Some(said) = said {
        why["statusURL"] = said;
    }
    send_again(txn, index, tool, args, why, delay_millis)
}

/// Whether step `index` was already sent again once because its status URL answered 404.
fn resent_after_404(txn: &Txn, index: usize) -> bool {
    let step = txn.index_at(index);
    txn.status.events.iter().any(|e| {
        e.type_ == EventType::StepToolStarted
            && e.step == Some(step)
            && e.data
                .as_ref()
                .and_then(|d| d.pointer("/resent/by"))
                .and_then(Value::as_str)
                == Some("statusURL")
    })
}

/// The step's tool and checked args, when it was executing an `http` tool with `reconcile`.
fn reconcilable(txn: &Txn, index: usize) -> Option<(usize, Value)> {
    let step = &txn.status.steps[index];
    if step.status != StepStatus::Interrupted
        || super::record::previous_status(step) != Some(StepStatus::Executing)
    {
        return None;
    }
    let decision = step.decision.as_ref()?;
    let (tool, args) = check_call(txn, decision).ok()?;
    reconcile_of(&txn.run.spec.tools[tool])?;
    Some((tool, args))
}

/// [`super::Input::ToolStatusAnswered`] for a running run.
pub(crate) fn answered(
    txn: &mut Txn,
    step: StepIndex,
    answer: StatusAnswer,
) -> Result<(), EngineError> {
    let pending = txn
        .last_position()
        .filter(|i| txn.index_at(*i) == step)
        .filter(|i| txn.status.steps[*i].status == StepStatus::Interrupted);
    let Some(index) = pending else {
        // Applied already: go on from the record.
        drive(txn);
        return Ok(());
    };
    let Some((tool, args)) = reconcilable(txn, index) else {
        drive(txn);
        return Ok(());
    };
    let spec_tool = txn.run.spec.tools[tool].clone();
    let template = reconcile_of(&spec_tool).and_then(|r| r.status_url.clone());
    let first_may_still_run = until_first_attempt_ended(txn, index);
    let flow = match answer {
        StatusAnswer::Succeeded { result } => {
            let settled_by = json!({"statusURL": template, "state": "succeeded"});
            outcome::settled_result(txn, index, &spec_tool, settled_by, result);
            Flow::Continue
        }
        StatusAnswer::Failed { error } => {
            let failure = ToolFailure::ToolReportedError;
            let headline = format!(
                "{} failed: {} (said its status URL after an interruption)",
                spec_tool.name,
                failure.as_str()
            );
            let settled_by = json!({"statusURL": template, "state": "failed"});
            outcome::settled_error(txn, index, &spec_tool, settled_by, failure, error, headline);
            Flow::Continue
        }
        // A 404 while the first attempt may still be on its way proves nothing: asked again
        // once it can no longer be running. Then it never arrived, and is sent again, once.
        StatusAnswer::NotFound if first_may_still_run > 0 => {
            ask_status(txn, index, tool, first_may_still_run);
            Flow::Halt
        }
        StatusAnswer::NotFound if resent_after_404(txn, index) => {
            let said = json!({
                "status": 404,
                "error": "the call was already sent again once after a 404; a second 404 is not \
                          trusted",
            });
            unsettled(
                txn,
                index,
                tool,
                args,
                json!({"url": template, "said": said}),
            )
        }
        StatusAnswer::NotFound => {
            let why = json!({"by": "statusURL", "status": 404});
            send_again(txn, index, tool, args, why, 0)
        }
        StatusAnswer::Unsettled { said } => unsettled(
            txn,
            index,
            tool,
            args,
            json!({"url": template, "said": said}),
        ),
    };
    if flow == Flow::Continue {
        drive(txn);
    }
    Ok(())
}

/// The status URL could not tell: honoured keys send the call again by its key; otherwise the
/// hook or a person is asked, seeing what it said (`status_url`: {url, said}).
fn unsettled(txn: &mut Txn, index: usize, tool: usize, args: Value, status_url: Value) -> Flow {
    let honored = reconcile_of(&txn.run.spec.tools[tool]).and_then(|r| r.idempotency_keys)
        == Some(IdempotencyKeys::Honored);
    if honored {
        return send_by_key(txn, index, tool, args, Some(status_url));
    }
    takeover::ask_someone(txn, index, Some(status_url))
}

/// Sends step `index`'s call again with its idempotency key after `delay_millis`, recording
/// why in `run.resumed` and in the attempt's `step.tool_started` (`resent`).
fn send_again(
    txn: &mut Txn,
    index: usize,
    tool: usize,
    args: Value,
    why: Value,
    delay_millis: u64,
) -> Flow {
    txn.event(
        EventType::RunResumed,
        None,
        json!({"after": "interruption", "reconciliation": "resend", "step": txn.index_at(index)}),
    );
    super::calls::start_tool_again(txn, index, tool, args, why, delay_millis)
}

#[cfg(test)]
mod tests {
    use super::KEY_ENCODED;

    #[test]
    fn the_key_is_one_path_segment() {
        assert_eq!(
            percent_encoding::utf8_percent_encode("0b6f-9a/3 x_~.", KEY_ENCODED).to_string(),
            "0b6f-9a%2F3%20x_~.",
            "a slash or a space in the key must not reach the URL raw"
        );
    }
}
