//! Content budgets (docs/design.md section 3, guarantee 8; docs/behaviours.md 50): content over the
//! per-step budget is cut, keeping its full size and SHA-256.
//!
//! Owns: how content is measured (bytes of canonical JSON) and the shape of a cut. Must not:
//! lose the fact that content was cut, its size, or its hash.

use serde_json::{json, Value};

pub mod answer;

use super::canonical::{canonical_json, escaped_char_len, sha256_tagged};
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
///
/// Measure: the byte length N of the canonical JSON of `content` (should canonicalization ever
/// fail, serde_json's compact text stands in for it, for size, hash and head alike).
/// - N ≤ `budget_bytes`: `content` is returned unchanged.
/// - Else the content becomes `{"head": H, "originalBytes": N, "sha256": "sha256:…",
///   "truncated": true}` where H is the longest prefix of the canonical text, cut on a character
///   boundary, for which this object's canonical JSON is at most `budget_bytes` (escaping
///   growth in H, e.g. `"` → `\"`, is accounted for); `truncated` is
///   `Some(Truncation { original_bytes: N, sha256 })`.
///
/// `content_hash` is always the hash of the full content. The cut form has a fixed overhead of
/// about 120 bytes, so a budget under that yields it with an empty head, which is then over the
/// budget (the default budget is 16 KiB).
pub fn bound(content: Value, budget_bytes: usize) -> Bounded {
    let text = canonical_json(&content)
        .or_else(|_| serde_json::to_string(&content))
        .unwrap_or_default();
    let content_hash = sha256_tagged(text.as_bytes());
    if text.len() <= budget_bytes {
        return Bounded {
            content,
            content_hash,
            truncated: None,
        };
    }
    let original_bytes = i64::try_from(text.len()).unwrap_or(i64::MAX);
    let cut = |head: &str| {
        json!({
            "truncated": true,
            "originalBytes": original_bytes,
            "sha256": content_hash,
            "head": head,
        })
    };
    // The size of the cut form with an empty head; the head's literal adds its escaped length.
    let overhead = canonical_json(&cut(""))
        .map(|t| t.len())
        .unwrap_or_else(|_| 128);
    let room = budget_bytes.saturating_sub(overhead);
    let mut used = 0usize;
    let mut end = 0usize;
    for (i, c) in text.char_indices() {
        let grow = escaped_char_len(c);
        if used + grow > room {
            break;
        }
        used += grow;
        end = i + c.len_utf8();
    }
    let head = text.get(..end).unwrap_or_default();
    Bounded {
        content: cut(head),
        content_hash: content_hash.clone(),
        truncated: Some(Truncation {
            original_bytes,
            sha256: content_hash,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::canonical::content_hash;
    use proptest::prelude::*;

    const BUDGET: usize = 16 * 1024;

    fn canonical_len(v: &Value) -> usize {
        canonical_json(v).expect("canonical").len()
    }

    #[test]
    fn content_within_the_budget_is_kept_unchanged() {
        let content = json!({"order": 1042, "status": "delivered", "damaged": true});
        let b = bound(content.clone(), BUDGET);
        assert_eq!(b.content, content);
        assert_eq!(b.truncated, None);
        assert_eq!(b.content_hash, content_hash(&content).expect("hash"));
        // Exactly at the budget is still within it.
        let n = canonical_len(&content);
        assert_eq!(bound(content.clone(), n).truncated, None);
        assert!(bound(content, n - 1).truncated.is_some());
    }

    #[test]
    fn a_one_mebibyte_string_is_cut_to_the_budget_keeping_size_and_hash() {
        let content = Value::String("x".repeat(1024 * 1024));
        let full_hash = content_hash(&content).expect("hash");
        let b = bound(content, BUDGET);
        let size = canonical_len(&b.content);
        assert!(size <= BUDGET, "{size}");
        assert!(size > BUDGET - 8, "head uses the room: {size}");
        assert_eq!(b.content_hash, full_hash);
        assert_eq!(
            b.truncated,
            Some(Truncation {
                original_bytes: 1024 * 1024 + 2,
                sha256: full_hash.clone()
            })
        );
        assert_eq!(b.content["truncated"], json!(true));
        assert_eq!(b.content["originalBytes"], json!(1024 * 1024 + 2));
        assert_eq!(b.content["sha256"], json!(full_hash));
        let head = b.content["head"].as_str().expect("head");
        assert!(head.starts_with("\"xxxx"));
    }

    #[test]
    fn the_head_is_the_start_of_the_canonical_json() {
        let content = json!({"b": "y".repeat(5000), "a": 1});
        let b = bound(content.clone(), 1024);
        let head = b.content["head"].as_str().expect("head");
        let full = canonical_json(&content).expect("canonical");
        assert!(full.starts_with(head));
        assert!(head.starts_with("{\"a\":1,\"b\":\"yyy"));
    }

    #[test]
    fn multibyte_characters_are_never_split_at_the_cut() {
        for budget in 256..300 {
            let content = Value::String("é😀€".repeat(2000));
            let b = bound(content, budget);
            assert!(canonical_len(&b.content) <= budget, "budget {budget}");
            let head = b.content["head"].as_str().expect("head");
            assert!(head.starts_with("\"é😀€"), "budget {budget}: {head}");
        }
    }

    #[test]
    fn content_that_grows_when_escaped_still_fits() {
        for text in [
            "\"".repeat(100_000),
            "\u{1}".repeat(100_000),
            "\\\n\t".repeat(50_000),
        ] {
            let content = json!({ "s": text });
            let b = bound(content, BUDGET);
            let size = canonical_len(&b.content);
            assert!(size <= BUDGET, "{size}");
            assert!(size > BUDGET - 12, "head uses the room: {size}");
        }
    }

    #[test]
    fn a_budget_below_the_overhead_still_records_size_and_hash() {
        let content = Value::String("z".repeat(1000));
        let b = bound(content.clone(), 10);
        assert_eq!(b.content["head"], json!(""));
        assert_eq!(b.truncated.map(|t| t.original_bytes), Some(1002));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|i| json!(i)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            any::<String>().prop_map(Value::String),
            "[\"\\\\\\x00-\\x1f]{0,300}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map(any::<String>(), inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn bounded_content_always_fits_a_budget_of_256_or_more(
            content in arb_json(),
            budget in 256usize..4096,
        ) {
            let full = canonical_json(&content).expect("canonical");
            let b = bound(content.clone(), budget);
            prop_assert!(canonical_len(&b.content) <= budget);
            prop_assert_eq!(&b.content_hash, &sha256_tagged(full.as_bytes()));
            match &b.truncated {
                None => prop_assert_eq!(&b.content, &content),
                Some(t) => {
                    prop_assert_eq!(t.original_bytes as usize, full.len());
                    let head = b.content["head"].as_str().expect("head");
                    prop_assert!(full.starts_with(head));
                }
            }
        }

        #[test]
        fn long_strings_always_fit(s in any::<String>(), reps in 1usize..200, budget in 256usize..2048) {
            let content = Value::String(s.repeat(reps));
            let b = bound(content, budget);
            prop_assert!(canonical_len(&b.content) <= budget);
        }
    }
}
