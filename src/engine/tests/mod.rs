//! The engine's unit tests: one per behaviour of docs/behaviours.md 1-50 the engine decides, named
//! for it, built on a fake controller ([`harness`]).

/// Asserts that `effects` (a `Vec<harness::Effect>`), as [`harness::kinds`] words, are exactly
/// the listed ones: `assert_effects!(effects, ["WriteStatus", "CallTool(send#1)"])`.
macro_rules! assert_effects {
    ($effects:expr, [$($word:expr),* $(,)?] $(, $($msg:tt)+)?) => {
        assert_eq!(
            super::harness::kinds(&$effects),
            super::harness::words(&[$($word),*])
            $(, $($msg)+)?
        )
    };
}

/// Asserts that a list of words (a journal as `h.journal()` gives it, or effects already as
/// words) is exactly the listed one: `assert_words!(h.journal(), ["run.created", ...])`.
macro_rules! assert_words {
    ($words:expr, [$($word:expr),* $(,)?] $(, $($msg:tt)+)?) => {
        assert_eq!($words, super::harness::words(&[$($word),*]) $(, $($msg)+)?)
    };
}

mod admin_policies;
mod agent_calls;
mod answers_by_key;
mod approvals;
mod calls;
mod grants;
mod habits;
mod harness;
mod mcp;
mod model;
mod outcomes;
mod properties;
mod records;
mod sealing;
mod starting;
mod steps;
mod takeover;
mod tasks;
