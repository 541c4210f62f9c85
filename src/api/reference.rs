//! The field reference `docs/reference.md` (docs/design.md section 2), generated from the CRDs'
//! OpenAPI schemas by `agentrt crds --markdown`; a test fails when the file is stale.
//!
//! Owns: turning a CustomResourceDefinition into Markdown (names, printer columns, one row per
//! field with its type, constraints and documentation). Must not: describe anything the schema
//! does not say; the words come from the types' doc comments in `src/api`.

use std::fmt::Write as _;

use serde_json::Value;

/// Deepest field path the reference descends to; deeper schemas are listed as their type only.
const MAX_DEPTH: usize = 12;

/// `docs/reference.md`: a heading per CRD (AgentRun, AgentRunSegment, Approval, in `crds/`
/// order), its names and printer columns, then a table of every field under `spec` and
/// `status` with type, constraints (required, default, enum, bounds, CEL rules' messages) and
/// description.
///
/// # Errors
/// When a CRD cannot be serialized (never expected; reported rather than unwrapped).
pub fn reference_markdown() -> Result<String, serde_json::Error> {
    let mut out = String::from(
        "# Field reference\n\n\
         Generated from the CustomResourceDefinitions by `agentrt crds --markdown` \
         (`scripts/gen-crds` writes this file; a test fails when it is stale). The rules behind \
         the fields are in [design.md](design.md).\n",
    );
    for crd in super::crd_values()? {
        crd_section(&mut out, &crd);
    }
    Ok(out)
}

fn crd_section(out: &mut String, crd: &Value) {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = names["kind"].as_str().unwrap_or_default();
    let _ = write!(
        out,
        "\n## {kind}\n\n`{group}` · scope `{scope}` · plural `{plural}`",
        group = spec["group"].as_str().unwrap_or_default(),
        scope = spec["scope"].as_str().unwrap_or_default(),
        plural = names["plural"].as_str().unwrap_or_default(),
    );
    let short: Vec<&str> = list(&names["shortNames"]);
    if !short.is_empty() {
        let _ = write!(out, " · short names `{}`", short.join("`, `"));
    }
    let categories: Vec<&str> = list(&names["categories"]);
    if !categories.is_empty() {
        let _ = write!(out, " · categories `{}`", categories.join("`, `"));
    }
    out.push('\n');
    let Some(versions) = spec["versions"].as_array() else {
        return;
    };
    for version in versions {
        let name = version["name"].as_str().unwrap_or_default();
        let _ = writeln!(out, "\n### {kind} {name}\n");
        if let Some(columns) = version["additionalPrinterColumns"].as_array() {
            out.push_str("`kubectl get` columns:\n\n| Column | Type | From |\n|---|---|---|\n");
            for column in columns {
                let _ = writeln!(
                    out,
                    "| {} | {} | `{}` |",
                    cell(column["name"].as_str().unwrap_or_default()),
                    cell(column["type"].as_str().unwrap_or_default()),
                    column["jsonPath"].as_str().unwrap_or_default()
                );
            }
            out.push('\n');
        }
        if let Some(fields) = version["selectableFields"].as_array() {
            let paths: Vec<&str> = fields
                .iter()
                .filter_map(|f| f["jsonPath"].as_str())
                .collect();
            let _ = writeln!(
                out,
                "Selectable fields (`kubectl get --field-selector`): `{}`\n",
                paths.join("`, `")
            );
        }
        let root = &version["schema"]["openAPIV3Schema"];
        out.push_str("| Field | Type | Description |\n|---|---|---|\n");
        for top in ["spec", "status"] {
            if let Some(schema) = root["properties"].get(top) {
                let required = required_of(root).contains(&top);
                rows(out, top, schema, required, 0);
            }
        }
    }
}

fn list(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn required_of(schema: &Value) -> Vec<&str> {
    list(&schema["required"])
}

/// One row for `schema` at `path`, then rows for what it contains.
fn rows(out: &mut String, path: &str, schema: &Value, required: bool, depth: usize) {
    let _ = writeln!(
        out,
        "| `{}` | {} | {} |",
        path.replace('|', "\\|"),
        cell(&type_of(schema)),
        cell(&description_of(schema, required))
    );
    if depth >= MAX_DEPTH {
        return;
    }
    if let Some(properties) = schema["properties"].as_object() {
        let required = required_of(schema);
        for (name, child) in properties {
            rows(
                out,
                &format!("{path}.{name}"),
                child,
                required.contains(&name.as_str()),
                depth + 1,
            );
        }
    }
    if let Some(items) = schema.get("items") {
        if items.get("properties").is_some() || items.get("items").is_some() {
            rows(out, &format!("{path}[]"), items, false, depth + 1);
        }
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        if values.get("properties").is_some() {
            rows(out, &format!("{path}.<key>"), values, false, depth + 1);
        }
    }
}

/// The field's type as a reader writes it: `string`, `integer (int64)`, `[]object`,
/// `map[string]string`, `any JSON`.
fn type_of(schema: &Value) -> String {
    match schema["type"].as_str() {
        Some("array") => format!("[]{}", type_of(&schema["items"])),
        Some("object") => match schema.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) => format!("map[string]{}", type_of(values)),
            None if schema.get("properties").is_none()
                && schema["x-kubernetes-preserve-unknown-fields"] == true =>
            {
                "object (any JSON)".to_string()
            }
            None => "object".to_string(),
        },
        Some(other) => match schema["format"].as_str() {
            Some(format) => format!("{other} ({format})"),
            None => other.to_string(),
        },
        None if schema["x-kubernetes-preserve-unknown-fields"] == true => "any JSON".to_string(),
        None if schema["x-kubernetes-int-or-string"] == true => "int or string".to_string(),
        None => "any".to_string(),
    }
}

/// The description, then the constraints the schema states.
fn description_of(schema: &Value, required: bool) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(text) = schema["description"].as_str() {
        if !text.starts_with("Auto-generated derived type") {
            parts.push(text.to_string());
        }
    }
    let mut facts: Vec<String> = Vec::new();
    if required {
        facts.push("required".to_string());
    }
    if schema["nullable"] == true {
        facts.push("may be null".to_string());
    }
    if let Some(default) = schema.get("default") {
        facts.push(format!("default `{default}`"));
    }
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
        facts.push(format!("one of {}", values.join(", ")));
    }
    for (key, word) in [
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("maxProperties", "max properties"),
        ("pattern", "pattern"),
    ] {
        if let Some(value) = schema.get(key) {
            let value = match (value.as_str(), value.as_f64()) {
                (Some(text), _) => format!("`{text}`"),
                // schemars writes integer bounds as floats (`1.0`); a reader writes `1`.
                (None, Some(number)) if number.fract() == 0.0 && number.abs() < 9.0e15 => {
                    format!("{}", number as i64)
                }
                _ => value.to_string(),
            };
            facts.push(format!("{word} {value}"));
        }
    }
    if let Some(rules) = schema["x-kubernetes-validations"].as_array() {
        for rule in rules {
            match rule["message"].as_str() {
                Some(message) => facts.push(format!("rule: {message}")),
                None => facts.push(format!(
                    "rule: `{}`",
                    rule["rule"].as_str().unwrap_or_default()
                )),
            }
        }
    }
    if !facts.is_empty() {
        parts.push(format!("({})", facts.join("; ")));
    }
    parts.join(" ")
}

/// `text` fit for one Markdown table cell: one line, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_of_every_crd_has_a_row() {
        let md = reference_markdown().expect("reference");
        for heading in ["## AgentRun\n", "## AgentRunSegment\n", "## Approval\n"] {
            assert!(md.contains(heading), "{heading} missing");
        }
        for path in [
            "| `spec.goal` |",
            "| `spec.tools[].name` |",
            "| `spec.limits.maxSteps` |",
            "| `status.phase` |",
            "| `spec.decision.verdict` |",
        ] {
            assert!(md.contains(path), "{path} missing");
        }
        for line in md.lines().filter(|l| l.starts_with("| `")) {
            assert_eq!(
                line.matches(" | ").count(),
                2,
                "a row has exactly three cells: {line}"
            );
        }
    }

    #[test]
    fn types_and_constraints_read_as_a_person_writes_them() {
        let schema = serde_json::json!({
            "type": "array",
            "items": {"type": "string"},
            "maxItems": 3,
            "description": "Names\nof things | with pipes.",
            "x-kubernetes-validations": [{"rule": "self.size() > 0", "message": "must not be empty"}]
        });
        assert_eq!(type_of(&schema), "[]string");
        assert_eq!(
            cell(&description_of(&schema, true)),
            "Names of things \\| with pipes. (required; max items 3; rule: must not be empty)"
        );
        let map = serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert_eq!(type_of(&map), "map[string]string");
        let any = serde_json::json!({"x-kubernetes-preserve-unknown-fields": true});
        assert_eq!(type_of(&any), "any JSON");
    }
}
