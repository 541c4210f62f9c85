//! The values CEL rules see, as kube-apiserver builds them from a custom resource: typed by the
//! schema (`number` fields are doubles even when stored as integers, `integer` fields ints,
//! int-or-string either), struct properties under their escaped CEL names (`x-y` as `x__dash__y`),
//! null properties absent, the resource root showing only `apiVersion`, `kind` and
//! `metadata.name`/`generateName` of its meta. Data under x-kubernetes-preserve-unknown-fields is
//! converted as it is (maps, lists, ints, doubles).

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map as CelMap, OptionalValue};
use cel::Value as CelValue;
use serde_json::{Map, Number, Value};

use super::node::{Node, SchemaType};

const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The CEL name of a property (Kubernetes' escaping), or `None` when it cannot be named in CEL.
pub(super) fn escape(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("__") {
            out.push_str("__underscores__");
            rest = after;
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c == '_' || c.is_ascii_alphanumeric() => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

fn map_value(entries: HashMap<Key, CelValue>) -> CelValue {
    CelValue::Map(CelMap {
        map: Arc::new(entries),
    })
}

fn key(name: &str) -> Key {
    Key::String(Arc::new(name.to_string()))
}

fn number(n: &Number) -> CelValue {
    match n.as_i64() {
        Some(i) => CelValue::Int(i),
        None => CelValue::Float(n.as_f64().unwrap_or(0.0)),
    }
}

/// A value with no schema: converted as it is.
pub(super) fn dynamic(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => number(n),
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(items) => CelValue::List(Arc::new(items.iter().map(dynamic).collect())),
        Value::Object(map) => map_value(map.iter().map(|(k, v)| (key(k), dynamic(v))).collect()),
    }
}

/// `v` as CEL sees it at `node`; `resource_root` for the root and embedded resources.
pub(super) fn typed(node: &Node, v: &Value, resource_root: bool) -> CelValue {
    if v.is_null() {
        return CelValue::Null;
    }
    if node.int_or_string {
        return dynamic(v);
    }
    match (node.ty, v) {
        (Some(SchemaType::Number), Value::Number(n)) => CelValue::Float(n.as_f64().unwrap_or(0.0)),
        (Some(SchemaType::Array), Value::Array(items)) => {
            let list = match node.items.as_deref() {
                Some(item_node) => items
                    .iter()
                    .map(|i| typed(item_node, i, item_node.embedded))
                    .collect(),
                None => items.iter().map(dynamic).collect(),
            };
            CelValue::List(Arc::new(list))
        }
        (_, Value::Object(map)) if node.is_struct() || resource_root => {
            structure(node, map, resource_root)
        }
        (_, Value::Object(map)) => match node.additional.as_deref() {
            Some(additional) => map_value(
                map.iter()
                    .map(|(k, v)| (key(k), typed(additional, v, additional.embedded)))
                    .collect(),
            ),
            None => dynamic(v),
        },
        _ => dynamic(v),
    }
}

fn structure(node: &Node, map: &Map<String, Value>, resource_root: bool) -> CelValue {
    let mut entries = HashMap::new();
    for (name, v) in map {
        if let Some(prop) = node.properties.get(name) {
            // Null properties of a struct read as absent.
            if let (false, Some(cel_name)) = (v.is_null(), escape(name)) {
                entries.insert(key(&cel_name), typed(prop, v, prop.embedded));
            }
        } else if resource_root && (name == "apiVersion" || name == "kind") {
            entries.insert(key(name), dynamic(v));
        } else if resource_root && name == "metadata" {
            if let Value::Object(meta) = v {
                let visible = meta
                    .iter()
                    .filter(|(k, v)| (*k == "name" || *k == "generateName") && v.is_string())
                    .map(|(k, v)| (key(k), dynamic(v)))
                    .collect();
                entries.insert(key(name), map_value(visible));
            }
        } else {
            // Only reachable under x-kubernetes-preserve-unknown-fields.
            entries.insert(key(name), dynamic(v));
        }
    }
    map_value(entries)
}

/// `oldSelf` of a rule with `optionalOldSelf: true`: `optional.of(old)` or `optional.none()`.
pub(super) fn optional(v: Option<CelValue>) -> CelValue {
    let opt = match v {
        Some(v) => OptionalValue::of(v),
        None => OptionalValue::none(),
    };
    CelValue::Opaque(Arc::new(opt))
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn property_names_are_escaped_like_kubernetes() {
        assert_eq!(escape("goal").as_deref(), Some("goal"));
        assert_eq!(escape("x-y").as_deref(), Some("x__dash__y"));
        assert_eq!(escape("a.b/c").as_deref(), Some("a__dot__b__slash__c"));
        assert_eq!(escape("a__b").as_deref(), Some("a__underscores__b"));
        assert_eq!(escape("namespace").as_deref(), Some("__namespace__"));
        assert_eq!(escape("1abc"), None);
        assert_eq!(escape("a b"), None);
    }
}
