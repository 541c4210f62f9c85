//! List pagination (`limit` and `continue`) as kube-apiserver's etcd3 storage answers it.
//!
//! This room owns the continue token (base64url, unpadded, of
//! `{"v":"meta.k8s.io/v1","rv":<rv>,"start":"<key>\u0000"}` where the key is the object's
//! storage key relative to the listed prefix: `/{name}` in a namespace or for a cluster-scoped
//! type, `/{namespace}/{name}` across namespaces), its validation with kube-apiserver's messages,
//! and the cutting of one page out of a list:
//!
//! - items come in storage-key order; a page holds at most `limit` items that match the
//!   selectors; `metadata.continue` is set when any key (matching or not) follows the page's
//!   last item, and `metadata.remainingItemCount` (the keys after it) only without selectors;
//! - every page of one list is served at the first page's resourceVersion (a consistent
//!   snapshot, rebuilt from the change history); a token older than the history answers 410
//!   `Expired` with a token (`rv: -1`) that continues inconsistently at the latest state;
//! - `resourceVersion=N&resourceVersionMatch=Exact` lists the snapshot at N (410 when the
//!   history no longer reaches it), and its pages continue at N;
//! - `limit` is ignored with `resourceVersion=0` (kube-apiserver serves those from its cache),
//!   and a `metadata.name=` field selector lists one key, so it never paginates.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{json, Value};

use super::schema::{invalid_status, FieldError, FieldErrorKind};
use super::status::ApiError;
use super::store::{ObjKey, Store};

const TOKEN_VERSION: &str = "meta.k8s.io/v1";

/// What a list request asked of pagination.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PageRequest {
    /// `limit` (`None` or 0: everything).
    pub limit: Option<u64>,
    /// The decoded `continue` token.
    pub continue_from: Option<ContinueToken>,
    /// `resourceVersion=N&resourceVersionMatch=Exact`: the list as it was at N.
    pub exact: Option<u64>,
}

/// A decoded continue token.
#[derive(Debug, Clone, PartialEq)]
pub struct ContinueToken {
    /// The resourceVersion of the list's first page (`-1`: the latest).
    pub rv: i64,
    /// The first relative key the next page may hold (inclusive).
    pub start: String,
}

fn bad(message: String) -> ApiError {
    ApiError::BadRequest(format!("invalid continue token: {message}"))
}

impl PageRequest {
    /// Reads `limit`, `continue` and `resourceVersion` from a list's query parameters.
    ///
    /// # Errors
    /// 400 BadRequest for a `limit` that is not an integer, an undecodable or invalid continue
    /// token, or a `resourceVersion` given with `continue`.
    pub fn parse(
        limit: Option<&str>,
        continue_: Option<&str>,
        resource_version: Option<&str>,
    ) -> Result<PageRequest, ApiError> {
        let limit = match limit.filter(|l| !l.is_empty()) {
            None => None,
            Some(l) => {
                let n: i64 = l.parse().map_err(|_| {
                    ApiError::BadRequest(format!("strconv.ParseInt: parsing {l:?}: invalid syntax"))
                })?;
                u64::try_from(n).ok().filter(|n| *n > 0)
            }
        };
        let continue_from = match continue_.filter(|c| !c.is_empty()) {
            None => None,
            Some(token) => {
                if resource_version.is_some_and(|rv| !rv.is_empty() && rv != "0") {
                    return Err(ApiError::BadRequest(
                        "specifying resource version is not allowed when using continue".into(),
                    ));
                }
                Some(ContinueToken::decode(token)?)
            }
        };
        // kube-apiserver serves `resourceVersion=0` lists from its watch cache, which ignores
        // the limit.
        let limit = if continue_from.is_none() && resource_version == Some("0") {
            None
        } else {
            limit
        };
        Ok(PageRequest {
            limit,
            continue_from,
            exact: None,
        })
    }

    /// Adds `resourceVersionMatch`, checked as kube-apiserver's ListOptions validation does.
    ///
    /// # Errors
    /// 422 Invalid on `ListOptions` for an unknown match, a match without a resourceVersion, or
    /// `Exact` at `0`; 400 for a resourceVersion that is not a number.
    pub fn with_match(
        mut self,
        resource_version: Option<&str>,
        version_match: Option<&str>,
    ) -> Result<PageRequest, ApiError> {
        let rv = resource_version.unwrap_or("");
        let m = version_match.unwrap_or("");
        let refuse = |kind, bad_value, detail: String| {
            let error = FieldError {
                kind,
                field: "resourceVersionMatch".into(),
                bad_value,
                detail,
            };
            Err(ApiError::Invalid(invalid_status(
                "ListOptions",
                "meta.k8s.io",
                "",
                &[error],
            )))
        };
        if !matches!(m, "" | "Exact" | "NotOlderThan") {
            return refuse(
                FieldErrorKind::NotSupported,
                Some(json!(m)),
                "supported values: \"Exact\", \"NotOlderThan\", \"\"".into(),
            );
        }
        if !m.is_empty() && rv.is_empty() {
            return refuse(
                FieldErrorKind::Forbidden,
                None,
                "resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
            );
        }
        if m == "Exact" && rv == "0" {
            return refuse(
                FieldErrorKind::Forbidden,
                None,
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"".into(),
            );
        }
        let parsed = match rv {
            "" => None,
            rv => Some(rv.parse::<u64>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "invalid resource version: resourceVersion: Invalid value: {rv:?}: \
                     strconv.ParseUint: parsing {rv:?}: invalid syntax"
                ))
            })?),
        };
        if m == "Exact" {
            self.exact = parsed;
        }
        Ok(self)
    }
}

impl ContinueToken {
    /// Decodes and checks a `continue` value as kube-apiserver's `storage.DecodeContinue` does.
    ///
    /// # Errors
    /// 400 BadRequest `invalid continue token: continue key is not valid: ...`.
    pub fn decode(token: &str) -> Result<ContinueToken, ApiError> {
        let data = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.trim_end_matches('='))
            .map_err(|e| bad(format!("continue key is not valid: {e}")))?;
        let parsed: Value = serde_json::from_slice(&data)
            .map_err(|e| bad(format!("continue key is not valid: {e}")))?;
        let version = parsed["v"].as_str().unwrap_or("");
        if version != TOKEN_VERSION {
            return Err(bad(format!(
                "continue key is not valid: server does not recognize this encoded version \
                 {version:?}"
            )));
        }
        let rv = parsed["rv"].as_i64().unwrap_or(0);
        if rv == 0 {
            return Err(bad(format!(
                "continue key is not valid: incorrect encoded start resourceVersion (version \
                 {TOKEN_VERSION})"
            )));
        }
        let start = parsed["start"].as_str().unwrap_or("");
        if start.is_empty() {
            return Err(bad(format!(
                "continue key is not valid: encoded start key empty (version {TOKEN_VERSION})"
            )));
        }
        let key = if start.starts_with('/') {
            start.to_string()
        } else {
            format!("/{start}")
        };
        if clean(&key) != key {
            return Err(bad(format!("continue key is not valid: {start}")));
        }
        Ok(ContinueToken { rv, start: key })
    }

    /// The token's wire form.
    pub fn encode(&self) -> String {
        // Fields in Go's struct order (`v`, `rv`, `start`), as kube-apiserver writes them.
        let body = format!(
            "{{\"v\":\"{TOKEN_VERSION}\",\"rv\":{},\"start\":{}}}",
            self.rv,
            Value::String(self.start.clone())
        );
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(body)
    }
}

/// Go's `path.Clean` for an absolute path: no empty, `.` or `..` segments, no trailing slash.
fn clean(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    format!("/{}", out.join("/"))
}

/// The storage key of an object relative to the listed prefix.
fn relative_key(key: &ObjKey, across_namespaces: bool) -> String {
    if across_namespaces && !key.namespace.is_empty() {
        format!("/{}/{}", key.namespace, key.name)
    } else {
        format!("/{}", key.name)
    }
}

/// One page of a list: the objects (storage form) and the list metadata to send.
pub struct Page {
    /// The page's objects, in storage-key order.
    pub items: Vec<Arc<Value>>,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
    /// `metadata.continue`, when more keys follow.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`, when known.
    pub remaining: Option<u64>,
}

impl Page {
    /// The list metadata kube-apiserver writes for this page. A list of custom resources
    /// (`unstructured` in kube-apiserver) always carries `continue`, empty on the last page;
    /// built-in lists and Tables leave it out then.
    pub fn metadata(&self, always_continue: bool) -> Value {
        let mut meta = serde_json::Map::new();
        meta.insert("resourceVersion".into(), json!(self.resource_version));
        match &self.continue_token {
            Some(c) => {
                meta.insert("continue".into(), json!(c));
            }
            None if always_continue => {
                meta.insert("continue".into(), json!(""));
            }
            None => {}
        }
        if let Some(n) = self.remaining {
            meta.insert("remainingItemCount".into(), json!(n));
        }
        Value::Object(meta)
    }
}

/// How a list selects its keys.
pub struct ListScope<'a> {
    /// The type's storage.
    pub storage: &'a str,
    /// The namespace listed (`None`: all, or a cluster-scoped type).
    pub namespace: Option<&'a str>,
    /// Whether the type is namespaced (keys across namespaces carry the namespace).
    pub namespaced: bool,
    /// Whether any label or field selector filters the list.
    pub filtered: bool,
    /// A `metadata.name=` field selector (kube-apiserver reads that one key: no paging).
    pub single_name: bool,
}

/// Cuts the page `req` asks for out of the store, keeping the objects `matches` accepts.
///
/// # Errors
/// 410 Expired (with an inconsistent continue token) when the token's resourceVersion is older
/// than the history kept.
pub fn page(
    store: &Store,
    scope: &ListScope<'_>,
    req: &PageRequest,
    matches: impl Fn(&Value) -> bool,
) -> Result<Page, ApiError> {
    let across = scope.namespaced && scope.namespace.is_none();
    let (objects, rv) = match (&req.continue_from, req.exact) {
        (None, Some(rv)) => match store.list_at(scope.storage, scope.namespace, rv) {
            Ok(objects) => (objects, rv),
            // A version ahead of the store is served as the latest (kube-apiserver waits for
            // it, then times out).
            Err(_) if rv > store.rv() => (
                store
                    .list(scope.storage, scope.namespace)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>(),
                store.rv(),
            ),
            Err(_) => {
                return Err(ApiError::Expired(
                    "The resourceVersion for the provided list is too old.".into(),
                ))
            }
        },
        (Some(token), _) if token.rv > 0 => {
            let rv = u64::try_from(token.rv).unwrap_or(0);
            match store.list_at(scope.storage, scope.namespace, rv) {
                Ok(objects) => (objects, rv),
                Err(_) => {
                    let fresh = ContinueToken {
                        rv: -1,
                        start: token.start.clone(),
                    };
                    return Err(ApiError::ExpiredContinue {
                        continue_token: fresh.encode(),
                    });
                }
            }
        }
        (_, _) => (
            store
                .list(scope.storage, scope.namespace)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            store.rv(),
        ),
    };
    let mut keyed: Vec<(String, Arc<Value>)> = objects
        .into_iter()
        .map(|(k, v)| (relative_key(&k, across), v))
        .collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(token) = &req.continue_from {
        keyed.retain(|(k, _)| k.as_str() >= token.start.as_str());
    }
    let limit = if scope.single_name { None } else { req.limit };
    let mut items = Vec::new();
    let mut last_examined = None;
    let mut more = false;
    for (i, (key, object)) in keyed.iter().enumerate() {
        if limit.is_some_and(|l| items.len() as u64 >= l) {
            more = true;
            break;
        }
        last_examined = Some((i, key));
        if matches(object) {
            items.push(object.clone());
        }
    }
    let (continue_token, remaining) = match (more, last_examined) {
        (true, Some((i, key))) => {
            let token = ContinueToken {
                rv: i64::try_from(rv).unwrap_or(i64::MAX),
                start: format!("{key}\u{0}"),
            };
            let remaining = (!scope.filtered).then(|| (keyed.len() - i - 1) as u64);
            (Some(token.encode()), remaining)
        }
        _ => (None, None),
    };
    Ok(Page {
        items,
        resource_version: rv.to_string(),
        continue_token,
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::store::ChangeKind;

    fn store_with(names: &[&str]) -> Store {
        let mut s = Store::new(100, 10);
        for n in names {
            s.put(
                ObjKey {
                    storage: Arc::from("configmaps"),
                    namespace: "pg".into(),
                    name: n.to_string(),
                },
                json!({"metadata": {"name": n, "namespace": "pg"}}),
                ChangeKind::Added,
            );
        }
        s
    }

    fn scope() -> ListScope<'static> {
        ListScope {
            storage: "configmaps",
            namespace: Some("pg"),
            namespaced: true,
            filtered: false,
            single_name: false,
        }
    }

    fn names(p: &Page) -> Vec<String> {
        p.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn tokens_round_trip_in_kube_apiservers_form() {
        let t = ContinueToken {
            rv: 270,
            start: "/cm2\u{0}".into(),
        };
        assert_eq!(
            t.encode(),
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjcwLCJzdGFydCI6Ii9jbTJcdTAwMDAifQ"
        );
        assert_eq!(ContinueToken::decode(&t.encode()).ok(), Some(t));
    }

    #[test]
    fn invalid_tokens_are_bad_requests() {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        for body in [
            r#"{"v":"x","rv":1,"start":"/a"}"#,
            r#"{"v":"meta.k8s.io/v1","rv":0,"start":"/a"}"#,
            r#"{"v":"meta.k8s.io/v1","rv":1,"start":""}"#,
            r#"{"v":"meta.k8s.io/v1","rv":1,"start":"/../a"}"#,
        ] {
            assert!(matches!(
                ContinueToken::decode(&enc(body)),
                Err(ApiError::BadRequest(_))
            ));
        }
        assert!(ContinueToken::decode("garbage").is_err());
    }

    #[test]
    fn pages_follow_a_consistent_snapshot() {
        let mut s = store_with(&["cm1", "cm2", "cm3", "cm4", "cm5"]);
        let req = PageRequest {
            limit: Some(2),
            continue_from: None,
            exact: None,
        };
        let first = page(&s, &scope(), &req, |_| true).expect("page");
        assert_eq!(names(&first), ["cm1", "cm2"]);
        assert_eq!(first.remaining, Some(3));
        let token = first.continue_token.clone().expect("more");
        s.put(
            ObjKey {
                storage: Arc::from("configmaps"),
                namespace: "pg".into(),
                name: "cm25".into(),
            },
            json!({"metadata": {"name": "cm25"}}),
            ChangeKind::Added,
        );
        let req = PageRequest {
            limit: Some(2),
            continue_from: Some(ContinueToken::decode(&token).expect("token")),
            exact: None,
        };
        let second = page(&s, &scope(), &req, |_| true).expect("page");
        assert_eq!(names(&second), ["cm3", "cm4"]);
        assert_eq!(second.resource_version, first.resource_version);
        assert_eq!(second.remaining, Some(1));
    }

    #[test]
    fn a_full_last_page_has_no_continue() {
        let s = store_with(&["a", "b"]);
        let req = PageRequest {
            limit: Some(2),
            continue_from: None,
            exact: None,
        };
        let p = page(&s, &scope(), &req, |_| true).expect("page");
        assert_eq!(p.continue_token, None);
        assert_eq!(p.remaining, None);
    }

    #[test]
    fn exact_lists_serve_the_snapshot_or_expire() {
        let mut s = store_with(&["a", "b"]);
        let at = s.rv();
        s.put(
            ObjKey {
                storage: Arc::from("configmaps"),
                namespace: "pg".into(),
                name: "c".into(),
            },
            json!({"metadata": {"name": "c"}}),
            ChangeKind::Added,
        );
        let req = PageRequest::default()
            .with_match(Some(&at.to_string()), Some("Exact"))
            .expect("valid");
        let p = page(&s, &scope(), &req, |_| true).expect("page");
        assert_eq!(names(&p), ["a", "b"]);
        let req = PageRequest::default()
            .with_match(Some("1"), Some("Exact"))
            .expect("valid");
        assert!(matches!(
            page(&s, &scope(), &req, |_| true),
            Err(ApiError::Expired(_))
        ));
        for (rv, m) in [(Some("0"), "Exact"), (None, "Exact"), (Some("5"), "Bogus")] {
            let r = PageRequest::default().with_match(rv, Some(m));
            assert!(matches!(r, Err(ApiError::Invalid(_))), "{rv:?} {m}");
        }
    }

    #[test]
    fn limit_is_ignored_at_resource_version_zero() {
        let req = PageRequest::parse(Some("2"), None, Some("0")).expect("parse");
        assert_eq!(req.limit, None);
        assert!(PageRequest::parse(Some("x"), None, None).is_err());
    }
}
