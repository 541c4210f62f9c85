//! The window's one lookup (docs/design.md section 4a): a step's index is not its position in
//! `status.steps` once the run has sealed, so every room goes through [`position`],
//! [`index_at`] and [`next_index`].

use crate::api::{AgentRunStatus, StepIndex};

/// The index of the window's first step (docs/design.md section 4a): `status.steps[0]`'s, or
/// with an empty window the step after the last sealed one (0 for a run that never sealed).
/// Step indices are not positions in `status.steps` once a run has sealed: every lookup goes
/// through [`position`] and [`index_at`].
pub(crate) fn window_start(status: &AgentRunStatus) -> i64 {
    match status.steps.first() {
        Some(first) => first.index.get(),
        None => status
            .archive
            .as_ref()
            .and_then(|a| a.segments.last())
            .map_or(0, |s| s.last_step.saturating_add(1)),
    }
}

/// The position in `status.steps` of step `index`, when the window holds it (`None` for a
/// sealed step, one not started yet, or a negative index in a record edited by hand).
pub(crate) fn position(status: &AgentRunStatus, index: StepIndex) -> Option<usize> {
    let offset = index.get().checked_sub(window_start(status))?;
    let guess = usize::try_from(offset).ok()?;
    match status.steps.get(guess) {
        Some(step) if step.index == index => Some(guess),
        // A window whose indices have a gap (edited by hand): look for it.
        _ => status.steps.iter().position(|s| s.index == index),
    }
}

/// The index of the step at `position` in `status.steps`; one past the window's end is the
/// index the next step gets ([`next_index`]).
pub(crate) fn index_at(status: &AgentRunStatus, position: usize) -> StepIndex {
    match status.steps.get(position) {
        Some(step) => step.index,
        None => {
            let past = position.saturating_sub(status.steps.len());
            StepIndex(
                next_index(status)
                    .get()
                    .saturating_add(i64::try_from(past).unwrap_or(i64::MAX)),
            )
        }
    }
}

/// The index the next step gets: the last step's index + 1 (the window's start when it is
/// empty).
pub(crate) fn next_index(status: &AgentRunStatus) -> StepIndex {
    StepIndex(
        status
            .steps
            .last()
            .map_or_else(|| window_start(status), |s| s.index.get().saturating_add(1)),
    )
}

/// How many steps the run has taken, sealed ones included (`stepCount`): the last step's index
/// + 1.
pub(crate) fn step_count(status: &AgentRunStatus) -> i64 {
    next_index(status).get()
}
