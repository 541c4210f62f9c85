//! The sample reconcile hook (`POST /reconcile` on the sample tools' address; docs/design.md
//! section 5): what a consumer who knows its own side effects answers after a takeover
//! interrupted a step. It looks the interrupted call up by the Idempotency-Key the runtime sent
//! with it (`<run uid>/<step>`):
//! - an `issue_refund` or `slow_export` that finished: `completed`, with what it returned (the
//!   run ends there; nothing runs twice and no person is asked);
//! - a `slow_export` still running: waits for it (up to [`WAIT_FOR_RUNNING`]), then as above;
//! - a call the tools never received (or one still running after the wait): `waiting`, pausing
//!   on a `require_approval` whose presentation says so, so a person decides whether to run it;
//! - anything else (a step that was deciding, a read-only tool): `continue`.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::{Export, Samples};

/// How long the hook waits for an export that is still running.
pub const WAIT_FOR_RUNNING: Duration = Duration::from_secs(20);

/// `POST /reconcile`: a RunView in, a Reconciliation out.
pub(super) async fn reconcile(
    State(samples): State<Samples>,
    Json(view): Json<Value>,
) -> Json<Value> {
    let step = view.get("interruptedStep").and_then(Value::as_i64);
    let uid = view
        .pointer("/run/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let tool = step
        .and_then(|s| view.get("steps")?.get(usize::try_from(s).ok()?))
        .filter(|s| s.pointer("/observation/content/previousStatus") == Some(&json!("executing")))
        .and_then(|s| s.pointer("/decision/tool"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let key = format!("{uid}/{}", step.unwrap_or(-1));
    let found = match tool {
        "issue_refund" => samples.refund(&key),
        "slow_export" => wait_for_export(&samples, &key).await,
        _ => return Json(json!({"outcome": "continue"})),
    };
    Json(match found {
        Some(result) => json!({
            "outcome": "completed",
            "result": result,
            "detail": format!("the sample tools finished {tool} for {key}; not running it again"),
        }),
        None => json!({
            "outcome": "waiting",
            "pause": {
                "decision": "require_approval",
                "kind": "not_found_downstream",
                "reason": format!("the sample tools have no finished {tool} for {key}"),
                "presentation": {
                    "tool": tool,
                    "idempotencyKey": key,
                    "notice": "The sample tools have no finished call with this key. Approving runs it (again); rejecting ends the run.",
                },
            },
        }),
    })
}

async fn wait_for_export(samples: &Samples, key: &str) -> Option<Value> {
    let deadline = Instant::now() + WAIT_FOR_RUNNING;
    loop {
        match samples.export(key) {
            Some(Export::Done(result)) => return Some(result),
            Some(Export::Running) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(tool: &str, previous: &str) -> Value {
        json!({
            "run": {"namespace": "default", "name": "r", "uid": "u-1"},
            "interruptedStep": 1,
            "steps": [
                {"index": 0, "status": "done"},
                {
                    "index": 1, "status": "interrupted",
                    "decision": {"kind": "tool_call", "tool": tool, "args": {}},
                    "observation": {"kind": "interrupted", "content": {"previousStatus": previous}},
                },
            ],
            "approvals": [],
        })
    }

    fn samples() -> Samples {
        Samples {
            ledger: Default::default(),
            slow: Duration::from_millis(10),
            sessions: Default::default(),
        }
    }

    async fn ask(samples: &Samples, view: Value) -> Value {
        reconcile(State(samples.clone()), Json(view)).await.0
    }

    #[tokio::test]
    async fn a_finished_call_is_completed_with_what_it_returned() {
        let samples = samples();
        samples
            .ledger
            .lock()
            .unwrap()
            .refunds
            .insert("u-1/1".into(), json!({"refundId": "rf-1"}));
        let answer = ask(&samples, view("issue_refund", "executing")).await;
        assert_eq!(answer["outcome"], "completed");
        assert_eq!(answer["result"], json!({"refundId": "rf-1"}));

        samples.set_export("u-1/1", Export::Running);
        let later = samples.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            later.set_export("u-1/1", Export::Done(json!({"rows": 1200})));
        });
        let answer = ask(&samples, view("slow_export", "executing")).await;
        assert_eq!(
            answer["outcome"], "completed",
            "waited for the running export"
        );
        assert_eq!(answer["result"], json!({"rows": 1200}));
    }

    #[tokio::test]
    async fn a_call_the_tools_never_saw_waits_for_a_person_and_anything_else_continues() {
        let samples = samples();
        let answer = ask(&samples, view("issue_refund", "executing")).await;
        assert_eq!(answer["outcome"], "waiting");
        assert_eq!(answer["pause"]["decision"], "require_approval");
        assert_eq!(answer["pause"]["presentation"]["idempotencyKey"], "u-1/1");
        let answer = ask(&samples, view("issue_refund", "deciding")).await;
        assert_eq!(answer, json!({"outcome": "continue"}));
        let answer = ask(&samples, view("lookup_order", "executing")).await;
        assert_eq!(answer, json!({"outcome": "continue"}));
    }
}
