//! OpenAPI v3 value validation of a custom resource, as kube-openapi's SchemaValidator runs it for
//! kube-apiserver: per node the type, allOf/anyOf/oneOf/not, string, format, number, list, enum
//! and object checks, in that order, with kube-openapi's messages converted to field errors the
//! way apiextensions-apiserver converts them. On update it ratchets: a node whose value equals its
//! correlated old value is not validated (kube-apiserver 1.32's CRDValidationRatcheting).

use serde_json::{Map, Number, Value};

use super::formats;
use super::gofmt;
use super::listtype;
use super::node::{ListType, Node};
use super::path::FieldPath;
use super::{FieldError, FieldErrorKind};

/// One validation failure, with whether kube-apiserver raised it as FieldValueTypeInvalid.
#[derive(Debug, Clone)]
pub(super) struct Issue {
    pub(super) error: FieldError,
    pub(super) type_invalid: bool,
}

impl Issue {
    fn new(kind: FieldErrorKind, path: &FieldPath, value: Option<Value>, detail: String) -> Self {
        Issue {
            error: FieldError {
                kind,
                field: path.field(),
                bad_value: value,
                detail,
            },
            type_invalid: false,
        }
    }

    /// An error kube-openapi does not tie to a field (anyOf/oneOf/allOf/not): `<nil>: Invalid value: ""`.
    fn unplaced(detail: String) -> Self {
        Issue::new(
            FieldErrorKind::Invalid,
            &FieldPath::root(),
            Some(Value::String(String::new())),
            detail,
        )
    }

    /// Whether kube-apiserver skips CEL rules because of this error.
    pub(super) fn blocks_rules(&self) -> bool {
        self.type_invalid
            || matches!(
                self.error.kind,
                FieldErrorKind::NotSupported
                    | FieldErrorKind::Required
                    | FieldErrorKind::TooLong
                    | FieldErrorKind::TooMany
            )
    }
}

/// Validates `value` against `node`; `old` is the object before an update, for ratcheting.
pub(super) fn validate(node: &Node, value: &Value, old: Option<&Value>) -> Vec<Issue> {
    let mut issues = Vec::new();
    check(node, value, old, &FieldPath::root(), &mut issues);
    issues
}

/// The JSON type kube-openapi infers for a decoded value, and its format.
fn json_type(value: &Value) -> (&'static str, &'static str) {
    match value {
        Value::Null => ("null", ""),
        Value::Bool(_) => ("boolean", ""),
        Value::Number(n) if n.is_i64() => ("integer", "int64"),
        Value::Number(_) => ("number", "float64"),
        Value::String(_) => ("string", ""),
        Value::Array(_) => ("array", ""),
        Value::Object(_) => ("object", ""),
    }
}

fn declared_types(node: &Node) -> Vec<&'static str> {
    if node.int_or_string {
        vec!["integer", "string"]
    } else {
        node.ty.map(|t| vec![t.name()]).unwrap_or_default()
    }
}

fn in_body(path: &FieldPath, rest: &str) -> String {
    format!("{} in body {rest}", path.as_str())
}

fn type_issue(path: &FieldPath, type_name: &str, actual: &str) -> Issue {
    let mut issue = Issue::new(
        FieldErrorKind::Invalid,
        path,
        Some(Value::String(actual.to_string())),
        in_body(
            path,
            &format!("must be of type {type_name}: {}", gofmt::quote(actual)),
        ),
    );
    issue.type_invalid = true;
    issue
}

fn check(node: &Node, value: &Value, old: Option<&Value>, path: &FieldPath, out: &mut Vec<Issue>) {
    if old == Some(value) {
        return; // ratcheted: unchanged since the stored object
    }
    let types = declared_types(node);
    if value.is_null() {
        if !types.is_empty() && !node.nullable {
            out.push(type_issue(path, &types.join(","), "null"));
        }
        check_enum(node, value, path, out);
        return;
    }
    check_type(node, &types, value, path, out);
    check_composition(node, value, path, out);
    if let Value::String(s) = value {
        check_string(node, s, path, out);
        if let Some(format) = &node.format {
            if !formats::valid(format, s) {
                out.push(type_issue(path, format, s));
            }
        }
    }
    if let Value::Number(n) = value {
        check_number(node, n, path, out);
    }
    if let Value::Array(items) = value {
        check_list(node, items, old, path, out);
    }
    check_enum(node, value, path, out);
    if let Value::Object(map) = value {
        check_object(node, map, old, path, out);
    }
}

/// kube-openapi's typeValidator, quirks included (a string format skips the type check of text
/// and lists).
fn check_type(node: &Node, types: &[&str], value: &Value, path: &FieldPath, out: &mut Vec<Issue>) {
    if types.is_empty() && node.format.is_none() {
        return;
    }
    let (actual, actual_format) = json_type(value);
    let integral_float = value.as_f64().is_some_and(|f| f.fract() == 0.0);
    let float_int = actual == "number" && integral_float && types.contains(&"integer");
    let int_float = actual == "integer" && types.contains(&"number");
    let is_text_or_list = matches!(value, Value::String(_) | Value::Array(_));
    if let Some(format) = &node.format {
        let matches = types.contains(&actual) || actual_format == format || float_int || int_float;
        if !is_text_or_list && !matches {
            out.push(type_issue(path, format, actual_format));
            return;
        }
        let numeric = types.contains(&"number") || types.contains(&"integer");
        if !numeric && is_text_or_list {
            return;
        }
    }
    if !(types.contains(&actual) || float_int || int_float) {
        out.push(type_issue(path, &types.join(","), actual));
    }
}

/// Validates `value` against each branch of a composition on its own.
fn branch(node: &Node, value: &Value, path: &FieldPath) -> Vec<Issue> {
    let mut issues = Vec::new();
    check(node, value, None, path, &mut issues);
    issues
}

fn fewest(results: Vec<Vec<Issue>>) -> Vec<Issue> {
    results
        .into_iter()
        .reduce(|best, r| if r.len() < best.len() { r } else { best })
        .unwrap_or_default()
}

fn check_composition(node: &Node, value: &Value, path: &FieldPath, out: &mut Vec<Issue>) {
    let name = gofmt::quote(path.as_str());
    if !node.any_of.is_empty() {
        let mut failures = Vec::new();
        let mut valid = false;
        for sub in &node.any_of {
            let r = branch(sub, value, path);
            if r.is_empty() {
                valid = true;
                break;
            }
            failures.push(r);
        }
        if !valid {
            out.push(Issue::unplaced(format!(
                "{name} must validate at least one schema (anyOf)"
            )));
            out.extend(fewest(failures));
        }
    }
    if !node.one_of.is_empty() {
        let results: Vec<Vec<Issue>> = node.one_of.iter().map(|s| branch(s, value, path)).collect();
        let valid = results.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let more = if valid == 0 {
                "Found none valid".to_string()
            } else {
                format!("Found {valid} valid alternatives")
            };
            out.push(Issue::unplaced(format!(
                "{name} must validate one and only one schema (oneOf). {more}"
            )));
            if valid == 0 {
                out.extend(fewest(results));
            }
        }
    }
    if !node.all_of.is_empty() {
        let mut valid = 0;
        for sub in &node.all_of {
            let r = branch(sub, value, path);
            if r.is_empty() {
                valid += 1;
            }
            out.extend(r);
        }
        if valid != node.all_of.len() {
            let more = if valid == 0 { ". None validated" } else { "" };
            out.push(Issue::unplaced(format!(
                "{name} must validate all the schemas (allOf){more}"
            )));
        }
    }
    if let Some(not) = &node.not {
        if branch(not, value, path).is_empty() {
            out.push(Issue::unplaced(format!(
                "{name} must not validate the schema (not)"
            )));
        }
    }
}

fn check_string(node: &Node, s: &str, path: &FieldPath, out: &mut Vec<Issue>) {
    let chars = i64::try_from(s.chars().count()).unwrap_or(i64::MAX);
    let value = Some(Value::String(s.to_string()));
    if let Some(max) = node.max_length.filter(|max| chars > *max) {
        let unit = if max == 1 { "byte" } else { "bytes" };
        out.push(Issue::new(
            FieldErrorKind::TooLong,
            path,
            value,
            format!("may not be more than {max} {unit}"),
        ));
    } else if let Some(min) = node.min_length.filter(|min| chars < *min) {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            value,
            in_body(path, &format!("should be at least {min} chars long")),
        ));
    } else if let Some(pattern) = node.pattern.as_ref().filter(|p| !p.regex.is_match(s)) {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            value,
            in_body(path, &format!("should match '{}'", pattern.source)),
        ));
    }
}

/// Whether a float64 is an integer as go-openapi's swag.IsFloat64AJSONInteger judges it.
fn is_json_integer(f: f64) -> bool {
    if !f.is_finite() || f.abs() > 9_007_199_254_740_991.0 {
        return false;
    }
    let diff = (f - f.trunc()).abs();
    diff == 0.0 || diff < 1e-9 * f.abs().max(1.0)
}

fn check_number(node: &Node, n: &Number, path: &FieldPath, out: &mut Vec<Issue>) {
    let value = Some(Value::Number(n.clone()));
    let int = n.as_i64();
    let data = n.as_f64().unwrap_or(0.0);
    let mut invalid = |detail: String| {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            value.clone(),
            in_body(path, &detail),
        ));
    };
    if let Some(factor) = node.multiple_of.filter(|f| *f > 0.0) {
        match int {
            Some(i) => {
                let f = factor as i64;
                if i.checked_rem(f).is_some_and(|r| r != 0) {
                    invalid(format!("should be a multiple of {f}"));
                }
            }
            None => {
                let mult = if factor < 1.0 {
                    1.0 / factor * data
                } else {
                    data / factor
                };
                if !is_json_integer(mult) {
                    invalid(format!("should be a multiple of {}", gofmt::float(factor)));
                }
            }
        }
    }
    // Integers are compared with the bound truncated to int64, as kube-openapi does.
    if let Some(min) = node.minimum {
        let excl = node.exclusive_minimum;
        let op = if excl {
            "greater than"
        } else {
            "greater than or equal to"
        };
        match int {
            Some(i) => {
                let m = min as i64;
                if (!excl && i < m) || (excl && i <= m) {
                    invalid(format!("should be {op} {m}"));
                }
            }
            None if (!excl && data < min) || (excl && data <= min) => {
                invalid(format!("should be {op} {}", gofmt::float(min)));
            }
            None => {}
        }
    }
    if let Some(max) = node.maximum {
        let excl = node.exclusive_maximum;
        let op = if excl {
            "less than"
        } else {
            "less than or equal to"
        };
        match int {
            Some(i) => {
                let m = max as i64;
                if (!excl && i > m) || (excl && i >= m) {
                    invalid(format!("should be {op} {m}"));
                }
            }
            None if (!excl && data > max) || (excl && data >= max) => {
                invalid(format!("should be {op} {}", gofmt::float(max)));
            }
            None => {}
        }
    }
}

fn check_list(
    node: &Node,
    items: &[Value],
    old: Option<&Value>,
    path: &FieldPath,
    out: &mut Vec<Issue>,
) {
    if let Some(item_node) = node.items.as_deref() {
        let old_items = old.and_then(Value::as_array);
        for (i, item) in items.iter().enumerate() {
            let old_item = match node.list_type {
                Some(ListType::Map) => listtype::correlate(&node.list_map_keys, item, old_items),
                _ => None,
            };
            check(item_node, item, old_item, &path.index(i), out);
        }
    }
    let size = i64::try_from(items.len()).unwrap_or(i64::MAX);
    if let Some(min) = node.min_items.filter(|min| size < *min) {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            Some(Value::from(size)),
            in_body(path, &format!("should have at least {min} items")),
        ));
    }
    if let Some(max) = node.max_items.filter(|max| size > *max) {
        out.push(too_many(path, size, max));
    }
    if node.unique_items && has_duplicates(items) {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            Some(Value::String(String::new())),
            in_body(path, "shouldn't contain duplicates"),
        ));
    }
}

fn has_duplicates(items: &[Value]) -> bool {
    let mut seen = std::collections::HashSet::new();
    !items.iter().all(|item| seen.insert(item.to_string()))
}

fn too_many(path: &FieldPath, actual: i64, max: i64) -> Issue {
    let unit = if max == 1 { "item" } else { "items" };
    Issue::new(
        FieldErrorKind::TooMany,
        path,
        Some(Value::from(actual)),
        format!("must have at most {max} {unit}"),
    )
}

/// kube-openapi's enum check: equal, or equal after Go's numeric conversion to the enum's type.
fn enum_matches(value: &Value, allowed: &Value) -> bool {
    match (value, allowed) {
        (Value::Number(v), Value::Number(a)) => match (v.as_i64(), a.as_i64()) {
            (Some(v), Some(a)) => v == a,
            // A float converts to an int64 enum by truncation, an int64 to a float64 exactly.
            (None, Some(a)) => v.as_f64().is_some_and(|f| f.trunc() == a as f64),
            (_, None) => v.as_f64() == a.as_f64(),
        },
        _ => value == allowed,
    }
}

fn check_enum(node: &Node, value: &Value, path: &FieldPath, out: &mut Vec<Issue>) {
    let Some(allowed) = &node.enum_values else {
        return;
    };
    if allowed.is_empty() || (!value.is_null() && allowed.iter().any(|a| enum_matches(value, a))) {
        return;
    }
    let listed: Vec<String> = allowed
        .iter()
        .map(|a| match a {
            Value::String(s) => gofmt::quote(s),
            other => gofmt::quote(&gofmt::json(other)),
        })
        .collect();
    out.push(Issue::new(
        FieldErrorKind::NotSupported,
        path,
        Some(value.clone()),
        format!("supported values: {}", listed.join(", ")),
    ));
}

fn check_object(
    node: &Node,
    map: &Map<String, Value>,
    old: Option<&Value>,
    path: &FieldPath,
    out: &mut Vec<Issue>,
) {
    let size = i64::try_from(map.len()).unwrap_or(i64::MAX);
    if let Some(min) = node.min_properties.filter(|min| size < *min) {
        out.push(Issue::new(
            FieldErrorKind::Invalid,
            path,
            Some(Value::from(size)),
            in_body(path, &format!("should have at least {min} properties")),
        ));
        return;
    }
    if let Some(max) = node.max_properties.filter(|max| size > *max) {
        out.push(too_many(path, size, max));
        return;
    }
    let old_map = old.and_then(Value::as_object);
    if let Some(additional) = node.additional.as_deref() {
        for (key, v) in map
            .iter()
            .filter(|(k, _)| !node.properties.contains_key(*k))
        {
            let old_v = old_map.and_then(|m| m.get(key));
            check(additional, v, old_v, &path.child(key), out);
        }
    }
    for (name, prop) in &node.properties {
        if let Some(v) = map.get(name) {
            let old_v = old_map.and_then(|m| m.get(name));
            check(prop, v, old_v, &path.child(name), out);
        }
    }
    for name in node.required.iter().filter(|n| !map.contains_key(*n)) {
        out.push(Issue::new(
            FieldErrorKind::Required,
            &path.child(name),
            None,
            String::new(),
        ));
    }
}
