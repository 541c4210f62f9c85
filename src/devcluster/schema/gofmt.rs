//! How Go prints values inside kube-apiserver's messages: `%q` for strings, `%v` for numbers
//! (float64 in `strconv` 'g' form, `1e+06`), `encoding/json` text, and field.Error's
//! `field: Type: value: detail` layout (whose maps and lists kube-apiserver v1.34 prints as
//! JSON: `{"name":"a"}`).
//! It owns the spelling of messages, not when they are raised.

use std::fmt::Write as _;

use serde_json::{Number, Value};

use super::{FieldError, FieldErrorKind};

/// Go's `strconv.Quote`.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c != ' ' && (c.is_control() || c.is_whitespace() || c == '\u{feff}') => {
                if (c as u32) < 0x10000 {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                } else {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%v` of a float64: `strconv.FormatFloat(f, 'g', -1, 64)`.
pub(super) fn float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-tripping digits, as Go's -1 precision does.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exp) {
        let mut out = format!("{sign}{}", &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp_sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{exp_sign}{:02}", exp.abs());
        return out;
    }
    let point = exp + 1; // digits before the decimal point
    if point <= 0 {
        let zeros = "0".repeat(usize::try_from(-point).unwrap_or(0));
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = usize::try_from(point).unwrap_or(0);
    if digits.len() <= point {
        format!("{sign}{digits}{}", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// Go's `%v` of a JSON number as decoded by kube-apiserver (int64 or float64).
pub(super) fn number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        float(n.as_f64().unwrap_or(0.0))
    }
}

/// How field.Error prints a bad value: `%q` strings, `%v` scalars, compounds as their JSON
/// (`Duplicate value: {"name":"a"}`, as kube-apiserver v1.34 answers; older ones printed Go's
/// `%#v`), and no value as `null` (v1.34: `Invalid value: null`; older ones quoted it).
pub(super) fn bad_value(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "null".to_string(),
        Some(Value::String(s)) => quote(s),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => number(n),
        Some(other) => json(other),
    }
}

/// Go's `encoding/json` text of a string: `<`, `>`, `&`, U+2028 and U+2029 escaped as `\u00XX`,
/// control characters other than `\n`, `\r`, `\t` as `\u00XX`.
pub(super) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `encoding/json` text of a value, as kube-apiserver lists non-string enum values.
pub(super) fn json(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            let abs = f.abs();
            if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
                let s = format!("{f:e}");
                // Go writes e-07 as e-7 and always signs the exponent.
                match s.split_once('e') {
                    Some((m, e)) if e.starts_with('-') => format!("{m}e{e}"),
                    Some((m, e)) => format!("{m}e+{e}"),
                    None => s,
                }
            } else {
                n.to_string()
            }
        }
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(json).collect();
            format!("[{}]", inner.join(","))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), json(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        other => other.to_string(),
    }
}

impl FieldErrorKind {
    /// The `reason` of a Status cause (field.ErrorType).
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Internal => "InternalError",
            FieldErrorKind::InvalidStruct => "FieldValueInvalid",
        }
    }

    /// The human spelling (field.ErrorType.String).
    pub fn label(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::Internal => "Internal error",
            FieldErrorKind::InvalidStruct => "Invalid value",
        }
    }
}

impl FieldError {
    /// The message without the field, as field.Error.ErrorBody writes it (a Status cause's message).
    pub fn body(&self) -> String {
        let mut s = match self.kind {
            FieldErrorKind::Required
            | FieldErrorKind::Forbidden
            | FieldErrorKind::TooLong
            | FieldErrorKind::Internal => self.kind.label().to_string(),
            FieldErrorKind::InvalidStruct => format!(
                "{}: {}",
                self.kind.label(),
                self.bad_value
                    .as_ref()
                    .and_then(Value::as_str)
                    .unwrap_or("null")
            ),
            _ => format!(
                "{}: {}",
                self.kind.label(),
                bad_value(self.bad_value.as_ref())
            ),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_print_like_go_percent_v() {
        assert_eq!(float(1.0), "1");
        assert_eq!(float(0.5), "0.5");
        assert_eq!(float(100000.0), "100000");
        assert_eq!(float(1000000.0), "1e+06");
        assert_eq!(float(123456789.0), "1.23456789e+08");
        assert_eq!(float(0.0001), "0.0001");
        assert_eq!(float(0.00001), "1e-05");
        assert_eq!(float(-2.5), "-2.5");
        assert_eq!(float(1.2345678901234567e19), "1.2345678901234567e+19");
    }

    #[test]
    fn a_field_errors_compound_value_prints_as_json_like_kube_apiserver() {
        assert_eq!(bad_value(Some(&json!({"name": "a"}))), r#"{"name":"a"}"#);
        assert_eq!(
            bad_value(Some(&json!({"b": 1, "a": [true, null]}))),
            r#"{"a":[true,null],"b":1}"#
        );
    }

    #[test]
    fn strings_are_quoted_like_go() {
        assert_eq!(quote("a\"b\n\u{1}é"), r#""a\"b\n\x01é""#);
    }

    #[test]
    fn json_floats_are_written_like_go_encoding_json() {
        assert_eq!(json(&json!(1.5)), "1.5");
        assert_eq!(json(&json!(1e21)), "1e+21");
        assert_eq!(json(&json!(1.5e-7)), "1.5e-7");
        assert_eq!(json(&json!({"a": [1, "x"]})), r#"{"a":[1,"x"]}"#);
    }
}
