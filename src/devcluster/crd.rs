//! CustomResourceDefinitions: validating one, filling the defaults and status kube-apiserver
//! fills (`NamesAccepted`, `Established`, `acceptedNames`, `storedVersions`), and turning a
//! stored one into the [`ResourceType`] its custom resources are served as.
//!
//! Simplifications (documented for users of `agentrt dev`): names never conflict (every CRD is
//! accepted and established at once), conversion is always `None` (objects are the same in
//! every version, only `apiVersion` changes), and the scale subresource is not served.

use std::sync::Arc;

use serde_json::{json, Value};

use super::registry::{Flavor, PrinterColumn, ResourceType, VersionSpec};
use super::schema::{CompiledSchema, FieldError, FieldErrorKind, SchemaError};

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn required(field: &str) -> FieldError {
    FieldError {
        kind: FieldErrorKind::Required,
        field: field.to_string(),
        bad_value: None,
        detail: String::new(),
    }
}

fn invalid(field: &str, value: Value, detail: &str) -> FieldError {
    FieldError {
        kind: FieldErrorKind::Invalid,
        field: field.to_string(),
        bad_value: Some(value),
        detail: detail.to_string(),
    }
}

/// Checks a CRD (after [`prepare`]) the way kube-apiserver's CRD validation does, for the
/// rules this server relies on: names present and consistent with `metadata.name`, a known
/// scope, at least one version, exactly one storage version, unique version names, and every
/// version's schema compiling.
///
/// Returns the field errors (empty = valid).
pub fn validate(crd: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let group = str_at(crd, &["spec", "group"]);
    let plural = str_at(crd, &["spec", "names", "plural"]);
    let kind = str_at(crd, &["spec", "names", "kind"]);
    let name = str_at(crd, &["metadata", "name"]);
    if group.is_empty() {
        errors.push(required("spec.group"));
    } else if !group.contains('.') {
        errors.push(invalid(
            "spec.group",
            json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        errors.push(required("spec.names.plural"));
    } else if plural != plural.to_lowercase() {
        errors.push(invalid(
            "spec.names.plural",
            json!(plural),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
             '-', and must start and end with an alphanumeric character",
        ));
    }
    if kind.is_empty() {
        errors.push(required("spec.names.kind"));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        errors.push(invalid(
            "metadata.name",
            json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    let scope = str_at(crd, &["spec", "scope"]);
    if scope != "Namespaced" && scope != "Cluster" {
        errors.push(FieldError {
            kind: FieldErrorKind::NotSupported,
            field: "spec.scope".to_string(),
            bad_value: Some(json!(scope)),
            detail: "supported values: \"Cluster\", \"Namespaced\"".to_string(),
        });
    }
    let versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if versions.is_empty() {
        errors.push(invalid(
            "spec.versions",
            json!([]),
            "must have exactly one version marked as storage version",
        ));
    }
    let storage_count = versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count();
    if !versions.is_empty() && storage_count != 1 {
        errors.push(invalid(
            "spec.versions",
            Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    // kube-apiserver keeps one schema for all versions when they are the same (and reports its
    // errors under `spec.validation`), else one per version.
    let schemas: Vec<Option<&Value>> = versions
        .iter()
        .map(|v| v["schema"].get("openAPIV3Schema"))
        .collect();
    let shared = schemas.len() > 1 || schemas.first().is_some_and(Option::is_some);
    let shared = shared && schemas.windows(2).all(|w| w[0] == w[1]);
    if let (true, Some(Some(schema))) = (shared, schemas.first()) {
        // A schema that is not structural is refused for that alone: kube-apiserver compiles
        // no rule of it.
        let before = errors.len();
        untyped_fields(schema, "spec.validation.openAPIV3Schema", &mut errors);
        if errors.len() == before {
            errors.extend(schema_errors(
                schema,
                "spec.validation",
                "spec.versions[0].schema",
            ));
        }
    }
    let mut seen = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let vname = v["name"].as_str().unwrap_or("");
        if vname.is_empty() {
            errors.push(required(&format!("spec.versions[{i}].name")));
        } else if seen.contains(&vname) {
            errors.push(FieldError {
                kind: FieldErrorKind::Duplicate,
                field: format!("spec.versions[{i}].name"),
                bad_value: Some(json!(vname)),
                detail: String::new(),
            });
        }
        seen.push(vname);
        if let (false, Some(schema)) = (shared, v["schema"].get("openAPIV3Schema")) {
            let at = format!("spec.versions[{i}].schema");
            let before = errors.len();
            untyped_fields(schema, &format!("{at}.openAPIV3Schema"), &mut errors);
            if errors.len() == before {
                errors.extend(schema_errors(schema, &at, &at));
            }
        }
    }
    selectable_field_errors(&versions, &mut errors);
    if !versions.iter().any(|v| v["served"].as_bool() == Some(true)) && !versions.is_empty() {
        errors.push(invalid(
            "spec.versions",
            Value::Array(versions),
            "must have at least one served version",
        ));
    }
    errors
}

/// At most this many selectable fields per version (kube-apiserver's `maxSelectableFields`).
const MAX_SELECTABLE_FIELDS: usize = 8;

/// The refusals of the versions' `selectableFields`, as kube-apiserver words them: a
/// `jsonPath` is required, must name a field of the version's schema by a simple path (no
/// array notation), not one in `metadata`, of type string, integer or boolean, at most once,
/// and at most 8 per version. Like the schema, identical selectable fields of every version are
/// reported under `spec.selectableFields` (kube-apiserver validates its internal form, which
/// hoists them), else under `spec.versions[i].selectableFields`.
fn selectable_field_errors(versions: &[Value], errors: &mut Vec<FieldError>) {
    let lists: Vec<&[Value]> = versions
        .iter()
        .map(|v| {
            v["selectableFields"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
        })
        .collect();
    let hoisted =
        lists.first().is_some_and(|l| !l.is_empty()) && lists.windows(2).all(|w| w[0] == w[1]);
    for (i, (version, list)) in versions.iter().zip(&lists).enumerate() {
        if hoisted && i > 0 {
            break;
        }
        let at = if hoisted {
            "spec.selectableFields".to_string()
        } else {
            format!("spec.versions[{i}].selectableFields")
        };
        let schema = &version["schema"]["openAPIV3Schema"];
        let mut unique: Vec<String> = Vec::new();
        for (j, field) in list.iter().enumerate() {
            let here = format!("{at}[{j}].jsonPath");
            let path = field["jsonPath"].as_str().unwrap_or("");
            if path.is_empty() {
                errors.push(required(&here));
                continue;
            }
            let found = match field_schema(schema, path) {
                Ok(found) => found,
                Err(why) => {
                    errors.push(invalid(
                        &here,
                        json!(path),
                        &format!("is an invalid path: {why}"),
                    ));
                    continue;
                }
            };
            if path.trim_start_matches('.').split('.').next() == Some("metadata") {
                errors.push(invalid(
                    &here,
                    json!(path),
                    "must not point to fields in metadata",
                ));
            }
            if !matches!(
                found["type"].as_str(),
                Some("string" | "integer" | "boolean")
            ) {
                errors.push(invalid(
                    &here,
                    json!(path),
                    "must point to a field of type string, boolean or integer. Enum string \
                     fields and strings with formats are allowed",
                ));
            }
            let key = path.trim_start_matches('.').to_string();
            if unique.contains(&key) {
                errors.push(FieldError {
                    kind: FieldErrorKind::Duplicate,
                    field: here,
                    bad_value: Some(json!(path)),
                    detail: String::new(),
                });
            } else {
                unique.push(key);
            }
        }
        if unique.len() > MAX_SELECTABLE_FIELDS {
            errors.push(FieldError {
                kind: FieldErrorKind::TooMany,
                field: at,
                bad_value: Some(json!(unique.len())),
                detail: format!("must have at most {MAX_SELECTABLE_FIELDS} items"),
            });
        }
    }
}

/// The schema node a simple JSON path (`.status.phase`) names in `schema`, or why not.
fn field_schema<'a>(schema: &'a Value, path: &str) -> Result<&'a Value, String> {
    let Some(rest) = path.strip_prefix('.') else {
        return Err(format!("expected [ or . at 0 in {path:?}"));
    };
    if rest.contains('[') {
        return Err("array notation is not allowed".into());
    }
    let mut node = schema;
    for part in rest.split('.') {
        match node["properties"].get(part) {
            Some(child) if !part.is_empty() => node = child,
            _ => return Err("does not refer to a valid field".into()),
        }
    }
    Ok(node)
}

/// The refusals of one `openAPIV3Schema`: its CEL rules' under `rules_at` (kube-apiserver's field
/// paths, e.g. `spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule`),
/// another problem as one error at `structural_at.openAPIV3Schema`.
fn schema_errors(schema: &Value, rules_at: &str, structural_at: &str) -> Vec<FieldError> {
    match CompiledSchema::check(schema) {
        Ok(_) => Vec::new(),
        Err(SchemaError::Rules(errors)) => errors
            .into_iter()
            .map(|mut e| {
                e.field = format!("{rules_at}.{}", e.field);
                e
            })
            .collect(),
        Err(SchemaError::Structural(msg)) => vec![invalid(
            &format!("{structural_at}.openAPIV3Schema"),
            Value::String(String::new()),
            &msg,
        )],
    }
}

/// The structural-schema rule that every specified property and array item has a `type`
/// (unless it is `x-kubernetes-int-or-string` or `x-kubernetes-preserve-unknown-fields`).
fn untyped_fields(node: &Value, at: &str, errors: &mut Vec<FieldError>) {
    let typed = |n: &Value| {
        n["type"].as_str().is_some_and(|t| !t.is_empty())
            || n["x-kubernetes-int-or-string"] == true
            || n["x-kubernetes-preserve-unknown-fields"] == true
    };
    let mut check = |child: &Value, path: String, what: &str| {
        if !typed(child) {
            errors.push(FieldError {
                kind: FieldErrorKind::Required,
                field: format!("{path}.type"),
                bad_value: None,
                detail: format!("must not be empty for specified {what}"),
            });
        }
        untyped_fields(child, &path, errors);
    };
    if let Some(props) = node["properties"].as_object() {
        for (name, child) in props {
            check(child, format!("{at}.properties[{name}]"), "object fields");
        }
    }
    if node["items"].is_object() {
        check(&node["items"], format!("{at}.items"), "array items");
    }
}

/// Fills what kube-apiserver defaults and sets on a CRD being written: `names.singular`,
/// `names.listKind`, `conversion.strategy: None`, per-version `served`/`storage` booleans; and
/// the status (`acceptedNames`, `NamesAccepted`/`Established` conditions, `storedVersions`,
/// keeping condition times and stored versions from `old`). `now` is an RFC 3339 timestamp.
pub fn prepare(crd: &mut Value, old: Option<&Value>, now: &str) {
    let kind = str_at(crd, &["spec", "names", "kind"]).to_string();
    if let Some(names) = crd["spec"]["names"].as_object_mut() {
        if names
            .get("singular")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            names.insert("singular".into(), json!(kind.to_lowercase()));
        }
        if names
            .get("listKind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
        {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = crd["spec"].as_object_mut() {
        if !spec.contains_key("conversion") {
            spec.insert("conversion".into(), json!({"strategy": "None"}));
        }
    }
    if let Some(versions) = crd["spec"]["versions"].as_array_mut() {
        for v in versions.iter_mut().filter_map(Value::as_object_mut) {
            v.entry("served").or_insert(json!(false));
            v.entry("storage").or_insert(json!(false));
        }
    }
    let storage_version = crd["spec"]["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["storage"].as_bool() == Some(true)))
        .and_then(|v| v["name"].as_str())
        .unwrap_or("")
        .to_string();
    let mut stored: Vec<String> = old
        .map(|o| strings(&o["status"]["storedVersions"]))
        .unwrap_or_default();
    if !storage_version.is_empty() && !stored.contains(&storage_version) {
        stored.push(storage_version);
    }
    let since = |ty: &str| -> String {
        old.and_then(|o| o["status"]["conditions"].as_array())
            .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
            .and_then(|c| c["lastTransitionTime"].as_str())
            .unwrap_or(now)
            .to_string()
    };
    let status = json!({
        "acceptedNames": crd["spec"]["names"].clone(),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
             "message": "no conflicts found", "lastTransitionTime": since("NamesAccepted")},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted",
             "lastTransitionTime": since("Established")},
        ],
        "storedVersions": stored,
    });
    if let Some(map) = crd.as_object_mut() {
        map.insert("status".into(), status);
    }
}

fn columns(version: &Value) -> Vec<PrinterColumn> {
    version["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or("").to_string(),
                    type_: c["type"].as_str().unwrap_or("string").to_string(),
                    format: c["format"].as_str().unwrap_or("").to_string(),
                    description: c["description"].as_str().unwrap_or("").to_string(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                    json_path: c["jsonPath"].as_str().unwrap_or("").to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The resource type a stored CRD declares: its served versions with their status
/// subresource, printer columns and compiled schema.
///
/// # Errors
/// A message when the CRD lacks names, a storage version, or a schema does not compile.
pub fn resource_type(crd: &Value) -> Result<ResourceType, String> {
    let group = str_at(crd, &["spec", "group"]).to_string();
    let names = &crd["spec"]["names"];
    let plural = str_at(names, &["plural"]).to_string();
    let kind = str_at(names, &["kind"]).to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Err("spec.group, spec.names.plural and spec.names.kind are required".into());
    }
    let mut versions = Vec::new();
    let mut storage_version = None;
    for v in crd["spec"]["versions"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().unwrap_or("").to_string();
        if v["storage"].as_bool() == Some(true) {
            storage_version = Some(name.clone());
        }
        if v["served"].as_bool() != Some(true) {
            continue;
        }
        let schema = match v["schema"].get("openAPIV3Schema") {
            Some(s) => Some(Arc::new(CompiledSchema::compile(s)?)),
            None => None,
        };
        let deprecation_warning = if v["deprecated"].as_bool() == Some(true) {
            Some(v["deprecationWarning"].as_str().map_or_else(
                || format!("{group}/{name} {kind} is deprecated"),
                str::to_string,
            ))
        } else {
            None
        };
        versions.push(VersionSpec {
            published: v["schema"].get("openAPIV3Schema").cloned().map(Arc::new),
            status_subresource: v["subresources"].get("status").is_some(),
            columns: columns(v),
            schema,
            deprecation_warning,
            shape: Arc::new(super::managed::from_crd_schema(
                v["schema"].get("openAPIV3Schema"),
            )),
            selectable_fields: v["selectableFields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["jsonPath"].as_str())
                .map(|p| p.trim_start_matches('.').to_string())
                .collect(),
            name,
        });
    }
    let storage_version = storage_version.ok_or("no storage version")?;
    let singular = match str_at(names, &["singular"]) {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let list_kind = match str_at(names, &["listKind"]) {
        "" => format!("{kind}List"),
        s => s.to_string(),
    };
    Ok(ResourceType {
        storage: Arc::from(format!("{plural}.{group}").as_str()),
        namespaced: str_at(crd, &["spec", "scope"]) != "Cluster",
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        group,
        plural,
        singular,
        kind,
        list_kind,
        versions,
        storage_version,
        flavor: Flavor::Custom,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget_crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.dev"},
            "spec": {
                "group": "example.dev",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}},
                     "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}]},
                    {"name": "v1beta1", "served": true, "storage": false}
                ]
            }
        })
    }

    #[test]
    fn prepared_crd_is_established_with_its_names() {
        let mut crd = widget_crd();
        prepare(&mut crd, None, "2025-01-01T00:00:00Z");
        assert!(validate(&crd).is_empty());
        assert_eq!(crd["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(crd["status"]["acceptedNames"]["singular"], "widget");
        assert_eq!(crd["status"]["conditions"][1]["type"], "Established");
        assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));
        let rt = resource_type(&crd).expect("type");
        assert_eq!(rt.versions.len(), 2);
        assert!(rt.has_status("v1"));
        assert!(!rt.has_status("v1beta1"));
        assert_eq!(rt.versions[0].columns[0].json_path, ".status.phase");
    }

    #[test]
    fn crd_name_must_be_plural_dot_group() {
        let mut crd = widget_crd();
        crd["metadata"]["name"] = json!("gadgets.example.dev");
        prepare(&mut crd, None, "2025-01-01T00:00:00Z");
        let errors = validate(&crd);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "metadata.name");
    }

    #[test]
    fn two_storage_versions_are_refused() {
        let mut crd = widget_crd();
        crd["spec"]["versions"][1]["storage"] = json!(true);
        assert!(validate(&crd).iter().any(|e| e.field == "spec.versions"));
    }

    #[test]
    fn selectable_fields_are_served_and_checked_against_the_schema() {
        let mut crd = widget_crd();
        crd["spec"]["versions"][0]["schema"] = json!({"openAPIV3Schema": {"type": "object",
            "properties": {"status": {"type": "object",
                "properties": {"phase": {"type": "string"}, "steps": {"type": "object"}}}}}});
        crd["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".status.phase"}]);
        prepare(&mut crd, None, "2025-01-01T00:00:00Z");
        assert!(validate(&crd).is_empty());
        let rt = resource_type(&crd).expect("type");
        assert_eq!(rt.versions[0].selectable_fields, ["status.phase"]);
        assert!(rt.versions[1].selectable_fields.is_empty(), "per version");
        crd["spec"]["versions"][0]["selectableFields"] =
            json!([{"jsonPath": ".status.steps"}, {"jsonPath": ".status.nope"}]);
        let fields: Vec<String> = validate(&crd).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "spec.versions[0].selectableFields[0].jsonPath",
                "spec.versions[0].selectableFields[1].jsonPath"
            ]
        );
    }
}
