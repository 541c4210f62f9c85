//! The write verbs (create, update, update of `/status`, patch) with kube-apiserver's rules:
//! system metadata (`uid`, `creationTimestamp`, `generation`, `generateName`), resourceVersion
//! preconditions (409), the status subresource (each endpoint ignores the other half), no-op
//! updates that change nothing (no new resourceVersion, no watch event), finalizers on objects
//! being deleted, built-ins' small rules, and schema admission of custom resources through
//! `schema::CompiledSchema::admit`.
//!
//! Everything runs under the server lock on `&mut Store`; nothing here does I/O.

use serde_json::{json, Value};

use super::convert::{from_storage, to_storage};
use super::crd;
use super::fields;
use super::intake;
use super::intake::{check_body, check_namespace_open, settle_namespace};
use super::meta::{self, meta_str, set_meta};
use super::patch::{self, PatchKind};
use super::registry::{Builtin, Flavor, ResourceType};
use super::route::Target;
use super::schema::{invalid_status, AdmissionError, FieldError, FieldErrorKind, FieldValidation};
use super::status::ApiError;
use super::store::{ChangeKind, ObjKey, Store, CRD_STORAGE};

/// Options shared by the write verbs.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// `dryRun=All`: compute and answer, store nothing.
    pub dry_run: bool,
    /// The `fieldValidation` query parameter.
    pub validation: FieldValidation,
    /// Set by [`patch`]: unknown fields are then reported as kube-apiserver reports them for
    /// patches (422 on `patch`) rather than as a decoding error (400).
    pub from_patch: bool,
    /// The field manager recorded in managedFields (`?fieldManager=`, else the User-Agent's
    /// program name; empty for the server's own writes, recorded as `agentrt-dev`).
    pub manager: String,
    /// Set by server-side apply (`apply.rs`): the object's managedFields are already computed.
    pub applied: bool,
    /// `?force=true` of server-side apply: take fields other managers own.
    pub force: bool,
}

/// What a write produced.
#[derive(Debug)]
pub struct Written {
    /// The object as stored, in the version the client speaks.
    pub object: Value,
    /// Warnings for `Warning: 299` headers.
    pub warnings: Vec<String>,
    /// Whether the write created the object (201 rather than 200).
    pub created: bool,
}

fn invalid(rt: &ResourceType, name: &str, errors: &[FieldError]) -> ApiError {
    ApiError::Invalid(invalid_status(&rt.kind, &rt.group, name, errors))
}

/// Refuses (Strict) or reports (Warn) unknown fields, as kube-apiserver's decoder does: 400
/// `<Kind> in version "<v>" cannot be handled as a <Kind>: strict decoding error: ...` for
/// create and update, 422 on the `patch` field for a patch.
fn strict_error(t: &Target, obj: &Value, messages: &[String], opts: &WriteOpts) -> ApiError {
    let strict = format!("strict decoding error: {}", messages.join(", "));
    if opts.from_patch {
        let patched = serde_json::to_string(obj).unwrap_or_default();
        return ApiError::Invalid(invalid_status(
            "",
            "",
            "",
            &[FieldError {
                kind: FieldErrorKind::Invalid,
                field: "patch".into(),
                bad_value: Some(json!(patched)),
                detail: strict,
            }],
        ));
    }
    ApiError::BadRequest(format!(
        "{kind} in version {version:?} cannot be handled as a {kind}: {strict}",
        kind = t.rt.kind,
        version = t.version
    ))
}

/// Checks fields (built-ins here, custom resources through their schema), runs schema
/// admission of custom resources, and stores numbers as Kubernetes does. Returns warnings.
fn admit(
    t: &Target,
    obj: &mut Value,
    old: Option<&Value>,
    opts: &WriteOpts,
) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    if let Some(kind) = t.rt.builtin() {
        let unknown = fields::prune_unknown(kind, obj);
        if !unknown.is_empty() {
            match opts.validation {
                FieldValidation::Strict => return Err(strict_error(t, obj, &unknown, opts)),
                FieldValidation::Warn => warnings.extend(unknown),
                FieldValidation::Ignore => {}
            }
        }
        meta::normalize_numbers(obj);
    }
    let Some(schema) = t.rt.version(&t.version).and_then(|v| v.schema.clone()) else {
        return Ok(warnings);
    };
    match schema.admit(obj, old, opts.validation) {
        Ok(w) => warnings.extend(w),
        Err(AdmissionError::StrictDecoding(msgs)) => return Err(strict_error(t, obj, &msgs, opts)),
        Err(AdmissionError::Invalid(errors)) => {
            return Err(invalid(&t.rt, meta_str(obj, "name"), &errors))
        }
    }
    Ok(warnings)
}

/// Built-in rules applied to an object being created or updated (in the client's version).
fn prepare_builtin(
    t: &Target,
    obj: &mut Value,
    old: Option<&Value>,
    now: &str,
) -> Result<(), ApiError> {
    match t.rt.builtin() {
        Some(Builtin::Namespace) if old.is_none() => {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Some(Builtin::Secret) => {
            if let Some(map) = obj.as_object_mut() {
                if let Some(Value::Object(string_data)) = map.remove("stringData") {
                    let data = map.entry("data").or_insert_with(|| json!({}));
                    if let Some(data) = data.as_object_mut() {
                        for (k, v) in string_data {
                            use base64::Engine as _;
                            let text = v.as_str().unwrap_or("").as_bytes().to_vec();
                            data.insert(
                                k,
                                json!(base64::engine::general_purpose::STANDARD.encode(text)),
                            );
                        }
                    }
                }
                if map
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    map.insert("type".into(), json!("Opaque"));
                }
            }
        }
        Some(Builtin::Crd) => {
            crd::prepare(obj, old, now);
            let errors = crd::validate(obj);
            if !errors.is_empty() {
                return Err(invalid(&t.rt, meta_str(obj, "name"), &errors));
            }
        }
        _ => {}
    }
    Ok(())
}

/// POST: creates the object `body` (in the client's version).
///
/// # Errors
/// 400 for a body of another kind/version/namespace, 404/403 for a missing/terminating
/// namespace, 409 AlreadyExists, 422 Invalid (names, labels, schema), 500 when a
/// resourceVersion is set.
pub fn create(
    store: &mut Store,
    t: &Target,
    body: Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let rt = t.rt.clone();
    let mut obj = check_body(t, body)?;
    let ns = settle_namespace(t, &mut obj)?;
    let requested = meta_str(&obj, "name").to_string();
    let prefix = meta_str(&obj, "generateName").to_string();
    if requested.is_empty() && prefix.is_empty() {
        return Err(invalid(
            &rt,
            "",
            &[FieldError {
                kind: FieldErrorKind::Required,
                field: "metadata.name".into(),
                bad_value: None,
                detail: "name or generateName is required".into(),
            }],
        ));
    }
    if rt.namespaced {
        check_namespace_open(store, t, &ns, &requested)?;
    }
    if rt.flavor == Flavor::Custom {
        let crd = ObjKey {
            storage: CRD_STORAGE.into(),
            namespace: String::new(),
            name: format!("{}.{}", rt.plural, rt.group),
        };
        if store.get(&crd).is_some_and(|c| meta::is_deleting(c)) {
            return Err(ApiError::MethodNotAllowedMessage {
                gr: t.gr(),
                message: "create not allowed while custom resource definition is terminating"
                    .into(),
            });
        }
    }
    if !meta_str(&obj, "resourceVersion").is_empty() {
        return Err(ApiError::Internal(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    let request_fields = meta::meta(&obj)
        .and_then(|m| m.get("managedFields"))
        .cloned();
    let now = meta::now_rfc3339();
    set_meta(&mut obj, "uid", Some(json!(meta::new_uid())));
    set_meta(&mut obj, "creationTimestamp", Some(json!(now)));
    for field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    ] {
        set_meta(&mut obj, field, None);
    }
    let generation = rt.tracks_generation().then(|| json!(1));
    set_meta(&mut obj, "generation", generation);
    if rt.flavor == Flavor::Custom && rt.has_status(&t.version) {
        if let Some(map) = obj.as_object_mut() {
            map.remove("status");
        }
    }
    // Pick the name: the requested one, or generateName plus a suffix that is free.
    let mut name = requested.clone();
    for attempt in 0..8 {
        if requested.is_empty() {
            name = meta::generate_name(&prefix);
        }
        if store.get(&t.key(&name)).is_none() {
            break;
        }
        if !requested.is_empty() || attempt == 7 {
            return Err(ApiError::AlreadyExists { gr: t.gr(), name });
        }
    }
    set_meta(&mut obj, "name", Some(json!(name)));
    let mut errors = meta::validate_name(&name, rt.builtin() == Some(Builtin::Namespace));
    errors.extend(meta::validate_labels(&obj));
    if !errors.is_empty() {
        return Err(invalid(&rt, &name, &errors));
    }
    let tracked = super::apply::builtin_view(t, &mut obj);
    prepare_builtin(t, &mut obj, None, &now)?;
    let warnings = admit(t, &mut obj, None, opts)?;
    super::webhook::admit(store.webhooks(), t, &obj, None)?;
    let mut request = json!({});
    set_meta(&mut request, "managedFields", request_fields);
    let view = super::apply::View {
        tracked: tracked.as_ref(),
        request: &request,
        old: &json!({}),
    };
    super::apply::record_managed(t, &mut obj, &view, opts, &now);
    let stored = to_storage(&rt, obj);
    let object = if opts.dry_run {
        from_storage(&rt, &t.version, &stored)
    } else {
        let saved = store.put(t.key(&name), stored, ChangeKind::Added);
        if rt.builtin() == Some(Builtin::Crd) {
            store.rebuild_registry();
        }
        from_storage(&rt, &t.version, &saved)
    };
    Ok(Written {
        object,
        warnings,
        created: true,
    })
}

/// Whether PUT of a missing object creates it (kube-apiserver allows it for leases and
/// events).
fn allows_create_on_update(rt: &ResourceType) -> bool {
    matches!(
        rt.builtin(),
        Some(Builtin::Lease | Builtin::CoreEvent | Builtin::Event)
    )
}

/// PUT: replaces the object (or, on `/status`, only its status) with `body`.
///
/// A `metadata.resourceVersion` in the body is a precondition (409 Conflict when stale).
/// Without one, an update of a built-in kind is unconditional, while a custom resource's is
/// refused (422 `metadata.resourceVersion: Invalid value: 0: must be specified for an update`),
/// as kube-apiserver refuses unconditional updates of custom resources.
///
/// # Errors
/// 400 for a body naming another object, 404 when missing, 409 when stale, 422 when invalid
/// or, for a custom resource, when the body has no resourceVersion.
pub fn update(
    store: &mut Store,
    t: &Target,
    body: Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let name = t.require_name()?.to_string();
    let mut obj = check_body(t, body)?;
    let body_name = meta_str(&obj, "name");
    if body_name != name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    settle_namespace(t, &mut obj)?;
    let key = t.key(&name);
    intake::require_resource_version(t, &obj, &name, store.get(&key).is_some())?;
    match store.get(&key).cloned() {
        Some(old) => apply_update(store, t, &key, obj, &old, opts),
        None if allows_create_on_update(&t.rt) && !t.status => {
            set_meta(&mut obj, "resourceVersion", None);
            create(store, t, obj, opts)
        }
        None => Err(ApiError::NotFound { gr: t.gr(), name }),
    }
}

/// PATCH: applies a patch to the current object, then updates it as PUT would (a
/// `resourceVersion` the patch sets is a precondition).
///
/// # Errors
/// 415 for strategic merge patch on custom resources; the errors of [`patch::apply`], of
/// [`update`] and, for server-side apply, of `apply::apply`.
pub fn patch(
    store: &mut Store,
    t: &Target,
    kind: PatchKind,
    body: &[u8],
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    if kind == PatchKind::Apply {
        return super::apply::apply(store, t, body, opts);
    }
    if kind == PatchKind::Strategic && t.rt.flavor == Flavor::Custom {
        return Err(patch::unsupported(false));
    }
    let name = t.require_name()?.to_string();
    let key = t.key(&name);
    let Some(old) = store.get(&key).cloned() else {
        return Err(ApiError::NotFound { gr: t.gr(), name });
    };
    let current = from_storage(&t.rt, &t.version, &old);
    let patched = patch::apply(kind, &current, body)?;
    let mut obj = check_body(t, patched)?;
    if meta_str(&obj, "name") != name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta_str(&obj, "name")
        )));
    }
    settle_namespace(t, &mut obj)?;
    let opts = WriteOpts {
        from_patch: true,
        ..opts.clone()
    };
    apply_update(store, t, &key, obj, &old, &opts)
}

/// The update proper, given the current stored object `old_stored`.
pub(super) fn apply_update(
    store: &mut Store,
    t: &Target,
    key: &ObjKey,
    obj: Value,
    old_stored: &Value,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let rt = t.rt.clone();
    let name = key.name.clone();
    let old = from_storage(&rt, &t.version, old_stored);
    let want_rv = meta_str(&obj, "resourceVersion");
    if !want_rv.is_empty() && want_rv != meta_str(&old, "resourceVersion") {
        return Err(ApiError::stale(t.gr(), &name));
    }
    let mut request = json!({});
    let request_fields = meta::meta(&obj)
        .and_then(|m| m.get("managedFields"))
        .cloned();
    set_meta(&mut request, "managedFields", request_fields);
    let mut new = if t.status {
        // /status: everything but status comes from the stored object.
        let mut new = old.clone();
        if let Some(map) = new.as_object_mut() {
            match obj.get("status") {
                Some(s) => map.insert("status".into(), s.clone()),
                None => map.remove("status"),
            };
        }
        new
    } else {
        carry_system_fields(&rt, &name, obj, &old)?
    };
    if !t.status && rt.has_status(&t.version) {
        if let Some(map) = new.as_object_mut() {
            match old.get("status") {
                Some(s) => map.insert("status".into(), s.clone()),
                None => map.remove("status"),
            };
        }
    }
    let mut tracked = None;
    if !t.status {
        tracked = super::apply::builtin_view(t, &mut new);
        prepare_builtin(t, &mut new, Some(&old), &meta::now_rfc3339())?;
        if rt.tracks_generation() && meta::content(&new, false) != meta::content(&old, false) {
            set_meta(
                &mut new,
                "generation",
                Some(json!(meta::generation(&old) + 1)),
            );
        }
        let errors = meta::validate_labels(&new);
        if !errors.is_empty() {
            return Err(invalid(&rt, &name, &errors));
        }
    }
    let warnings = admit(t, &mut new, Some(&old), opts)?;
    super::webhook::admit(store.webhooks(), t, &new, Some(&old))?;
    let view = super::apply::View {
        tracked: tracked.as_ref(),
        request: &request,
        old: &old,
    };
    super::apply::record_managed(t, &mut new, &view, opts, &meta::now_rfc3339());
    let mut stored_new = to_storage(&rt, new);
    set_meta(
        &mut stored_new,
        "resourceVersion",
        Some(json!(meta_str(old_stored, "resourceVersion"))),
    );
    if stored_new == *old_stored {
        // Nothing changed: kube-apiserver writes nothing and keeps the resourceVersion.
        return Ok(Written {
            object: old,
            warnings,
            created: false,
        });
    }
    let finished = meta::is_deleting(&stored_new)
        && meta::finalizers(&stored_new).is_empty()
        && rt.builtin() != Some(Builtin::Namespace);
    let object = if opts.dry_run {
        from_storage(&rt, &t.version, &stored_new)
    } else if finished {
        // The last finalizer is gone: the object is deleted now.
        let last = store.remove(key, Some(stored_new.clone()));
        if rt.builtin() == Some(Builtin::Crd) {
            store.rebuild_registry();
        }
        from_storage(&rt, &t.version, last.as_deref().unwrap_or(&stored_new))
    } else {
        let saved = store.put(key.clone(), stored_new, ChangeKind::Modified);
        if rt.builtin() == Some(Builtin::Crd) {
            store.rebuild_registry();
        }
        from_storage(&rt, &t.version, &saved)
    };
    Ok(Written {
        object,
        warnings,
        created: false,
    })
}

/// Copies what an update may not change from the stored object: uid (refusing a different
/// one), creationTimestamp, generation, deletionTimestamp and its grace period; and refuses new
/// finalizers on an object being deleted.
fn carry_system_fields(
    rt: &ResourceType,
    name: &str,
    mut new: Value,
    old: &Value,
) -> Result<Value, ApiError> {
    let uid = meta_str(&new, "uid");
    let old_uid = meta_str(old, "uid").to_string();
    if !uid.is_empty() && uid != old_uid {
        return Err(invalid(
            rt,
            name,
            &[FieldError {
                kind: FieldErrorKind::Invalid,
                field: "metadata.uid".into(),
                bad_value: Some(json!(uid)),
                detail: "field is immutable".into(),
            }],
        ));
    }
    set_meta(&mut new, "uid", Some(json!(old_uid)));
    for field in [
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        let value = meta::meta(old).and_then(|m| m.get(field)).cloned();
        set_meta(&mut new, field, value);
    }
    set_meta(&mut new, "selfLink", None);
    set_meta(&mut new, "managedFields", None);
    if meta::is_deleting(old) {
        let before = meta::finalizers(old);
        let added: Vec<String> = meta::finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let list = added
                .iter()
                .map(|f| format!("{f:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(invalid(
                rt,
                name,
                &[FieldError {
                    kind: FieldErrorKind::Forbidden,
                    field: "metadata.finalizers".into(),
                    bad_value: None,
                    detail: format!(
                        "no new finalizers can be added if the object is being deleted, found \
                         new finalizers []string{{{list}}}"
                    ),
                }],
            ));
        }
    }
    Ok(new)
}
