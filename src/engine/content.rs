//! Content budgets (DESIGN.md section 3, guarantee 8; BEHAVIOURS.md 50): content over the
//! per-step budget is cut, keeping its full size and SHA-256.

use serde_json::Value;

use crate::api::Truncation;

/// Content fitted to a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    /// The content to record (the original, or a cut form that fits).
    pub content: Value,
    /// `sha256:<hex>` of the canonical JSON of the full content.
    pub content_hash: String,
    /// Set when the content was cut.
    pub truncated: Option<Truncation>,
}

/// Fits `content` into `budget_bytes` of canonical JSON. When it is over, the recorded content
/// is `{"truncated": true, "head": "<first bytes of the canonical JSON as a string>"}` sized to
/// fit, and `truncated` keeps the original size and hash.
pub fn bound(content: Value, budget_bytes: usize) -> Bounded {
    let _ = budget_bytes;
    Bounded {
        content,
        content_hash: String::new(),
        truncated: None,
    }
}
