//! JSON numbers as kube-apiserver keeps them: it decodes an integer that fits int64 as int64 and
//! every other number (fractions, exponents, integers beyond int64) as float64, and Go's encoder
//! writes a float64 with an integral value without a fraction (`250.0` is stored as `250`).
//! This module owns that normalization and nothing else.

use serde_json::{Number, Value};

/// The float64 bounds within which an integral float is written like an int64 by Go.
const I64_LOWER: f64 = -9_223_372_036_854_775_808.0;
const I64_UPPER: f64 = 9_223_372_036_854_775_808.0;

/// Rewrites every number in `value` the way kube-apiserver stores it.
pub(super) fn normalize(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if let Some(normal) = normalize_number(n) {
                *n = normal;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize),
        Value::Object(map) => map.values_mut().for_each(normalize),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// The stored form of `n`, or `None` when it is already stored as it is.
fn normalize_number(n: &Number) -> Option<Number> {
    if n.is_i64() {
        return None;
    }
    // A u64 beyond int64 or a float: Go holds a float64.
    let f = n.as_f64()?;
    let negative_zero = f == 0.0 && f.is_sign_negative();
    if f.is_finite() && f.fract() == 0.0 && (I64_LOWER..I64_UPPER).contains(&f) && !negative_zero {
        // Exact: an integral float64 in this range is an int64 value.
        return Some(Number::from(f as i64));
    }
    if n.is_f64() {
        None
    } else {
        Number::from_f64(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> String {
        let mut v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        normalize(&mut v);
        v.to_string()
    }

    #[test]
    fn integral_floats_are_stored_without_a_fraction() {
        assert_eq!(stored("250.0"), "250");
        assert_eq!(stored("1e3"), "1000");
        assert_eq!(stored("0.0"), "0");
        assert_eq!(stored("-2.0"), "-2");
    }

    #[test]
    fn fractions_and_integers_beyond_int64_stay_floats() {
        assert_eq!(stored("1.5"), "1.5");
        let mut big = json!(12_345_678_901_234_567_890u64);
        normalize(&mut big);
        assert!(big.is_f64());
        assert_eq!(big.as_f64(), Some(12_345_678_901_234_567_890.0));
    }

    #[test]
    fn int64_values_are_kept_exactly() {
        assert_eq!(stored("9223372036854775807"), "9223372036854775807");
        assert_eq!(stored("-9223372036854775808"), "-9223372036854775808");
        assert_eq!(stored(r#"{"a":[1,2.5,3.0]}"#), r#"{"a":[1,2.5,3]}"#);
    }
}
