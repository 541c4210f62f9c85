//! Server-side apply (`PATCH` with `application/apply-patch+yaml`) and the managedFields every
//! other write records, as kube-apiserver: the request checks and messages of an apply (its
//! `fieldManager`, the configuration's apiVersion, kind, name and managedFields), create when
//! absent, the status subresource split, and the hand-over to the write verbs (`write.rs`).
//! The merge, ownership and conflict rules themselves live in `managed`.

use serde_json::{json, Value};

use super::convert::from_storage;
use super::managed::{self, ApplyError};
use super::meta::{self, meta_str, set_meta};
use super::route::Target;
use super::status::ApiError;
use super::store::Store;
use super::write::{self, WriteOpts, Written};

/// kube-apiserver's 422 for a write option that is wrong, e.g. `PatchOptions.meta.k8s.io ""
/// is invalid: fieldManager: Required value: is required for apply patch` (`options` is
/// `CreateOptions`, `UpdateOptions` or `PatchOptions`).
pub fn options_invalid(options: &str, field: &str, reason: &str, message: &str) -> ApiError {
    ApiError::Invalid(json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("{options}.meta.k8s.io \"\" is invalid: {field}: {message}"),
        "reason": "Invalid",
        "details": {"group": "meta.k8s.io", "kind": options,
                    "causes": [{"reason": reason, "message": message, "field": field}]},
        "code": 422,
    }))
}

/// The field manager of a write: `?fieldManager=`, else the User-Agent's program name (before
/// the first `/`, printable characters, at most 128), else `unknown`.
pub fn manager_of(field_manager: Option<&str>, user_agent: &str) -> String {
    if let Some(m) = field_manager.filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    let program: String = user_agent
        .split('/')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if program.is_empty() {
        "unknown".to_string()
    } else {
        program
    }
}

/// Decodes an apply body (YAML, of which JSON is a subset) into a JSON object.
fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let yaml: serde_yaml::Value = serde_yaml::from_slice(body).map_err(|e| {
        ApiError::BadRequest(format!(
            "error decoding YAML: error converting YAML to JSON: yaml: {e}"
        ))
    })?;
    serde_json::to_value(yaml).map_err(|e| {
        ApiError::BadRequest(format!(
            "error decoding YAML: error converting YAML to JSON: {e}"
        ))
    })
}

/// The configuration checks kube-apiserver makes before merging: a JSON object with apiVersion
/// and kind of the URL's type, the URL's name, no managedFields.
fn check_config(t: &Target, name: &str, config: Value) -> Result<Value, ApiError> {
    if !config.is_object() {
        return Err(ApiError::BadRequest(
            "the body of the request must be a JSON object".to_string(),
        ));
    }
    let av = config["apiVersion"].as_str().unwrap_or("");
    let kind = config["kind"].as_str().unwrap_or("");
    if av.is_empty() || kind.is_empty() {
        let (group, version) = av.rsplit_once('/').unwrap_or(("", av));
        return Err(ApiError::BadRequest(format!(
            "invalid object type: {group}/{version}, Kind={kind}"
        )));
    }
    if meta::meta(&config).is_some_and(|m| m.contains_key("managedFields")) {
        return Err(ApiError::BadRequest(
            "metadata.managedFields must be nil".to_string(),
        ));
    }
    let body_name = meta_str(&config, "name");
    if body_name.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({name} based on URL) was undeterminable: name must be \
             provided"
        )));
    }
    if body_name != name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let mut config = super::intake::check_body(t, config)?;
    super::intake::settle_namespace(t, &mut config)?;
    Ok(config)
}

/// What of a configuration an endpoint applies: on a type with a status subresource, the main
/// endpoint ignores `status` and `/status` applies only `status`.
fn endpoint_part(t: &Target, mut config: Value) -> Value {
    if !t.rt.has_status(&t.version) {
        return config;
    }
    if let Some(map) = config.as_object_mut() {
        if t.status {
            map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"));
        } else {
            map.remove("status");
        }
    }
    config
}

/// PATCH with `application/apply-patch+yaml`: merges the configuration into the object (or
/// creates it), with `opts.manager` owning what it applies.
///
/// # Errors
/// 400 for a body that is not a configuration of this object, 404 for `/status` of a missing
/// object, 409 Conflict (`FieldManagerConflict` causes) when the configuration changes fields
/// other managers own and `opts.force` is not set, 409 for a stale `resourceVersion`, and the
/// errors of create and update (422 for an invalid result).
pub fn apply(
    store: &mut Store,
    t: &Target,
    body: &[u8],
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let name = t.require_name()?.to_string();
    let raw = decode(body)?;
    let sent_namespace = meta_str(&raw, "namespace").to_string();
    let config = check_config(t, &name, raw)?;
    let key = t.key(&name);
    let stored = store.get(&key).cloned();
    let live = stored.as_ref().map(|s| from_storage(&t.rt, &t.version, s));
    if live.is_none() && t.status {
        return Err(ApiError::NotFound { gr: t.gr(), name });
    }
    let mut config = endpoint_part(t, config);
    if t.status {
        // `/status` applies only status: the rest of metadata is not the applier's there.
        let metadata = json!({"name": name, "namespace": meta_str(&config, "namespace")});
        if let Some(map) = config.as_object_mut() {
            map.insert("metadata".into(), metadata);
        }
    }
    if live.is_none() {
        // A resourceVersion means nothing to an object that does not exist yet.
        set_meta(&mut config, "resourceVersion", None);
    }
    let Some(version) = t.rt.version(&t.version) else {
        return Err(ApiError::NoRoute);
    };
    let writer = managed::Writer {
        manager: opts.manager.clone(),
        subresource: if t.status {
            "status".into()
        } else {
            String::new()
        },
        api_version: t.rt.api_version(&t.version),
        now: meta::now_rfc3339(),
    };
    let (object, _changed) =
        managed::apply(live.as_ref(), &config, &version.shape, &writer, opts.force).map_err(
            |e| match e {
                ApplyError::Conflict(status) => ApiError::ApplyConflict(status),
                ApplyError::Undeclared(why) => ApiError::TypedPatch(format!(
                    "failed to create typed patch object ({sent_namespace}/{name}; {}, Kind={}): \
                     {why}",
                    writer.api_version, t.rt.kind
                )),
            },
        )?;
    let opts = WriteOpts {
        applied: true,
        from_patch: true,
        ..opts.clone()
    };
    match stored {
        None => write::create(store, t, object, &opts),
        Some(old) => write::apply_update(store, t, &key, object, &old, &opts),
    }
}

/// What an Update's managedFields are computed from.
pub(super) struct View<'a> {
    /// For built-ins, the object before the server's own rules (`builtin_view`): what the
    /// server sets there (a namespace's `spec.finalizers` and `status.phase`) is nobody's, as
    /// on kube-apiserver, where the field manager runs before the strategy.
    pub tracked: Option<&'a Value>,
    /// The object the client sent (its managedFields are the base when it sends some).
    pub request: &'a Value,
    /// The object replaced (`{}` on create).
    pub old: &'a Value,
}

/// Applies the defaults kube-apiserver's decoder gives a built-in object (a Secret's `type:
/// Opaque`, a namespace's `kubernetes.io/metadata.name` label), then returns the object as the
/// field manager sees it: unknown fields dropped, numbers stored as Kubernetes stores them,
/// before the server's own rules. `None` for custom resources (their schema defaults are
/// applied in admission and are their writer's).
pub(super) fn builtin_view(t: &Target, object: &mut Value) -> Option<Value> {
    use super::registry::Builtin;
    let kind = t.rt.builtin()?;
    match kind {
        Builtin::Secret
            if object
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            if let Some(map) = object.as_object_mut() {
                map.insert("type".into(), json!("Opaque"));
            }
        }
        Builtin::Namespace => {
            let name = meta_str(object, "name").to_string();
            if let Some(m) = meta::meta_mut(object) {
                let labels = m.entry("labels").or_insert_with(|| json!({}));
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
        }
        _ => {}
    }
    let mut view = object.clone();
    super::fields::prune_unknown(kind, &mut view);
    meta::normalize_numbers(&mut view);
    Some(view)
}

/// Sets `metadata.managedFields` of `new` (the object about to be stored): server-side
/// apply's entries as the request carries them, none when the request resets them
/// (`managedFields: [{}]`), else the entries of an Update by `opts.manager` (see
/// `managed::record_update`) from `view.old` to `view.tracked` (or `new`).
pub(super) fn record_managed(
    t: &Target,
    new: &mut Value,
    view: &View<'_>,
    opts: &WriteOpts,
    now: &str,
) {
    let request = view.request;
    let fields = if opts.applied {
        meta::meta(request)
            .and_then(|m| m.get("managedFields"))
            .cloned()
    } else if managed::resets(request) {
        None
    } else {
        let Some(version) = t.rt.version(&t.version) else {
            return;
        };
        let writer = managed::Writer {
            manager: if opts.manager.is_empty() {
                "agentrt-dev".to_string()
            } else {
                opts.manager.clone()
            },
            subresource: if t.status {
                "status".into()
            } else {
                String::new()
            },
            api_version: t.rt.api_version(&t.version),
            now: now.to_string(),
        };
        let base = managed::base_entries(request, view.old);
        let target = view.tracked.unwrap_or(new);
        let zero;
        let old = if view.old.as_object().is_some_and(|o| o.is_empty()) {
            zero = managed::zero_value(&t.rt.kind);
            &zero
        } else {
            view.old
        };
        let entries = managed::record_update(base, old, target, &version.shape, &writer);
        // No entries: the field is left out, as kube-apiserver leaves it.
        Some(managed::encode(&entries)).filter(|l| l.as_array().is_some_and(|a| !a.is_empty()))
    };
    set_meta(new, "managedFields", fields);
}
