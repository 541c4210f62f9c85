//! Request paths: which endpoint a URL addresses (discovery, OpenAPI, or a resource) and, for
//! resources, the resolved [`Target`] (type, version, namespace, name, subresource).
//!
//! Paths follow kube-apiserver: `/api/v1/...` for the core group, `/apis/{group}/{version}/...`
//! otherwise; then `namespaces/{ns}/{resource}[/{name}[/status]]` or
//! `{resource}[/{name}[/status]]`, and the legacy `watch/` prefix. `/api/v1/namespaces/{name}`
//! and `/api/v1/namespaces/{name}/status` address namespaces themselves.

use std::sync::Arc;

use super::registry::{Registry, ResourceType};
use super::status::{ApiError, GroupResource};
use super::store::ObjKey;

/// What a request path addresses.
#[derive(Debug, Clone, PartialEq)]
pub enum Route {
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz`
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1` or `/apis/{group}/{version}`
    GroupVersion(String, String),
    /// `/openapi/v3`
    OpenApiRoot,
    /// `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}`
    OpenApi(String, String),
    /// A resource path (resolved against the registry by [`resolve`]).
    Resource(ResourcePath),
    /// Anything else.
    Unknown,
}

/// The parts of a resource path before the registry is consulted.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourcePath {
    /// API group (`""` for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Namespace from `namespaces/{ns}/...`.
    pub namespace: Option<String>,
    /// Plural resource.
    pub plural: String,
    /// Object name.
    pub name: Option<String>,
    /// Subresource (only `status` is served).
    pub subresource: Option<String>,
    /// Whether the path used the legacy `/watch/` prefix.
    pub legacy_watch: bool,
}

/// Parses a request path (without the query).
pub fn parse(path: &str) -> Route {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["livez"] | ["readyz"] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["apis", g] => Route::Group(g.to_string()),
        ["openapi", "v3"] => Route::OpenApiRoot,
        ["openapi", "v3", "api", v] => Route::OpenApi(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => Route::OpenApi(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => resource_route("", v, rest),
        ["apis", g, v, rest @ ..] => resource_route(g, v, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    if rest.is_empty() {
        return Route::GroupVersion(group.to_string(), version.to_string());
    }
    let (legacy_watch, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let namespace_itself = group.is_empty()
        && rest.len() == 3
        && rest[0] == "namespaces"
        && matches!(rest[2], "status" | "finalize");
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() && !namespace_itself => {
            (Some(ns.to_string()), tail)
        }
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [p] => (p, None, None),
        [p, n] => (p, Some(n.to_string()), None),
        [p, n, s] => (p, Some(n.to_string()), Some(s.to_string())),
        _ => return Route::Unknown,
    };
    Route::Resource(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        plural: plural.to_string(),
        name,
        subresource,
        legacy_watch,
    })
}

/// A resolved resource request.
#[derive(Clone)]
pub struct Target {
    /// The resource type.
    pub rt: Arc<ResourceType>,
    /// The version the client speaks.
    pub version: String,
    /// The namespace of a namespaced request (`None` = all namespaces, or cluster-scoped).
    pub namespace: Option<String>,
    /// The object name, for single-object requests.
    pub name: Option<String>,
    /// Whether the `status` subresource is addressed.
    pub status: bool,
}

impl Target {
    /// The store key of the object called `name` in this target's namespace.
    pub fn key(&self, name: &str) -> ObjKey {
        ObjKey {
            storage: self.rt.storage.clone(),
            namespace: if self.rt.namespaced {
                self.namespace.clone().unwrap_or_default()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    /// Group and plural for error messages.
    pub fn gr(&self) -> GroupResource {
        self.rt.gr()
    }

    /// The name addressed, or 405 for a collection path.
    ///
    /// # Errors
    /// [`ApiError::MethodNotAllowed`] when the path has no name.
    pub fn require_name(&self) -> Result<&str, ApiError> {
        self.name
            .as_deref()
            .ok_or(ApiError::MethodNotAllowed { gr: self.gr() })
    }
}

/// Resolves a resource path against the served types.
///
/// # Errors
/// 404 when no served type matches, when the scope of the path does not match the type (a
/// cluster-scoped type under `namespaces/{ns}`, or a namespaced type's object without a
/// namespace), or when a subresource other than a served `status` is addressed.
pub fn resolve(registry: &Registry, p: &ResourcePath) -> Result<Target, ApiError> {
    let rt = registry
        .find(&p.group, &p.version, &p.plural)
        .ok_or(ApiError::NoRoute)?;
    if p.namespace.is_some() && !rt.namespaced {
        return Err(ApiError::NoRoute);
    }
    if rt.namespaced && p.namespace.is_none() && p.name.is_some() {
        return Err(ApiError::NoRoute);
    }
    let status = match p.subresource.as_deref() {
        None => false,
        Some("status") if rt.has_status(&p.version) => true,
        Some(_) => {
            return Err(ApiError::NotFound {
                gr: rt.gr(),
                name: p.name.clone().unwrap_or_default(),
            })
        }
    };
    Ok(Target {
        version: p.version.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        status,
        rt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(path: &str) -> ResourcePath {
        match parse(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn namespaced_paths_carry_the_namespace() {
        let r = res("/apis/example.dev/v1/namespaces/ns1/widgets/w1/status");
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.plural, "widgets");
        assert_eq!(r.name.as_deref(), Some("w1"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
    }

    #[test]
    fn namespace_objects_are_cluster_scoped_paths() {
        let r = res("/api/v1/namespaces/ns1");
        assert_eq!(
            (r.plural.as_str(), r.name.as_deref()),
            ("namespaces", Some("ns1"))
        );
        let r = res("/api/v1/namespaces/ns1/status");
        assert_eq!(r.namespace, None);
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = res("/api/v1/namespaces/ns1/configmaps");
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.plural, "configmaps");
    }

    #[test]
    fn discovery_and_legacy_watch_paths() {
        assert_eq!(
            parse("/api/v1"),
            Route::GroupVersion(String::new(), "v1".into())
        );
        assert_eq!(parse("/apis/a.b"), Route::Group("a.b".into()));
        assert!(res("/api/v1/watch/namespaces/x/configmaps").legacy_watch);
        assert_eq!(parse("/nope"), Route::Unknown);
    }

    #[test]
    fn cluster_scoped_types_refuse_namespaced_paths() {
        let registry = Registry::builtins();
        let p = res("/apis/apiextensions.k8s.io/v1/namespaces/x/customresourcedefinitions");
        assert!(matches!(resolve(&registry, &p), Err(ApiError::NoRoute)));
        let p = res("/api/v1/configmaps");
        assert!(resolve(&registry, &p).is_ok());
    }
}
