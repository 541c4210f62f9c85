//! The fields built-in objects may carry, for `fieldValidation` (kube-apiserver decodes
//! built-ins into Go structs, so an unknown field is refused with `Strict`, warned about with
//! `Warn`, dropped with `Ignore`).
//!
//! Checked: top-level fields of every built-in, `metadata`, a Lease's `spec`, a Namespace's
//! `spec`/`status`, a CRD's `spec`. Deeper structures (event sources, CRD versions) are not
//! checked. Custom resources are checked by `schema::CompiledSchema::admit` instead.

use serde_json::Value;

use super::registry::Builtin;

const METADATA: &[&str] = &[
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
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

fn top_level(kind: Builtin) -> &'static [&'static str] {
    match kind {
        Builtin::Namespace => &["spec", "status"],
        Builtin::ConfigMap => &["data", "binaryData", "immutable"],
        Builtin::Secret => &["data", "stringData", "type", "immutable"],
        Builtin::ServiceAccount => &[
            "secrets",
            "imagePullSecrets",
            "automountServiceAccountToken",
        ],
        Builtin::CoreEvent => &[
            "involvedObject",
            "reason",
            "message",
            "source",
            "firstTimestamp",
            "lastTimestamp",
            "count",
            "type",
            "eventTime",
            "series",
            "action",
            "related",
            "reportingComponent",
            "reportingInstance",
        ],
        Builtin::Event => &[
            "eventTime",
            "series",
            "reportingController",
            "reportingInstance",
            "action",
            "reason",
            "regarding",
            "related",
            "note",
            "type",
            "deprecatedSource",
            "deprecatedFirstTimestamp",
            "deprecatedLastTimestamp",
            "deprecatedCount",
        ],
        Builtin::Lease => &["spec"],
        Builtin::Crd => &["spec", "status"],
    }
}

fn nested(kind: Builtin) -> &'static [(&'static str, &'static [&'static str])] {
    match kind {
        Builtin::Lease => &[(
            "spec",
            &[
                "holderIdentity",
                "leaseDurationSeconds",
                "acquireTime",
                "renewTime",
                "leaseTransitions",
                "strategy",
                "preferredHolder",
            ],
        )],
        Builtin::Namespace => &[
            ("spec", &["finalizers"]),
            ("status", &["phase", "conditions"]),
        ],
        Builtin::Crd => &[(
            "spec",
            &[
                "group",
                "names",
                "scope",
                "versions",
                "conversion",
                "preserveUnknownFields",
            ],
        )],
        _ => &[],
    }
}

fn prune(map: &mut serde_json::Map<String, Value>, known: &[&str], prefix: &str) -> Vec<String> {
    let unknown: Vec<String> = map
        .keys()
        .filter(|k| !known.contains(&k.as_str()))
        .cloned()
        .collect();
    for k in &unknown {
        map.remove(k);
    }
    unknown
        .into_iter()
        .map(|k| format!("unknown field \"{prefix}{k}\""))
        .collect()
}

/// Removes the fields a built-in of `kind` does not have from `object` (in the client's
/// version) and returns one `unknown field "<path>"` message per field, in path order.
pub fn prune_unknown(kind: Builtin, object: &mut Value) -> Vec<String> {
    let mut messages = Vec::new();
    let Some(map) = object.as_object_mut() else {
        return messages;
    };
    let mut known: Vec<&str> = vec!["apiVersion", "kind", "metadata"];
    known.extend_from_slice(top_level(kind));
    messages.extend(prune(map, &known, ""));
    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
        messages.extend(prune(meta, METADATA, "metadata."));
    }
    for (field, fields) in nested(kind) {
        if let Some(Value::Object(inner)) = map.get_mut(*field) {
            messages.extend(prune(inner, fields, &format!("{field}.")));
        }
    }
    messages.sort();
    messages
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_of_builtins_are_named_and_removed() {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "x", "colour": "red"}, "data": {}, "spec": {}});
        let messages = prune_unknown(Builtin::ConfigMap, &mut cm);
        assert_eq!(
            messages,
            [
                "unknown field \"metadata.colour\"",
                "unknown field \"spec\""
            ]
        );
        assert_eq!(
            cm,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}})
        );
    }

    #[test]
    fn lease_spec_fields_are_checked() {
        let mut lease = json!({"spec": {"holderIdentity": "a", "holder": "b"}});
        assert_eq!(
            prune_unknown(Builtin::Lease, &mut lease),
            ["unknown field \"spec.holder\""]
        );
    }
}
