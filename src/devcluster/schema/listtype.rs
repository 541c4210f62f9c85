//! `x-kubernetes-list-type: set` and `map` invariants (unique items, unique keys), as
//! apiextensions-apiserver's listtype package checks them, and the correlation of a map-list item
//! with the old item of the same keys (used for ratcheting and for CEL's `oldSelf`).

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::node::{ListType, Node};
use super::path::FieldPath;
use super::{FieldError, FieldErrorKind};

/// The old item of a map-type list with the same keys as `item`.
pub(super) fn correlate<'a>(
    keys: &[String],
    item: &Value,
    old_items: Option<&'a Vec<Value>>,
) -> Option<&'a Value> {
    let item = item.as_object()?;
    old_items?.iter().find(|old| {
        old.as_object()
            .is_some_and(|old| keys.iter().all(|k| old.get(k) == item.get(k)))
    })
}

/// Checks every set and map list under the resource root.
pub(super) fn validate(root: &Node, object: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Value::Object(map) = object {
        walk_map(root, map, &FieldPath::root(), &mut errors);
    }
    errors
}

fn walk(node: &Node, value: &Value, path: &FieldPath, out: &mut Vec<FieldError>) {
    match value {
        Value::Array(items) => walk_list(node, items, path, out),
        Value::Object(map) => walk_map(node, map, path, out),
        _ => {}
    }
}

fn walk_map(node: &Node, map: &Map<String, Value>, path: &FieldPath, out: &mut Vec<FieldError>) {
    if let Some(additional) = node.additional.as_deref() {
        for (key, v) in map {
            walk(additional, v, &path.key(key), out);
        }
    }
    for (key, v) in map {
        if let Some(prop) = node.properties.get(key) {
            walk(prop, v, &path.child(key), out);
        }
    }
}

fn duplicate(path: FieldPath, value: Value) -> FieldError {
    FieldError {
        kind: FieldErrorKind::Duplicate,
        field: path.field(),
        bad_value: Some(value),
        detail: String::new(),
    }
}

fn walk_list(node: &Node, items: &[Value], path: &FieldPath, out: &mut Vec<FieldError>) {
    match node.list_type {
        Some(ListType::Set) => {
            for i in second_occurrences(items) {
                out.push(duplicate(path.index(i), items[i].clone()));
            }
        }
        Some(ListType::Map) => check_map_list(node, items, path, out),
        _ => {}
    }
    if let Some(item_node) = node.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            walk(item_node, item, &path.index(i), out);
        }
    }
}

/// The index of each value's second appearance (kube-apiserver reports each duplicate once).
/// Values are compared by their JSON text, as kube-apiserver compares compound items.
fn second_occurrences(items: &[Value]) -> Vec<usize> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut found = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let times = seen.entry(item.to_string()).or_insert(0);
        *times += 1;
        if *times == 2 {
            found.push(i);
        }
    }
    found
}

fn check_map_list(node: &Node, items: &[Value], path: &FieldPath, out: &mut Vec<FieldError>) {
    if let Some((i, item)) = items
        .iter()
        .enumerate()
        .find(|(_, x)| !x.is_null() && !x.is_object())
    {
        out.push(FieldError {
            kind: FieldErrorKind::Invalid,
            field: path.index(i).field(),
            bad_value: Some(item.clone()),
            detail: "must be an object for an array of list-type map".to_string(),
        });
        return;
    }
    // The key of each item: the key fields it has (an absent key is "unspecified").
    let keys: Vec<Map<String, Value>> = items
        .iter()
        .map(|item| {
            node.list_map_keys
                .iter()
                .filter_map(|k| Some((k.clone(), item.as_object()?.get(k)?.clone())))
                .collect()
        })
        .collect();
    let as_values: Vec<Value> = keys.iter().cloned().map(Value::Object).collect();
    for i in second_occurrences(&as_values) {
        out.push(duplicate(path.index(i), as_values[i].clone()));
    }
}
