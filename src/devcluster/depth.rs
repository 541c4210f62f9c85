//! Decoding a request body's JSON deeper than serde_json's default allows, as kube-apiserver
//! does: it reads JSON with Go's `encoding/json` scanner (through sigs.k8s.io/json), whose
//! nesting limit is 10000, and apimachinery's number conversion stops at the same depth
//! (`exceeded max depth of 10000`). serde_json's own limit (128) refused bodies the real server
//! accepts (args nested 150 deep), so the recursion limit is lifted and the depth is bounded
//! here instead, by a scan that does not recurse, at [`MAX_DEPTH`]: 512, not 10000, because
//! the embedded server's later passes (pruning, validation, CEL, managed fields, even dropping
//! the value) recurse once per level on a worker thread's stack, and a 10000-deep value
//! overflows it. Every client agentrt knows reads at most 128 levels (kube-rs) and the engine
//! refuses args past 100 (docs/design.md section 6), so only a body between 513 and 10000
//! levels deep is answered differently, with a 400 naming both limits. Must not: decide
//! anything about what the body holds.

use serde::Deserialize as _;
use serde_json::Value;

/// The deepest nesting of objects and arrays a body may have here (kube-apiserver: 10000).
pub const MAX_DEPTH: usize = 512;

/// `body` decoded as JSON when its nesting is at most [`MAX_DEPTH`].
///
/// # Errors
/// A sentence saying why: `exceeded max depth of 512 ...` (kube-apiserver's words, with
/// both limits) or serde_json's syntax error.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    if depth(body) > MAX_DEPTH {
        return Err(format!(
            "exceeded max depth of {MAX_DEPTH} (agentrt dev's bound; kube-apiserver's is 10000)"
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    let value = Value::deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// The deepest nesting of `[` and `{` in `body` outside strings (a scan, no recursion).
fn depth(body: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &byte in body {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(levels: usize) -> String {
        format!(
            "{{\"a\": {}1{}}}",
            "[".repeat(levels - 1),
            "]".repeat(levels - 1)
        )
    }

    #[test]
    fn a_body_nested_150_deep_decodes_as_on_kube_apiserver() {
        let value = decode(nested(150).as_bytes()).expect("decodes");
        assert!(value["a"].is_array());
    }

    #[test]
    fn a_body_deeper_than_the_bound_is_refused_naming_it() {
        assert!(decode(nested(MAX_DEPTH).as_bytes()).is_ok());
        let err = decode(nested(MAX_DEPTH + 1).as_bytes()).expect_err("too deep");
        assert!(err.starts_with("exceeded max depth of 512"), "{err}");
    }

    #[test]
    fn brackets_inside_strings_are_not_nesting() {
        assert_eq!(depth(br#"{"a": "[[[{\"[[", "b": [1]}"#), 2);
    }
}
