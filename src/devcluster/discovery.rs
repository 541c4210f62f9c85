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
//! The OpenAPI v3 documents are `openapi.rs`'s.

use serde_json::{json, Value};

use super::registry::{api_version, Registry, ResourceType, VERBS};
use super::review::RESOURCES;

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
        .chain(review_groups().map(|g| group_doc(g, &["v1".to_string()])))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The groups of the access reviews (`review.rs`), each served at `v1` only.
fn review_groups() -> impl Iterator<Item = &'static str> {
    let mut groups: Vec<&str> = RESOURCES.iter().map(|(g, ..)| *g).collect();
    groups.dedup();
    groups.into_iter()
}

/// `/apis/{group}`, or `None` when the group is not served.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = registry
        .groups()
        .into_iter()
        .chain(review_groups().map(|g| (g.to_string(), vec!["v1".to_string()])))
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
    let reviews = if version == "v1" {
        super::review::resources(group)
    } else {
        Vec::new()
    };
    if types.is_empty() && reviews.is_empty() {
        return None;
    }
    let mut resources = reviews;
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
