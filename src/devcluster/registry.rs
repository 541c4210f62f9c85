//! The resource types the server serves: the built-ins (namespaces, configmaps, secrets,
//! serviceaccounts, core and `events.k8s.io` events, leases, customresourcedefinitions) and the
//! custom resources that stored CustomResourceDefinitions declare (see `crd.rs`).
//!
//! It owns names (plural, singular, kind, short names, categories), scope, served versions,
//! printer columns, the status subresource and compiled schemas; it does not hold objects.
//! Storage is per group-resource (`storage`), shared by every served version: an object is
//! stored once, in its storage version, and rewritten to the version a client asks for.

use std::cmp::Ordering;
use std::sync::Arc;

use serde_json::Value;

use super::schema::CompiledSchema;
use super::status::GroupResource;

/// One `additionalPrinterColumns` entry (or a built-in's column).
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    /// Header, e.g. `Phase` (kubectl upper-cases it).
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// OpenAPI format hint, e.g. `name`.
    pub format: String,
    /// Human description.
    pub description: String,
    /// 0 = always shown; >0 only with `-o wide`.
    pub priority: i64,
    /// Simple JSONPath into the object, e.g. `.status.phase`.
    pub json_path: String,
}

/// One served version of a resource type.
pub struct VersionSpec {
    /// Version name, e.g. `v1alpha1`.
    pub name: String,
    /// Whether `/status` is served and the main endpoint ignores status.
    pub status_subresource: bool,
    /// Printer columns (empty = default Name/Age for custom resources).
    pub columns: Vec<PrinterColumn>,
    /// The compiled `openAPIV3Schema`, for custom resources that declare one.
    pub schema: Option<Arc<CompiledSchema>>,
    /// The `openAPIV3Schema` as the CRD declares it, published in `/openapi/v3`.
    pub published: Option<Arc<Value>>,
    /// A deprecation warning to send with every request to this version.
    pub deprecation_warning: Option<String>,
    /// How server-side apply merges and managedFields track this version's objects.
    pub shape: Arc<super::managed::Shape>,
    /// The fields a field selector may name besides `metadata.name` and `metadata.namespace`,
    /// as selectors spell them (`status.phase`): a CRD version's `selectableFields[].jsonPath`
    /// without the leading dot; empty for built-ins.
    pub selectable_fields: Vec<String>,
}

/// The built-in resource types, each with its own small rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// `v1` Namespace.
    Namespace,
    /// `v1` ConfigMap.
    ConfigMap,
    /// `v1` Secret.
    Secret,
    /// `v1` ServiceAccount.
    ServiceAccount,
    /// `v1` Event (the storage form of both event APIs).
    CoreEvent,
    /// `events.k8s.io/v1` Event, stored as a core Event.
    Event,
    /// `coordination.k8s.io/v1` Lease.
    Lease,
    /// `apiextensions.k8s.io/v1` CustomResourceDefinition.
    Crd,
}

/// Where a resource type comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Compiled into the server.
    Builtin(Builtin),
    /// Declared by a CustomResourceDefinition.
    Custom,
}

/// A resource type: names, scope, served versions and storage.
pub struct ResourceType {
    /// API group, `""` for core.
    pub group: String,
    /// Plural resource name (the URL segment).
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind, e.g. `AgentRun`.
    pub kind: String,
    /// List kind, e.g. `AgentRunList`.
    pub list_kind: String,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl, e.g. `ar`.
    pub short_names: Vec<String>,
    /// Categories for kubectl, e.g. `agentrt`.
    pub categories: Vec<String>,
    /// Served versions, in declaration order.
    pub versions: Vec<VersionSpec>,
    /// The version objects are stored in.
    pub storage_version: String,
    /// Storage identity shared by all versions (and by both event APIs).
    pub storage: Arc<str>,
    /// Built-in or custom.
    pub flavor: Flavor,
}

/// Verbs every resource type serves (discovery lists them).
pub const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceType {
    /// Group and plural, for error messages.
    pub fn gr(&self) -> GroupResource {
        GroupResource {
            group: self.group.clone(),
            resource: self.plural.clone(),
        }
    }

    /// The served version called `name`.
    pub fn version(&self, name: &str) -> Option<&VersionSpec> {
        self.versions.iter().find(|v| v.name == name)
    }

    /// `apiVersion` for a version: `v1` for core, `group/version` otherwise.
    pub fn api_version(&self, version: &str) -> String {
        api_version(&self.group, version)
    }

    /// Whether the version (or, when unknown, any version) has the status subresource.
    pub fn has_status(&self, version: &str) -> bool {
        self.version(version)
            .map(|v| v.status_subresource)
            .unwrap_or(false)
    }

    /// The built-in kind, if this is one.
    pub fn builtin(&self) -> Option<Builtin> {
        match self.flavor {
            Flavor::Builtin(b) => Some(b),
            Flavor::Custom => None,
        }
    }

    /// Whether this type records `metadata.generation` (custom resources and CRDs do).
    pub fn tracks_generation(&self) -> bool {
        matches!(self.flavor, Flavor::Custom | Flavor::Builtin(Builtin::Crd))
    }
}

/// `v1` for core, `group/version` otherwise.
pub fn api_version(group: &str, version: &str) -> String {
    if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    }
}

/// The set of resource types currently served.
#[derive(Clone)]
pub struct Registry {
    types: Vec<Arc<ResourceType>>,
}

impl Registry {
    /// The built-in types only.
    pub fn builtins() -> Registry {
        Registry {
            types: builtin_types().into_iter().map(Arc::new).collect(),
        }
    }

    /// The built-ins plus the custom types of `crds` (CRD objects as stored). A CRD that cannot
    /// be turned into a type (it was validated when written, so this is unexpected) is skipped.
    pub fn with_crds<'a>(crds: impl Iterator<Item = &'a Value>) -> Registry {
        let mut registry = Registry::builtins();
        for crd in crds {
            match super::crd::resource_type(crd) {
                Ok(rt) => registry.types.push(Arc::new(rt)),
                Err(err) => tracing::warn!(
                    crd = crd["metadata"]["name"].as_str().unwrap_or(""),
                    "not serving a stored CustomResourceDefinition: {err}"
                ),
            }
        }
        registry
    }

    /// The type served at `group`/`version` under `plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.types
            .iter()
            .find(|t| t.group == group && t.plural == plural && t.version(version).is_some())
            .cloned()
    }

    /// The primary type stored under `storage` (for events, the core type).
    pub fn by_storage(&self, storage: &str) -> Option<Arc<ResourceType>> {
        self.types.iter().find(|t| &*t.storage == storage).cloned()
    }

    /// The groups served, each with its versions sorted by preference (kube-aware ordering).
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for t in &self.types {
            let idx = match groups.iter().position(|(g, _)| *g == t.group) {
                Some(i) => i,
                None => {
                    groups.push((t.group.clone(), Vec::new()));
                    groups.len() - 1
                }
            };
            for v in &t.versions {
                if !groups[idx].1.contains(&v.name) {
                    groups[idx].1.push(v.name.clone());
                }
            }
        }
        for (_, versions) in &mut groups {
            versions.sort_by(|a, b| compare_versions(a, b));
        }
        groups
    }

    /// The types served at `group`/`version`.
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceType>> {
        self.types
            .iter()
            .filter(|t| t.group == group && t.version(version).is_some())
            .cloned()
            .collect()
    }
}

/// Orders versions as Kubernetes prefers them: GA before beta before alpha, higher numbers
/// first, anything not shaped like `v1beta2` last in lexical order.
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u32, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let major: u64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((2, major, 0));
        }
        let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        Some((level, major, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

fn builtin(
    group: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    flavor: Builtin,
) -> ResourceType {
    let status_subresource = matches!(flavor, Builtin::Namespace | Builtin::Crd);
    let storage: Arc<str> = match flavor {
        Builtin::Event | Builtin::CoreEvent => Arc::from("events"),
        _ if group.is_empty() => Arc::from(plural),
        _ => Arc::from(format!("{plural}.{group}").as_str()),
    };
    ResourceType {
        group: group.to_string(),
        plural: plural.to_string(),
        singular: kind.to_lowercase(),
        kind: kind.to_string(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: if flavor == Builtin::Crd {
            vec!["api-extensions".to_string()]
        } else {
            Vec::new()
        },
        versions: vec![VersionSpec {
            name: "v1".to_string(),
            status_subresource,
            columns: Vec::new(),
            schema: None,
            published: None,
            deprecation_warning: None,
            shape: Arc::new(super::managed::builtin_shape(kind)),
            selectable_fields: Vec::new(),
        }],
        storage_version: "v1".to_string(),
        storage,
        flavor: Flavor::Builtin(flavor),
    }
}

fn builtin_types() -> Vec<ResourceType> {
    vec![
        builtin(
            "",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            Builtin::Namespace,
        ),
        builtin(
            "",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            Builtin::ConfigMap,
        ),
        builtin("", "secrets", "Secret", true, &[], Builtin::Secret),
        builtin(
            "",
            "serviceaccounts",
            "ServiceAccount",
            true,
            &["sa"],
            Builtin::ServiceAccount,
        ),
        builtin("", "events", "Event", true, &["ev"], Builtin::CoreEvent),
        builtin(
            "coordination.k8s.io",
            "leases",
            "Lease",
            true,
            &[],
            Builtin::Lease,
        ),
        builtin(
            "events.k8s.io",
            "events",
            "Event",
            true,
            &["ev"],
            Builtin::Event,
        ),
        builtin(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            Builtin::Crd,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_ga_then_beta_then_alpha_then_other() {
        let mut v = vec![
            "v1alpha1",
            "foo",
            "v1beta1",
            "v2",
            "v1",
            "v1beta2",
            "v10alpha3",
        ];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(
            v,
            vec![
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v10alpha3",
                "v1alpha1",
                "foo"
            ]
        );
    }

    #[test]
    fn both_event_apis_share_one_storage() {
        let r = Registry::builtins();
        let core = r.find("", "v1", "events").map(|t| t.storage.clone());
        let new = r
            .find("events.k8s.io", "v1", "events")
            .map(|t| t.storage.clone());
        assert_eq!(core, new);
        assert!(core.is_some());
    }
}
