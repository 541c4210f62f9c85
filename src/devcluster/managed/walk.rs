//! The walks structured-merge-diff makes over objects of a [`Shape`]: the field set an object
//! (or an applied configuration) names, the comparison of two objects (added, removed and
//! modified paths), the merge of an applied configuration into the live object (map lists by
//! key, sets by value, in structured-merge-diff's item order) and the removal of fields an
//! applier no longer applies and nobody else owns.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::fieldset::{FieldSet, Path, Pe};
use super::shape::{ListKind, Shape};

/// How a value of a shape is walked.
enum Walk<'a> {
    /// A leaf: compared and owned whole.
    Leaf,
    /// A granular map.
    Map(&'a Map<String, Value>),
    /// A set or map list.
    List(&'a [Value], &'a Shape, &'a ListKind),
}

fn walk_of<'a>(shape: &'a Shape, value: &'a Value) -> Walk<'a> {
    match (shape, value) {
        (Shape::Map { atomic: false, .. } | Shape::Deduced, Value::Object(map)) => Walk::Map(map),
        (
            Shape::List {
                elem,
                kind: kind @ (ListKind::Set | ListKind::Map(_)),
            },
            Value::Array(items),
        ) => Walk::List(items, elem, kind),
        _ => Walk::Leaf,
    }
}

/// The path element of a list item.
fn item_pe(kind: &ListKind, item: &Value, index: usize) -> Pe {
    match kind {
        ListKind::Map(keys) if !keys.is_empty() => {
            let mut fields: Vec<(String, String)> = keys
                .iter()
                .filter_map(|k| Some((k.clone(), item.as_object()?.get(k)?.to_string())))
                .collect();
            fields.sort();
            Pe::Key(fields)
        }
        ListKind::Set => Pe::Value(item.to_string()),
        _ => Pe::Index(index),
    }
}

/// The list's items by path element (the first of duplicates), and the elements in order.
fn index_items<'a>(kind: &ListKind, items: &'a [Value]) -> (Vec<Pe>, HashMap<Pe, &'a Value>) {
    let mut order = Vec::with_capacity(items.len());
    let mut by_pe = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let pe = item_pe(kind, item, i);
        by_pe.entry(pe.clone()).or_insert(item);
        order.push(pe);
    }
    (order, by_pe)
}

/// The set of fields `value` names (structured-merge-diff's `ToFieldSet`): leaves, list items,
/// undeclared map keys, and empty or null fields.
pub fn to_set(value: &Value, shape: &Shape) -> FieldSet {
    let mut out = FieldSet::new();
    let mut path = Vec::new();
    to_set_at(value, shape, &mut path, &mut out);
    out
}

fn to_set_at(value: &Value, shape: &Shape, path: &mut Path, out: &mut FieldSet) {
    match walk_of(shape, value) {
        Walk::Leaf => {
            if !path.is_empty() {
                out.insert(path.clone());
            }
        }
        Walk::Map(map) => {
            for (key, child) in map {
                let (child_shape, declared) = shape.child(key);
                path.push(Pe::Field(key.clone()));
                to_set_at(child, child_shape, path, out);
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !declared {
                    out.insert(path.clone());
                }
                path.pop();
            }
        }
        Walk::List(items, elem, kind) => {
            for (i, item) in items.iter().enumerate() {
                path.push(item_pe(kind, item, i));
                to_set_at(item, elem, path, out);
                out.insert(path.clone());
                path.pop();
            }
        }
    }
}

/// What changed between two objects.
#[derive(Debug, Default)]
pub struct Comparison {
    /// Paths only the new object has.
    pub added: FieldSet,
    /// Paths only the old object has.
    pub removed: FieldSet,
    /// Leaves whose values differ.
    pub modified: FieldSet,
}

/// Compares `old` and `new` (structured-merge-diff's `Compare`).
pub fn compare(old: &Value, new: &Value, shape: &Shape) -> Comparison {
    let mut out = Comparison::default();
    compare_at(Some(old), Some(new), shape, &mut Vec::new(), &mut out);
    out
}

fn compare_at(
    l: Option<&Value>,
    r: Option<&Value>,
    shape: &Shape,
    path: &mut Path,
    out: &mut Comparison,
) {
    let empty_map = Map::new();
    let lw = l.map(|v| walk_of(shape, v));
    let rw = r.map(|v| walk_of(shape, v));
    let mark = |out: &mut Comparison, path: &Path, set: fn(&mut Comparison) -> &mut FieldSet| {
        if !path.is_empty() {
            set(out).insert(path.clone());
        }
    };
    match (lw, rw) {
        (None, None) => {}
        (Some(Walk::Map(a)), Some(Walk::Map(b))) => compare_maps(a, b, shape, path, out),
        (None, Some(Walk::Map(b))) => {
            mark(out, path, |c| &mut c.added);
            compare_maps(&empty_map, b, shape, path, out);
        }
        (Some(Walk::Map(a)), None) => {
            mark(out, path, |c| &mut c.removed);
            compare_maps(a, &empty_map, shape, path, out);
        }
        (Some(Walk::List(a, elem, kind)), Some(Walk::List(b, _, _))) => {
            compare_lists(a, b, elem, kind, path, out);
        }
        (None, Some(Walk::List(b, elem, kind))) => {
            mark(out, path, |c| &mut c.added);
            compare_lists(&[], b, elem, kind, path, out);
        }
        (Some(Walk::List(a, elem, kind)), None) => {
            mark(out, path, |c| &mut c.removed);
            compare_lists(a, &[], elem, kind, path, out);
        }
        _ => match (l, r) {
            (None, Some(_)) => mark(out, path, |c| &mut c.added),
            (Some(_), None) => mark(out, path, |c| &mut c.removed),
            (Some(a), Some(b)) if a != b => mark(out, path, |c| &mut c.modified),
            _ => {}
        },
    }
}

fn compare_maps(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    shape: &Shape,
    path: &mut Path,
    out: &mut Comparison,
) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for key in keys {
        let (child, _) = shape.child(key);
        path.push(Pe::Field(key.clone()));
        compare_at(a.get(key), b.get(key), child, path, out);
        path.pop();
    }
}

fn compare_lists(
    a: &[Value],
    b: &[Value],
    elem: &Shape,
    kind: &ListKind,
    path: &mut Path,
    out: &mut Comparison,
) {
    let (lorder, lby) = index_items(kind, a);
    let (rorder, rby) = index_items(kind, b);
    let mut seen = HashSet::new();
    for pe in lorder.iter().chain(rorder.iter()) {
        if !seen.insert(pe.clone()) {
            continue;
        }
        path.push(pe.clone());
        compare_at(lby.get(pe).copied(), rby.get(pe).copied(), elem, path, out);
        path.pop();
    }
}

/// Merges an applied configuration `config` into `live` (structured-merge-diff's `Merge`):
/// granular maps field by field, set and map lists item by item, everything else replaced.
pub fn merge(live: Option<&Value>, config: &Value, shape: &Shape) -> Value {
    let Some(live) = live else {
        return config.clone();
    };
    match (walk_of(shape, live), walk_of(shape, config)) {
        (Walk::Map(l), Walk::Map(r)) => {
            let mut out = l.clone();
            for (key, rv) in r {
                let (child, _) = shape.child(key);
                let merged = merge(l.get(key), rv, child);
                out.insert(key.clone(), merged);
            }
            Value::Object(out)
        }
        (Walk::List(l, elem, kind), Walk::List(r, _, _)) => {
            Value::Array(merge_lists(l, r, elem, kind))
        }
        _ => config.clone(),
    }
}

/// structured-merge-diff's list merge: live items keep their order, items of the
/// configuration are placed in its order relative to the items both share.
fn merge_lists(lhs: &[Value], rhs: &[Value], elem: &Shape, kind: &ListKind) -> Vec<Value> {
    let (lpes, lby) = index_items(kind, lhs);
    let (rpes, rby) = index_items(kind, rhs);
    let mut shared: std::collections::VecDeque<&Pe> =
        rpes.iter().filter(|pe| lby.contains_key(*pe)).collect();
    let mut next_shared = shared.pop_front();
    let mut merged_rhs: HashSet<&Pe> = HashSet::new();
    let mut out = Vec::with_capacity(lhs.len().max(rhs.len()));
    let (mut li, mut ri) = (0, 0);
    while li < lpes.len() || ri < rpes.len() {
        if li < lpes.len() && ri < rpes.len() {
            let pe = &lpes[li];
            if *pe == rpes[ri] {
                merged_rhs.insert(pe);
                if let Some(rv) = rby.get(pe) {
                    out.push(merge(lby.get(pe).copied(), rv, elem));
                }
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if rby.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lpes.len() {
            let pe = &lpes[li];
            if !rby.contains_key(pe) {
                out.push(lhs[li].clone());
                li += 1;
                continue;
            } else if merged_rhs.contains(pe) {
                li += 1;
                continue;
            }
        }
        if ri < rpes.len() {
            let pe = &rpes[ri];
            merged_rhs.insert(pe);
            if let Some(rv) = rby.get(pe) {
                out.push(merge(lby.get(pe).copied(), rv, elem));
            }
            ri += 1;
            if next_shared == Some(pe) {
                next_shared = shared.pop_front();
            }
        }
    }
    out
}

/// Removes from `object` what the applier owned before (`last`) and nobody owns now
/// (`owned`, every manager's set after the apply). A struct field owned only through fields
/// below it goes when none of them is owned; a map list item keeps its key fields, the object
/// its apiVersion, kind and metadata.
pub fn prune(object: &mut Value, shape: &Shape, last: &FieldSet, owned: &FieldSet) {
    let type_meta = ["apiVersion".to_string(), "kind".into(), "metadata".into()];
    prune_at(object, shape, last, owned, &mut Vec::new(), &type_meta);
}

fn prune_at(
    value: &mut Value,
    shape: &Shape,
    last: &FieldSet,
    owned: &FieldSet,
    path: &mut Path,
    keep: &[String],
) {
    let goes = |path: &Path, declared: bool| {
        (last.contains(path) || (declared && last.has_below(path))) && !owned.covers(path)
    };
    match (shape, value) {
        (Shape::Map { atomic: false, .. } | Shape::Deduced, Value::Object(map)) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let (child, declared) = shape.child(&key);
                path.push(Pe::Field(key.clone()));
                if !keep.contains(&key) && goes(path, declared) {
                    map.remove(&key);
                } else if last.has_below(path) {
                    if let Some(v) = map.get_mut(&key) {
                        prune_at(v, child, last, owned, path, &[]);
                    }
                }
                path.pop();
            }
        }
        (
            Shape::List {
                elem,
                kind: kind @ (ListKind::Set | ListKind::Map(_)),
            },
            Value::Array(items),
        ) => {
            let keys: &[String] = match kind {
                ListKind::Map(keys) => keys,
                _ => &[],
            };
            let mut kept = Vec::with_capacity(items.len());
            for (i, mut item) in std::mem::take(items).into_iter().enumerate() {
                path.push(item_pe(kind, &item, i));
                if !goes(path, false) {
                    if last.has_below(path) {
                        prune_at(&mut item, elem, last, owned, path, keys);
                    }
                    kept.push(item);
                }
                path.pop();
            }
            *items = kept;
        }
        _ => {}
    }
}

/// The first field of an applied configuration its type does not declare (a struct field
/// outside `properties` where nothing else is allowed), as structured-merge-diff refuses it:
/// `.spec.x: field not declared in schema`.
pub fn undeclared(value: &Value, shape: &Shape) -> Option<String> {
    undeclared_at(value, shape, &mut Vec::new())
}

fn undeclared_at(value: &Value, shape: &Shape, path: &mut Path) -> Option<String> {
    match walk_of(shape, value) {
        Walk::Leaf => None,
        Walk::Map(map) => {
            for (key, child) in map {
                path.push(Pe::Field(key.clone()));
                let found = match shape {
                    Shape::Map {
                        fields, elem: None, ..
                    } if !fields.contains_key(key) => Some(format!(
                        "{}: field not declared in schema",
                        super::fieldset::path_text(path)
                    )),
                    _ => undeclared_at(child, shape.child(key).0, path),
                };
                path.pop();
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        Walk::List(items, elem, kind) => {
            for (i, item) in items.iter().enumerate() {
                path.push(item_pe(kind, item, i));
                let found = undeclared_at(item, elem, path);
                path.pop();
                if found.is_some() {
                    return found;
                }
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shape() -> Shape {
        super::super::shape::from_crd_schema(Some(&json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "color": {"type": "string"},
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "port": {"type": "integer"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set",
                "items": {"type": "string"}},
            "args": {"type": "array", "items": {"type": "string"}},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }}}})))
    }

    #[test]
    fn the_field_set_of_a_config_is_what_the_real_server_records() {
        let config = json!({"spec": {"color": "red", "ports": [{"name": "a", "port": 1}],
            "tags": ["x"], "args": ["q"], "extra": {"foo": {"bar": 1}}}});
        assert_eq!(
            to_set(&config, &shape()).to_fields_v1(),
            json!({"f:spec": {"f:color": {}, "f:args": {},
                "f:ports": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:port": {}}},
                "f:tags": {"v:\"x\"": {}},
                "f:extra": {"f:foo": {".": {}, "f:bar": {}}}}})
        );
    }

    #[test]
    fn compare_marks_new_maps_as_added() {
        let c = compare(
            &json!({}),
            &json!({"spec": {"color": "red", "tags": ["x"]}}),
            &shape(),
        );
        assert_eq!(
            c.added.to_fields_v1(),
            json!({"f:spec": {".": {}, "f:color": {}, "f:tags": {".": {}, "v:\"x\"": {}}}})
        );
        let c = compare(
            &json!({"spec": {"color": "red", "args": ["a"]}}),
            &json!({"spec": {"color": "blue"}}),
            &shape(),
        );
        assert_eq!(
            c.modified.to_fields_v1(),
            json!({"f:spec": {"f:color": {}}})
        );
        assert_eq!(c.removed.to_fields_v1(), json!({"f:spec": {"f:args": {}}}));
    }

    #[test]
    fn lists_merge_by_key_and_value_in_the_real_servers_order() {
        let live = json!({"spec": {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}],
            "tags": ["t1", "t2"], "args": ["x"]}});
        let config = json!({"spec": {"ports": [{"name": "b", "port": 3}, {"name": "c"}],
            "tags": ["t2", "t3"], "args": ["y"]}});
        assert_eq!(
            merge(Some(&live), &config, &shape()),
            json!({"spec": {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 3},
                {"name": "c"}], "tags": ["t1", "t2", "t3"], "args": ["y"]}})
        );
    }

    #[test]
    fn undeclared_fields_are_named_first_in_order() {
        let config = json!({"spec": {"bogus": 1, "ports": [{"name": "a", "zz": 1}],
                                     "extra": {"anything": {"goes": 1}}}});
        assert_eq!(
            undeclared(&config, &shape()).as_deref(),
            Some(".spec.bogus: field not declared in schema")
        );
        let config = json!({"spec": {"ports": [{"name": "a", "zz": 1}]}});
        assert_eq!(
            undeclared(&config, &shape()).as_deref(),
            Some(".spec.ports[name=\"a\"].zz: field not declared in schema")
        );
        assert_eq!(
            undeclared(&json!({"spec": {"extra": {"a": 1}}}), &shape()),
            None
        );
    }

    #[test]
    fn prune_removes_what_only_the_applier_owned() {
        let s = shape();
        let mut obj = json!({"metadata": {"labels": {"a": "b"}}, "spec": {"color": "red",
            "ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}], "tags": ["t1"]}});
        let last = to_set(&obj, &s);
        let mut owned = to_set(&json!({"spec": {"color": "red"}}), &s);
        owned.insert(vec![
            Pe::Field("spec".into()),
            Pe::Field("ports".into()),
            Pe::Key(vec![("name".into(), "\"b\"".into())]),
            Pe::Field("port".into()),
        ]);
        prune(&mut obj, &s, &last, &owned);
        assert_eq!(
            obj,
            json!({"metadata": {}, "spec": {"color": "red", "ports": [{"name": "b", "port": 2}]}})
        );
    }
}
