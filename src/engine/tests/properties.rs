//! The property test of docs/design.md section 9: random scripts (tool calls over tools of random
//! side-effect classes, complete, fail, invalid decisions), given by a scripted agent or by a
//! model whose attempts also fail or go unanswered, random policies, random tool outcomes
//! (result, error, unknown), crash points that drop the effects not yet performed (a new
//! replica then takes over), cancels, a person approving or rejecting at random, and half the
//! time sealing constantly (small `SealLimits`; docs/design.md section 4a).
//!
//! Whatever happens: no non-ReadOnly step's tool call is performed twice without a grant in
//! between or the tool's own word (its status URL said the call never arrived, or it honours
//! idempotency keys; a Job tool's Job is created once per attempt, and read back after a
//! takeover: see `properties/jobs`), no attempt starts while an earlier one may still be running (a 404 counts
//! only once the earlier one cannot be), a grant executes at most once, no run ends with a step deciding or executing,
//! event seqs have no gaps and history is never rewritten, every model attempt is counted once
//! and closed by an outcome, and the run ends within a bounded number of inputs.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use serde_json::{json, Value};

use super::harness::*;
use crate::api::{OpenAiAgent, PolicyOutcome, PolicyRule, RunPhase, SideEffect, StepStatus};
use crate::engine::model::ReportedUsage;
use crate::engine::{Input, ModelOutcome, StatusAnswer};

mod jobs;
mod pins;

const MAX_ROUNDS: usize = 400;
const MAX_CRASHES: usize = 5;

#[derive(Debug, Clone)]
enum Decision {
    Call(usize, i64),
    Complete,
    Fail,
    UnknownKind,
    UnknownTool,
    BadArgs(usize),
}

fn decision() -> impl Strategy<Value = Decision> {
    prop_oneof![
        6 => (0..4usize, 0..8i64).prop_map(|(t, n)| Decision::Call(t, n)),
        1 => Just(Decision::Complete),
        1 => Just(Decision::Fail),
        1 => Just(Decision::UnknownKind),
        1 => Just(Decision::UnknownTool),
        1 => (0..4usize).prop_map(Decision::BadArgs),
    ]
}

fn outcome() -> impl Strategy<Value = PolicyOutcome> {
    prop_oneof![
        4 => Just(PolicyOutcome::Allow),
        2 => Just(PolicyOutcome::Deny),
        4 => Just(PolicyOutcome::RequireApproval),
        1 => Just(PolicyOutcome::Abort),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    classes: Vec<SideEffect>,
    defaults: Vec<PolicyOutcome>,
    rule: Option<PolicyOutcome>,
    decisions: Vec<Decision>,
    max_steps: i64,
    /// A model agent (answering the decisions in order) instead of the script.
    model: bool,
    /// Seal constantly: (seal_steps, keep_steps) (docs/design.md section 4a).
    seal: Option<(usize, usize)>,
    /// Per tool: 0 no `reconcile`, 1 a `statusURL`, 2 `idempotencyKeys: Honored`, 3 a `job`
    /// tool (docs/design.md section 6, "Job tools").
    reconcile: Vec<u8>,
    entropy: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(prop::sample::select(SideEffect::ALL.to_vec()), 4),
        prop::collection::vec(outcome(), 4),
        prop::option::of(outcome()),
        prop::collection::vec(decision(), 1..16),
        3..20i64,
        prop::bool::weighted(0.3),
        prop::option::of((1..4usize, 0..2usize)),
        reconcile(),
        prop::collection::vec(any::<u8>(), MAX_ROUNDS * 2),
    )
        .prop_map(
            |(classes, defaults, rule, decisions, max_steps, model, seal, reconcile, entropy)| {
                Case {
                    classes,
                    defaults,
                    rule,
                    decisions,
                    max_steps,
                    model,
                    seal,
                    reconcile,
                    entropy,
                }
            },
        )
}

/// Per tool: mostly nothing, else a status URL, honoured keys or a Job tool.
fn reconcile() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![4 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 2 => Just(3u8)],
        4,
    )
}

fn harness(case: &Case) -> Harness {
    let mut h = Harness::scripted(Vec::new());
    let spec = h.spec_mut();
    spec.tools.truncate(4);
    for (i, tool) in spec.tools.iter_mut().enumerate() {
        tool.name = format!("t{i}");
        tool.side_effect = case.classes[i];
        tool.input_schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}});
        if case.reconcile[i] == 3 {
            tool.http = None;
            tool.job = Some(jobs::job_tool());
            continue;
        }
        let http = tool.http.as_mut().expect("an http tool");
        http.reconcile = match case.reconcile[i] {
            1 => Some(crate::api::HttpReconcile {
                status_url: Some("http://127.0.0.1:8089/status/{key}".into()),
                ..Default::default()
            }),
            2 => Some(crate::api::HttpReconcile {
                idempotency_keys: Some(crate::api::IdempotencyKeys::Honored),
                ..Default::default()
            }),
            _ => None,
        };
    }
    let sides = &mut spec.policy.side_effects;
    sides.read_only = case.defaults[0];
    sides.local_mutation = case.defaults[1];
    sides.remote_mutation = case.defaults[2];
    sides.destructive = case.defaults[3];
    if let Some(outcome) = case.rule {
        spec.policy.rules = vec![PolicyRule {
            name: "big-n".into(),
            tools: vec!["t0".into(), "t1".into()],
            when: Some("args.n > 5".into()),
            outcome,
            reason: Some("n is big".into()),
            kind: Some("big".into()),
            capability: Some(json!({"n": "big"})),
            presentation: None,
        }];
    }
    spec.limits.max_steps = case.max_steps;
    if let Some((seal_steps, keep_steps)) = case.seal {
        // The window keeps at least these many settled steps: lower, so short runs seal too.
        spec.limits.loop_threshold = 2;
        spec.limits.max_consecutive_tool_failures = 2;
        h.seal_often(seal_steps, keep_steps);
    }
    let spec = h.spec_mut();
    let decisions = case.decisions.iter().map(decision_json).collect();
    if case.model {
        spec.agent.scripted = None;
        spec.agent.openai = Some(OpenAiAgent {
            base_url: "http://127.0.0.1:8091/v1".into(),
            model: "m".into(),
            max_output_tokens: Some(50),
            ..OpenAiAgent::default()
        });
    } else {
        spec.agent.scripted.as_mut().expect("scripted").decisions = decisions;
    }
    h
}

fn decision_json(decision: &Decision) -> Value {
    match decision {
        Decision::Call(t, n) => call(&format!("t{t}"), json!({"n": n})),
        Decision::Complete => complete(json!({"done": true})),
        Decision::Fail => json!({"kind": "fail", "message": "gave up"}),
        Decision::UnknownKind => json!({"kind": "dance"}),
        Decision::UnknownTool => call("nope", json!({})),
        Decision::BadArgs(t) => call(&format!("t{t}"), json!({"n": "x"})),
    }
}

/// A model attempt's outcome, the `k`th answer giving the `k`th decision of the case.
fn model_outcome(case: &Case, choice: u8, answers: &mut usize) -> ModelOutcome {
    match choice % 8 {
        0..=4 => {
            let decision = case.decisions.get(*answers).map_or_else(
                || json!({"kind": "fail", "message": "out of ideas"}),
                decision_json,
            );
            *answers += 1;
            ModelOutcome::Answered {
                decision,
                usage: Some(ReportedUsage {
                    input_tokens: 40,
                    cached_input_tokens: 10,
                    output_tokens: 20,
                }),
                latency_ms: 10,
            }
        }
        5 => ModelOutcome::Failed {
            status: if choice % 16 == 5 { 400 } else { 429 },
            retry_after_ms: None,
            detail: "busy".into(),
            latency_ms: 1,
        },
        _ => ModelOutcome::NoAnswer {
            detail: "timeout".into(),
            latency_ms: 1,
        },
    }
}

/// Plays one case: executors answer, crash and get replaced; a person decides approvals.
fn play(case: &Case) -> Harness {
    let mut h = harness(case);
    let mut entropy = case.entropy.iter().copied().cycle();
    let mut next = move || entropy.next().unwrap_or(0);
    let mut alive: Option<String> = None;
    let mut replicas = 0;
    let mut crashes = 0;
    let mut answers = 0;
    for _ in 0..MAX_ROUNDS {
        if h.status().phase.is_terminal() && alive.is_none() {
            break;
        }
        let choice = next();
        if let Some(holder) = alive.clone() {
            if let Some(query) = h.pending_status.take() {
                // The executor waits before it asks, when told to.
                h.advance_millis(i64::try_from(query.delay_millis).unwrap_or(0));
                // The status URL answers at random, or the executor dies asking.
                let answer = match choice % 6 {
                    0 if crashes < MAX_CRASHES => {
                        crashes += 1;
                        h.expire_lease();
                        alive = None;
                        continue;
                    }
                    1 => StatusAnswer::Succeeded {
                        result: json!({"v": 1}),
                    },
                    2 => StatusAnswer::Failed {
                        error: json!("declined"),
                    },
                    3 | 4 => {
                        let attempts = h
                            .steps()
                            .iter()
                            .find(|s| s.index == query.step)
                            .map_or(0, |s| s.attempts);
                        h.never_arrived.insert((query.step, attempts));
                        StatusAnswer::NotFound
                    }
                    _ => StatusAnswer::Unsettled {
                        said: json!({"status": 500}),
                    },
                };
                let effects = h.step(
                    &holder,
                    Input::ToolStatusAnswered {
                        step: query.step,
                        answer,
                    },
                );
                if !calls_out(&effects) {
                    alive = None;
                }
                continue;
            }
            if jobs::pending(&h) {
                // The executor of a Job tool's call creates or reads its Job.
                if crashes < MAX_CRASHES && next() % 6 == 0 {
                    h.crash_after = Some(usize::from(next() % 3));
                }
                match jobs::execute(&mut h, &holder, choice, &mut crashes) {
                    None => alive = None,
                    Some(effects) => {
                        if h.crash_after.take().is_some() {
                            crashes += 1;
                            h.pending_tool = None;
                            h.pending_model = None;
                            h.pending_status = None;
                            h.expire_lease();
                            alive = None;
                        } else if !calls_out(&effects) {
                            alive = None;
                        }
                    }
                }
                continue;
            }
            if h.pending_tool.is_none() && h.pending_model.is_none() {
                alive = None;
                continue;
            }
            let content = json!({"v": choice % 2});
            // A crash point inside the executor's next transition.
            if crashes < MAX_CRASHES && next() % 6 == 0 {
                h.crash_after = Some(usize::from(next() % 3));
            }
            let effects = match (h.pending_model, choice % 10) {
                (Some(_), 7) if crashes < MAX_CRASHES => {
                    crashes += 1;
                    h.crash_after = None;
                    h.pending_model = None;
                    h.expire_lease();
                    alive = None;
                    continue;
                }
                (Some((step, attempt)), _) => {
                    h.pending_model = None;
                    let outcome = model_outcome(case, choice, &mut answers);
                    h.step(
                        &holder,
                        Input::ModelAnswered {
                            step,
                            attempt,
                            outcome,
                        },
                    )
                }
                (None, 0..=4) => h.result(&holder, content),
                (None, 5) => h.error(&holder, content),
                (None, 6) => h.unknown(&holder),
                (None, 7) if crashes < MAX_CRASHES => {
                    // The executor dies with its tool call in flight.
                    crashes += 1;
                    h.crash_after = None;
                    h.pending_tool = None;
                    h.expire_lease();
                    alive = None;
                    continue;
                }
                (None, 8) => {
                    h.spec_mut().cancel = true;
                    h.result(&holder, content)
                }
                _ => {
                    h.crash_after = None;
                    let other = format!("r{}", replicas + 100);
                    let effects = h.reconcile(&other);
                    assert!(
                        !h.status().phase.is_terminal() || h.spec_mut().cancel,
                        "an observer of a live run changed it: {effects:?}"
                    );
                    continue;
                }
            };
            if h.crash_after.take().is_some() {
                crashes += 1;
                h.pending_tool = None;
                h.pending_model = None;
                h.pending_status = None;
                h.expire_lease();
                alive = None;
            } else if !calls_out(&effects) {
                alive = None;
            }
            continue;
        }
        if h.status().phase == RunPhase::WaitingForApproval {
            if let Some(name) = pending_approval(&h) {
                let interrupted = h.approvals[&name]["spec"]["kind"]
                    == json!(crate::api::INTERRUPTED_SIDE_EFFECT);
                match (choice % 6, interrupted) {
                    (0 | 1, _) => h.approve(&name),
                    (2, _) => h.reject(&name, "no"),
                    // A person settles an interrupted call without running it.
                    (3, true) => settle(&mut h, &name, "TookEffect"),
                    (4, true) => settle(&mut h, &name, "DidNotTakeEffect"),
                    _ => h.advance(1),
                }
            }
        }
        if choice % 17 == 5 {
            // Someone removes a Job by hand while no replica holds the run.
            jobs::remove_one(&mut h, next());
        }
        replicas += 1;
        let holder = format!("r{replicas}");
        if crashes < MAX_CRASHES && next() % 4 == 0 {
            h.crash_after = Some(usize::from(next() % 4));
        }
        let effects = h.reconcile(&holder);
        // An observer told to come back later (a re-run waiting out the first attempt, an
        // expiry) is requeued for that moment: the clock moves there.
        if let Some(millis) = effects.iter().find_map(|e| match e {
            Effect::RequeueAfter { millis } => Some(*millis),
            _ => None,
        }) {
            h.advance_millis(i64::try_from(millis).unwrap_or(i64::MAX).min(3_600_000));
        }
        if h.crash_after.is_some() {
            crashes += 1;
            h.crash_after = None;
            h.pending_tool = None;
            h.pending_model = None;
            h.pending_status = None;
            h.expire_lease();
            alive = None;
        } else if calls_out(&effects) {
            alive = Some(holder);
        } else if h.status().phase == RunPhase::Running {
            // Stopped without finishing (e.g. a started step found on its way): let the
            // lease run out.
            h.expire_lease();
        }
    }
    h
}

/// A person patches the interrupted call's Approval with `verdict` (`TookEffect` with a result,
/// `DidNotTakeEffect`), the hash it was shown.
fn settle(h: &mut Harness, name: &str, verdict: &str) {
    h.decide_approval(name, verdict, None);
    if verdict == "TookEffect" {
        let decision = &mut h.approvals.get_mut(name).expect("the Approval")["spec"]["decision"];
        decision["result"] = json!({"v": 1, "settled": true});
    }
}

/// Whether the transition ended in a tool or model call the executor now awaits.
fn calls_out(effects: &[Effect]) -> bool {
    effects.iter().any(|e| {
        matches!(
            e,
            Effect::CallTool(_) | Effect::CallModel { .. } | Effect::AskToolStatus(_)
        )
    })
}

/// The latest Approval of the waiting step, if undecided.
fn pending_approval(h: &Harness) -> Option<String> {
    let step = h
        .steps()
        .into_iter()
        .rfind(|s| s.status == StepStatus::AwaitingApproval)?;
    let name = step.approvals.last()?.name.clone();
    let object = h.approvals.get(&name)?;
    object["spec"].get("decision").is_none().then_some(name)
}

/// A written status's whole journal: the events of the segments its chain reaches (its archive
/// keeps only the newest entries; the older ones are walked through `previous`), then its
/// window's.
fn whole_events(h: &Harness, write: &Value) -> Vec<Value> {
    let status: crate::api::AgentRunStatus =
        serde_json::from_value(write.clone()).expect("a written status decodes");
    let fetched = h
        .segments
        .iter()
        .map(|(name, object)| (name.clone(), object["spec"].clone()))
        .collect();
    let verified =
        crate::engine::archive::verify_chain(&h.run.uid, status.archive.as_ref(), &fetched)
            .expect("every segment the chain names was created first");
    let mut events: Vec<Value> = verified
        .segments
        .iter()
        .flat_map(|s| s.events.iter())
        .map(|e| serde_json::to_value(e).expect("an event encodes"))
        .collect();
    events.extend(write["events"].as_array().cloned().unwrap_or_default());
    events
}

fn check(h: &Harness) {
    // The whole history: the window stitched with its segments, the chain checked.
    let status = h.whole();
    assert!(
        status.phase.is_terminal(),
        "the run ends within {MAX_ROUNDS} rounds: {:?} {:?}",
        status.phase,
        h.journal()
    );
    for step in &status.steps {
        assert!(
            !matches!(step.status, StepStatus::Deciding | StepStatus::Executing),
            "a terminal run has no step in flight: {step:?}"
        );
    }
    // The journal: seq 1, 2, 3... in every write, each write extending the one before.
    let mut previous: Vec<Value> = Vec::new();
    for write in &h.writes {
        let events = whole_events(h, write);
        for (i, event) in events.iter().enumerate() {
            assert_eq!(event["seq"], json!(i + 1), "no gap in {events:?}");
        }
        assert!(events.len() >= previous.len());
        assert_eq!(
            events[..previous.len()],
            previous[..],
            "history is never rewritten"
        );
        previous = events;
    }
    // Model attempts: each counted once, each closed by an outcome.
    let word = |e: &crate::api::RunEvent| serde_json::to_value(e.type_).unwrap_or(Value::Null);
    let mut open: BTreeSet<(Option<StepIndex>, i64)> = BTreeSet::new();
    let mut dispatched = 0;
    for event in &status.events {
        let attempt = event.data.as_ref().and_then(|d| d["attempt"].as_i64());
        let key = (event.step, attempt.unwrap_or(-1));
        match word(event).as_str() {
            Some("model.dispatched") => {
                dispatched += 1;
                assert!(open.insert(key), "attempt {key:?} dispatched twice");
            }
            Some("model.completed" | "model.failed") => {
                assert!(
                    open.remove(&key),
                    "an outcome for {key:?}, which is not open"
                );
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "attempts left open: {open:?}");
    assert_eq!(status.usage.model_calls, dispatched);
    // Which approval each started attempt carried.
    let mut started: BTreeMap<(StepIndex, i64), Option<String>> = BTreeMap::new();
    let mut granted = BTreeSet::new();
    for event in &status.events {
        let Some(data) = event.data.as_ref() else {
            continue;
        };
        if serde_json::to_value(event.type_).ok() != Some(json!("step.tool_started")) {
            continue;
        }
        let attempt = data["attempt"].as_i64().expect("an attempt");
        let approval = data
            .get("approval")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| {
                // A call sent again by the tool's own word, named by what allowed it.
                let by = data.get("resent")?.get("by")?.as_str()?;
                Some(format!("resent:{by}"))
            });
        if let Some(name) = approval.as_ref().filter(|n| !n.starts_with("resent:")) {
            assert!(granted.insert(name.clone()), "grant {name} executed twice");
        }
        let step = event.step.expect("a step");
        assert!(
            started.insert((step, attempt), approval).is_none(),
            "attempt {attempt} of step {step} started twice"
        );
    }
    // No attempt of a step starts while an earlier one may still be running: an attempt whose
    // outcome never came back (its holder died, or it ended unknown) runs until its start plus
    // the tool's timeoutSeconds (docs/design.md section 5).
    for (i, later) in h.tool_calls.iter().enumerate() {
        for (j, earlier) in h.tool_calls[..i].iter().enumerate() {
            if earlier.step != later.step || h.answered.contains(&(earlier.step, earlier.attempt)) {
                continue;
            }
            let may_run_until = h.tool_call_times[j].plus_seconds(earlier.tool.timeout_seconds);
            assert!(
                h.tool_call_times[i] >= may_run_until,
                "attempt {} of step {} started at {:?}, while attempt {} may run until {:?}",
                later.attempt,
                later.step,
                h.tool_call_times[i],
                earlier.attempt,
                may_run_until
            );
        }
    }
    jobs::check(h, &status.events);
    // Every performed call: once per attempt; a non-ReadOnly step runs again only on a grant.
    let mut performed = BTreeSet::new();
    let mut unapproved: BTreeMap<StepIndex, usize> = BTreeMap::new();
    for call in &h.tool_calls {
        assert!(
            performed.insert((call.step, call.attempt)),
            "attempt {} of step {} performed twice",
            call.attempt,
            call.step
        );
        let approval = started
            .get(&(call.step, call.attempt))
            .expect("every performed call was recorded first");
        if call.tool.side_effect == SideEffect::ReadOnly {
            continue;
        }
        match approval {
            None => {
                let count = unapproved.entry(call.step).or_default();
                *count += 1;
                assert_eq!(*count, 1, "step {} ran twice without a grant", call.step);
                assert_eq!(call.attempt, 1, "only a first attempt runs without a grant");
            }
            Some(name) if name == "resent:statusURL" => {
                assert!(
                    h.never_arrived.contains(&(call.step, call.attempt - 1)),
                    "step {} was sent again by its status URL, which never said attempt {} \
                     did not arrive",
                    call.step,
                    call.attempt - 1
                );
            }
            Some(name) if name == "resent:idempotencyKeys" => {
                assert_eq!(
                    call.tool
                        .http
                        .as_ref()
                        .and_then(|h| h.reconcile.as_ref())
                        .and_then(|r| r.idempotency_keys),
                    Some(crate::api::IdempotencyKeys::Honored),
                    "step {} was sent again by its key, which its tool does not honour",
                    call.step
                );
            }
            Some(name) => {
                let object = &h.approvals[name];
                assert_eq!(object["spec"]["decision"]["verdict"], json!("Approved"));
                let step = status.steps.iter().find(|s| s.index == call.step).unwrap();
                assert!(step.approvals.iter().any(|a| &a.name == name && a.executed));
            }
        }
    }
}

/// Longer runs (mostly tool calls the policy mostly allows) that seal constantly, so the
/// window moves on many times while crashes, takeovers and grants happen.
fn sealing_case() -> impl Strategy<Value = Case> {
    let decision = prop_oneof![
        12 => (0..4usize, 0..8i64).prop_map(|(t, n)| Decision::Call(t, n)),
        1 => Just(Decision::Complete),
        1 => (0..4usize).prop_map(Decision::BadArgs),
    ];
    let outcome = prop_oneof![
        6 => Just(PolicyOutcome::Allow),
        2 => Just(PolicyOutcome::RequireApproval),
        1 => Just(PolicyOutcome::Deny),
    ];
    (
        prop::collection::vec(prop::sample::select(SideEffect::ALL.to_vec()), 4),
        prop::collection::vec(outcome, 4),
        prop::collection::vec(decision, 6..24),
        6..30i64,
        prop::bool::weighted(0.3),
        (1..4usize, 0..2usize),
        reconcile(),
        prop::collection::vec(any::<u8>(), MAX_ROUNDS * 2),
    )
        .prop_map(
            |(classes, defaults, decisions, max_steps, model, seal, reconcile, entropy)| Case {
                classes,
                defaults,
                rule: None,
                decisions,
                max_steps,
                model,
                seal: Some(seal),
                reconcile,
                entropy,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn crashes_never_run_a_side_effect_twice_without_a_grant(case in case()) {
        let h = play(&case);
        check(&h);
    }

}

proptest! {
    // Cancels, rejections and failures end most runs within a few steps; many cases, so that
    // more than a hundred of them seal at least once.
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn crashes_never_run_a_side_effect_twice_without_a_grant_while_sealing(
        case in sealing_case()
    ) {
        let h = play(&case);
        check(&h);
    }
}

#[test]
fn play_a_fixed_case_with_crashes_and_approvals() {
    let case = Case {
        classes: vec![
            SideEffect::RemoteMutation,
            SideEffect::LocalMutation,
            SideEffect::ReadOnly,
            SideEffect::Destructive,
        ],
        defaults: vec![
            PolicyOutcome::Allow,
            PolicyOutcome::Allow,
            PolicyOutcome::RequireApproval,
            PolicyOutcome::Deny,
        ],
        rule: None,
        decisions: vec![
            Decision::Call(0, 1),
            Decision::Call(1, 2),
            Decision::Call(2, 3),
            Decision::Complete,
        ],
        max_steps: 10,
        model: false,
        seal: Some((1, 0)),
        reconcile: vec![1, 2, 0, 0],
        entropy: (0..=255).collect(),
    };
    let h = play(&case);
    check(&h);
}
