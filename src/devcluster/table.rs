//! Server-side printing: the `meta.k8s.io/v1` `Table` kubectl asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! Custom resources get `Name` plus their CRD's `additionalPrinterColumns` (evaluated with the
//! simple JSONPath subset CRDs use: `.a.b`, `[n]`, `['k']`, `[?(@.f=="v")]`), or `Name` and
//! `Age` when the CRD declares none. `priority` is sent and kubectl hides priority > 0 unless
//! `-o wide`. `date` cells are rendered as ages (`5m3s`) as kube-apiserver does. Built-ins get
//! the columns kube-apiserver's printers give them (configmaps `Data`, leases `Holder`, ...).
//! Rows carry `PartialObjectMetadata` (or the whole object with `includeObject=Object`).

use serde_json::{json, Value};

use super::registry::{Builtin, PrinterColumn, ResourceType};

/// What each row's `object` holds (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query value (unknown values mean the default).
    pub fn parse(s: &str) -> IncludeObject {
        match s {
            "None" => IncludeObject::None,
            "Object" => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

fn col(name: &str, type_: &str, path: &str, description: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.to_string(),
        type_: type_.to_string(),
        format: if name == "Name" { "name" } else { "" }.to_string(),
        description: description.to_string(),
        priority: 0,
        json_path: path.to_string(),
    }
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating \
    resources, although some resources may allow a client to request the generation of an \
    appropriate name automatically. Name is primarily intended for creation idempotence and \
    configuration definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when \
    this object was created.";

/// The columns of a type's table, `Name` first.
pub fn columns(rt: &ResourceType, version: &str) -> Vec<PrinterColumn> {
    let name = col("Name", "string", ".metadata.name", NAME_DESC);
    let age = col("Age", "date", ".metadata.creationTimestamp", AGE_DESC);
    let mut cols = vec![name];
    match rt.builtin() {
        None => {
            let declared = rt
                .version(version)
                .map(|v| v.columns.clone())
                .unwrap_or_default();
            if declared.is_empty() {
                cols.push(age);
            } else {
                cols.extend(declared);
            }
        }
        Some(Builtin::Namespace) => {
            cols.push(col("Status", "string", ".status.phase", "The phase."));
            cols.push(age);
        }
        Some(Builtin::ConfigMap) => {
            cols.push(col("Data", "integer", "#data", "Number of keys."));
            cols.push(age);
        }
        Some(Builtin::Secret) => {
            cols.push(col("Type", "string", ".type", "The type of the secret."));
            cols.push(col("Data", "integer", "#data", "Number of keys."));
            cols.push(age);
        }
        Some(Builtin::ServiceAccount) => {
            cols.push(col("Secrets", "integer", "#secrets", "Number of secrets."));
            cols.push(age);
        }
        Some(Builtin::Lease) => {
            cols.push(col(
                "Holder",
                "string",
                ".spec.holderIdentity",
                "The holder.",
            ));
            cols.push(age);
        }
        Some(Builtin::CoreEvent | Builtin::Event) => {
            cols = vec![
                col(
                    "Last Seen",
                    "date",
                    "#lastSeen",
                    "Time of the last occurrence.",
                ),
                col("Type", "string", ".type", "Normal or Warning."),
                col("Reason", "string", ".reason", "Why."),
                col(
                    "Object",
                    "string",
                    "#object",
                    "The object the event is about.",
                ),
                col("Message", "string", "#message", "What happened."),
            ];
        }
        Some(Builtin::Crd) => {
            cols.push(col(
                "Created At",
                "date",
                "#createdAt",
                "When the definition was created.",
            ));
        }
    }
    cols
}

/// Renders a table of `objects` (already in the client's version).
pub fn table(
    rt: &ResourceType,
    version: &str,
    objects: &[Value],
    resource_version: Option<String>,
    include: IncludeObject,
) -> Value {
    let cols = columns(rt, version);
    let definitions: Vec<Value> = cols
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.type_, "format": c.format,
                   "description": c.description, "priority": c.priority})
        })
        .collect();
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| row(&cols, o, include, now))
        .collect();
    let mut metadata = serde_json::Map::new();
    if let Some(rv) = resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

fn row(cols: &[PrinterColumn], obj: &Value, include: IncludeObject, now: jiff::Timestamp) -> Value {
    let cells: Vec<Value> = cols.iter().map(|c| cell(c, obj, now)).collect();
    let mut row = json!({"cells": cells});
    let object = match include {
        IncludeObject::None => None,
        IncludeObject::Object => Some(obj.clone()),
        IncludeObject::Metadata => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"].clone(),
        })),
    };
    if let (Some(o), Some(map)) = (object, row.as_object_mut()) {
        map.insert("object".into(), o);
    }
    row
}

fn count(v: &Value) -> usize {
    match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    }
}

fn cell(c: &PrinterColumn, obj: &Value, now: jiff::Timestamp) -> Value {
    let raw = match c.json_path.as_str() {
        "#data" => json!(count(&obj["data"]) + count(&obj["binaryData"])),
        "#secrets" => json!(count(&obj["secrets"])),
        "#object" => {
            let o = if obj["involvedObject"].is_object() {
                &obj["involvedObject"]
            } else {
                &obj["regarding"]
            };
            json!(format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("").to_lowercase(),
                o["name"].as_str().unwrap_or("")
            ))
        }
        "#message" => obj
            .get("message")
            .or_else(|| obj.get("note"))
            .cloned()
            .unwrap_or(Value::Null),
        "#lastSeen" => [
            &obj["series"]["lastObservedTime"],
            &obj["lastTimestamp"],
            &obj["deprecatedLastTimestamp"],
            &obj["eventTime"],
            &obj["metadata"]["creationTimestamp"],
        ]
        .into_iter()
        .find(|v| v.is_string())
        .cloned()
        .unwrap_or(Value::Null),
        "#createdAt" => return obj["metadata"]["creationTimestamp"].clone(),
        path => eval_path(obj, path).unwrap_or(Value::Null),
    };
    if raw.is_null() {
        return Value::Null;
    }
    match c.type_.as_str() {
        "integer" => match raw.as_i64().or_else(|| raw.as_f64().map(|f| f as i64)) {
            Some(i) => json!(i),
            None => Value::Null,
        },
        "number" => raw.as_f64().map_or(Value::Null, |f| json!(f)),
        "boolean" => raw.as_bool().map_or(Value::Null, |b| json!(b)),
        "date" => match raw.as_str().map(str::parse::<jiff::Timestamp>) {
            Some(Ok(ts)) => json!(human_duration(now.duration_since(ts).as_secs())),
            Some(Err(_)) => json!("<invalid>"),
            None => Value::Null,
        },
        _ => match raw {
            Value::String(s) => json!(s),
            other => json!(other.to_string()),
        },
    }
}

/// Evaluates the simple JSONPath CRD printer columns use; `None` when nothing is there.
pub fn eval_path(obj: &Value, path: &str) -> Option<Value> {
    let path = path.trim();
    let path = path
        .strip_prefix('{')
        .and_then(|p| p.strip_suffix('}'))
        .unwrap_or(path);
    let mut cur = obj.clone();
    let mut rest = path.strip_prefix('$').unwrap_or(path);
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let field = &r[..end];
            if !field.is_empty() {
                cur = cur.get(field)?.clone();
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = find_bracket_end(r)?;
            let inner = r[..end].trim();
            rest = &r[end + 1..];
            cur = if let Some(filter) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
                let items = cur.as_array()?;
                let (lhs, rhs) = filter.split_once("==")?;
                let field = lhs.trim().strip_prefix("@")?;
                let want = rhs.trim().trim_matches(|c| c == '"' || c == '\'');
                items
                    .iter()
                    .find(|i| {
                        eval_path(i, field).is_some_and(|v| match v {
                            Value::String(s) => s == want,
                            other => {
                                let text = other.to_string();
                                text == want
                            }
                        })
                    })?
                    .clone()
            } else if let Ok(idx) = inner.parse::<i64>() {
                let items = cur.as_array()?;
                let i = if idx < 0 {
                    items.len() as i64 + idx
                } else {
                    idx
                };
                items.get(usize::try_from(i).ok()?)?.clone()
            } else {
                let key = inner.trim_matches(|c| c == '"' || c == '\'');
                cur.get(key)?.clone()
            };
        } else {
            return None;
        }
    }
    Some(cur)
}

fn find_bracket_end(s: &str) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

/// A duration in seconds as kubectl and kube-apiserver print ages (`45s`, `3m20s`, `5h`,
/// `2d3h`, `1y20d`); `<invalid>` for more than a second in the future.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_print_like_kubectl() {
        assert_eq!(human_duration(45), "45s");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(3600 * 5), "5h");
        assert_eq!(human_duration(3600 * 51), "2d3h");
        assert_eq!(human_duration(-5), "<invalid>");
    }

    #[test]
    fn printer_column_paths_reach_nested_fields_and_filters() {
        let o = json!({"spec": {"request": {"tool": {"name": "t"}}, "items": [1, 2]},
                       "status": {"conditions": [{"type": "A", "status": "False"},
                                                 {"type": "Ready", "status": "True"}]}});
        assert_eq!(eval_path(&o, ".spec.request.tool.name"), Some(json!("t")));
        assert_eq!(eval_path(&o, ".spec.items[1]"), Some(json!(2)));
        assert_eq!(
            eval_path(&o, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(json!("True"))
        );
        assert_eq!(eval_path(&o, ".status.phase"), None);
    }
}
