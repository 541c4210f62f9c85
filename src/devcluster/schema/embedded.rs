//! `x-kubernetes-embedded-resource` objects: kube-apiserver requires their `apiVersion` and `kind`
//! (apiextensions-apiserver's objectmeta validation). Their `metadata` is kept and not validated
//! here.

use serde_json::{Map, Value};

use super::node::Node;
use super::path::FieldPath;
use super::{FieldError, FieldErrorKind};

/// Checks every embedded resource below the root.
pub(super) fn validate(root: &Node, object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Value::Object(map) = object {
        walk_map(root, map, &FieldPath::root(), &mut errors);
    }
    errors
}

fn walk(node: &Node, value: &Value, path: &FieldPath, out: &mut Vec<FieldError>) {
    match value {
        Value::Object(map) => {
            if node.embedded {
                check_resource(map, path, out);
            }
            walk_map(node, map, path, out);
        }
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for (i, item) in items.iter().enumerate() {
                    walk(item_node, item, &path.index(i), out);
                }
            }
        }
        _ => {}
    }
}

fn walk_map(node: &Node, map: &Map<String, Value>, path: &FieldPath, out: &mut Vec<FieldError>) {
    for (key, v) in map {
        if let Some(prop) = node.properties.get(key) {
            walk(prop, v, &path.child(key), out);
        } else if let Some(additional) = node.additional.as_deref() {
            walk(additional, v, &path.key(key), out);
        }
    }
}

fn error(kind: FieldErrorKind, path: FieldPath, value: Option<&Value>, detail: &str) -> FieldError {
    FieldError {
        kind,
        field: path.field(),
        bad_value: value.cloned(),
        detail: detail.to_string(),
    }
}

fn is_dns1035_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[bytes.len() - 1] != b'-'
}

fn check_resource(map: &Map<String, Value>, path: &FieldPath, out: &mut Vec<FieldError>) {
    let required = |field: &str| error(FieldErrorKind::Required, path.child(field), None, "");
    match map.get("apiVersion") {
        None => out.push(required("apiVersion")),
        Some(Value::String(s)) if s.is_empty() => out.push(required("apiVersion")),
        Some(Value::String(s)) if s.matches('/').count() > 1 => out.push(error(
            FieldErrorKind::Invalid,
            path.child("apiVersion"),
            map.get("apiVersion"),
            &format!("unexpected GroupVersion string: {s}"),
        )),
        Some(Value::String(_)) => {}
        Some(other) => out.push(error(
            FieldErrorKind::Invalid,
            path.child("apiVersion"),
            Some(other),
            "must be a string",
        )),
    }
    match map.get("kind") {
        None => out.push(required("kind")),
        Some(Value::String(s)) if s.is_empty() => out.push(required("kind")),
        Some(Value::String(s)) if !is_dns1035_label(&s.to_lowercase()) => out.push(error(
            FieldErrorKind::Invalid,
            path.child("kind"),
            map.get("kind"),
            "may have mixed case, but should otherwise match: a DNS-1035 label must consist of \
             lower case alphanumeric characters or '-', start with an alphabetic character, and \
             end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for \
             validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
        )),
        Some(Value::String(_)) => {}
        Some(other) => out.push(error(
            FieldErrorKind::Invalid,
            path.child("kind"),
            Some(other),
            "must be a string",
        )),
    }
}
