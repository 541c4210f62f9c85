//! `spec.changed` (docs/design.md section 2, docs/behaviours.md 73): the record keeps a small
//! hash of each top-level spec field (`status.specHashes`), so the first write after an edit of
//! a live run's spec (`metadata.generation` past `status.observedGeneration`) can say which
//! fields changed. Pure: the spec as decoded in, the hashes out.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::AgentRunSpec;
use crate::engine::canonical::{canonical_json, sha256_tagged};

/// How many hex digits of SHA-256 a field's hash keeps: 64 bits tell an edit from none, and a
/// run's hashes stay a few hundred bytes.
const HASH_HEX_DIGITS: usize = 16;

/// Each top-level spec field but `cancel` (which has its own record, `run.finished`) → the
/// first [`HASH_HEX_DIGITS`] hex digits of SHA-256 of its canonical JSON (RFC 8785), as the
/// spec decodes (defaults filled in).
pub(super) fn spec_hashes(spec: &AgentRunSpec) -> BTreeMap<String, String> {
    let Ok(Value::Object(fields)) = serde_json::to_value(spec) else {
        return BTreeMap::new();
    };
    fields
        .into_iter()
        .filter(|(name, _)| name != "cancel")
        .map(|(name, value)| {
            let text = canonical_json(&value).unwrap_or_else(|_| value.to_string());
            let tagged = sha256_tagged(text.as_bytes());
            let hex = tagged.trim_start_matches("sha256:");
            (name, hex[..HASH_HEX_DIGITS.min(hex.len())].to_string())
        })
        .collect()
}

/// The fields whose hash differs between `before` and `now` (added or removed ones too), as
/// `spec.<field>`, in name order.
pub(super) fn changed_fields(
    before: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut names: Vec<&String> = before.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| before.get(*name) != now.get(*name))
        .map(|name| format!("spec.{name}"))
        .collect()
}
