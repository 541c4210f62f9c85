//! Pruning and defaulting, as kube-apiserver applies them when it decodes a custom resource:
//! fields the schema does not declare are dropped (and reported, for `fieldValidation`), nulls of
//! non-nullable fields without a default are dropped, then `default:`s fill what is missing.
//! Top-level and embedded `apiVersion`/`kind`/`metadata` are left as they are.

use serde_json::{Map, Value};

use super::node::Node;

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Drops undeclared fields from the resource `object`, returning their paths in the dotted form
/// kube-apiserver reports (`spec.foo`, `spec.items[0].bar`).
pub(super) fn prune(object: &mut Value, root: &Node) -> Vec<String> {
    let mut pruned = Vec::new();
    if let Value::Object(map) = object {
        if root.preserve_unknown {
            skip_prune_map(map, root, true, "", &mut pruned);
        } else {
            prune_map(map, root, true, "", &mut pruned);
        }
    }
    pruned
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn prune_value(value: &mut Value, node: Option<&Node>, path: &str, pruned: &mut Vec<String>) {
    if let Some(n) = node.filter(|n| n.preserve_unknown) {
        skip_prune(value, n, path, pruned);
        return;
    }
    match value {
        Value::Object(map) => match node {
            Some(n) => prune_map(map, n, n.embedded, path, pruned),
            None => {
                pruned.extend(map.keys().map(|k| join(path, k)));
                map.clear();
            }
        },
        Value::Array(items) => {
            let item_node = node.and_then(|n| n.items.as_deref());
            for (i, item) in items.iter_mut().enumerate() {
                prune_value(item, item_node, &format!("{path}[{i}]"), pruned);
            }
        }
        _ => {}
    }
}

fn prune_map(
    map: &mut Map<String, Value>,
    node: &Node,
    keep_meta: bool,
    path: &str,
    pruned: &mut Vec<String>,
) {
    let mut dropped = Vec::new();
    for (key, value) in map.iter_mut() {
        if keep_meta && META_FIELDS.contains(&key.as_str()) {
            continue;
        }
        let child_path = join(path, key);
        if let Some(sub) = node.properties.get(key) {
            prune_value(value, Some(sub), &child_path, pruned);
        } else if let Some(sub) = node.additional.as_deref() {
            prune_value(value, Some(sub), &child_path, pruned);
        } else {
            pruned.push(child_path);
            dropped.push(key.clone());
        }
    }
    for key in dropped {
        map.remove(&key);
    }
}

/// Under `x-kubernetes-preserve-unknown-fields`: unknown fields stay, declared ones still prune.
fn skip_prune(value: &mut Value, node: &Node, path: &str, pruned: &mut Vec<String>) {
    match value {
        Value::Object(map) => skip_prune_map(map, node, node.embedded, path, pruned),
        Value::Array(items) => {
            if let Some(item_node) = node.items.as_deref() {
                for (i, item) in items.iter_mut().enumerate() {
                    skip_prune(item, item_node, &format!("{path}[{i}]"), pruned);
                }
            }
        }
        _ => {}
    }
}

fn skip_prune_map(
    map: &mut Map<String, Value>,
    node: &Node,
    keep_meta: bool,
    path: &str,
    pruned: &mut Vec<String>,
) {
    for (key, value) in map.iter_mut() {
        if keep_meta && META_FIELDS.contains(&key.as_str()) {
            continue;
        }
        let child_path = join(path, key);
        if let Some(sub) = node.properties.get(key) {
            prune_value(value, Some(sub), &child_path, pruned);
        } else if let Some(sub) = node.additional.as_deref() {
            prune_value(value, Some(sub), &child_path, pruned);
        }
    }
}

/// Drops nulls of non-nullable fields that have no default (they would otherwise fail the type
/// check); non-nullable nulls with a default are left for [`apply_defaults`].
pub(super) fn drop_non_nullable_nulls(value: &mut Value, node: Option<&Node>) {
    match value {
        Value::Object(map) => {
            let mut dropped = Vec::new();
            for (key, v) in map.iter_mut() {
                let sub = node.and_then(|n| n.properties.get(key).or(n.additional.as_deref()));
                if v.is_null() && sub.is_some_and(|s| !s.nullable && s.default.is_none()) {
                    dropped.push(key.clone());
                } else {
                    drop_non_nullable_nulls(v, sub);
                }
            }
            for key in dropped {
                map.remove(&key);
            }
        }
        Value::Array(items) => {
            let sub = node.and_then(|n| n.items.as_deref());
            for item in items {
                drop_non_nullable_nulls(item, sub);
            }
        }
        _ => {}
    }
}

fn is_non_nullable_null(value: &Value, node: &Node) -> bool {
    value.is_null() && !node.nullable
}

/// Applies `default:`s to missing fields and to nulls of non-nullable fields, recursively (a
/// defaulted object is defaulted inside too).
pub(super) fn apply_defaults(value: &mut Value, node: &Node) {
    match value {
        Value::Object(map) => {
            for (key, prop) in &node.properties {
                let Some(default) = &prop.default else {
                    continue;
                };
                let missing = map.get(key).is_none_or(|v| is_non_nullable_null(v, prop));
                if missing {
                    map.insert(key.clone(), default.clone());
                }
            }
            for (key, v) in map.iter_mut() {
                if let Some(prop) = node.properties.get(key) {
                    apply_defaults(v, prop);
                } else if let Some(additional) = node.additional.as_deref() {
                    if let Some(default) = &additional.default {
                        if is_non_nullable_null(v, additional) {
                            *v = default.clone();
                        }
                    }
                    apply_defaults(v, additional);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_node) = node.items.as_deref() else {
                return;
            };
            for item in items {
                if let Some(default) = &item_node.default {
                    if is_non_nullable_null(item, item_node) {
                        *item = default.clone();
                    }
                }
                apply_defaults(item, item_node);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::schema::node::Site;
    use crate::devcluster::schema::rules::{Checks, RuleEnv};
    use serde_json::json;

    fn node(schema: Value) -> Option<Node> {
        let env = RuleEnv::new().ok()?;
        let mut checks = Checks::new(&env);
        Node::parse(&schema, &Site::root(), &mut checks).ok()
    }

    #[test]
    fn preserved_subtrees_keep_unknown_fields_but_prune_declared_ones() {
        let Some(root) = node(json!({"type": "object", "properties": {"raw": {
            "type": "object", "x-kubernetes-preserve-unknown-fields": true,
            "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}}}}))
        else {
            panic!("schema compiles");
        };
        let mut obj =
            json!({"raw": {"anything": {"x": 1}, "known": {"a": "1", "b": 2}}, "kind": "K"});
        let pruned = prune(&mut obj, &root);
        assert_eq!(pruned, vec!["raw.known.b"]);
        assert_eq!(
            obj,
            json!({"raw": {"anything": {"x": 1}, "known": {"a": "1"}}, "kind": "K"})
        );
    }

    #[test]
    fn embedded_resources_keep_their_type_and_object_meta() {
        let Some(root) = node(json!({"type": "object", "properties": {"t": {
            "type": "object", "x-kubernetes-embedded-resource": true,
            "properties": {"spec": {"type": "object"}}}}}))
        else {
            panic!("schema compiles");
        };
        let mut obj = json!({"t": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": 1}, "y": 2}});
        let pruned = prune(&mut obj, &root);
        assert_eq!(pruned, vec!["t.spec.x", "t.y"]);
        assert_eq!(
            obj,
            json!({"t": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}}})
        );
    }
}
