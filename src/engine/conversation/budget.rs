//! The openai agent's conversation from the whole history, bounded by
//! `spec.agent.openai.maxContextBytes` (docs/design.md section 4a, last bullet; docs/behaviours.md
//! 59).
//!
//! Owns: which sealed steps a request carries, whole or as their summary, and the lines that say
//! what was left out. Must not: read a segment (the executor hands them in as a
//! [`SealedHistory`]) or measure anything but the bytes the provider's wire encodes.
//!
//! The rule, measured over the encoded request (`ModelWire::encode`), never an estimate:
//! - the system prompt, the goal, the functions and the window's steps always stay whole;
//! - when the request would pass the budget, the sealed steps' observations are cut to their
//!   summary form (content over [`SUMMARY_CONTENT_BYTES`] becomes `engine::content::bound`'s
//!   head, size and sha256), oldest first;
//! - when even that is over, the oldest sealed steps are left out, and one line (a
//!   [`Turn::Note`] after the goal) says how many ("N earlier steps are left out ...").
//!
//! Bounded work: each sealed turn is rendered and measured once (whole and summarised), the cuts
//! are decided arithmetically from those sizes (each counted with one separator byte more than it
//! adds, so the sum is an upper bound), then the request is encoded once and checked; should a
//! wire not add up that way, at most [`EXTRA_PASSES`] more passes each leave one more step out.
//! When the window alone is over the budget, every sealed step is left out and the request is
//! sent as it is, over the budget: the goal and the window always stay whole.

use super::{turn, Conversation, ModelWire, Turn};
use crate::api::Step;
use crate::engine::archive::SealedHistory;

/// A sealed step's observation content is cut to this many bytes of canonical JSON in its
/// summary form.
pub const SUMMARY_CONTENT_BYTES: usize = 256;

/// Passes beyond the first when the arithmetic was not an upper bound.
pub const EXTRA_PASSES: usize = 4;

/// One sealed entry of the history, oldest first.
struct Item {
    /// The first step it covers.
    first_step: i64,
    /// The whole turn and its measured size.
    whole: (Turn, usize),
    /// The summary turn and its measured size (the same as `whole` for a note).
    summary: (Turn, usize),
}

impl Conversation {
    /// The conversation for deciding the next step: the sealed steps of `sealed` (those before
    /// the window's first step), then the `window`'s steps, fitted into `max_context_bytes` as
    /// `wire` encodes the request (this module's rule). `base` is
    /// [`Conversation::from_record`] of the window alone.
    pub fn from_history(
        base: Conversation,
        sealed: &SealedHistory,
        window: &[Step],
        wire: ModelWire,
        max_context_bytes: usize,
    ) -> Conversation {
        let window_first = window.first().map_or(i64::MAX, |s| s.index.get());
        let items = items(sealed, window_first, wire);
        // Every step before the window is sealed; those no item covers (never read: older than
        // what the executor needed) are left out too.
        let history_start = window.first().map_or_else(
            || {
                let ends = sealed.segments.iter().filter_map(|s| s.last());
                ends.map(|s| s.index.get() + 1)
                    .chain(sealed.unreadable.iter().map(|r| r.1 + 1))
                    .max()
                    .unwrap_or(0)
            },
            |s| s.index.get(),
        );
        let build = |summarised: usize, dropped: usize| {
            let mut conversation = base.clone();
            let first_kept = items
                .get(dropped)
                .map_or(history_start, |item| item.first_step);
            let mut turns = Vec::with_capacity(items.len() + base.turns.len() + 1);
            if first_kept > 0 {
                turns.push(left_out(first_kept));
            }
            for (i, item) in items.iter().enumerate().skip(dropped) {
                let (turn, _) = if i < summarised {
                    &item.summary
                } else {
                    &item.whole
                };
                turns.push(turn.clone());
            }
            turns.extend(base.turns.iter().cloned());
            conversation.turns = turns;
            conversation
        };
        if history_start == 0 {
            return base;
        }
        let encoded = |c: &Conversation| (wire.encode)(&(wire.render)(c)).len();
        // The longest the left-out line can be (its count is at most `history_start`).
        let fixed = encoded(&base) + measure(&left_out(history_start), wire);
        let room = max_context_bytes.saturating_sub(fixed);
        let mut total: usize = items.iter().map(|i| i.whole.1).sum();
        let mut summarised = 0;
        while total > room && summarised < items.len() {
            total -= items[summarised].whole.1 - items[summarised].summary.1;
            summarised += 1;
        }
        let mut dropped = 0;
        while total > room && dropped < items.len() {
            total -= items[dropped].summary.1;
            dropped += 1;
        }
        let mut conversation = build(summarised, dropped);
        for _ in 0..EXTRA_PASSES {
            if dropped >= items.len() || encoded(&conversation) <= max_context_bytes {
                break;
            }
            dropped += 1;
            conversation = build(summarised.max(dropped), dropped);
        }
        conversation
    }
}

/// The sealed entries before `window_first`, oldest first: each read step with a decision
/// (whole and summarised), and a note for each unreadable range.
fn items(sealed: &SealedHistory, window_first: i64, wire: ModelWire) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    let steps = sealed
        .segments
        .iter()
        .flat_map(|s| s.iter())
        .filter(|s| s.index.get() < window_first);
    for step in steps {
        let (Some(whole), Some(summary)) =
            (turn(step, None), turn(step, Some(SUMMARY_CONTENT_BYTES)))
        else {
            continue;
        };
        let (w, s) = (measure(&whole, wire), measure(&summary, wire));
        items.push(Item {
            first_step: step.index.get(),
            whole: (whole, w),
            summary: (summary, s.min(w)),
        });
    }
    for &(first, last) in &sealed.unreadable {
        if first >= window_first {
            continue;
        }
        let note = Turn::Note {
            text: format!(
                "Steps {first}–{last} could not be read from the run's sealed history (a segment \
                 is missing or was altered); they are left out."
            ),
        };
        let size = measure(&note, wire);
        items.push(Item {
            first_step: first,
            whole: (note.clone(), size),
            summary: (note, size),
        });
    }
    items.sort_by_key(|i| i.first_step);
    items
}

/// The line saying the first `count` steps are left out.
fn left_out(count: i64) -> Turn {
    let steps = if count == 1 {
        "1 earlier step is left out (step 0)".to_string()
    } else {
        format!("{count} earlier steps are left out (steps 0–{})", count - 1)
    };
    Turn::Note {
        text: format!(
            "{steps} to keep this request within maxContextBytes; the steps after them are \
             shown in order."
        ),
    }
}

/// What `turn` adds to a request as `wire` encodes it, plus one byte for a separator: the
/// encoded size of an empty conversation with this one turn, less that of the empty one.
fn measure(turn: &Turn, wire: ModelWire) -> usize {
    let empty = Conversation {
        model: String::new(),
        system: String::new(),
        goal: String::new(),
        functions: Vec::new(),
        turns: Vec::new(),
        max_output_tokens: None,
        temperature: None,
    };
    let size = |c: &Conversation| -> usize { (wire.encode)(&(wire.render)(c)).len() };
    let without = size(&empty);
    let with = size(&Conversation {
        turns: vec![turn.clone()],
        ..empty
    });
    with.saturating_sub(without) + 1
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{json, Value};

    use super::*;
    use crate::agents::openai::WIRE;
    use crate::api::OpenAiAgent;

    /// Step `index`: a call of `read` whose result carries `bytes` bytes of text.
    fn step(index: i64, bytes: usize) -> Step {
        let content = json!({"n": index, "text": "r".repeat(bytes)});
        serde_json::from_value(json!({
            "index": index,
            "status": "done",
            "attempts": 1,
            "decision": {"kind": "tool_call", "tool": "read", "args": {"n": index}},
            "observation": {
                "kind": "tool_result",
                "summary": format!("read {index}"),
                "content": content,
                "contentHash": crate::engine::canonical::content_hash(&content).expect("hash"),
            },
        }))
        .expect("a step")
    }

    /// A history of `n` steps of `bytes` each: all but the last `window` sealed, in segments
    /// of 10.
    fn history(n: i64, window: i64, bytes: usize) -> (SealedHistory, Vec<Step>) {
        let steps: Vec<Step> = (0..n).map(|i| step(i, bytes)).collect();
        let cut = usize::try_from(n - window).expect("n >= window");
        let segments = steps[..cut]
            .chunks(10)
            .map(|c| Arc::new(c.to_vec()))
            .collect();
        let sealed = SealedHistory {
            segments,
            unreadable: Vec::new(),
        };
        (sealed, steps[cut..].to_vec())
    }

    fn conversation(sealed: &SealedHistory, window: &[Step], budget: usize) -> Conversation {
        let agent = OpenAiAgent {
            model: "m".into(),
            ..OpenAiAgent::default()
        };
        let base = Conversation::from_record("Read everything.", &agent, &[], window, Some(100));
        Conversation::from_history(base, sealed, window, WIRE, budget)
    }

    fn size(c: &Conversation) -> usize {
        (WIRE.encode)(&(WIRE.render)(c)).len()
    }

    fn call_ids(c: &Conversation) -> Vec<String> {
        c.turns
            .iter()
            .filter_map(|t| match t {
                Turn::Call { id, .. } => Some(id.clone()),
                _ => None,
            })
            .collect()
    }

    fn notes(c: &Conversation) -> Vec<String> {
        c.turns
            .iter()
            .filter_map(|t| match t {
                Turn::Note { text } => Some(text.clone()),
                _ => None,
            })
            .collect()
    }

    fn observation(c: &Conversation, id: &str) -> Value {
        let text = c
            .turns
            .iter()
            .find_map(|t| match t {
                Turn::Call {
                    id: i, observation, ..
                } if i == id => Some(observation.clone()),
                _ => None,
            })
            .expect("the call is in the conversation");
        serde_json::from_str(&text).expect("an observation is JSON")
    }

    #[test]
    fn a_conversation_over_sealed_and_window_steps_includes_the_sealed_turns_whole() {
        let (sealed, window) = history(25, 3, 100);
        let c = conversation(&sealed, &window, 256 * 1024);
        let expected: Vec<String> = (0..25).map(|i| format!("call_{i}")).collect();
        assert_eq!(call_ids(&c), expected);
        assert!(notes(&c).is_empty(), "{:?}", notes(&c));
        // Within the budget, a sealed result is shown exactly as the window would show it.
        let unsealed: Vec<Step> = (0..25).map(|i| step(i, 100)).collect();
        let agent = OpenAiAgent {
            model: "m".into(),
            ..OpenAiAgent::default()
        };
        let whole =
            Conversation::from_record("Read everything.", &agent, &[], &unsealed, Some(100));
        assert_eq!(c, whole);
    }

    #[test]
    fn past_the_budget_older_results_become_summaries_then_the_oldest_steps_are_left_out() {
        let (sealed, window) = history(40, 3, 2000);
        let whole = size(&conversation(&sealed, &window, usize::MAX));
        // A budget that fits every step summarised, not whole: the oldest are summaries.
        let budget = whole / 2;
        let c = conversation(&sealed, &window, budget);
        assert!(size(&c) <= budget, "{} > {budget}", size(&c));
        assert_eq!(call_ids(&c).len(), 40, "nothing is left out yet");
        assert!(notes(&c).is_empty());
        let oldest = observation(&c, "call_0");
        assert_eq!(oldest["content"]["truncated"], json!(true), "{oldest}");
        assert!(oldest["truncated"]["sha256"].as_str().is_some(), "{oldest}");
        assert!(oldest["truncated"]["originalBytes"].as_i64() > Some(2000));
        let newest_sealed = observation(&c, "call_36");
        assert_eq!(newest_sealed["content"]["text"], json!("r".repeat(2000)));

        // A budget that does not fit every summary: the oldest steps are left out, one line
        // says how many, and every window step stays whole.
        let budget = 12 * 1024;
        let c = conversation(&sealed, &window, budget);
        assert!(size(&c) <= budget, "{} > {budget}", size(&c));
        let ids = call_ids(&c);
        let first: i64 = ids[0]["call_".len()..].parse().expect("an index");
        assert!(first > 0, "{ids:?}");
        let expected: Vec<String> = (first..40).map(|i| format!("call_{i}")).collect();
        assert_eq!(ids, expected);
        assert_eq!(
            notes(&c),
            vec![format!(
                "{first} earlier steps are left out (steps 0–{}) to keep this request within \
                 maxContextBytes; the steps after them are shown in order.",
                first - 1
            )]
        );
        assert!(matches!(&c.turns[0], Turn::Note { .. }));
        for i in 37..40 {
            let shown = observation(&c, &format!("call_{i}"));
            assert_eq!(
                shown["content"]["text"],
                json!("r".repeat(2000)),
                "window step {i}"
            );
        }
    }

    #[test]
    fn a_window_over_the_budget_is_sent_whole_without_the_sealed_steps() {
        let (sealed, window) = history(20, 4, 3000);
        let c = conversation(&sealed, &window, 4096);
        assert_eq!(call_ids(&c), ["call_16", "call_17", "call_18", "call_19"]);
        assert_eq!(notes(&c).len(), 1);
        assert!(notes(&c)[0].starts_with("16 earlier steps are left out"));
        assert!(size(&c) > 4096, "the window is whole, over the budget");
    }

    #[test]
    fn unreadable_segments_are_named_in_their_place_and_the_rest_is_shown() {
        let (mut sealed, window) = history(30, 2, 50);
        sealed.segments.remove(1);
        sealed.unreadable.push((10, 19));
        let c = conversation(&sealed, &window, 256 * 1024);
        let ids = call_ids(&c);
        assert_eq!(ids.len(), 20);
        assert!(!ids.iter().any(|id| id == "call_10" || id == "call_19"));
        let at = c
            .turns
            .iter()
            .position(|t| matches!(t, Turn::Note { text } if text.starts_with("Steps 10–19 could not be read")))
            .expect("a line for the unreadable steps");
        assert!(matches!(&c.turns[at - 1], Turn::Call { id, .. } if id == "call_9"));
        assert!(matches!(&c.turns[at + 1], Turn::Call { id, .. } if id == "call_20"));
    }

    /// docs/behaviours.md 59: once the budget is reached, the request stops growing.
    #[test]
    fn the_encoded_request_stops_growing_once_it_reaches_the_budget() {
        let budget = 16 * 1024;
        let mut sizes = Vec::new();
        for n in (10..=200).step_by(10) {
            let (sealed, window) = history(n, 2, 500);
            let c = conversation(&sealed, &window, budget);
            let size = size(&c);
            assert!(size <= budget, "{n} steps: {size} > {budget}");
            sizes.push(size);
        }
        // It reaches the budget (within a few steps' worth of it) and stays there.
        let reached = sizes
            .iter()
            .position(|s| *s > budget - 2048)
            .expect("the requests reach the budget");
        assert!(reached < sizes.len() - 5, "{sizes:?}");
        let biggest_before = sizes[..reached].iter().max().copied().unwrap_or(0);
        assert!(sizes[reached..]
            .iter()
            .all(|s| *s >= biggest_before.min(budget - 2048)));
    }
}
