//! What a write's body must be before the verbs' rules (`write.rs`) run: a JSON object of the
//! target's kind and version (a custom resource of another kind is 422 at `kind`, as its
//! validation answers), the URL's namespace, a namespace that exists and is not terminating,
//! and, for custom resources and CRDs (whose strategies allow no unconditional update), a
//! `resourceVersion` on update.

use serde_json::{json, Value};

use super::meta::{self, meta_str, set_meta};
use super::registry::{Builtin, Flavor};
use super::route::Target;
use super::schema::{invalid_status, FieldError, FieldErrorKind};
use super::status::{ApiError, GroupResource};
use super::store::{ObjKey, Store, NAMESPACE_STORAGE};

/// A 422 with one `Invalid value` cause; `kind` names the object as kube-apiserver's message
/// does.
fn invalid_field(
    kind: &str,
    group: &str,
    name: &str,
    field: &str,
    value: Value,
    detail: &str,
) -> ApiError {
    let error = FieldError {
        kind: FieldErrorKind::Invalid,
        field: field.into(),
        bad_value: Some(value),
        detail: detail.into(),
    };
    ApiError::Invalid(invalid_status(kind, group, name, &[error]))
}

/// Checks the body is a JSON object of the target's kind and version, filling a missing
/// `apiVersion`/`kind` from the URL as kube-apiserver's decoder does.
pub fn check_body(t: &Target, body: Value) -> Result<Value, ApiError> {
    let mut obj = match body {
        Value::Object(_) => body,
        _ => {
            return Err(ApiError::BadRequest(
                "the body of the request must be a JSON object".to_string(),
            ))
        }
    };
    let want_av = t.rt.api_version(&t.version);
    let av = obj["apiVersion"].as_str().unwrap_or("").to_string();
    let kind = obj["kind"].as_str().unwrap_or("").to_string();
    if !av.is_empty() && av != want_av {
        return Err(ApiError::BadRequest(format!(
            "the API version in the data ({av}) does not match the expected API version \
             ({want_av})"
        )));
    }
    if !kind.is_empty() && kind != t.rt.kind && t.rt.flavor == Flavor::Custom {
        // Custom resources decode as unstructured: the kind is refused by validation.
        let detail = format!("must be {}", t.rt.kind);
        let name = meta_str(&obj, "name");
        return Err(invalid_field(
            &kind,
            &t.rt.group,
            name,
            "kind",
            json!(kind),
            &detail,
        ));
    }
    if !kind.is_empty() && kind != t.rt.kind {
        return Err(ApiError::BadRequest(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            t.rt.kind
        )));
    }
    if let Some(map) = obj.as_object_mut() {
        map.insert("apiVersion".into(), json!(want_av));
        map.insert("kind".into(), json!(t.rt.kind));
    }
    if !obj.get("metadata").is_none_or(Value::is_object) {
        return Err(ApiError::BadRequest(
            "metadata must be an object".to_string(),
        ));
    }
    Ok(obj)
}

/// Puts the URL's namespace into the body (refusing a different one) or clears it for
/// cluster-scoped types. Returns the namespace (`""` for cluster-scoped).
pub fn settle_namespace(t: &Target, obj: &mut Value) -> Result<String, ApiError> {
    if !t.rt.namespaced {
        set_meta(obj, "namespace", None);
        return Ok(String::new());
    }
    let url_ns = t.namespace.clone().unwrap_or_default();
    let body_ns = meta_str(obj, "namespace");
    if !body_ns.is_empty() && body_ns != url_ns {
        return Err(ApiError::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the \
             request"
                .to_string(),
        ));
    }
    set_meta(obj, "namespace", Some(json!(url_ns)));
    Ok(url_ns)
}

/// Refuses creation in a namespace that does not exist (404) or is terminating (403).
pub fn check_namespace_open(
    store: &Store,
    t: &Target,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    let key = ObjKey {
        storage: NAMESPACE_STORAGE.into(),
        namespace: String::new(),
        name: ns.to_string(),
    };
    match store.get(&key) {
        None => Err(ApiError::NotFound {
            gr: GroupResource {
                group: String::new(),
                resource: "namespaces".into(),
            },
            name: ns.to_string(),
        }),
        Some(n) if meta::is_deleting(n) => Err(ApiError::Forbidden {
            gr: t.gr(),
            name: name.to_string(),
            message: format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ),
        }),
        Some(_) => Ok(()),
    }
}

/// Refuses an update without `metadata.resourceVersion` of an existing custom resource or CRD
/// (422 naming the plural resource, as kube-apiserver does).
///
/// # Errors
/// [`ApiError::Invalid`] at `metadata.resourceVersion`.
pub fn require_resource_version(
    t: &Target,
    obj: &Value,
    name: &str,
    exists: bool,
) -> Result<(), ApiError> {
    let requires = matches!(t.rt.flavor, Flavor::Custom | Flavor::Builtin(Builtin::Crd));
    if requires && exists && meta_str(obj, "resourceVersion").is_empty() {
        let rt = &t.rt;
        return Err(invalid_field(
            &rt.plural,
            &rt.group,
            name,
            "metadata.resourceVersion",
            json!(0),
            "must be specified for an update",
        ));
    }
    Ok(())
}
