//! The request audit log (`agentrt dev --audit-log PATH`): one JSON line per resource request
//! with the Kubernetes verb, group, resource, subresource, namespace, name and response code,
//! as a real API server's audit backend would record them. Tests use it to list every API call
//! the controller makes and check the chart's RBAC grants exactly those (issue 6).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use http::Method;
use serde_json::json;

use super::route::{self, Route};

/// An open audit log.
pub struct AuditLog {
    file: Mutex<File>,
}

/// What one request asked for, in RBAC terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'static str,
    /// API group (`""` for core).
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource (`status`), if any.
    pub subresource: Option<String>,
    /// Namespace, if any.
    pub namespace: Option<String>,
    /// Object name, if any.
    pub name: Option<String>,
}

impl AuditLog {
    /// Creates (truncates) the log at `path`.
    ///
    /// # Errors
    /// When the file cannot be created.
    pub fn create(path: &Path) -> std::io::Result<AuditLog> {
        Ok(AuditLog {
            file: Mutex::new(File::create(path)?),
        })
    }

    /// Appends one line for `entry` answered with HTTP `code`, attributed to `user_agent`.
    pub fn record(&self, entry: &AuditEntry, code: u16, user_agent: &str) {
        let line = json!({
            "verb": entry.verb,
            "group": entry.group,
            "resource": entry.resource,
            "subresource": entry.subresource,
            "namespace": entry.namespace,
            "name": entry.name,
            "code": code,
            "userAgent": user_agent,
        });
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // An audit line that cannot be written is dropped: the log is a test aid, never a
        // reason to fail a request.
        let _ = writeln!(file, "{line}");
    }
}

/// The RBAC view of a request, or `None` for non-resource paths (discovery, version, health).
pub fn entry(method: &Method, path: &str, watch_param: bool) -> Option<AuditEntry> {
    if method == Method::POST && path.trim_end_matches('/') == SELF_SUBJECT_REVIEWS {
        return Some(AuditEntry {
            verb: "create",
            group: "authentication.k8s.io".into(),
            resource: "selfsubjectreviews".into(),
            subresource: None,
            namespace: None,
            name: None,
        });
    }
    let Route::Resource(p) = route::parse(path) else {
        return None;
    };
    let verb = match (method.as_str(), p.name.is_some()) {
        ("GET", _) if watch_param || p.legacy_watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(AuditEntry {
        verb,
        group: p.group,
        resource: p.plural,
        subresource: p.subresource,
        namespace: p.namespace,
        name: p.name,
    })
}

/// The path of `authentication.k8s.io/v1` SelfSubjectReviews ("who am I").
pub const SELF_SUBJECT_REVIEWS: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

/// The user every request to the embedded server is (it has one user).
pub const DEV_USER: &str = "agentrt-dev-admin";

/// kube-apiserver's answer to a SelfSubjectReview for the embedded server's one user.
pub fn self_subject_review() -> serde_json::Value {
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": {"username": DEV_USER, "groups": ["system:masters", "system:authenticated"]}}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_named_as_rbac_names_them() {
        let e = entry(
            &Method::PUT,
            "/apis/agentrt.dev/v1alpha1/namespaces/a/agentruns/r/status",
            false,
        )
        .expect("a resource request");
        assert_eq!(
            (
                e.verb,
                e.group.as_str(),
                e.resource.as_str(),
                e.subresource.as_deref()
            ),
            ("update", "agentrt.dev", "agentruns", Some("status"))
        );
        let e = entry(
            &Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/a/leases",
            true,
        )
        .expect("watch");
        assert_eq!(e.verb, "watch");
        let e = entry(&Method::GET, "/api/v1/namespaces/a/secrets/s", false).expect("get");
        assert_eq!((e.verb, e.group.as_str()), ("get", ""));
        assert!(entry(&Method::GET, "/apis", false).is_none());
        assert_eq!(
            entry(&Method::POST, SELF_SUBJECT_REVIEWS, false).map(|e| e.verb),
            Some("create")
        );
    }
}
