//! The OpenAPI v3 documents: `/openapi/v3` (where each group-version's document is, with a
//! content hash) and `/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`.
//!
//! For custom resources each served version's `openAPIV3Schema` is published as kube-apiserver
//! builds it (`components.schemas["<reversed group>.<version>.<Kind>"]`): the CRD's schema with
//! the standard `apiVersion`, `kind` and `metadata` (a `$ref` to ObjectMeta) properties and an
//! `x-kubernetes-group-version-kind`, plus the `<Kind>List` schema and the meta types they
//! reference. That is what `kubectl explain` reads.
//!
//! Every resource also has its GET and PATCH operations with their GVK, the `fieldValidation`
//! parameter and the accepted patch types: kubectl needs them to use server-side field
//! validation instead of `/openapi/v2` (not served), and to choose merge patch for custom
//! resources in `kubectl apply` (strategic merge patch is offered for built-ins only).
//! Built-in kinds get no schema (`kubectl explain configmap` is not supported).

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};

use super::discovery::KUBE_VERSION;
use super::registry::{Flavor, Registry, ResourceType};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";
const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation \
    of an object. Servers should convert recognized schemas to the latest internal value, and \
    may reject unrecognized values. More info: \
    https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object \
    represents. Servers may infer this from the endpoint the client submits requests to. Cannot \
    be updated. In CamelCase. More info: \
    https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DOC: &str = "Standard object's metadata. More info: \
    https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DOC: &str = "Standard list metadata. More info: \
    https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

fn meta_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{META}.{name}")})
}

/// kube-openapi's definition name prefix of a group: its DNS labels reversed
/// (`agentrt.dev` → `dev.agentrt`).
fn reversed_group(group: &str) -> String {
    group.split('.').rev().collect::<Vec<_>>().join(".")
}

fn schema_name(rt: &ResourceType, version: &str, kind: &str) -> String {
    format!("{}.{version}.{kind}", reversed_group(&rt.group))
}

fn openapi_path(rt: &ResourceType, version: &str) -> String {
    let prefix = if rt.group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{}/{version}", rt.group)
    };
    if rt.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
    } else {
        format!("{prefix}/{}/{{name}}", rt.plural)
    }
}

/// The published schema of one custom resource version: the CRD's schema with the standard
/// top-level properties and the GVK extension.
fn resource_schema(rt: &ResourceType, version: &str, crd_schema: &Value) -> Value {
    let mut schema = match crd_schema {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let mut props = match schema.remove("properties") {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    props.insert(
        "apiVersion".into(),
        json!({"description": API_VERSION_DOC, "type": "string"}),
    );
    props.insert(
        "kind".into(),
        json!({"description": KIND_DOC, "type": "string"}),
    );
    props.insert(
        "metadata".into(),
        json!({"description": METADATA_DOC, "allOf": [meta_ref("ObjectMeta")]}),
    );
    schema.insert("properties".into(), Value::Object(props));
    schema.insert(
        "x-kubernetes-group-version-kind".into(),
        json!([{"group": rt.group, "kind": rt.kind, "version": version}]),
    );
    Value::Object(schema)
}

fn list_schema(rt: &ResourceType, version: &str) -> Value {
    json!({
        "description": format!("{} is a list of {}", rt.list_kind, rt.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"description": API_VERSION_DOC, "type": "string"},
            "items": {
                "description": format!(
                    "List of {}. More info: \
                     https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md",
                    rt.plural
                ),
                "type": "array",
                "items": {"$ref": format!("#/components/schemas/{}", schema_name(rt, version, &rt.kind))},
            },
            "kind": {"description": KIND_DOC, "type": "string"},
            "metadata": {"description": LIST_METADATA_DOC, "allOf": [meta_ref("ListMeta")]},
        },
        "x-kubernetes-group-version-kind": [
            {"group": rt.group, "kind": rt.list_kind, "version": version}
        ],
    })
}

fn string(description: &str) -> Value {
    json!({"description": description, "type": "string"})
}

fn string_map(description: &str) -> Value {
    json!({"description": description, "type": "object",
           "additionalProperties": {"type": "string", "default": ""}})
}

fn time(description: &str) -> Value {
    json!({"description": description, "allOf": [meta_ref("Time")]})
}

/// The meta types a custom resource's schema references, described briefly.
fn meta_schemas() -> Vec<(String, Value)> {
    let object_meta = json!({
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "type": "object",
        "properties": {
            "annotations": string_map("Unstructured key value data set by external tools."),
            "creationTimestamp": time("When this object was created (set by the server)."),
            "deletionGracePeriodSeconds": {"description": "Seconds allowed for graceful \
                termination before the object is removed.", "type": "integer", "format": "int64"},
            "deletionTimestamp": time("When this object will be deleted (set by the server \
                when a deletion is requested)."),
            "finalizers": {"description": "Must be empty before the object is deleted from the \
                registry.", "type": "array", "items": {"type": "string", "default": ""},
                "x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"},
            "generateName": string("A prefix the server uses to generate a unique name when \
                name is not given."),
            "generation": {"description": "A sequence number of a specific generation of the \
                desired state (set by the server).", "type": "integer", "format": "int64"},
            "labels": string_map("Key value pairs to organize and select objects."),
            "managedFields": {"description": "Which managers own which fields.",
                "type": "array", "items": {"default": {}, "allOf": [meta_ref("ManagedFieldsEntry")]}},
            "name": string("Name must be unique within a namespace."),
            "namespace": string("The namespace the name is unique in."),
            "ownerReferences": {"description": "Objects this object depends on; when all are \
                deleted, this object is garbage collected.", "type": "array",
                "items": {"default": {}, "allOf": [meta_ref("OwnerReference")]},
                "x-kubernetes-list-map-keys": ["uid"], "x-kubernetes-list-type": "map",
                "x-kubernetes-patch-merge-key": "uid", "x-kubernetes-patch-strategy": "merge"},
            "resourceVersion": string("An opaque value for the internal version of this \
                object, used for optimistic concurrency and watches."),
            "selfLink": string("Deprecated; not set by the server."),
            "uid": string("The unique identity of this object in time and space."),
        },
    });
    let list_meta = json!({
        "description": "ListMeta describes metadata that synthetic resources must have.",
        "type": "object",
        "properties": {
            "continue": string("Set when a limit cut the list: give it to get the next page."),
            "remainingItemCount": {"description": "The number of items after this page \
                (approximate, unset with selectors).", "type": "integer", "format": "int64"},
            "resourceVersion": string("The version the list was read at."),
            "selfLink": string("Deprecated; not set by the server."),
        },
    });
    let owner = json!({
        "description": "OwnerReference names an object this object depends on.",
        "type": "object",
        "required": ["apiVersion", "kind", "name", "uid"],
        "properties": {
            "apiVersion": string("API version of the referent."),
            "blockOwnerDeletion": {"description": "Whether the owner cannot be deleted before \
                this reference is removed (foreground deletion).", "type": "boolean"},
            "controller": {"description": "Whether the referent is the managing controller.",
                "type": "boolean"},
            "kind": string("Kind of the referent."),
            "name": string("Name of the referent."),
            "uid": string("UID of the referent."),
        },
        "x-kubernetes-map-type": "atomic",
    });
    let managed = json!({
        "description": "ManagedFieldsEntry names a workflow and the fields it manages.",
        "type": "object",
        "properties": {
            "apiVersion": string("The version of the fields' set."),
            "fieldsType": string("The format of fieldsV1 (FieldsV1)."),
            "fieldsV1": {"description": "The set of fields.", "allOf": [meta_ref("FieldsV1")]},
            "manager": string("The workflow managing these fields."),
            "operation": string("Apply or Update."),
            "subresource": string("The subresource written, if any."),
            "time": time("When the fields were last changed."),
        },
    });
    vec![
        (format!("{META}.ObjectMeta"), object_meta),
        (format!("{META}.ListMeta"), list_meta),
        (format!("{META}.OwnerReference"), owner),
        (format!("{META}.ManagedFieldsEntry"), managed),
        (
            format!("{META}.FieldsV1"),
            json!({"description": "FieldsV1 stores a set of fields.", "type": "object"}),
        ),
        (
            format!("{META}.Time"),
            json!({"description": "Time is an RFC 3339 date-time.", "type": "string",
                   "format": "date-time"}),
        ),
    ]
}

/// The OpenAPI v3 document of one group-version, or `None` when not served.
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for rt in &types {
        let gvk = json!({"group": rt.group, "version": version, "kind": rt.kind});
        let published = rt.version(version).and_then(|v| v.published.as_ref());
        let object_ref = match published {
            Some(crd_schema) => {
                let name = schema_name(rt, version, &rt.kind);
                schemas.insert(name.clone(), resource_schema(rt, version, crd_schema));
                schemas.insert(
                    schema_name(rt, version, &rt.list_kind),
                    list_schema(rt, version),
                );
                json!({"$ref": format!("#/components/schemas/{name}")})
            }
            None => json!({"type": "object"}),
        };
        let mut content = Map::new();
        content.insert(
            "application/json-patch+json".into(),
            json!({"schema": {"type": "object"}}),
        );
        content.insert(
            "application/merge-patch+json".into(),
            json!({"schema": {"type": "object"}}),
        );
        if rt.flavor != Flavor::Custom {
            content.insert(
                "application/strategic-merge-patch+json".into(),
                json!({"schema": {"type": "object"}}),
            );
        }
        let ok = json!({"200": {"description": "OK",
                                "content": {"application/json": {"schema": object_ref}}}});
        let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
        paths.insert(
            openapi_path(rt, version),
            json!({
                "get": {
                    "operationId": format!("read{}", rt.kind),
                    "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk,
                    "responses": ok,
                },
                "patch": {
                    "operationId": format!("patch{}", rt.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [query("dryRun"), query("fieldManager"),
                                   query("fieldValidation"), query("force")],
                    "requestBody": {"content": content},
                    "responses": ok,
                },
            }),
        );
    }
    if !schemas.is_empty() {
        schemas.extend(meta_schemas());
    }
    let title = if schemas.is_empty() {
        "Kubernetes"
    } else {
        "Kubernetes CRD Swagger"
    };
    let info_version = if schemas.is_empty() {
        KUBE_VERSION
    } else {
        "v0.1.0"
    };
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": title, "version": info_version},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v3`: where each group-version's document is, with a content hash (SHA-512,
/// upper-case hex, as kube-apiserver writes it) so clients cache it until it changes.
pub fn root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Some(doc) = group_version(registry, &group, &version) else {
                continue;
            };
            let hash = hex::encode_upper(Sha512::digest(doc.to_string().as_bytes()));
            let key = if group.is_empty() {
                format!("api/{version}")
            } else {
                format!("apis/{group}/{version}")
            };
            paths.insert(
                key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}),
            );
        }
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_reversed_as_kube_openapi_names_definitions() {
        assert_eq!(reversed_group("agentrt.dev"), "dev.agentrt");
        assert_eq!(reversed_group("a.b.example.com"), "com.example.b.a");
    }

    #[test]
    fn builtins_have_paths_but_no_schemas() {
        let r = Registry::builtins();
        let Some(doc) = group_version(&r, "", "v1") else {
            panic!("core served");
        };
        assert!(doc["components"]["schemas"]
            .as_object()
            .is_some_and(Map::is_empty));
        assert!(doc["paths"]
            .as_object()
            .is_some_and(|p| p.contains_key("/api/v1/namespaces/{namespace}/configmaps/{name}")));
        let root = root(&r);
        let url = root["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap_or("");
        assert!(url.starts_with("/openapi/v3/api/v1?hash="), "{url}");
        assert_eq!(url.len(), "/openapi/v3/api/v1?hash=".len() + 128);
    }
}
