//! The CEL types a rule is type-checked against, built from the structural schema as
//! kube-apiserver builds its `DeclType`s (`apiserver/pkg/cel/common/schemas.go`): a property with
//! no `type` (only `x-kubernetes-preserve-unknown-fields`) has no CEL type and is left out of its
//! object, `x-kubernetes-int-or-string` is `dyn`, `additionalProperties` objects are maps,
//! `format: byte|date|date-time|duration` strings are `bytes`/`timestamp`/`duration`, and a
//! resource root (the root, an `x-kubernetes-embedded-resource`) gets `apiVersion`, `kind` and
//! `metadata` with only `name` and `generateName`. Each type carries the sizes the cost estimate
//! reads: the most elements (characters, items, properties) a value can have, and the fewest bytes
//! it serializes to. It owns types, not checking: `cel_check.rs` does that.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cel_value::escape;
use super::node::{Node, SchemaType};

/// kube-apiserver's largest request, which bounds every unbounded size estimate.
pub(super) const MAX_REQUEST_SIZE_BYTES: i64 = 3 * 1024 * 1024;

/// A CEL type, as the checker reasons about it.
#[derive(Debug, Clone)]
pub(super) enum Ty {
    Dyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Timestamp,
    Duration,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    /// An object of the schema; its fields are in the declaration.
    Object(Arc<Decl>),
    Optional(Box<Ty>),
    /// A type value (`int`, `type(x)`).
    Type(Box<Ty>),
    /// A type parameter of an overload signature.
    Param(&'static str),
    /// An opaque library type (`URL`, `Quantity`, ...).
    Opaque(&'static str),
    /// An expression that already failed to check: matches anything, reports nothing more.
    Error,
}

impl Ty {
    /// The type's name as cel-go prints it in `found no matching overload` messages. Objects are
    /// named `selfType.<path>`; kube-apiserver adds a random number after `selfType`, which we
    /// cannot reproduce.
    pub(super) fn name(&self) -> String {
        match self {
            Ty::Dyn => "dyn".into(),
            Ty::Null => "null".into(),
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::Bytes => "bytes".into(),
            Ty::Timestamp => "timestamp".into(),
            Ty::Duration => "duration".into(),
            Ty::List(e) => format!("list({})", e.name()),
            Ty::Map(k, v) => format!("map({}, {})", k.name(), v.name()),
            Ty::Object(d) => d.name.clone(),
            Ty::Optional(t) => format!("optional_type({})", t.name()),
            Ty::Type(t) => format!("type({})", t.name()),
            Ty::Param(p) => (*p).into(),
            Ty::Opaque(n) => (*n).into(),
            Ty::Error => "*error*".into(),
        }
    }

    /// Whether values of this type have a fixed size (cel-go's `isScalar`; type values, null and
    /// the libraries' opaque values too, which kube-apiserver never sizes as unbounded).
    pub(super) fn is_scalar(&self) -> bool {
        matches!(
            self,
            Ty::Bool
                | Ty::Int
                | Ty::Uint
                | Ty::Double
                | Ty::Null
                | Ty::Timestamp
                | Ty::Duration
                | Ty::Type(_)
                | Ty::Opaque(_)
        )
    }
}

/// The CEL declaration of one schema node.
#[derive(Debug)]
pub(super) struct Decl {
    pub(super) kind: DeclKind,
    /// The object type's name (objects only).
    pub(super) name: String,
    /// The most characters, items or properties a value can have (0 for objects and scalars).
    pub(super) max_elements: u64,
    /// The fewest bytes a value serializes to in JSON.
    pub(super) min_size: i64,
}

/// What a declaration declares.
#[derive(Debug)]
pub(super) enum DeclKind {
    Scalar(Ty),
    List(Arc<Decl>),
    /// A map with string keys; the key's declaration is kept for size estimates.
    Map(Arc<Decl>, Arc<Decl>),
    /// Fields by escaped CEL name.
    Object(BTreeMap<String, Arc<Decl>>),
}

impl Decl {
    fn scalar(ty: Ty, max_elements: u64, min_size: i64) -> Arc<Decl> {
        Arc::new(Decl {
            kind: DeclKind::Scalar(ty),
            name: String::new(),
            max_elements,
            min_size,
        })
    }

    /// The CEL type of values of this declaration.
    pub(super) fn ty(self: &Arc<Self>) -> Ty {
        match &self.kind {
            DeclKind::Scalar(t) => t.clone(),
            DeclKind::List(e) => Ty::List(Box::new(e.ty())),
            DeclKind::Map(k, v) => Ty::Map(Box::new(k.ty()), Box::new(v.ty())),
            DeclKind::Object(_) => Ty::Object(Arc::clone(self)),
        }
    }

    /// The field `name` (escaped) of an object declaration.
    pub(super) fn field(&self, name: &str) -> Option<&Arc<Decl>> {
        match &self.kind {
            DeclKind::Object(fields) => fields.get(name),
            _ => None,
        }
    }
}

fn non_negative(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn string_max_length(node: &Node) -> u64 {
    if let Some(max) = node.max_length {
        // maxLength counts code points; a code point is up to 4 bytes.
        return non_negative(max).saturating_mul(4);
    }
    match &node.enum_values {
        Some(values) if !values.is_empty() => values
            .iter()
            .filter_map(|v| v.as_str())
            .map(|s| s.len() as u64)
            .max()
            .unwrap_or(0),
        _ => non_negative(MAX_REQUEST_SIZE_BYTES - 2),
    }
}

fn string_decl(node: &Node) -> Arc<Decl> {
    let unbounded = non_negative(MAX_REQUEST_SIZE_BYTES - 2);
    match node.format.as_deref() {
        Some("byte") => Decl::scalar(
            Ty::Bytes,
            node.max_length.map_or(unbounded, non_negative),
            2,
        ),
        Some("duration") => Decl::scalar(Ty::Duration, 32, 3),
        Some("date") => Decl::scalar(Ty::Timestamp, 12, 12),
        Some("date-time") => Decl::scalar(Ty::Timestamp, 32, 21),
        _ => Decl::scalar(Ty::String, string_max_length(node), 2),
    }
}

/// The declaration of `node` (`path` names its type in messages), or `None` when CEL cannot see
/// values of it (no `type`, or an array/map of such).
pub(super) fn declare(node: &Node, resource_root: bool, path: &str) -> Option<Arc<Decl>> {
    if node.int_or_string {
        return Some(Decl::scalar(
            Ty::Dyn,
            non_negative(MAX_REQUEST_SIZE_BYTES - 2),
            1,
        ));
    }
    match node.ty? {
        SchemaType::Array => {
            let items = node.items.as_deref()?;
            let item = declare(items, items.embedded, &format!("{path}.@idx"))?;
            let max = match node.max_items {
                Some(m) => non_negative(m),
                None => non_negative((MAX_REQUEST_SIZE_BYTES - 2) / (item.min_size + 1)),
            };
            Some(Arc::new(Decl {
                kind: DeclKind::List(item),
                name: String::new(),
                max_elements: max,
                min_size: 2,
            }))
        }
        SchemaType::Object if node.additional.is_some() => {
            let additional = node.additional.as_deref()?;
            let value = declare(additional, additional.embedded, &format!("{path}.@elem"))?;
            let max = match node.max_properties {
                Some(m) => non_negative(m),
                None => non_negative((MAX_REQUEST_SIZE_BYTES - 2) / (value.min_size + 6)),
            };
            Some(Arc::new(Decl {
                kind: DeclKind::Map(Decl::scalar(Ty::String, 0, 2), value),
                name: String::new(),
                max_elements: max,
                min_size: 2,
            }))
        }
        SchemaType::Object => Some(object_decl(node, resource_root, path)),
        SchemaType::String => Some(string_decl(node)),
        SchemaType::Boolean => Some(Decl::scalar(Ty::Bool, 0, 4)),
        SchemaType::Number => Some(Decl::scalar(Ty::Double, 0, 1)),
        SchemaType::Integer => Some(Decl::scalar(Ty::Int, 0, 1)),
    }
}

fn object_decl(node: &Node, resource_root: bool, path: &str) -> Arc<Decl> {
    let mut fields = BTreeMap::new();
    let mut min_size: i64 = 2;
    for (name, prop) in &node.properties {
        if resource_root && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let Some(decl) = declare(prop, prop.embedded, &format!("{path}.{name}")) else {
            continue;
        };
        if node.required.contains(name) && prop.default.is_none() {
            min_size += name.len() as i64 + decl.min_size + 4;
        }
        if let Some(cel_name) = escape(name) {
            fields.insert(cel_name, decl);
        }
    }
    if resource_root {
        let string = || Decl::scalar(Ty::String, non_negative(MAX_REQUEST_SIZE_BYTES - 2), 2);
        fields.insert("apiVersion".into(), string());
        fields.insert("kind".into(), string());
        let meta: BTreeMap<String, Arc<Decl>> = [
            ("name".to_string(), string()),
            ("generateName".to_string(), string()),
        ]
        .into_iter()
        .collect();
        fields.insert(
            "metadata".into(),
            Arc::new(Decl {
                kind: DeclKind::Object(meta),
                name: format!("{path}.metadata"),
                max_elements: 0,
                min_size: 2,
            }),
        );
    }
    Arc::new(Decl {
        kind: DeclKind::Object(fields),
        name: path.to_string(),
        max_elements: 0,
        min_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::schema::node::Site;
    use crate::devcluster::schema::rules::RuleEnv;
    use serde_json::json;

    fn decl(schema: serde_json::Value) -> Option<Arc<Decl>> {
        let env = RuleEnv::new().expect("env");
        let site = Site::root();
        let mut checks = crate::devcluster::schema::rules::Checks::new(&env);
        let node = Node::parse(&schema, &site, &mut checks).expect("parses");
        declare(&node, false, "selfType")
    }

    #[test]
    fn untyped_properties_are_left_out_of_their_object() {
        let d = decl(json!({"type": "object", "properties": {
            "raw": {"x-kubernetes-preserve-unknown-fields": true},
            "obj": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "x-y": {"type": "string"}}}))
        .expect("declared");
        assert!(d.field("raw").is_none());
        assert!(d.field("obj").is_some());
        assert!(d.field("x__dash__y").is_some());
    }

    #[test]
    fn unbounded_lists_are_bounded_by_the_request_size() {
        let d = decl(json!({"type": "array", "items": {"type": "string"}})).expect("declared");
        assert_eq!(d.max_elements, ((MAX_REQUEST_SIZE_BYTES - 2) / 3) as u64);
        let d = decl(
            json!({"type": "array", "maxItems": 7, "items": {"type": "string", "maxLength": 5}}),
        )
        .expect("declared");
        assert_eq!(d.max_elements, 7);
        match &d.kind {
            DeclKind::List(item) => assert_eq!(item.max_elements, 20),
            other => panic!("{other:?}"),
        }
        assert!(decl(
            json!({"type": "array", "items": {"x-kubernetes-preserve-unknown-fields": true}})
        )
        .is_none());
    }

    #[test]
    fn embedded_resources_see_only_type_and_name_meta() {
        let d = decl(json!({"type": "object", "properties": {"template": {"type": "object",
            "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true,
            "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}}}}))
        .expect("declared");
        let template = d.field("template").expect("template");
        assert!(template.field("kind").is_some() && template.field("apiVersion").is_some());
        let meta = template.field("metadata").expect("metadata");
        assert!(meta.field("name").is_some() && meta.field("generateName").is_some());
        assert!(meta.field("labels").is_none());
        assert!(matches!(
            decl(json!({"x-kubernetes-int-or-string": true})).map(|d| d.ty()),
            Some(Ty::Dyn)
        ));
    }
}
