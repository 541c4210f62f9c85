//! [`StepIndex`]: which step of a run a record entry, an input or an Approval is about.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A step's 0-based number in its run, counting sealed steps (docs/design.md section 1;
/// `status.steps[].index`, `status.events[].step`, an Approval's `spec.stepIndex`, the step of
/// an input or a call). Serialized as the bare integer, so the record and the CRD schemas are
/// those of an `int64`; a newtype so that a step is never mixed up with an attempt, a count or
/// an epoch (ARCHITECTURE.md, "Types carry the contract"). Once a run has sealed, it is not a position
/// in `status.steps` (the window, docs/design.md section 4a): the engine's record looks a step
/// up by its index.
#[derive(
    Serialize,
    Deserialize,
    JsonSchema,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
#[serde(transparent)]
pub struct StepIndex(pub i64);

impl StepIndex {
    /// The bare integer, as serialized.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl std::fmt::Display for StepIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_index_is_written_as_its_bare_integer() {
        assert_eq!(
            serde_json::to_value(StepIndex(3)).unwrap(),
            serde_json::json!(3)
        );
        let read: StepIndex = serde_json::from_value(serde_json::json!(7)).unwrap();
        assert_eq!(read, StepIndex(7));
    }
}
