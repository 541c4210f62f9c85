//! The compiled form of one `openAPIV3Schema`: a tree of [`Node`]s, one per schema node, with
//! every keyword kube-apiserver acts on parsed once (regexes compiled, CEL rules compiled by
//! `rules.rs`). It owns reading the schema JSON and refusing what a CRD could not declare; it does
//! not look at objects.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use super::cel_reads::Reads;
use super::numbers;
use super::rules::{self, Checks, Rule};

/// Why a schema could not be compiled. Rendered into the `String` of `CompiledSchema::compile`.
#[derive(Debug, thiserror::Error)]
pub(super) enum CompileError {
    /// A keyword has a value of the wrong JSON type, or an unsupported value.
    #[error("{path}: Invalid value: {value}: {detail}")]
    Invalid {
        path: String,
        value: String,
        detail: String,
    },
}

impl CompileError {
    pub(super) fn invalid(path: &str, value: &Value, detail: impl Into<String>) -> Self {
        CompileError::Invalid {
            path: path.to_string(),
            value: value.to_string(),
            detail: detail.into(),
        }
    }
}

/// The six OpenAPI types a structural schema may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SchemaType {
    Object,
    Array,
    String,
    Integer,
    Number,
    Boolean,
}

impl SchemaType {
    /// The spelling used in schemas and in kube-apiserver's messages.
    pub(super) fn name(self) -> &'static str {
        match self {
            SchemaType::Object => "object",
            SchemaType::Array => "array",
            SchemaType::String => "string",
            SchemaType::Integer => "integer",
            SchemaType::Number => "number",
            SchemaType::Boolean => "boolean",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "object" => SchemaType::Object,
            "array" => SchemaType::Array,
            "string" => SchemaType::String,
            "integer" => SchemaType::Integer,
            "number" => SchemaType::Number,
            "boolean" => SchemaType::Boolean,
            _ => return None,
        })
    }
}

/// `x-kubernetes-list-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ListType {
    Atomic,
    Set,
    Map,
}

/// A `pattern`, kept with its source text for messages.
#[derive(Debug)]
pub(super) struct Pattern {
    pub(super) source: String,
    pub(super) regex: Regex,
}

/// One schema node.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) ty: Option<SchemaType>,
    pub(super) nullable: bool,
    /// The format as written, kept only when kube-apiserver validates it for this type.
    pub(super) format: Option<String>,
    pub(super) properties: BTreeMap<String, Node>,
    /// Whether `properties` was written (an object with properties, even none).
    pub(super) has_properties: bool,
    pub(super) additional: Option<Box<Node>>,
    pub(super) items: Option<Box<Node>>,
    pub(super) required: Vec<String>,
    pub(super) enum_values: Option<Vec<Value>>,
    pub(super) default: Option<Value>,
    pub(super) minimum: Option<f64>,
    pub(super) exclusive_minimum: bool,
    pub(super) maximum: Option<f64>,
    pub(super) exclusive_maximum: bool,
    pub(super) multiple_of: Option<f64>,
    pub(super) min_length: Option<i64>,
    pub(super) max_length: Option<i64>,
    pub(super) pattern: Option<Pattern>,
    pub(super) min_items: Option<i64>,
    pub(super) max_items: Option<i64>,
    pub(super) unique_items: bool,
    pub(super) min_properties: Option<i64>,
    pub(super) max_properties: Option<i64>,
    pub(super) all_of: Vec<Node>,
    pub(super) any_of: Vec<Node>,
    pub(super) one_of: Vec<Node>,
    pub(super) not: Option<Box<Node>>,
    pub(super) preserve_unknown: bool,
    pub(super) embedded: bool,
    pub(super) int_or_string: bool,
    pub(super) list_type: Option<ListType>,
    pub(super) list_map_keys: Vec<String>,
    pub(super) rules: Vec<Rule>,
    /// What `rules` (and their messageExpressions) read of `self` and `oldSelf` together: the
    /// parts of the value their bindings are built from (`cel_eval`).
    pub(super) rule_reads: RuleReads,
    /// Whether this node or one below it has CEL rules.
    pub(super) has_rules: bool,
}

/// What a node's rules read, together ([`Node::rule_reads`]).
#[derive(Debug, Clone, Default)]
pub(super) struct RuleReads {
    /// Of `self`.
    pub(super) this: Reads,
    /// Of `oldSelf`; only bound when `transition`.
    pub(super) old: Reads,
    /// Whether any rule reads `oldSelf`.
    pub(super) transition: bool,
}

impl RuleReads {
    fn of(rules: &[Rule]) -> RuleReads {
        let mut reads = RuleReads::default();
        for rule in rules {
            reads.this.union(&rule.reads_self);
            reads.old.union(&rule.reads_old_self);
            reads.transition |= rule.uses_old_self;
        }
        reads
    }
}

/// String formats kube-apiserver validates (after removing dashes, as go-openapi normalizes).
const STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "quantity",
];

/// Where a node sits, for compile-time checks of CEL rules.
#[derive(Clone)]
pub(super) struct Site {
    /// The schema path, e.g. `openAPIV3Schema.properties[spec]`.
    pub(super) path: String,
    /// Whether `oldSelf` can be correlated here (not under a set or atomic list's items).
    pub(super) correlatable: bool,
    /// How many times this node can occur in one object: the product of the `maxItems` and
    /// `maxProperties` above it (`None` when one of them is unset).
    pub(super) cardinality: Option<u64>,
    /// Whether values here are resources (the root, an `x-kubernetes-embedded-resource`), which
    /// rules see with `apiVersion`, `kind` and `metadata`.
    pub(super) resource_root: bool,
}

impl Site {
    /// The root of an `openAPIV3Schema`.
    pub(super) fn root() -> Site {
        Site {
            path: "openAPIV3Schema".to_string(),
            correlatable: true,
            cardinality: Some(1),
            resource_root: true,
        }
    }

    /// The site of a child schema at `path`, occurring up to `max` times per parent value
    /// (`Some(1)` for a property, `maxItems` for items, `maxProperties` for map values).
    fn child(&self, path: String, max: Option<i64>, correlatable: bool, embedded: bool) -> Site {
        let cardinality = match (self.cardinality, max) {
            (Some(c), Some(m)) => Some(c.saturating_mul(u64::try_from(m).unwrap_or(0))),
            _ => None,
        };
        Site {
            path,
            correlatable,
            cardinality,
            resource_root: embedded,
        }
    }
}

fn embedded_flag(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

impl Node {
    /// Parses one schema node and everything under it.
    pub(super) fn parse(
        schema: &Value,
        site: &Site,
        checks: &mut Checks<'_>,
    ) -> Result<Node, CompileError> {
        let Some(obj) = schema.as_object() else {
            return Err(CompileError::invalid(
                &site.path,
                schema,
                "must be a schema object",
            ));
        };
        if obj.contains_key("$ref") {
            return Err(CompileError::invalid(
                &format!("{}.$ref", site.path),
                &obj["$ref"],
                "must not be set",
            ));
        }
        let mut node = Node {
            ty: parse_type(obj, site)?,
            nullable: flag(obj, "nullable", site)?,
            preserve_unknown: flag(obj, "x-kubernetes-preserve-unknown-fields", site)?,
            embedded: flag(obj, "x-kubernetes-embedded-resource", site)?,
            int_or_string: flag(obj, "x-kubernetes-int-or-string", site)?,
            unique_items: flag(obj, "uniqueItems", site)?,
            exclusive_minimum: flag(obj, "exclusiveMinimum", site)?,
            exclusive_maximum: flag(obj, "exclusiveMaximum", site)?,
            minimum: float(obj, "minimum", site)?,
            maximum: float(obj, "maximum", site)?,
            multiple_of: float(obj, "multipleOf", site)?,
            min_length: int(obj, "minLength", site)?,
            max_length: int(obj, "maxLength", site)?,
            min_items: int(obj, "minItems", site)?,
            max_items: int(obj, "maxItems", site)?,
            min_properties: int(obj, "minProperties", site)?,
            max_properties: int(obj, "maxProperties", site)?,
            required: strings(obj, "required", site)?,
            list_map_keys: strings(obj, "x-kubernetes-list-map-keys", site)?,
            ..Node::default()
        };
        node.format = parse_format(obj, node.ty, site)?;
        node.pattern = parse_pattern(obj, site)?;
        node.list_type = parse_list_type(obj, site)?;
        if let Some(values) = obj.get("enum") {
            let Some(list) = values.as_array() else {
                return Err(CompileError::invalid(
                    &site.path,
                    values,
                    "enum must be a list",
                ));
            };
            node.enum_values = Some(list.iter().cloned().map(normalized).collect());
        }
        if let Some(default) = obj.get("default") {
            node.default = Some(normalized(default.clone()));
        }
        if let Some(props) = obj.get("properties") {
            let Some(props) = props.as_object() else {
                return Err(CompileError::invalid(
                    &site.path,
                    props,
                    "properties must be an object",
                ));
            };
            node.has_properties = true;
            for (name, sub) in props {
                let sub_site = site.child(
                    format!("{}.properties[{name}]", site.path),
                    Some(1),
                    site.correlatable,
                    embedded_flag(sub),
                );
                node.properties
                    .insert(name.clone(), Node::parse(sub, &sub_site, checks)?);
            }
        }
        match obj.get("additionalProperties") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                return Err(CompileError::invalid(
                    &format!("{}.additionalProperties", site.path),
                    &Value::Bool(false),
                    "additionalProperties: false is not supported",
                ));
            }
            Some(sub) => {
                let sub_site = site.child(
                    format!("{}.additionalProperties", site.path),
                    node.max_properties,
                    site.correlatable,
                    embedded_flag(sub),
                );
                node.additional = Some(Box::new(Node::parse(sub, &sub_site, checks)?));
            }
        }
        if let Some(items) = obj.get("items") {
            let correlatable = site.correlatable && node.list_type == Some(ListType::Map);
            let sub_site = site.child(
                format!("{}.items", site.path),
                node.max_items,
                correlatable,
                embedded_flag(items),
            );
            node.items = Some(Box::new(Node::parse(items, &sub_site, checks)?));
        }
        node.all_of = parse_branches(obj, "allOf", site, checks)?;
        node.any_of = parse_branches(obj, "anyOf", site, checks)?;
        node.one_of = parse_branches(obj, "oneOf", site, checks)?;
        if let Some(not) = obj.get("not") {
            let sub_site = Site {
                path: format!("{}.not", site.path),
                ..site.clone()
            };
            node.not = Some(Box::new(Node::parse(not, &sub_site, checks)?));
        }
        if let Some(rules) = obj.get("x-kubernetes-validations") {
            node.rules = rules::compile_all(rules, site, &node, checks)?;
            node.rule_reads = RuleReads::of(&node.rules);
        }
        node.has_rules = !node.rules.is_empty()
            || node.properties.values().any(|p| p.has_rules)
            || node.additional.as_ref().is_some_and(|a| a.has_rules)
            || node.items.as_ref().is_some_and(|i| i.has_rules)
            || node.all_of.iter().any(|b| b.has_rules);
        Ok(node)
    }

    /// The type as kube-apiserver prints it in CEL errors (empty for int-or-string and untyped).
    pub(super) fn type_name(&self) -> &'static str {
        self.ty.map(SchemaType::name).unwrap_or("")
    }

    /// Whether this node is a map-type object (additionalProperties) rather than a struct.
    pub(super) fn is_struct(&self) -> bool {
        self.has_properties || self.embedded
    }
}

fn normalized(mut v: Value) -> Value {
    numbers::normalize(&mut v);
    v
}

fn parse_branches(
    obj: &Map<String, Value>,
    key: &str,
    site: &Site,
    checks: &mut Checks<'_>,
) -> Result<Vec<Node>, CompileError> {
    let Some(list) = obj.get(key) else {
        return Ok(Vec::new());
    };
    let Some(list) = list.as_array() else {
        return Err(CompileError::invalid(
            &format!("{}.{key}", site.path),
            list,
            "must be a list of schemas",
        ));
    };
    list.iter()
        .enumerate()
        .map(|(i, sub)| {
            let sub_site = Site {
                path: format!("{}.{key}[{i}]", site.path),
                ..site.clone()
            };
            Node::parse(sub, &sub_site, checks)
        })
        .collect()
}

fn parse_type(obj: &Map<String, Value>, site: &Site) -> Result<Option<SchemaType>, CompileError> {
    match obj.get("type") {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => SchemaType::parse(s).map(Some).ok_or_else(|| {
            CompileError::invalid(
                &format!("{}.type", site.path),
                &Value::String(s.clone()),
                "must be one of object, array, string, integer, number, boolean",
            )
        }),
        Some(other) => Err(CompileError::invalid(
            &format!("{}.type", site.path),
            other,
            "must be a string",
        )),
    }
}

fn parse_format(
    obj: &Map<String, Value>,
    ty: Option<SchemaType>,
    site: &Site,
) -> Result<Option<String>, CompileError> {
    let Some(format) = obj.get("format") else {
        return Ok(None);
    };
    let Some(format) = format.as_str() else {
        return Err(CompileError::invalid(
            &format!("{}.format", site.path),
            format,
            "must be a string",
        ));
    };
    // Formats kube-apiserver does not know for the type are dropped, as its post-processing does.
    let kept = match ty {
        None | Some(SchemaType::String) => {
            STRING_FORMATS.contains(&format.replace('-', "").as_str())
        }
        Some(SchemaType::Integer) => format == "int32" || format == "int64",
        Some(SchemaType::Number) => format == "float" || format == "double",
        _ => false,
    };
    Ok(kept.then(|| format.to_string()))
}

fn parse_pattern(obj: &Map<String, Value>, site: &Site) -> Result<Option<Pattern>, CompileError> {
    let Some(pattern) = obj.get("pattern") else {
        return Ok(None);
    };
    let path = format!("{}.pattern", site.path);
    let Some(source) = pattern.as_str() else {
        return Err(CompileError::invalid(&path, pattern, "must be a string"));
    };
    let regex = Regex::new(source).map_err(|e| {
        CompileError::invalid(&path, pattern, format!("must be a valid regex: {e}"))
    })?;
    Ok(Some(Pattern {
        source: source.to_string(),
        regex,
    }))
}

fn parse_list_type(
    obj: &Map<String, Value>,
    site: &Site,
) -> Result<Option<ListType>, CompileError> {
    let Some(value) = obj.get("x-kubernetes-list-type") else {
        return Ok(None);
    };
    match value.as_str() {
        Some("atomic") => Ok(Some(ListType::Atomic)),
        Some("set") => Ok(Some(ListType::Set)),
        Some("map") => Ok(Some(ListType::Map)),
        _ => Err(CompileError::invalid(
            &format!("{}.x-kubernetes-list-type", site.path),
            value,
            "must be one of atomic, set, map",
        )),
    }
}

fn flag(obj: &Map<String, Value>, key: &str, site: &Site) -> Result<bool, CompileError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(CompileError::invalid(
            &format!("{}.{key}", site.path),
            other,
            "must be a boolean",
        )),
    }
}

fn float(obj: &Map<String, Value>, key: &str, site: &Site) -> Result<Option<f64>, CompileError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(other) => Err(CompileError::invalid(
            &format!("{}.{key}", site.path),
            other,
            "must be a number",
        )),
    }
}

fn int(obj: &Map<String, Value>, key: &str, site: &Site) -> Result<Option<i64>, CompileError> {
    let path = || format!("{}.{key}", site.path);
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(i)),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e18 => Ok(Some(f as i64)),
            _ => Err(CompileError::invalid(
                &path(),
                &Value::Number(n.clone()),
                "must be an integer",
            )),
        },
        Some(other) => Err(CompileError::invalid(&path(), other, "must be an integer")),
    }
}

fn strings(obj: &Map<String, Value>, key: &str, site: &Site) -> Result<Vec<String>, CompileError> {
    let Some(value) = obj.get(key) else {
        return Ok(Vec::new());
    };
    let err = || {
        CompileError::invalid(
            &format!("{}.{key}", site.path),
            value,
            "must be a list of strings",
        )
    };
    let Some(list) = value.as_array() else {
        return Err(err());
    };
    list.iter()
        .map(|v| v.as_str().map(str::to_string).ok_or_else(err))
        .collect()
}
