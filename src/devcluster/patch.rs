//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and, for built-ins,
//! strategic merge patch.
//!
//! Simplifications, as kube-apiserver would not make them: a strategic merge patch is applied
//! as a merge patch after its directives are honoured or dropped (`$patch: delete` removes the
//! map, `$patch: replace` replaces it, `$retainKeys`, `$setElementOrder/...` and
//! `$deleteFromPrimitiveList/...` are ignored), so lists are replaced rather than merged by
//! key. Custom resources refuse strategic merge patch with 415, exactly as kube-apiserver does
//! (so `kubectl patch` needs `--type merge` or `--type json` for them, as on a real cluster).
//! Server-side apply (`application/apply-patch+yaml`) is not a body applied here: `apply.rs`
//! and `managed` handle it.

use serde_json::{json, Map, Value};

use super::status::ApiError;

/// The PATCH flavours, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, see `apply.rs`).
    Apply,
}

impl PatchKind {
    /// The kind a `Content-Type` names (parameters such as `charset` ignored).
    pub fn from_content_type(content_type: &str) -> Option<PatchKind> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

/// The 415 kube-apiserver returns for a patch type a resource does not accept.
pub fn unsupported(builtin: bool) -> ApiError {
    let accepted = if builtin {
        "application/json-patch+json, application/merge-patch+json, \
         application/strategic-merge-patch+json"
    } else {
        "application/json-patch+json, application/merge-patch+json"
    };
    ApiError::UnsupportedMediaType(format!(
        "the body of the request was in an unknown format - accepted media types include: \
         {accepted}"
    ))
}

/// Applies a patch body to `current` (the object as the client's version shows it).
///
/// # Errors
/// 400 BadRequest for a body that does not decode; 422 for a JSON patch whose operations fail
/// (a `test` that does not hold, a path that does not exist); 415 for server-side apply, which
/// is not a body this function applies (`write::patch` routes it to `apply.rs`).
pub fn apply(kind: PatchKind, current: &Value, body: &[u8]) -> Result<Value, ApiError> {
    match kind {
        PatchKind::Apply => Err(ApiError::UnsupportedMediaType(
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json (server-side apply is \
             not supported by agentrt dev; use client-side kubectl apply)"
                .to_string(),
        )),
        PatchKind::Json => {
            let patch: json_patch::Patch = super::depth::decode(body)
                .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
                .map_err(|e| ApiError::BadRequest(format!("error decoding patch: {e}")))?;
            if patch.0.len() > 10_000 {
                return Err(ApiError::TooLarge(format!(
                    "The allowed maximum operations in a JSON patch is 10000, got {}",
                    patch.0.len()
                )));
            }
            let mut doc = current.clone();
            json_patch::patch(&mut doc, &patch).map_err(|_| {
                // kube-apiserver's answer carries no cause for a failed operation.
                ApiError::Invalid(json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure",
                    "message": "the server rejected our request due to an error in our request",
                    "reason": "Invalid",
                    "details": {},
                    "code": 422,
                }))
            })?;
            Ok(doc)
        }
        PatchKind::Merge | PatchKind::Strategic => {
            let mut patch: Value = super::depth::decode(body)
                .map_err(|e| ApiError::BadRequest(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::BadRequest(
                    "error decoding patch: a merge patch must be a JSON object".to_string(),
                ));
            }
            let mut doc = current.clone();
            if kind == PatchKind::Strategic {
                strategic_merge(&mut doc, &mut patch);
            } else {
                json_patch::merge(&mut doc, &patch);
            }
            Ok(doc)
        }
    }
}

fn strategic_merge(doc: &mut Value, patch: &mut Value) {
    let Some(pmap) = patch.as_object_mut() else {
        *doc = patch.clone();
        return;
    };
    let directive = pmap.remove("$patch");
    pmap.retain(|k, _| !k.starts_with('$'));
    match directive.as_ref().and_then(Value::as_str) {
        Some("delete") => {
            *doc = Value::Null;
            return;
        }
        Some("replace") => {
            *doc = Value::Object(pmap.clone());
            return;
        }
        _ => {}
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Some(dmap) = doc.as_object_mut() else {
        return;
    };
    for (k, pv) in pmap.iter_mut() {
        if pv.is_null() {
            dmap.remove(k);
        } else if pv.is_object() {
            let entry = dmap.entry(k.clone()).or_insert(Value::Null);
            strategic_merge(entry, pv);
            if entry.is_null() {
                dmap.remove(k);
            }
        } else {
            dmap.insert(k.clone(), pv.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_sets_and_removes_fields() {
        let cur = json!({"spec": {"a": 1, "b": 2}});
        let out = apply(PatchKind::Merge, &cur, br#"{"spec":{"a":null,"c":3}}"#);
        assert_eq!(out.ok(), Some(json!({"spec": {"b": 2, "c": 3}})));
    }

    #[test]
    fn failing_json_patch_test_is_invalid() {
        let cur = json!({"spec": {"a": 1}});
        let body = br#"[{"op":"test","path":"/spec/a","value":2}]"#;
        match apply(PatchKind::Json, &cur, body) {
            Err(e) => assert_eq!(e.code(), http::StatusCode::UNPROCESSABLE_ENTITY),
            Ok(v) => panic!("patched: {v}"),
        }
        let ok = br#"[{"op":"replace","path":"/spec/a","value":2}]"#;
        assert_eq!(
            apply(PatchKind::Json, &cur, ok).ok(),
            Some(json!({"spec": {"a": 2}}))
        );
    }

    #[test]
    fn strategic_directives_are_honoured_or_dropped() {
        let cur = json!({"data": {"a": "1"}, "metadata": {"labels": {"x": "y"}}});
        let body = br#"{"$setElementOrder/x":[],"metadata":{"labels":{"$patch":"delete"}},"data":{"b":"2"}}"#;
        assert_eq!(
            apply(PatchKind::Strategic, &cur, body).ok(),
            Some(json!({"data": {"a": "1", "b": "2"}, "metadata": {}}))
        );
    }

    #[test]
    fn garbage_is_a_bad_request() {
        let e = apply(PatchKind::Merge, &json!({}), b"{nope");
        assert!(matches!(e, Err(ApiError::BadRequest(_))));
    }
}
