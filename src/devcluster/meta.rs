//! Object metadata as kube-apiserver handles it: reading `metadata.*` fields out of JSON
//! objects, name validation (RFC 1123), `generateName`, uids, timestamps, and JSON numbers
//! stored the way Kubernetes stores them.
//!
//! Pure helpers over `serde_json::Value`; no verb rules live here.

use rand::Rng;
use serde_json::{Map, Value};

use super::schema::{FieldError, FieldErrorKind};

/// The current time as kube-apiserver writes timestamps (RFC 3339, whole seconds, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A fresh object uid (UUID v4).
pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `generateName` plus five random characters from kube-apiserver's alphabet.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    // kube-apiserver truncates the prefix so the result stays within 63 characters.
    let max_prefix = 63 - 5;
    let prefix: String = prefix.chars().take(max_prefix).collect();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// `metadata` of an object, if it is a JSON object.
pub fn meta(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata").and_then(Value::as_object)
}

/// `metadata` of an object, created if absent (the object must be a JSON object).
pub fn meta_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    object
        .as_object_mut()
        .map(|o| {
            o.entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()))
        })
        .and_then(Value::as_object_mut)
}

/// A string field of `metadata`, `""` when absent.
pub fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    meta(object)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.finalizers` as strings.
pub fn finalizers(object: &Value) -> Vec<String> {
    meta(object)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether deletion has been requested (`metadata.deletionTimestamp` set).
pub fn is_deleting(object: &Value) -> bool {
    !meta_str(object, "deletionTimestamp").is_empty()
}

/// The uids of `metadata.ownerReferences`.
pub fn owner_uids(object: &Value) -> Vec<String> {
    meta(object)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.generation`, 0 when absent.
pub fn generation(object: &Value) -> i64 {
    meta(object)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Sets or removes (`None`) a `metadata` field.
pub fn set_meta(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(m) = meta_mut(object) {
        match value {
            Some(v) => {
                m.insert(field.to_string(), v);
            }
            None => {
                m.remove(field);
            }
        }
    }
}

/// The object without `metadata` (and without `status` when `without_status`), to tell
/// whether a write changed anything that bumps `metadata.generation`.
pub fn content(object: &Value, without_status: bool) -> Value {
    let mut copy = object.clone();
    if let Some(o) = copy.as_object_mut() {
        o.remove("metadata");
        if without_status {
            o.remove("status");
        }
    }
    copy
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case \
    alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character \
    (e.g. 'example.com', regex used for validation is \
    '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
    characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  \
    or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    s.len() <= 63 && is_subdomain_part(s)
}

/// One dot-separated part of an RFC 1123 subdomain: as a label, but kube-apiserver's
/// `IsDNS1123Subdomain` bounds only the whole name (253), not each part.
fn is_subdomain_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// Checks `metadata.name`: an RFC 1123 label (namespaces, `label_only`) or subdomain.
///
/// Returns the field errors kube-apiserver reports (empty = valid).
pub fn validate_name(name: &str, label_only: bool) -> Vec<FieldError> {
    if !label_only && name.len() > 253 {
        return vec![FieldError {
            kind: FieldErrorKind::Invalid,
            field: "metadata.name".to_string(),
            bad_value: Some(Value::String(name.to_string())),
            detail: "must be no more than 253 characters".to_string(),
        }];
    }
    let ok = if label_only {
        is_label(name)
    } else {
        name.split('.').all(is_subdomain_part)
    };
    if ok {
        return Vec::new();
    }
    vec![FieldError {
        kind: FieldErrorKind::Invalid,
        field: "metadata.name".to_string(),
        bad_value: Some(Value::String(name.to_string())),
        detail: if label_only { LABEL_MSG } else { SUBDOMAIN_MSG }.to_string(),
    }]
}

/// Checks label keys and values (`metadata.labels`): keys are an optional DNS-subdomain prefix
/// and a name of at most 63 characters; values at most 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending alphanumeric.
pub fn validate_labels(object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(labels) = meta(object).and_then(|m| m.get("labels")) else {
        return errors;
    };
    let Some(labels) = labels.as_object() else {
        errors.push(FieldError {
            kind: FieldErrorKind::Invalid,
            field: "metadata.labels".into(),
            bad_value: Some(labels.clone()),
            detail: "must be a map of strings".into(),
        });
        return errors;
    };
    // kube-apiserver's IsQualifiedName / IsValidLabelValue: the length and the characters are
    // two checks, each with its own message (both reported when both fail).
    let chars_ok = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let invalid = |bad: &Value, detail: &str| FieldError {
        kind: FieldErrorKind::Invalid,
        field: "metadata.labels".into(),
        bad_value: Some(bad.clone()),
        detail: detail.into(),
    };
    for (k, v) in labels {
        let key = Value::String(k.clone());
        let name = k.rsplit_once('/').map_or(k.as_str(), |(_, n)| n);
        let prefix_ok = k
            .rsplit_once('/')
            .is_none_or(|(p, _)| validate_name(p, false).is_empty());
        if name.len() > 63 {
            errors.push(invalid(
                &key,
                "name part must be no more than 63 characters",
            ));
        }
        if !prefix_ok || name.is_empty() || !chars_ok(name) {
            errors.push(invalid(
                &key,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
                 start and end with an alphanumeric character",
            ));
        }
        match v.as_str() {
            Some("") => {}
            Some(s) => {
                if s.len() > 63 {
                    errors.push(invalid(v, "must be no more than 63 characters"));
                }
                if !chars_ok(s) {
                    errors.push(invalid(
                        v,
                        "a valid label must be an empty string or consist of alphanumeric \
                         characters, '-', '_' or '.', and must start and end with an \
                         alphanumeric character",
                    ));
                }
            }
            None => errors.push(invalid(
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, \
                 '-', '_' or '.', and must start and end with an alphanumeric character",
            )),
        }
    }
    errors
}

/// Rewrites JSON numbers as kube-apiserver stores them in built-in objects: an integer that
/// fits int64 stays an integer, anything else is a float64; a float64 with an integral value
/// below 1e21 is written without a fraction (Go prints it that way, so it reads back as an
/// integer).
pub fn normalize_numbers(value: &mut Value) {
    match value {
        Value::Number(n) => {
            if n.is_i64() {
                return;
            }
            if let Some(u) = n.as_u64() {
                // Above int64: kube-apiserver decodes it as float64.
                if let Some(f) = serde_json::Number::from_f64(u as f64) {
                    *n = f;
                }
                return;
            }
            if let Some(f) = n.as_f64() {
                if f.fract() == 0.0 && f.abs() < 1e21 && f.abs() <= i64::MAX as f64 {
                    *n = serde_json::Number::from(f as i64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        Value::Object(map) => map.values_mut().for_each(normalize_numbers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generated_names_keep_the_prefix_and_add_five_characters() {
        let n = generate_name("run-");
        assert!(n.starts_with("run-"));
        assert_eq!(n.len(), 9);
    }

    #[test]
    fn names_must_be_rfc1123() {
        assert!(validate_name("my-widget.v1", false).is_empty());
        assert!(!validate_name("My_Widget", false).is_empty());
        assert!(!validate_name("a.b", true).is_empty());
        assert!(validate_name("default", true).is_empty());
        // kube-apiserver bounds a subdomain as a whole (253), not each part (63).
        let long = "a".repeat(100);
        assert!(validate_name(&long, false).is_empty());
        assert!(!validate_name(&long, true).is_empty());
        let too_long = validate_name(&"a".repeat(254), false);
        assert_eq!(too_long[0].detail, "must be no more than 253 characters");
    }

    #[test]
    fn numbers_are_stored_as_int64_or_float64() {
        let mut v = json!({"a": 1.0, "b": 1.5, "c": 18446744073709551615u64, "d": [-3]});
        normalize_numbers(&mut v);
        assert_eq!(v["a"], json!(1));
        assert!(v["a"].is_i64());
        assert_eq!(v["b"], json!(1.5));
        assert!(v["c"].is_f64());
        assert_eq!(v["d"][0], json!(-3));
    }

    #[test]
    fn bad_label_values_are_refused() {
        let ok = json!({"metadata": {"labels": {"app.kubernetes.io/name": "x", "tier": ""}}});
        assert!(validate_labels(&ok).is_empty());
        let bad = json!({"metadata": {"labels": {"tier": "-x-"}}});
        assert_eq!(validate_labels(&bad).len(), 1);
    }
}
