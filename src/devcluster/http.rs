//! The HTTP layer: one axum fallback handler that authenticates (bearer token, or the token
//! path prefix of `kubeconfig.rs`), routes the
//! path (`route.rs`), parses query parameters and bodies, takes the store lock around one
//! verb (`write.rs`, `delete.rs`), and writes JSON responses, Tables (`table.rs`), watch
//! streams (`watch.rs`), `Warning: 299` headers and `Status` errors (`status.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde_json::{json, Value};

use super::convert::from_storage;
use super::delete::{self, DeleteOpts, Propagation};
use super::discovery;
use super::openapi;
use super::paging::{self, ListScope, PageRequest};
use super::patch::PatchKind;
use super::registry::Flavor;
use super::route::{self, ResourcePath, Route, Target};
use super::schema::{invalid_status, FieldError, FieldErrorKind, FieldValidation};
use super::selectors::{selectable_fields, unknown_field_message, FieldSelector, LabelSelector};
use super::server::Shared;
use super::status::ApiError;
use super::table::{self, IncludeObject};
use super::watch::{self, WatchParams};
use super::write::{self, WriteOpts, Written};

/// Largest request body accepted (kube-apiserver's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// The router serving every path.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

type Params = HashMap<String, String>;

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut path = parts.uri.path().to_string();
    if let Some(token) = &shared.token {
        let expected = format!("Bearer {token}");
        let given = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let prefix = super::kubeconfig::token_prefix(token);
        let by_path = match path.strip_prefix(&prefix) {
            Some(rest) if rest.is_empty() || rest.starts_with('/') => Some(rest.to_string()),
            _ => None,
        };
        match by_path {
            Some(rest) => path = rest,
            None if given == Some(expected.as_str()) => {}
            None => return error(&ApiError::Unauthorized),
        }
    }
    // It has no authorization, so it cannot act as another user: a request asking to
    // (`kubectl --as`, `agentrt --as`) is refused rather than done as the admin it always is.
    if parts
        .headers
        .keys()
        .any(|name| name.as_str().starts_with("impersonate-"))
    {
        return error(&ApiError::Forbidden {
            gr: super::status::GroupResource {
                group: String::new(),
                resource: "users".to_string(),
            },
            name: String::new(),
            message: "agentrt dev has no authorization and cannot impersonate (--as, \
                      --as-group); run against a real cluster to act as another user"
                .to_string(),
        });
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return error(&ApiError::TooLarge(
                "the request body is larger than 3 MiB".to_string(),
            ))
        }
    };
    let params: Params = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map(|q| q.0.into_iter().collect())
        .unwrap_or_default();
    tracing::debug!(method = %parts.method, uri = %parts.uri, "request");
    let audited = shared.audit.as_ref().and_then(|log| {
        let watch = params.get("watch").is_some_and(|w| w == "true" || w == "1");
        super::audit::entry(&parts.method, &path, watch).map(|e| (log, e))
    });
    let response = if parts.method == Method::POST
        && path.trim_end_matches('/') == super::audit::SELF_SUBJECT_REVIEWS
    {
        json_response(
            StatusCode::CREATED,
            &super::audit::self_subject_review(),
            &[],
        )
    } else if path.trim_end_matches('/') == super::review::SELF_SUBJECT_ACCESS_REVIEWS {
        match parts.method {
            Method::POST => match parse_body(&parts.headers, &body)
                .and_then(|review| super::review::self_subject_access_review(&review))
            {
                Ok(answer) => json_response(StatusCode::CREATED, &answer, &[]),
                Err(e) => error(&e),
            },
            _ => json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                        "status": "Failure", "reason": "MethodNotAllowed", "details": {},
                        "message": "the server does not allow this method on the requested \
                                    resource", "code": 405}),
                &[],
            ),
        }
    } else {
        match dispatch(&shared, &parts.method, &path, &parts.headers, &params, body) {
            Ok(resp) => resp,
            Err(ApiError::NoRoute) if !answers_not_found_as_status(&path) => page_not_found(),
            Err(e) => error(&e),
        }
    };
    if let Some((log, entry)) = audited {
        let agent = parts
            .headers
            .get(http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        log.record(&entry, response.status().as_u16(), agent);
    }
    response
}

/// Whether kube-apiserver answers an unknown path with a JSON `Status`: under `/api` and the
/// built-in groups (its own API groups end in `.k8s.io`, or carry a legacy name). Unknown
/// groups, CRD groups and other paths get Go's plain-text `404 page not found`.
fn answers_not_found_as_status(path: &str) -> bool {
    const LEGACY: [&str; 6] = [
        "apps",
        "batch",
        "autoscaling",
        "policy",
        "extensions",
        "events",
    ];
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api", ..] => true,
        ["apis", group, _, ..] => group.ends_with(".k8s.io") || LEGACY.contains(group),
        _ => false,
    }
}

/// Go's `http.NotFound`.
fn page_not_found() -> Response {
    let mut resp = (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    let headers = resp.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A `Status` error response.
pub fn error(e: &ApiError) -> Response {
    json_response(e.code(), &e.to_status(), &[])
}

fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut resp = (code, bytes).into_response();
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    add_warnings(headers, warnings);
    resp
}

/// Appends one `Warning: 299 - "<text>"` header per warning.
fn add_warnings(headers: &mut HeaderMap, warnings: &[String]) {
    for w in warnings {
        let escaped = w.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            headers.append("warning", v);
        }
    }
}

fn ok(body: Value) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &body, &[]))
}

fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    params: &Params,
    body: Bytes,
) -> Result<Response, ApiError> {
    let registry = shared.lock().registry();
    match route::parse(path) {
        Route::Version => ok(discovery::version()),
        Route::Health => Ok((StatusCode::OK, "ok").into_response()),
        Route::CoreVersions => ok(discovery::core_versions(&shared.addr.to_string())),
        Route::Groups => ok(discovery::groups(&registry)),
        Route::Group(g) => ok(discovery::group(&registry, &g).ok_or(ApiError::NoRoute)?),
        Route::GroupVersion(g, v) => {
            ok(discovery::resource_list(&registry, &g, &v).ok_or(ApiError::NoRoute)?)
        }
        Route::OpenApiRoot => ok(openapi::root(&registry)),
        Route::OpenApi(g, v) => {
            ok(openapi::group_version(&registry, &g, &v).ok_or(ApiError::NoRoute)?)
        }
        Route::Resource(p) => {
            let t = route::resolve(&registry, &p)?;
            // kube-apiserver warns on every request to a deprecated version.
            let deprecation =
                t.rt.version(&t.version)
                    .and_then(|v| v.deprecation_warning.clone());
            let mut resp = resource(shared, method, &p, t, headers, params, body)?;
            if let Some(w) = deprecation {
                add_warnings(resp.headers_mut(), &[w]);
            }
            Ok(resp)
        }
        Route::Unknown => Err(ApiError::NoRoute),
    }
}

fn flag(params: &Params, name: &str) -> bool {
    matches!(params.get(name).map(String::as_str), Some("true" | "1"))
}

/// `Some(include)` when the Accept header asks for a `meta.k8s.io` Table.
fn table_request(headers: &HeaderMap, params: &Params) -> Option<IncludeObject> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok())?;
    let wants = accept.split(',').any(|media| {
        let parts: Vec<&str> = media.split(';').map(str::trim).collect();
        parts.contains(&"as=Table") && parts.contains(&"g=meta.k8s.io")
    });
    wants.then(|| IncludeObject::parse(params.get("includeObject").map_or("", |s| s.as_str())))
}

/// The write options of a request; `options` names its kind in errors (`PatchOptions`, ...).
fn write_opts(
    params: &Params,
    headers: &HeaderMap,
    options_kind: &str,
) -> Result<WriteOpts, ApiError> {
    if params.get("fieldManager").is_some_and(|m| m.len() > 128) {
        return Err(super::apply::options_invalid(
            options_kind,
            "fieldManager",
            "FieldValueTooLong",
            "Too long: may not be more than 128 bytes",
        ));
    }
    let validation = match params.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            let error = FieldError {
                kind: FieldErrorKind::NotSupported,
                field: "fieldValidation".into(),
                bad_value: Some(json!(other)),
                detail: "supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"".into(),
            };
            return Err(ApiError::Invalid(invalid_status(
                options_kind,
                "meta.k8s.io",
                "",
                &[error],
            )));
        }
    };
    let user_agent = headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Ok(WriteOpts {
        dry_run: params.get("dryRun").is_some_and(|v| v == "All"),
        validation,
        from_patch: false,
        manager: super::apply::manager_of(
            params.get("fieldManager").map(String::as_str),
            user_agent,
        ),
        applied: false,
        force: flag(params, "force"),
    })
}

fn parse_body(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        super::protobuf::decode(body).map_err(ApiError::UnsupportedMediaType)
    } else if content_type.contains("yaml") {
        let yaml: serde_yaml::Value = serde_yaml::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding YAML: {e}")))?;
        serde_json::to_value(yaml)
            .map_err(|e| ApiError::BadRequest(format!("error decoding YAML: {e}")))
    } else {
        super::depth::decode(body).map_err(|e| {
            ApiError::BadRequest(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })
    }
}

fn selectors(t: &Target, params: &Params) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(params.get("labelSelector").map_or("", |s| s.as_str()))
        .map_err(ApiError::BadRequest)?;
    let fields = FieldSelector::parse(
        params.get("fieldSelector").map_or("", |s| s.as_str()),
        &selectable_fields(&t.rt, &t.version),
        |field| unknown_field_message(&t.rt, field),
    )
    .map_err(ApiError::BadRequest)?;
    Ok((labels, fields))
}

fn written(w: Written) -> Response {
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(code, &w.object, &w.warnings)
}

#[allow(clippy::too_many_arguments)]
fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    p: &ResourcePath,
    t: Target,
    headers: &HeaderMap,
    params: &Params,
    body: Bytes,
) -> Result<Response, ApiError> {
    let watch = p.legacy_watch || flag(params, "watch");
    let all_namespaces = t.rt.namespaced && t.namespace.is_none();
    let has_name = t.name.is_some();
    match *method {
        Method::GET if watch => start_watch(shared, t, headers, params),
        Method::GET if has_name => get(shared, &t, headers, params),
        Method::GET if !t.status => list(shared, &t, headers, params),
        Method::POST if !has_name && !t.status && !all_namespaces => {
            let obj = parse_body(headers, &body)?;
            let opts = write_opts(params, headers, "CreateOptions")?;
            let w = write::create(&mut shared.lock(), &t, obj, &opts)?;
            Ok(written(w))
        }
        Method::PUT if has_name => {
            let obj = parse_body(headers, &body)?;
            let opts = write_opts(params, headers, "UpdateOptions")?;
            let w = write::update(&mut shared.lock(), &t, obj, &opts)?;
            if super::meta::is_deleting(&w.object) {
                shared.gc.notify_one();
            }
            Ok(written(w))
        }
        Method::PATCH if has_name => {
            let content_type = headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let kind = PatchKind::from_content_type(content_type)
                .ok_or_else(|| super::patch::unsupported(t.rt.builtin().is_some()))?;
            let opts = write_opts(params, headers, "PatchOptions")?;
            if kind == PatchKind::Apply && params.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(super::apply::options_invalid(
                    "PatchOptions",
                    "fieldManager",
                    "FieldValueRequired",
                    "Required value: is required for apply patch",
                ));
            }
            if kind != PatchKind::Apply && params.contains_key("force") {
                return Err(super::apply::options_invalid(
                    "PatchOptions",
                    "force",
                    "FieldValueForbidden",
                    "Forbidden: may not be specified for non-apply patch",
                ));
            }
            let w = write::patch(&mut shared.lock(), &t, kind, &body, &opts)?;
            if super::meta::is_deleting(&w.object) {
                shared.gc.notify_one();
            }
            Ok(written(w))
        }
        Method::DELETE if !t.status && !all_namespaces => {
            let opts = delete_opts(headers, params, &body)?;
            let result = if has_name {
                delete::delete(&mut shared.lock(), &t, &opts)?
            } else {
                let (labels, fields) = selectors(&t, params)?;
                delete::delete_collection(&mut shared.lock(), &t, &labels, &fields, &opts)?
            };
            shared.gc.notify_one();
            ok(result)
        }
        _ => Err(ApiError::MethodNotAllowed { gr: t.gr() }),
    }
}

fn get(
    shared: &Arc<Shared>,
    t: &Target,
    headers: &HeaderMap,
    params: &Params,
) -> Result<Response, ApiError> {
    let name = t.require_name()?;
    let object = {
        let store = shared.lock();
        let stored = store.get(&t.key(name)).ok_or_else(|| ApiError::NotFound {
            gr: t.gr(),
            name: name.to_string(),
        })?;
        from_storage(&t.rt, &t.version, stored)
    };
    match table_request(headers, params) {
        Some(include) => ok(table::table(&t.rt, &t.version, &[object], None, include)),
        None => ok(object),
    }
}

fn list(
    shared: &Arc<Shared>,
    t: &Target,
    headers: &HeaderMap,
    params: &Params,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(t, params)?;
    let req = PageRequest::parse(
        params.get("limit").map(String::as_str),
        params.get("continue").map(String::as_str),
        params.get("resourceVersion").map(String::as_str),
    )?
    .with_match(
        params.get("resourceVersion").map(String::as_str),
        params.get("resourceVersionMatch").map(String::as_str),
    )?;
    let scope = ListScope {
        storage: &t.rt.storage,
        namespace: t.namespace.as_deref(),
        namespaced: t.rt.namespaced,
        filtered: !labels.is_empty() || !fields.is_empty(),
        single_name: fields.single_name().is_some(),
    };
    let page = {
        let store = shared.lock();
        paging::page(&store, &scope, &req, |v| {
            labels.matches(v) && fields.matches(v)
        })?
    };
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|v| from_storage(&t.rt, &t.version, v))
        .collect();
    if let Some(include) = table_request(headers, params) {
        let mut doc = table::table(&t.rt, &t.version, &items, None, include);
        doc["metadata"] = page.metadata(false);
        return ok(doc);
    }
    ok(json!({
        "kind": t.rt.list_kind,
        "apiVersion": t.rt.api_version(&t.version),
        "metadata": page.metadata(t.rt.flavor == Flavor::Custom),
        "items": items,
    }))
}

fn start_watch(
    shared: &Arc<Shared>,
    mut t: Target,
    headers: &HeaderMap,
    params: &Params,
) -> Result<Response, ApiError> {
    let mut params = params.clone();
    if let Some(name) = t.name.take() {
        // A watch of one object is a watch of the collection selected by name.
        let mut fs = format!("metadata.name={name}");
        if let Some(existing) = params.get("fieldSelector").filter(|s| !s.is_empty()) {
            fs = format!("{existing},{fs}");
        }
        params.insert("fieldSelector".into(), fs);
    }
    let (labels, fields) = selectors(&t, &params)?;
    let send_initial = params.get("sendInitialEvents").map(String::as_str);
    let resource_version = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::BadRequest(format!("invalid resource version: {rv:?}")))?,
        ),
    };
    let initial_events = match send_initial {
        Some("true") => true,
        Some("false") => false,
        _ => resource_version.is_none(),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let wp = WatchParams {
        resource_version,
        initial_events,
        initial_events_end: send_initial == Some("true"),
        bookmarks: flag(&params, "allowWatchBookmarks"),
        timeout,
        labels,
        fields,
        table: table_request(headers, &params),
    };
    let stream = watch::start(shared.clone(), t, wp);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn delete_opts(headers: &HeaderMap, params: &Params, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let options = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_body(headers, body)?
    };
    let policy = options["propagationPolicy"]
        .as_str()
        .or(params.get("propagationPolicy").map(String::as_str))
        .unwrap_or("Background");
    let orphan_legacy = options["orphanDependents"].as_bool() == Some(true)
        || params.get("orphanDependents").is_some_and(|v| v == "true");
    let propagation = match policy {
        "Orphan" => Propagation::Orphan,
        "Background" | "Foreground" | "" if !orphan_legacy => Propagation::Background,
        "Background" | "Foreground" | "" => Propagation::Orphan,
        other => {
            return Err(ApiError::BadRequest(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \
                 \"Foreground\", \"Background\", \"Orphan\""
            )))
        }
    };
    let dry_run = options["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || params.get("dryRun").is_some_and(|v| v == "All");
    Ok(DeleteOpts {
        dry_run,
        propagation,
        uid: options["preconditions"]["uid"].as_str().map(str::to_string),
        resource_version: options["preconditions"]["resourceVersion"]
            .as_str()
            .map(str::to_string),
    })
}
