//! Canonical JSON (RFC 8785, JCS) and SHA-256 digests: the bytes the policy, the loop detector
//! and the approval hash see (docs/design.md section 2 "The hash", docs/behaviours.md 11).
//!
//! Owns: the one serialization every hash in the engine is computed over, and the `sha256:`
//! tagging. Must not: depend on the order a map happens to be in, or on how a number was
//! spelled (`250.0` and `250` are the same number and give the same bytes, which matters
//! because kube-apiserver stores `250.0` as `250` and hashes are computed over what it stores).
//!
//! The serialization follows RFC 8785: object members sorted by the UTF-16 code units of their
//! names, strings with the minimal escaping of section 3.2.2.2 (`\"`, `\\`, `\b`, `\f`, `\n`,
//! `\r`, `\t`, other controls as `\u00xx`, everything else literal), floats in ECMAScript
//! `Number.prototype.toString` form (section 3.2.2.3; `1e+21`, `1e-7`, `0.000001`, `-0` → `0`).
//!
//! One deliberate refinement: an integer that serde_json holds as `i64`/`u64` is written with
//! its exact decimal digits. For every integer a double holds exactly this is the very output
//! RFC 8785 prescribes (ECMAScript prints integers below 10^21 as plain digits); it differs
//! only for integers beyond 2^53 that no double holds (RFC 8785 leaves those outside I-JSON),
//! where strict JCS would round them and make, say, `9007199254740993` and `9007199254740992`
//! hash alike. Kubernetes stores int64 exactly, so an approval must bind the exact integer.
//!
//! The serializer keeps an explicit stack, so arbitrarily deep values (built in code; the JSON
//! parser itself stops at 128 levels) cannot overflow the thread's stack.

use std::cmp::Ordering;
use std::fmt::Write as _;

use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// Why a value has no canonical form.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("value cannot be encoded as canonical JSON: {0}")]
pub struct CanonicalError(pub String);

/// The RFC 8785 canonical serialization of `value` (see the module doc for the one refinement:
/// integers keep their exact digits).
///
/// Shape: compact JSON text, UTF-8, no whitespace, members sorted by UTF-16 code units.
///
/// # Errors
/// [`CanonicalError`] for a value JCS cannot encode (a number that is not a finite IEEE 754
/// double; serde_json's own `Value` never holds one, so in practice this does not fail).
pub fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    let mut stack: Vec<Frame<'_>> = Vec::new();
    open(value, &mut out, &mut stack)?;
    loop {
        let next = match stack.last_mut() {
            None => break,
            Some(Frame::Array { items, next }) => {
                let item = items.get(*next);
                if item.is_some() && *next > 0 {
                    out.push(',');
                }
                *next += 1;
                item
            }
            Some(Frame::Object { members, next }) => {
                let member = members.get(*next).copied();
                if let Some((name, _)) = member {
                    if *next > 0 {
                        out.push(',');
                    }
                    write_string(name, &mut out);
                    out.push(':');
                }
                *next += 1;
                member.map(|(_, v)| v)
            }
        };
        match next {
            Some(child) => open(child, &mut out, &mut stack)?,
            None => {
                if let Some(done) = stack.pop() {
                    out.push(match done {
                        Frame::Array { .. } => ']',
                        Frame::Object { .. } => '}',
                    });
                }
            }
        }
    }
    Ok(out)
}

/// `"sha256:" + lowercase hex of SHA-256(bytes)` (71 characters).
pub fn sha256_tagged(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    format!("sha256:{}", hex::encode(digest))
}

/// `sha256_tagged(canonical_json(value))`.
///
/// # Errors
/// As [`canonical_json`].
pub fn content_hash(value: &Value) -> Result<String, CanonicalError> {
    Ok(sha256_tagged(canonical_json(value)?.as_bytes()))
}

/// The number of bytes `s` takes as a canonical JSON string literal, quotes included.
pub fn canonical_string_len(s: &str) -> usize {
    2 + s.chars().map(escaped_char_len).sum::<usize>()
}

/// The bytes one character takes inside a canonical JSON string literal.
pub fn escaped_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{08}' | '\u{0c}' | '\n' | '\r' | '\t' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Orders two member names as RFC 8785 section 3.2.3 does: by their UTF-16 code units.
pub fn utf16_order(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// A container being written: its remaining children.
enum Frame<'a> {
    Array {
        items: &'a [Value],
        next: usize,
    },
    Object {
        members: Vec<(&'a str, &'a Value)>,
        next: usize,
    },
}

/// Writes a scalar, or the opening bracket of a container and pushes its frame.
fn open<'a>(
    value: &'a Value,
    out: &mut String,
    stack: &mut Vec<Frame<'a>>,
) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            stack.push(Frame::Array { items, next: 0 });
        }
        Value::Object(map) => {
            out.push('{');
            stack.push(Frame::Object {
                members: sorted_members(map),
                next: 0,
            });
        }
    }
    Ok(())
}

fn sorted_members(map: &Map<String, Value>) -> Vec<(&str, &Value)> {
    let mut members: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
    // serde_json keeps keys in byte (UTF-8) order; that differs from UTF-16 order only around
    // supplementary-plane characters versus U+E000..U+FFFF, so this sort is almost always a
    // no-op, but it is what the RFC says.
    members.sort_by(|a, b| utf16_order(a.0, b.0));
    members
}

fn write_number(n: &Number, out: &mut String) -> Result<(), CanonicalError> {
    if let Some(u) = n.as_u64() {
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64() {
        let _ = write!(out, "{i}");
    } else {
        let f = n
            .as_f64()
            .ok_or_else(|| CanonicalError(format!("number {n} is not an IEEE 754 double")))?;
        out.push_str(&ecmascript_number(f)?);
    }
    Ok(())
}

/// `f` as ECMAScript's `Number.prototype.toString` writes it (RFC 8785 section 3.2.2.3):
/// `-0` → `0`, `1e21` → `1e+21`, `1e-7` → `1e-7`, `0.000001` → `0.000001`.
///
/// # Errors
/// [`CanonicalError`] for NaN and the infinities, which JSON cannot hold.
pub fn ecmascript_number(f: f64) -> Result<String, CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError(format!("number {f} is not finite")));
    }
    // serde_jcs formats doubles with ryu-js, a port of Ryu that emits ECMAScript's form.
    serde_jcs::to_string(&f).map_err(|e| CanonicalError(format!("number {f}: {e}")))
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        canonical_json(v).expect("canonical")
    }

    fn canon_text(text: &str) -> String {
        canon(&serde_json::from_str(text).expect("json"))
    }

    #[test]
    fn sorts_keys_and_escapes_minimally() {
        assert_eq!(
            canon(&json!({"b": 1, "a": [true, null, "é"]})),
            "{\"a\":[true,null,\"é\"],\"b\":1}"
        );
    }

    /// RFC 8785 section 3.2.2.3 and appendix B: ECMAScript number formatting.
    #[test]
    fn numbers_follow_rfc8785_examples() {
        let cases = [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("1e21", "1e+21"),
            ("1e-7", "1e-7"),
            ("0.000001", "0.000001"),
            ("333333333.33333329", "333333333.3333333"),
            ("1E30", "1e+30"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000000000000000000000000001", "1e-27"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("-1.7976931348623157e308", "-1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("-5e-324", "-5e-324"),
            ("4.9406564584124654e-324", "5e-324"),
            ("9007199254740992", "9007199254740992"),
            ("9007199254740992.0", "9007199254740992"),
            ("295147905179352830000", "295147905179352830000"),
            ("1e23", "1e+23"),
            ("0.1", "0.1"),
            ("100", "100"),
            ("250.0", "250"),
            ("-250.5", "-250.5"),
            ("123456789012345680000", "123456789012345680000"),
        ];
        for (input, want) in cases {
            assert_eq!(canon_text(input), want, "input {input}");
        }
    }

    /// RFC 8785 section 3.2.3: the sorting example (names compared as UTF-16 code units).
    #[test]
    fn keys_sort_by_utf16_code_units_as_in_rfc8785() {
        let input = r#"{
            "\u20ac": "Euro Sign",
            "\r": "Carriage Return",
            "\ufb33": "Hebrew Letter Dalet With Dagesh",
            "1": "One",
            "\ud83d\ude00": "Emoji: Grinning Face",
            "\u0080": "Control",
            "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let want = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
                    \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
                    \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon_text(input), want);
    }

    /// RFC 8785 section 3.2.4: the serialization example.
    #[test]
    fn serializes_the_rfc8785_example() {
        let input = r#"{
            "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
            "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals": [null, true, false]
        }"#;
        let want = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon_text(input), want);
    }

    #[test]
    fn escapes_controls_as_lowercase_unicode_escapes() {
        let v = json!("\u{0}\u{1f}\u{7f}\u{2028}\u{8}\u{c}\t\r\n");
        assert_eq!(canon(&v), "\"\\u0000\\u001f\u{7f}\u{2028}\\b\\f\\t\\r\\n\"");
    }

    #[test]
    fn integer_and_integral_float_spellings_give_the_same_bytes() {
        assert_eq!(canon(&json!({"a": 250.0})), canon(&json!({"a": 250})));
        assert_eq!(canon(&json!(-3.0)), canon(&json!(-3)));
        assert_eq!(
            canon(&json!(1e19)),
            canon(&json!(10_000_000_000_000_000_000u64))
        );
    }

    #[test]
    fn integers_beyond_two_to_the_53_keep_their_exact_digits() {
        assert_eq!(canon(&json!(9_007_199_254_740_993i64)), "9007199254740993");
        assert_eq!(canon(&json!(i64::MIN)), "-9223372036854775808");
        assert_eq!(canon(&json!(u64::MAX)), "18446744073709551615");
    }

    #[test]
    fn sha256_tagged_is_lowercase_hex_of_the_digest() {
        assert_eq!(
            sha256_tagged(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            content_hash(&json!({"b": 1, "a": [true, null, "é"]})).expect("hash"),
            sha256_tagged("{\"a\":[true,null,\"é\"],\"b\":1}".as_bytes())
        );
    }

    #[test]
    fn a_value_nested_100k_deep_serializes_without_overflowing_the_stack() {
        let depth = 100_000;
        let mut v = json!(1);
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        let text = canonical_json(&v).expect("canonical");
        assert_eq!(text.len(), 2 * depth + 1);
        crate::engine::validate::tests_support::drop_deep(v);
    }

    #[test]
    fn canonical_string_len_matches_the_serialization() {
        for s in ["", "abc", "é\"\\\u{1}\n😀", "\u{1f}\u{7f}"] {
            assert_eq!(canonical_string_len(s), canon(&json!(s)).len(), "{s:?}");
        }
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(1i64 << 53)..(1i64 << 53)).prop_map(|i| json!(i)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            ".*".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".*", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Within I-JSON (integers within ±2^53) the output is exactly strict JCS (serde_jcs).
        #[test]
        fn agrees_with_serde_jcs_within_i_json(v in arb_json()) {
            let ours = canonical_json(&v).expect("canonical");
            let theirs = serde_jcs::to_string(&v).expect("jcs");
            prop_assert_eq!(ours, theirs);
        }

        /// The canonical bytes parse back to a value with the same canonical bytes.
        #[test]
        fn canonical_form_is_a_fixed_point(v in arb_json()) {
            let once = canonical_json(&v).expect("canonical");
            let back: Value = serde_json::from_str(&once).expect("parse");
            prop_assert_eq!(canonical_json(&back).expect("canonical"), once);
        }
    }
}
