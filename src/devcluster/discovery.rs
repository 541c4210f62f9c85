//! Discovery documents, as kube-apiserver 1.32 serves them: `/version`, `/api`, `/apis`,
//! `/apis/{group}`, and the resource lists of `/api/v1` and `/apis/{group}/{version}` (names,
//! short names, categories, verbs, scope, subresources) that kubectl's RESTMapper and
//! `kubectl api-resources` read. Groups and versions declared by CRDs appear as soon as the CRD
//! is created.
//!
//! Only the legacy (unaggregated) format is served: when kubectl asks for the aggregated
//! `apidiscovery.k8s.io/v2` format, the `application/json` answer tells client-go to fall back,
//! exactly as an older server would.
//!
//! Also a minimal OpenAPI v3 (`/openapi/v3` and one document per group-version) listing each
//! resource's PATCH operation with its `x-kubernetes-group-version-kind`, the
//! `fieldValidation` parameter and the accepted patch types. kubectl 1.32 needs it to use
//! server-side field validation instead of downloading `/openapi/v2` for client-side validation
//! (which this server does not serve), and to choose merge patch for custom resources in
//! `kubectl apply`. The documents carry no schemas (`kubectl explain` is not supported).

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::registry::{api_version, Flavor, Registry, ResourceType, VERBS};

/// The Kubernetes version this server answers as.
pub const KUBE_VERSION: &str = "v1.32.0";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": KUBE_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2024-12-11T00:00:00Z",
        "goVersion": "go1.23.3",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`: the core group's versions.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": api_version(name, v), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": gvs,
        "preferredVersion": gvs.first().cloned().unwrap_or(Value::Null),
    })
}

/// `/apis`: every non-core group with its versions, preferred first.
pub fn groups(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_doc(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`, or `None` when the group is not served.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = registry
        .groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())?;
    let mut doc = group_doc(&g, &vs);
    if let Some(map) = doc.as_object_mut() {
        map.insert("kind".into(), json!("APIGroup"));
        map.insert("apiVersion".into(), json!("v1"));
    }
    Some(doc)
}

fn resource_entry(rt: &ResourceType) -> Value {
    let mut entry = json!({
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    });
    if let Some(map) = entry.as_object_mut() {
        if !rt.short_names.is_empty() {
            map.insert("shortNames".into(), json!(rt.short_names));
        }
        if !rt.categories.is_empty() {
            map.insert("categories".into(), json!(rt.categories));
        }
    }
    entry
}

/// `/api/v1` or `/apis/{group}/{version}`, or `None` when not served.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for rt in &types {
        resources.push(resource_entry(rt));
        if rt.has_status(version) {
            resources.push(json!({
                "name": format!("{}/status", rt.plural),
                "singularName": "",
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": api_version(group, version),
        "resources": resources,
    }))
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

/// The OpenAPI v3 document of one group-version, or `None` when not served.
pub fn openapi_group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for rt in &types {
        let gvk = json!({"group": rt.group, "version": version, "kind": rt.kind});
        let mut content = serde_json::Map::new();
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
        let query = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
        paths.insert(
            openapi_path(rt, version),
            json!({
                "get": {
                    "operationId": format!("read{}", rt.kind),
                    "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": gvk,
                    "responses": {"200": {"description": "OK"}},
                },
                "patch": {
                    "operationId": format!("patch{}", rt.kind),
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": gvk,
                    "parameters": [query("dryRun"), query("fieldManager"),
                                   query("fieldValidation"), query("force")],
                    "requestBody": {"content": content},
                    "responses": {"200": {"description": "OK"}},
                },
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": KUBE_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

/// `/openapi/v3`: where each group-version's document is, with a content hash so clients
/// cache it until it changes.
pub fn openapi_root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Some(doc) = openapi_group_version(registry, &group, &version) else {
                continue;
            };
            let hash = hex::encode(Sha256::digest(doc.to_string().as_bytes()));
            let (key, url) = if group.is_empty() {
                (
                    format!("api/{version}"),
                    format!("/openapi/v3/api/{version}"),
                )
            } else {
                (
                    format!("apis/{group}/{version}"),
                    format!("/openapi/v3/apis/{group}/{version}"),
                )
            };
            paths.insert(
                key,
                json!({"serverRelativeURL": format!("{url}?hash={}", hash.to_uppercase())}),
            );
        }
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_resource_list_has_short_names_and_status() {
        let r = Registry::builtins();
        let Some(list) = resource_list(&r, "", "v1") else {
            panic!("core served");
        };
        let resources = list["resources"].as_array().cloned().unwrap_or_default();
        let ns = resources.iter().find(|e| e["name"] == "namespaces");
        assert_eq!(ns.map(|e| e["shortNames"].clone()), Some(json!(["ns"])));
        assert!(resources.iter().any(|e| e["name"] == "namespaces/status"));
        assert!(resource_list(&r, "", "v2").is_none());
    }

    #[test]
    fn groups_exclude_core_and_prefer_the_first_version() {
        let r = Registry::builtins();
        let doc = groups(&r);
        let names: Vec<&str> = doc["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str())
            .collect();
        assert!(names.contains(&"coordination.k8s.io"));
        assert!(!names.contains(&""));
    }
}
