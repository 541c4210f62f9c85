//! docs/design.md section 4a, docs/behaviours.md 54-58: the window and sealing, as the
//! engine decides them. A sealing run decides exactly as an unsealed one (the limits, loop
//! detection, takeovers and grants see what they need in the window), its whole history is
//! what an unsealed record would hold, and a seal rides on the write of a step's outcome.

use serde_json::{json, Value};

use super::harness::*;
use crate::api::{RunPhase, StepStatus, TerminalReason};

fn reads(n: usize) -> Vec<Value> {
    let mut decisions: Vec<Value> = (0..n).map(|i| call("read", json!({"n": i}))).collect();
    decisions.push(complete(json!({"read": n})));
    decisions
}

/// Runs `h` (a scripted run of `read` calls) to its end, answering each call with `answer(i)`.
fn run_to_end(h: &mut Harness, answer: impl Fn(usize) -> Value) {
    h.reconcile("a");
    let mut i = 0;
    while h.pending_tool.is_some() {
        h.result("a", answer(i));
        i += 1;
        assert!(i < 1000, "the run never ended");
    }
}

#[test]
fn a_sealing_run_holds_the_same_whole_history_as_an_unsealed_one() {
    let mut plain = Harness::scripted(reads(30));
    plain.spec_mut().limits.max_steps = 100;
    let mut sealed = Harness::scripted(reads(30));
    sealed.spec_mut().limits.max_steps = 100;
    sealed.seal_often(4, 1);
    run_to_end(&mut plain, |i| json!({"v": i}));
    run_to_end(&mut sealed, |i| json!({"v": i}));

    assert_eq!(sealed.status().phase, RunPhase::Completed);
    assert!(
        sealed.segments.len() > 3,
        "{} segments",
        sealed.segments.len()
    );
    let whole = sealed.whole();
    let unsealed = plain.status();
    assert_eq!(whole.steps, unsealed.steps);
    assert_eq!(whole.events, unsealed.events);
    assert_eq!(sealed.status().step_count, unsealed.step_count);
    assert_eq!(sealed.status().step_count, 31);
    assert_eq!(
        sealed.tool_calls, plain.tool_calls,
        "the same calls, keys and all"
    );
    assert_eq!(
        sealed.writes.len(),
        plain.writes.len(),
        "sealing adds no status write (docs/behaviours.md 55)"
    );
    // The window stays small: the step sealing keeps and those settled since the last seal.
    assert!(
        sealed.status().steps.len() <= 8,
        "{:?}",
        sealed.status().steps.len()
    );
}

#[test]
fn a_seal_is_created_before_the_write_that_records_a_steps_outcome() {
    let mut h = Harness::scripted(reads(12));
    h.seal_often(4, 1);
    h.reconcile("a");
    let mut sealing = Vec::new();
    while h.pending_tool.is_some() {
        let effects = h.result("a", json!({"v": 1}));
        let words = kinds(&effects);
        if let Some(at) = words.iter().position(|w| w.starts_with("CreateSegment")) {
            assert_eq!(words[at + 1], "WriteStatus", "{words:?}");
            assert_eq!(at, 0, "{words:?}");
            sealing.push(words);
        }
    }
    assert!(!sealing.is_empty());
    // Every segment the record names was created, in order, chained.
    let archive = h.status().archive.unwrap();
    assert_eq!(archive.segments.len(), h.segments.len());
    for (i, entry) in archive.segments.iter().enumerate() {
        assert_eq!(entry.index, i as i64);
        assert!(h.segments.contains_key(&entry.name), "{}", entry.name);
    }
}

#[test]
fn an_observer_and_a_takeover_never_seal() {
    let mut h = Harness::scripted(vec![call("read", json!({})), call("send", json!({"n": 1}))]);
    h.seal_often(1, 1);
    h.reconcile("a");
    h.result("a", json!({"v": 1}));
    // The run is waiting for the send's approval; what follows settles no step.
    h.expire_lease();
    for effects in [h.reconcile("b"), h.reconcile("b")] {
        assert!(
            !kinds(&effects)
                .iter()
                .any(|w| w.starts_with("CreateSegment")),
            "{:?}",
            kinds(&effects)
        );
    }
}

#[test]
fn the_step_limit_counts_sealed_steps() {
    let mut h = Harness::scripted(reads(20));
    h.spec_mut().limits.max_steps = 10;
    h.seal_often(2, 1);
    run_to_end(&mut h, |i| json!({"v": i}));
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LimitSteps));
    assert_eq!(status.step_count, 10);
    assert!(!h.segments.is_empty());
    assert_eq!(
        h.last_event("limit.exceeded"),
        json!({"limit": "maxSteps", "value": 10, "max": 10})
    );
    assert_eq!(h.tool_calls.len(), 10);
}

#[test]
fn loop_detection_sees_the_window_it_needs_when_everything_else_is_sealed() {
    // Six different answers, then the same call with the same answer: loop_detected after
    // loopThreshold (5) steps, though sealing asks to keep none.
    let decisions: Vec<Value> = (0..12).map(|_| call("read", json!({"n": 7}))).collect();
    let mut plain = Harness::scripted(decisions.clone());
    let mut sealed = Harness::scripted(decisions);
    sealed.seal_often(1, 0);
    for h in [&mut plain, &mut sealed] {
        h.spec_mut().limits.loop_threshold = 5;
        h.reconcile("a");
        let mut i = 0;
        while h.pending_tool.is_some() {
            let answer = if i < 6 {
                json!({"v": i})
            } else {
                json!({"v": "same"})
            };
            h.result("a", answer);
            i += 1;
        }
    }
    let status = sealed.status();
    assert_eq!(status.reason, Some(TerminalReason::LoopDetected));
    assert!(!sealed.segments.is_empty());
    assert!(
        status.steps.len() >= 5,
        "the window keeps loopThreshold steps"
    );
    assert_eq!(status.step_count, plain.status().step_count);
    assert_eq!(sealed.whole().events, plain.status().events);
}

#[test]
fn consecutive_failures_are_counted_through_sealing() {
    let decisions: Vec<Value> = (0..12).map(|i| call("read", json!({"n": i}))).collect();
    let mut plain = Harness::scripted(decisions.clone());
    let mut sealed = Harness::scripted(decisions);
    sealed.seal_often(1, 0);
    for h in [&mut plain, &mut sealed] {
        h.spec_mut().limits.max_consecutive_tool_failures = 4;
        h.reconcile("a");
        let mut i = 0;
        while h.pending_tool.is_some() {
            if i < 3 {
                h.result("a", json!({"v": i}));
            } else {
                h.error("a", json!({"error": i}));
            }
            i += 1;
        }
    }
    let status = sealed.status();
    assert_eq!(status.reason, Some(TerminalReason::RepeatedToolFailures));
    assert!(!sealed.segments.is_empty());
    assert_eq!(sealed.whole().events, plain.status().events);
    assert_eq!(sealed.whole().steps, plain.status().steps);
}

#[test]
fn a_takeover_and_a_grant_of_a_sealed_run_use_the_step_index() {
    // Eight reads (sealed away), then a send that is in flight when the holder dies.
    let mut decisions: Vec<Value> = (0..8).map(|i| call("read", json!({"n": i}))).collect();
    decisions.push(call("write_local", json!({"n": 99})));
    decisions.push(complete(json!({})));
    let mut h = Harness::scripted(decisions);
    h.seal_often(2, 1);
    h.reconcile("a");
    for i in 0..8 {
        h.result("a", json!({"v": i}));
    }
    let call = h.pending_tool.clone().expect("write_local was started");
    assert_eq!(call.step.get(), 8);
    assert_eq!(call.idempotency_key, "uid-1/8");
    assert!(
        h.status().steps[0].index.get() > 0,
        "the window starts later"
    );
    // The holder dies; another replica takes over and pauses on the unknown outcome.
    h.pending_tool = None;
    h.expire_lease();
    h.reconcile("b");
    let status = h.status();
    assert_eq!(status.phase, RunPhase::WaitingForApproval);
    let step = status.steps.iter().find(|s| s.index.get() == 8).unwrap();
    assert_eq!(step.status, StepStatus::AwaitingApproval);
    let name = step.approvals[0].name.clone();
    assert_eq!(name, "tools-8-1");
    assert_eq!(h.approval(&name)["spec"]["stepIndex"], json!(8));
    h.approve(&name);
    // The re-run waits out the first attempt (docs/design.md section 5).
    h.advance(10);
    h.reconcile("b");
    let again = h
        .pending_tool
        .clone()
        .expect("the grant runs the call again");
    assert_eq!((again.step.get(), again.attempt), (8, 2));
    assert_eq!(again.idempotency_key, "uid-1/8");
    h.result("b", json!({"ok": true}));
    assert_eq!(h.status().phase, RunPhase::Completed);
    let whole = h.whole();
    let indices: Vec<i64> = whole.steps.iter().map(|s| s.index.get()).collect();
    assert_eq!(indices, (0..10).collect::<Vec<_>>());
    let seqs: Vec<i64> = whole.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=whole.events.len() as i64).collect::<Vec<_>>());
}

#[test]
fn the_object_budget_is_checked_on_the_sealed_status() {
    // Unsealed, this run ends record_too_large at about its 13th step (as in records.rs);
    // sealed, it completes. (Each segment adds its entry to `status.archive`.)
    let mut h = Harness::scripted(reads(40));
    h.spec_mut().limits.max_steps = 100;
    h.budgets.object_bytes = 32 * 1024;
    h.budgets.seal = crate::engine::archive::SealLimits {
        seal_steps: 64,
        seal_bytes: 8 * 1024,
        keep_steps: 1,
        ..crate::engine::archive::SealLimits::default()
    };
    run_to_end(&mut h, |_| json!({"text": "y".repeat(2000)}));
    let status = h.status();
    assert_eq!(
        status.phase,
        RunPhase::Completed,
        "{:?}",
        status.reason_detail
    );
    for write in &h.writes {
        let bytes = serde_json::to_vec(write).unwrap().len()
            + serde_json::to_vec(&*h.run.spec).unwrap().len();
        assert!(bytes <= h.budgets.object_bytes, "{bytes} bytes written");
    }
    assert_eq!(h.whole().steps.len(), 41);
}

#[test]
fn a_run_from_before_sealing_is_sealed_a_bounded_segment_per_transition() {
    let mut h = Harness::scripted(reads(60));
    h.spec_mut().limits.max_steps = 100;
    h.budgets.seal.seal_steps = 1000;
    h.reconcile("a");
    for i in 0..40 {
        h.result("a", json!({"v": i, "pad": "x".repeat(500)}));
    }
    assert!(h.segments.is_empty());
    assert_eq!(h.status().steps.len(), 41);
    // The controller is upgraded: sealing on, at most ~4 KiB of steps per segment.
    h.budgets.seal = crate::engine::archive::SealLimits {
        seal_steps: 4,
        keep_steps: 1,
        segment_bytes: 4 * 1024,
        ..crate::engine::archive::SealLimits::default()
    };
    let mut lengths = Vec::new();
    while h.pending_tool.is_some() {
        let effects = h.result("a", json!({"v": 0}));
        let creates = kinds(&effects)
            .iter()
            .filter(|w| w.starts_with("CreateSegment"))
            .count();
        assert!(creates <= 1, "one segment per transition");
        lengths.push(h.status().steps.len());
    }
    assert_eq!(h.status().phase, RunPhase::Completed);
    assert!(lengths[0] < 41 && lengths[0] > 30, "{lengths:?}");
    assert!(*lengths.last().unwrap() <= 8, "{lengths:?}");
    for segment in h.segments.values() {
        assert!(segment["spec"]["stepCount"].as_i64().unwrap() <= 8);
    }
    let whole = h.whole();
    assert_eq!(whole.steps.len(), 61);
}

#[test]
fn the_webhook_agent_and_the_reconcile_hook_get_the_window_and_the_archive() {
    let mut h = Harness::new(WEBHOOK);
    h.seal_often(2, 1);
    h.reconcile("a");
    for n in 0..8 {
        let (step, request) = h.pending_agent.take().expect("the agent is asked");
        if n == 0 {
            assert_eq!(request["archive"], Value::Null, "nothing sealed yet");
        }
        h.step(
            "a",
            crate::engine::Input::AgentAnswered {
                step,
                decision: Ok(call("send", json!({"n": n}))),
            },
        );
        h.result("a", json!({"sent": n}));
    }
    let (step, request) = h.pending_agent.clone().expect("the agent is asked");
    assert_eq!(step.get(), 8);
    assert_eq!(request["step"], json!(8));
    // The request is the record as this transition decided on it, before the write sealed:
    // its archive and its window continue each other.
    let segments = request["archive"]["segments"].as_array().expect("sealed");
    let last_sealed = segments.last().unwrap()["lastStep"].as_i64().unwrap();
    assert_eq!(request["steps"][0]["index"], json!(last_sealed + 1));
    assert_eq!(
        request["steps"].as_array().unwrap().last().unwrap()["index"],
        json!(8)
    );
    h.step(
        "a",
        crate::engine::Input::AgentAnswered {
            step,
            decision: Ok(call("send", json!({"n": 8}))),
        },
    );
    // The holder dies with step 8 executing; the next one asks the hook.
    h.pending_tool = None;
    h.expire_lease();
    h.reconcile("b");
    let view = h.pending_hook.clone().expect("the hook is asked");
    assert_eq!(view["interruptedStep"], json!(8));
    let archive = h.status().archive.expect("sealed");
    assert_eq!(view["archive"], serde_json::to_value(&archive).unwrap());
    let last = view["steps"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["index"].clone(), last["status"].clone()),
        (json!(8), json!("interrupted"))
    );
}

#[test]
fn a_run_with_lifted_limits_still_seals_and_its_limits_still_fire() {
    // maxConsecutiveToolFailures and loopThreshold far above the run's length (as the
    // benchmark's runs set them): the window keeps only the trailing runs those rules need.
    let decisions: Vec<Value> = (0..30).map(|_| call("read", json!({"n": 1}))).collect();
    let mut h = Harness::scripted(decisions);
    h.spec_mut().limits.max_steps = 100;
    h.spec_mut().limits.max_consecutive_tool_failures = 1000;
    h.spec_mut().limits.loop_threshold = 12;
    h.seal_often(4, 1);
    h.reconcile("a");
    for i in 0..14 {
        h.result("a", json!({"v": i}));
    }
    assert!(!h.segments.is_empty(), "it sealed");
    assert!(h.status().steps.len() <= 6, "{}", h.status().steps.len());
    // Now the same answer again and again: loop_detected after 12 in a row, as unsealed.
    while h.pending_tool.is_some() {
        h.result("a", json!({"v": "same"}));
    }
    let status = h.status();
    assert_eq!(status.reason, Some(TerminalReason::LoopDetected));
    assert_eq!(h.last_event("loop.detected")["count"], json!(12));
    assert_eq!(status.step_count, 14 + 12);
}

#[test]
fn a_step_is_found_by_its_index_whatever_the_window_holds() {
    use crate::engine::record::{index_at, next_index, position, step_count};
    let mut h = Harness::scripted(reads(12));
    h.seal_often(2, 1);
    run_to_end(&mut h, |i| json!({"v": i}));
    let status = h.status();
    let first = status.steps[0].index;
    assert!(first.get() > 0, "the window starts after the sealed steps");
    assert_eq!(position(&status, first), Some(0));
    assert_eq!(
        position(&status, StepIndex(first.get() - 1)),
        None,
        "a sealed step"
    );
    assert_eq!(position(&status, StepIndex(99)), None, "not started");
    assert_eq!(position(&status, StepIndex(-1)), None);
    assert_eq!(index_at(&status, 0), first);
    assert_eq!(next_index(&status), StepIndex(13));
    assert_eq!(index_at(&status, status.steps.len()), StepIndex(13));
    assert_eq!(step_count(&status), 13);
    // An empty window continues after its archive.
    let mut empty = status.clone();
    empty.steps.clear();
    let last_sealed = empty
        .archive
        .as_ref()
        .unwrap()
        .segments
        .last()
        .unwrap()
        .last_step;
    assert_eq!(next_index(&empty), StepIndex(last_sealed + 1));
    assert_eq!(step_count(&crate::api::AgentRunStatus::default()), 0);
}

/// The model request in `effects`.
fn model_request(effects: &[Effect]) -> Option<Value> {
    effects.iter().find_map(|e| match e {
        Effect::CallModel { request, .. } => Some(request.clone()),
        _ => None,
    })
}

/// An openai run of `n` `read` calls, sealing often, each result carrying `marker-<i>` and
/// `bytes` of text; returns every model request sent, in order.
fn openai_run(n: usize, bytes: usize, max_context_bytes: Option<i64>) -> (Harness, Vec<Value>) {
    use crate::engine::ModelOutcome;
    let mut h = Harness::new(OPENAI);
    h.spec_mut().limits.max_steps = 1000;
    h.spec_mut().limits.max_model_calls = None;
    if let Some(max) = max_context_bytes {
        h.spec_mut()
            .agent
            .openai
            .as_mut()
            .expect("openai")
            .max_context_bytes = max;
    }
    h.seal_often(2, 1);
    let mut requests = Vec::new();
    let mut effects = h.reconcile("a");
    for i in 0..=n {
        requests.push(model_request(&effects).expect("a model call"));
        let (step, attempt) = h.pending_model.take().expect("a model call is pending");
        let decision = if i < n {
            call("read", json!({"n": i}))
        } else {
            complete(json!({"read": n}))
        };
        let outcome = ModelOutcome::Answered {
            decision,
            usage: Some(crate::engine::model::ReportedUsage {
                input_tokens: 10,
                output_tokens: 10,
                cached_input_tokens: 0,
            }),
            latency_ms: 5,
        };
        h.step(
            "a",
            crate::engine::Input::ModelAnswered {
                step,
                attempt,
                outcome,
            },
        );
        if i < n {
            effects = h.result(
                "a",
                json!({"marker": format!("marker-{i}"), "text": "t".repeat(bytes)}),
            );
        }
    }
    assert_eq!(h.status().phase, RunPhase::Completed);
    (h, requests)
}

/// docs/behaviours.md 59: the model is asked with the whole history, sealed steps included.
#[test]
fn an_openai_agent_is_asked_with_its_sealed_steps_too() {
    let (h, requests) = openai_run(12, 10, None);
    let archive = h.status().archive.expect("sealed");
    assert!(archive.segments.len() >= 3, "{archive:?}");
    let last = requests.last().expect("requests").to_string();
    for i in 0..12 {
        assert!(
            last.contains(&format!("marker-{i}")),
            "marker-{i} missing: {last}"
        );
    }
    // The window alone holds only the last few.
    assert!(h.status().steps.len() < 5);
}

/// docs/behaviours.md 59: the request stops growing at maxContextBytes, the oldest results
/// summarised or left out, the newest whole, as the projection measured it (46).
#[test]
fn an_openai_agents_request_stops_growing_at_max_context_bytes() {
    let (_, requests) = openai_run(60, 400, Some(8192));
    let sizes: Vec<usize> = requests
        .iter()
        .map(|r| crate::agents::openai::encode(r).len())
        .collect();
    assert!(sizes.iter().all(|s| *s <= 8192), "{sizes:?}");
    assert!(sizes[40..].iter().all(|s| *s > 6 * 1024), "{sizes:?}");
    let last = requests.last().expect("requests").to_string();
    assert!(last.contains("earlier steps are left out"), "{last}");
    assert!(last.contains("marker-59"), "the newest step is whole");
    assert!(!last.contains("marker-0\\"), "the oldest is left out");
}

#[test]
fn a_long_sealing_run_keeps_a_bounded_archive_index_in_every_write() {
    let mut h = Harness::scripted(reads(200));
    h.spec_mut().limits.max_steps = 300;
    h.seal_often(4, 1);
    run_to_end(&mut h, |i| json!({"v": i}));
    assert_eq!(h.status().phase, RunPhase::Completed);
    assert!(h.segments.len() > 20, "{} segments", h.segments.len());
    let mut largest = 0;
    for write in &h.writes {
        let entries = write["archive"]["segments"].as_array().map_or(0, Vec::len);
        assert!(
            entries <= crate::engine::archive::KEPT_ENTRIES,
            "{entries} entries"
        );
        largest = largest.max(serde_json::to_string(&write["archive"]).unwrap().len());
    }
    assert!(
        largest < 4096,
        "status.archive stays small: {largest} bytes"
    );
    let archive = h.status().archive.expect("sealed");
    assert_eq!(archive.count, Some(h.segments.len() as i64));
    // The whole history is still read back, walking the chain from the kept entries.
    let whole = h.whole();
    assert_eq!(whole.steps.len(), 201);
}
