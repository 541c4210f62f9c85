//! The merge types of objects, as structured-merge-diff sees a schema: which maps are structs
//! with declared fields, which are granular or atomic, which lists are `atomic`, `set` or `map`
//! (and by which keys), and the "deduced" type of fields no schema describes (maps granular,
//! lists atomic). Built from a CRD version's `openAPIV3Schema`, with `metadata` as ObjectMeta;
//! built-ins get ObjectMeta and a few declared top-level fields.

use std::collections::BTreeMap;

use serde_json::Value;

/// How a list merges (`x-kubernetes-list-type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced whole (the default).
    Atomic,
    /// Items are unique scalars, merged by value.
    Set,
    /// Items are objects merged by these key fields.
    Map(Vec<String>),
}

/// The merge type of one node.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A scalar (also int-or-string).
    Scalar,
    /// A map or struct: declared `fields`, the type of other keys (`elem`), and whether it is
    /// replaced whole (`x-kubernetes-map-type: atomic`).
    Map {
        /// Declared properties.
        fields: BTreeMap<String, Shape>,
        /// The type of undeclared keys (additionalProperties, or deduced).
        elem: Option<Box<Shape>>,
        /// `x-kubernetes-map-type: atomic`.
        atomic: bool,
    },
    /// A list.
    List {
        /// The items' type.
        elem: Box<Shape>,
        /// How it merges.
        kind: ListKind,
    },
    /// No schema: objects are granular maps of deduced values, lists atomic.
    Deduced,
}

/// A granular map with undeclared keys of `elem`.
fn map_of(elem: Shape) -> Shape {
    Shape::Map {
        fields: BTreeMap::new(),
        elem: Some(Box::new(elem)),
        atomic: false,
    }
}

fn strukt(fields: &[(&str, Shape)]) -> Shape {
    Shape::Map {
        fields: fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        elem: None,
        atomic: false,
    }
}

/// `metadata` (ObjectMeta): labels and annotations granular, finalizers a set,
/// ownerReferences a map list keyed by uid.
pub fn object_meta() -> Shape {
    let scalars = [
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ];
    let mut fields: Vec<(&str, Shape)> = scalars.iter().map(|s| (*s, Shape::Scalar)).collect();
    fields.push(("labels", map_of(Shape::Scalar)));
    fields.push(("annotations", map_of(Shape::Scalar)));
    fields.push((
        "finalizers",
        Shape::List {
            elem: Box::new(Shape::Scalar),
            kind: ListKind::Set,
        },
    ));
    let owner = strukt(&[
        ("apiVersion", Shape::Scalar),
        ("kind", Shape::Scalar),
        ("name", Shape::Scalar),
        ("uid", Shape::Scalar),
        ("controller", Shape::Scalar),
        ("blockOwnerDeletion", Shape::Scalar),
    ]);
    fields.push((
        "ownerReferences",
        Shape::List {
            elem: Box::new(owner),
            kind: ListKind::Map(vec!["uid".into()]),
        },
    ));
    fields.push((
        "managedFields",
        Shape::List {
            elem: Box::new(Shape::Deduced),
            kind: ListKind::Atomic,
        },
    ));
    strukt(&fields)
}

/// Adds `apiVersion`, `kind` and `metadata` to a root (or embedded resource) struct.
fn with_type_meta(shape: Shape) -> Shape {
    match shape {
        Shape::Map {
            mut fields,
            elem,
            atomic,
        } => {
            fields.insert("apiVersion".into(), Shape::Scalar);
            fields.insert("kind".into(), Shape::Scalar);
            fields.insert("metadata".into(), object_meta());
            Shape::Map {
                fields,
                elem,
                atomic,
            }
        }
        _ => with_type_meta(map_of(Shape::Deduced)),
    }
}

/// The shape of a custom resource from its version's `openAPIV3Schema` (`None`: no schema).
pub fn from_crd_schema(schema: Option<&Value>) -> Shape {
    match schema {
        Some(s) => with_type_meta(parse(s)),
        None => with_type_meta(map_of(Shape::Deduced)),
    }
}

fn parse(schema: &Value) -> Shape {
    let flag = |k: &str| schema.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("x-kubernetes-int-or-string") {
        return Shape::Scalar;
    }
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    let embedded = flag("x-kubernetes-embedded-resource");
    let shape = match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let fields: BTreeMap<String, Shape> = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.iter().map(|(k, v)| (k.clone(), parse(v))).collect())
                .unwrap_or_default();
            let elem = match schema.get("additionalProperties") {
                Some(a @ Value::Object(_)) => Some(Box::new(parse(a))),
                Some(Value::Bool(true)) => Some(Box::new(Shape::Deduced)),
                _ if preserve => Some(Box::new(Shape::Deduced)),
                _ => None,
            };
            let atomic =
                schema.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic");
            Shape::Map {
                fields,
                elem,
                atomic,
            }
        }
        Some("array") => {
            let elem = schema.get("items").map_or(Shape::Deduced, parse);
            let kind = match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                Some("set") => ListKind::Set,
                Some("map") => ListKind::Map(
                    schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|keys| {
                            keys.iter()
                                .filter_map(|k| k.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                _ => ListKind::Atomic,
            };
            Shape::List {
                elem: Box::new(elem),
                kind,
            }
        }
        None if preserve => Shape::Deduced,
        _ => Shape::Scalar,
    };
    if embedded {
        with_type_meta(shape)
    } else {
        shape
    }
}

/// The shape of a built-in kind (by its kind name): ObjectMeta, and for the kinds with string
/// maps (ConfigMap, Secret) those maps declared; everything else deduced.
pub fn builtin(kind: &str) -> Shape {
    let string_map = map_of(Shape::Scalar);
    let fields: Vec<(&str, Shape)> = match kind {
        "ConfigMap" => vec![
            ("data", string_map.clone()),
            ("binaryData", string_map),
            ("immutable", Shape::Scalar),
        ],
        "Secret" => vec![
            ("data", string_map.clone()),
            ("stringData", string_map),
            ("type", Shape::Scalar),
            ("immutable", Shape::Scalar),
        ],
        "Lease" => vec![(
            "spec",
            strukt(&[
                ("holderIdentity", Shape::Scalar),
                ("leaseDurationSeconds", Shape::Scalar),
                ("acquireTime", Shape::Scalar),
                ("renewTime", Shape::Scalar),
                ("leaseTransitions", Shape::Scalar),
                ("strategy", Shape::Scalar),
                ("preferredHolder", Shape::Scalar),
            ]),
        )],
        _ => vec![],
    };
    let mut root = strukt(&fields);
    if let Shape::Map { elem, .. } = &mut root {
        *elem = Some(Box::new(Shape::Deduced));
    }
    with_type_meta(root)
}

static DEDUCED: Shape = Shape::Deduced;

impl Shape {
    /// The type of the child `key` of a map of this shape, and whether it is a declared field.
    pub fn child(&self, key: &str) -> (&Shape, bool) {
        match self {
            Shape::Map { fields, elem, .. } => match fields.get(key) {
                Some(s) => (s, true),
                None => (elem.as_deref().unwrap_or(&DEDUCED), false),
            },
            _ => (&DEDUCED, false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_keywords_become_merge_types() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "sel": {"type": "object", "x-kubernetes-map-type": "atomic"},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }}}});
        let root = from_crd_schema(Some(&schema));
        let (spec, declared) = root.child("spec");
        assert!(declared);
        assert!(
            matches!(spec.child("ports").0, Shape::List { kind: ListKind::Map(k), .. } if k == &vec!["name".to_string()])
        );
        assert!(matches!(
            spec.child("tags").0,
            Shape::List {
                kind: ListKind::Set,
                ..
            }
        ));
        assert!(matches!(
            spec.child("sel").0,
            Shape::Map { atomic: true, .. }
        ));
        let (extra, _) = spec.child("extra");
        assert_eq!(extra.child("anything"), (&Shape::Deduced, false));
        assert!(root.child("metadata").0.child("labels").1);
    }
}
