//! The access reviews kubectl asks of a server about its own user: `SelfSubjectAccessReview`
//! (`authorization.k8s.io/v1`, `kubectl auth can-i`) and the discovery entries of it and of
//! `SelfSubjectReview` (`authentication.k8s.io/v1`, `kubectl auth whoami`, answered in
//! `audit.rs`). The embedded server has one all-powerful user (`system:masters`), so every
//! well-formed review is allowed, as kube-apiserver's privileged-group authorizer answers: 201
//! with the spec echoed and `status: {allowed: true}` (no reason).

use serde_json::{json, Value};

use super::schema::{invalid_status, FieldError, FieldErrorKind};
use super::status::ApiError;

/// The path of `SelfSubjectAccessReview`s.
pub const SELF_SUBJECT_ACCESS_REVIEWS: &str =
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// The review resources served, per group (all `v1`, cluster-scoped, `create` only):
/// (group, plural, singular, kind).
pub const RESOURCES: [(&str, &str, &str, &str); 2] = [
    (
        "authentication.k8s.io",
        "selfsubjectreviews",
        "selfsubjectreview",
        "SelfSubjectReview",
    ),
    (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        "SelfSubjectAccessReview",
    ),
];

/// The discovery entries (`APIResource`s) of `group`'s review resources.
pub fn resources(group: &str) -> Vec<Value> {
    RESOURCES
        .iter()
        .filter(|(g, ..)| *g == group)
        .map(|(_, plural, singular, kind)| {
            json!({"name": plural, "singularName": singular, "namespaced": false,
                   "kind": kind, "verbs": ["create"]})
        })
        .collect()
}

/// Answers a `POST` of a SelfSubjectAccessReview (the decoded body).
///
/// # Errors
/// 400 for a body of another kind; 422 when not exactly one of `resourceAttributes` and
/// `nonResourceAttributes` is given (kube-apiserver's messages).
pub fn self_subject_access_review(review: &Value) -> Result<Value, ApiError> {
    let kind = review["kind"].as_str().unwrap_or("");
    if !kind.is_empty() && kind != "SelfSubjectAccessReview" {
        return Err(ApiError::BadRequest(format!(
            "{kind} in version \"v1\" cannot be handled as a SelfSubjectAccessReview: no kind \
             {kind:?} is registered for version \"authorization.k8s.io/v1\""
        )));
    }
    let spec = &review["spec"];
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let error = match (resource, non_resource) {
        (None, None) => Some(FieldError {
            kind: FieldErrorKind::Invalid,
            field: "spec.resourceAttributes".into(),
            bad_value: Some(Value::Null),
            detail: "exactly one of nonResourceAttributes or resourceAttributes must be \
                     specified"
                .into(),
        }),
        (Some(_), Some(n)) => Some(FieldError {
            kind: FieldErrorKind::Invalid,
            field: "spec.nonResourceAttributes".into(),
            bad_value: Some(n.clone()),
            detail: "cannot be specified in combination with resourceAttributes".into(),
        }),
        _ => None,
    };
    if let Some(error) = error {
        return Err(ApiError::Invalid(invalid_status(
            "",
            "authorization.k8s.io",
            "",
            &[error],
        )));
    }
    Ok(json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {},
        "spec": spec,
        "status": {"allowed": true},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_review_of_the_one_user_is_allowed() {
        let body =
            json!({"spec": {"resourceAttributes": {"verb": "create", "resource": "agentruns"}}});
        let Ok(answer) = self_subject_access_review(&body) else {
            panic!("answered");
        };
        assert_eq!(answer["status"], json!({"allowed": true}));
        assert_eq!(answer["spec"]["resourceAttributes"]["verb"], "create");
    }

    #[test]
    fn exactly_one_kind_of_attributes_is_required() {
        for body in [
            json!({"spec": {}}),
            json!({"spec": {"resourceAttributes": {}, "nonResourceAttributes": {"path": "/x"}}}),
        ] {
            let err = self_subject_access_review(&body).err();
            assert_eq!(err.map(|e| e.code().as_u16()), Some(422));
        }
        let err = self_subject_access_review(&json!({"kind": "Foo"})).err();
        assert_eq!(err.map(|e| e.code().as_u16()), Some(400));
    }
}
