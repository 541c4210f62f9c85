//! Errors of the HTTP boundary and the `Status` objects kube-apiserver writes for them.
//!
//! Every refusal the embedded API server makes is an [`ApiError`]; [`ApiError::to_status`]
//! renders it as kube-apiserver 1.32 would (`kind: Status`, `status: Failure`, `reason`,
//! `message`, `details`, `code`), because clients (kubectl, kube-rs, client-go) branch on the
//! `reason` and `code` and people read the `message`. Messages follow
//! `k8s.io/apimachinery/pkg/api/errors`.

use http::StatusCode;
use serde_json::{json, Value};

/// Names the resource an error is about: group (empty for the core group) and plural resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupResource {
    /// API group, `""` for the core group.
    pub group: String,
    /// Plural resource name, e.g. `agentruns`.
    pub resource: String,
}

impl GroupResource {
    /// `resource.group`, or `resource` for the core group (how kube-apiserver names it).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }
}

/// A refused request, rendered as a kube-apiserver `Status` by [`ApiError::to_status`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// 404 NotFound: `agentruns.agentrt.dev "x" not found`.
    #[error("{} {name:?} not found", gr.qualified())]
    NotFound {
        /// The resource looked up.
        gr: GroupResource,
        /// The object's name.
        name: String,
    },
    /// 404 NotFound for a path no resource serves.
    #[error("the server could not find the requested resource")]
    NoRoute,
    /// 409 AlreadyExists: `agentruns.agentrt.dev "x" already exists`.
    #[error("{} {name:?} already exists", gr.qualified())]
    AlreadyExists {
        /// The resource created.
        gr: GroupResource,
        /// The object's name.
        name: String,
    },
    /// 409 Conflict: `Operation cannot be fulfilled on agentruns.agentrt.dev "x": <reason>`.
    #[error("Operation cannot be fulfilled on {} {name:?}: {reason}", gr.qualified())]
    Conflict {
        /// The resource written.
        gr: GroupResource,
        /// The object's name.
        name: String,
        /// Why, e.g. the stale-resourceVersion sentence.
        reason: String,
    },
    /// 422 Invalid, carrying the complete `Status` body (see `schema::invalid_status`).
    #[error("{}", .0.get("message").and_then(Value::as_str).unwrap_or("invalid"))]
    Invalid(Value),
    /// 409 Conflict of server-side apply, carrying the complete `Status` body (causes of
    /// reason `FieldManagerConflict`).
    #[error("{}", .0.get("message").and_then(Value::as_str).unwrap_or("conflict"))]
    ApplyConflict(Value),
    /// 500 of server-side apply for a configuration the type does not describe: `failed to
    /// create typed patch object (ns/name; v1, Kind=K): .spec.x: field not declared in schema`
    /// (a `Status` without a reason, as kube-apiserver writes it).
    #[error("{0}")]
    TypedPatch(String),
    /// 400 BadRequest with this message.
    #[error("{0}")]
    BadRequest(String),
    /// 403 Forbidden: `<resource> "<name>" is forbidden: <message>`.
    #[error("{} {name:?} is forbidden: {message}", gr.qualified())]
    Forbidden {
        /// The resource written.
        gr: GroupResource,
        /// The object's name (may be empty).
        name: String,
        /// Why.
        message: String,
    },
    /// 401 Unauthorized (missing or wrong bearer token).
    #[error("Unauthorized")]
    Unauthorized,
    /// 405 MethodNotAllowed.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed {
        /// The resource addressed.
        gr: GroupResource,
    },
    /// 405 MethodNotAllowed with a specific message.
    #[error("{message}")]
    MethodNotAllowedMessage {
        /// The resource addressed.
        gr: GroupResource,
        /// Why.
        message: String,
    },
    /// 410 Expired (a watch or list from a resourceVersion older than the retained history).
    #[error("{0}")]
    Expired(String),
    /// 410 Expired for a list's continue token older than the history kept; the `Status`
    /// carries `metadata.continue`, a token that continues at the latest state.
    #[error(
        "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter, or use the continue \
             token in this response to retrieve the remainder of the results. Continuing with \
             the provided token results in an inconsistent list - objects that were created, \
             modified, or deleted between the time the first chunk was returned and now may \
             show up in the list."
    )]
    ExpiredContinue {
        /// The token to continue with.
        continue_token: String,
    },
    /// 415 UnsupportedMediaType with this message.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 413 RequestEntityTooLarge with this message.
    #[error("{0}")]
    TooLarge(String),
    /// 500 InternalError: `Internal error occurred: <message>`.
    #[error("Internal error occurred: {0}")]
    Internal(String),
}

impl ApiError {
    /// The stale-`resourceVersion` conflict kube-apiserver returns for a compare-and-set update.
    pub fn stale(gr: GroupResource, name: &str) -> ApiError {
        ApiError::Conflict {
            gr,
            name: name.to_string(),
            reason: "the object has been modified; please apply your changes to the latest \
                     version and try again"
                .to_string(),
        }
    }

    /// The HTTP status code of this error.
    pub fn code(&self) -> StatusCode {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => StatusCode::NOT_FOUND,
            ApiError::AlreadyExists { .. }
            | ApiError::Conflict { .. }
            | ApiError::ApplyConflict(_) => StatusCode::CONFLICT,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Forbidden { .. } => StatusCode::FORBIDDEN,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::MethodNotAllowed { .. } | ApiError::MethodNotAllowedMessage { .. } => {
                StatusCode::METHOD_NOT_ALLOWED
            }
            ApiError::Expired(_) | ApiError::ExpiredContinue { .. } => StatusCode::GONE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) | ApiError::TypedPatch(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `Status` object kube-apiserver writes for this error.
    pub fn to_status(&self) -> Value {
        if let ApiError::Invalid(body) | ApiError::ApplyConflict(body) = self {
            return body.clone();
        }
        if let ApiError::TypedPatch(message) = self {
            return json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": message, "code": 500});
        }
        let (reason, details) = match self {
            ApiError::NotFound { gr, name } => ("NotFound", Some(details(gr, name))),
            ApiError::NoRoute => ("NotFound", Some(json!({}))),
            ApiError::AlreadyExists { gr, name } => ("AlreadyExists", Some(details(gr, name))),
            ApiError::Conflict { gr, name, .. } => ("Conflict", Some(details(gr, name))),
            ApiError::Forbidden { gr, name, .. } => ("Forbidden", Some(details(gr, name))),
            ApiError::MethodNotAllowed { gr } | ApiError::MethodNotAllowedMessage { gr, .. } => {
                ("MethodNotAllowed", Some(details(gr, "")))
            }
            ApiError::BadRequest(_) => ("BadRequest", None),
            ApiError::Unauthorized => ("Unauthorized", None),
            ApiError::Expired(_) | ApiError::ExpiredContinue { .. } => ("Expired", None),
            ApiError::UnsupportedMediaType(_) => ("UnsupportedMediaType", None),
            ApiError::TooLarge(_) => ("RequestEntityTooLarge", None),
            ApiError::Internal(message) => (
                "InternalError",
                Some(json!({"causes": [{"message": message}]})),
            ),
            ApiError::Invalid(_) => ("Invalid", None),
            ApiError::ApplyConflict(_) => ("Conflict", None),
            ApiError::TypedPatch(_) => ("InternalError", None),
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": reason,
            "code": self.code().as_u16(),
        });
        if let (Some(details), Some(map)) = (details, status.as_object_mut()) {
            map.insert("details".to_string(), details);
        }
        if let ApiError::ExpiredContinue { continue_token } = self {
            status["metadata"] = json!({"continue": continue_token});
        }
        status
    }
}

fn details(gr: &GroupResource, name: &str) -> Value {
    let mut details = serde_json::Map::new();
    if !name.is_empty() {
        details.insert("name".into(), json!(name));
    }
    if !gr.group.is_empty() {
        details.insert("group".into(), json!(gr.group));
    }
    details.insert("kind".into(), json!(gr.resource));
    Value::Object(details)
}

/// A `Status` of success, as kube-apiserver returns for an immediate delete: details name the
/// object (`kind` carries the plural resource, as kube-apiserver does).
pub fn success_status(gr: &GroupResource, name: &str, uid: &str) -> Value {
    let mut details = details(gr, name);
    if let Some(map) = details.as_object_mut() {
        map.insert("uid".into(), json!(uid));
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widgets() -> GroupResource {
        GroupResource {
            group: "example.dev".into(),
            resource: "widgets".into(),
        }
    }

    #[test]
    fn stale_update_reads_like_kube_apiserver() {
        let status = ApiError::stale(widgets(), "x").to_status();
        assert_eq!(
            status["message"],
            "Operation cannot be fulfilled on widgets.example.dev \"x\": the object has been \
             modified; please apply your changes to the latest version and try again"
        );
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["code"], 409);
        assert_eq!(status["details"]["name"], "x");
        assert_eq!(status["details"]["group"], "example.dev");
        assert_eq!(status["details"]["kind"], "widgets");
    }

    #[test]
    fn core_group_not_found_omits_the_group() {
        let gr = GroupResource {
            group: String::new(),
            resource: "namespaces".into(),
        };
        let status = ApiError::NotFound {
            gr,
            name: "x".into(),
        }
        .to_status();
        assert_eq!(status["message"], "namespaces \"x\" not found");
        assert_eq!(status["code"], 404);
        assert!(status["details"].get("group").is_none());
    }
}
