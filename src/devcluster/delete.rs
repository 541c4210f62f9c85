//! Deletion: DELETE and deletecollection with finalizers (`deletionTimestamp` first, removal
//! when the last finalizer goes), preconditions, and the background work kube-controller-
//! manager and kube-apiserver's controllers do after a delete: garbage collection of
//! dependents whose owners are gone, namespace termination, and CRD cleanup.
//!
//! Simplifications: `propagationPolicy: Foreground` is treated as `Background` (dependents are
//! collected after the owner is gone); `Orphan` removes the owner's references from its
//! dependents at once, without the `orphan` finalizer. An object some of whose owners still
//! exist is kept with its dangling references. Deleting a namespace marks it `Terminating`;
//! its objects are deleted in the background and the namespace goes when none is left.
//! Deleting a CRD with instances marks it (finalizer `customresourcecleanup.apiextensions.k8s.io`,
//! condition `Terminating`) until they are gone.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{json, Value};

use super::convert::from_storage;
use super::meta::{self, meta_str, set_meta};
use super::registry::Builtin;
use super::route::Target;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{success_status, ApiError};
use super::store::{ChangeKind, ObjKey, Store, CRD_STORAGE, NAMESPACE_STORAGE};

const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";
const PROTECTED_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// How dependents are treated (`propagationPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Collected after the owner is gone (also used for `Foreground`).
    #[default]
    Background,
    /// Owner references to the deleted object are removed from its dependents.
    Orphan,
}

/// Options of DELETE (from the query or a `DeleteOptions` body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `propagationPolicy`.
    pub propagation: Propagation,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

/// What deleting one object did.
enum Outcome {
    /// Removed from the store (DELETED event).
    Removed,
    /// Marked for deletion (`deletionTimestamp` set; MODIFIED event) or already marked.
    Pending(Arc<Value>),
}

/// DELETE of one object. Returns the body to send: a success `Status` when the object is gone,
/// or the object (with `deletionTimestamp`) when finalizers hold it.
///
/// # Errors
/// 404 when missing; 409 when a precondition fails; 403 for the built-in namespaces.
pub fn delete(store: &mut Store, t: &Target, opts: &DeleteOpts) -> Result<Value, ApiError> {
    let name = t.require_name()?.to_string();
    let key = t.key(&name);
    let Some(stored) = store.get(&key).cloned() else {
        return Err(ApiError::NotFound { gr: t.gr(), name });
    };
    let uid = meta_str(&stored, "uid").to_string();
    if let Some(want) = opts.uid.as_deref().filter(|u| *u != uid) {
        return Err(ApiError::Conflict {
            gr: t.gr(),
            name,
            reason: format!(
                "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
            ),
        });
    }
    let rv = meta_str(&stored, "resourceVersion").to_string();
    if let Some(want) = opts.resource_version.as_deref().filter(|r| *r != rv) {
        return Err(ApiError::Conflict {
            gr: t.gr(),
            name,
            reason: format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion \
                 in object meta: {rv}"
            ),
        });
    }
    if t.rt.builtin() == Some(Builtin::Namespace) && PROTECTED_NAMESPACES.contains(&name.as_str()) {
        return Err(ApiError::Forbidden {
            gr: t.gr(),
            name,
            message: "this namespace may not be deleted".into(),
        });
    }
    if opts.dry_run {
        return Ok(from_storage(&t.rt, &t.version, &stored));
    }
    if opts.propagation == Propagation::Orphan {
        orphan_dependents(store, &uid);
    }
    Ok(match delete_object(store, &key) {
        Some(Outcome::Removed) | None => success_status(&t.gr(), &name, &uid),
        Some(Outcome::Pending(obj)) => from_storage(&t.rt, &t.version, &obj),
    })
}

/// deletecollection: deletes every object of the target's type in its namespace (or all)
/// matching the selectors. Returns the list of matched objects as they were.
///
/// # Errors
/// None beyond what the caller validated; kept fallible for symmetry with the other verbs.
pub fn delete_collection(
    store: &mut Store,
    t: &Target,
    labels: &LabelSelector,
    fields: &FieldSelector,
    opts: &DeleteOpts,
) -> Result<Value, ApiError> {
    let matched: Vec<(ObjKey, Arc<Value>)> = store
        .list(&t.rt.storage, t.namespace.as_deref())
        .filter(|(_, v)| labels.matches(v) && fields.matches(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut items = Vec::new();
    for (key, obj) in matched {
        items.push(from_storage(&t.rt, &t.version, &obj));
        if opts.dry_run {
            continue;
        }
        if opts.propagation == Propagation::Orphan {
            orphan_dependents(store, meta_str(&obj, "uid"));
        }
        delete_object(store, &key);
    }
    Ok(json!({
        "kind": t.rt.list_kind,
        "apiVersion": t.rt.api_version(&t.version),
        "metadata": {"resourceVersion": store.rv().to_string()},
        "items": items,
    }))
}

/// Deletes (or marks for deletion) the stored object at `key`, by the rules of its type.
fn delete_object(store: &mut Store, key: &ObjKey) -> Option<Outcome> {
    let stored = store.get(key)?.clone();
    let registry = store.registry();
    let builtin = registry
        .by_storage(&key.storage)
        .and_then(|rt| rt.builtin());
    if meta::is_deleting(&stored) {
        return Some(Outcome::Pending(stored));
    }
    let mut finalizers = meta::finalizers(&stored);
    let mut marked = stored.as_ref().clone();
    match builtin {
        Some(Builtin::Namespace) => {
            marked["status"]["phase"] = json!("Terminating");
        }
        Some(Builtin::Crd) => {
            let storage = crd_storage(&stored);
            if store.list(&storage, None).next().is_some() {
                finalizers.push(CRD_CLEANUP.to_string());
                set_meta(&mut marked, "finalizers", Some(json!(finalizers)));
                if let Some(conds) = marked["status"]["conditions"].as_array_mut() {
                    conds.push(json!({"type": "Terminating", "status": "True",
                        "reason": "InstanceDeletionPending",
                        "message": "CustomResourceDefinition marked for deletion; instances \
                                    are being deleted",
                        "lastTransitionTime": meta::now_rfc3339()}));
                }
            }
        }
        _ => {}
    }
    if finalizers.is_empty() && builtin != Some(Builtin::Namespace) {
        store.remove(key, None)?;
        if builtin == Some(Builtin::Crd) {
            store.rebuild_registry();
        }
        return Some(Outcome::Removed);
    }
    let generation = meta::generation(&marked);
    if generation > 0 {
        set_meta(&mut marked, "generation", Some(json!(generation + 1)));
    }
    set_meta(
        &mut marked,
        "deletionTimestamp",
        Some(json!(meta::now_rfc3339())),
    );
    set_meta(&mut marked, "deletionGracePeriodSeconds", Some(json!(0)));
    Some(Outcome::Pending(store.put(
        key.clone(),
        marked,
        ChangeKind::Modified,
    )))
}

fn crd_storage(crd: &Value) -> String {
    format!(
        "{}.{}",
        crd["spec"]["names"]["plural"].as_str().unwrap_or(""),
        crd["spec"]["group"].as_str().unwrap_or("")
    )
}

/// Removes owner references to `uid` from every object that has one.
fn orphan_dependents(store: &mut Store, uid: &str) {
    let dependents: Vec<(ObjKey, Arc<Value>)> = store
        .all()
        .filter(|(_, v)| meta::owner_uids(v).iter().any(|u| u == uid))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, obj) in dependents {
        let mut obj = obj.as_ref().clone();
        if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
            refs.retain(|r| r["uid"].as_str() != Some(uid));
        }
        if obj["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(Vec::is_empty)
        {
            set_meta(&mut obj, "ownerReferences", None);
        }
        store.put(key, obj, ChangeKind::Modified);
    }
}

/// One round of the background controllers: deletes objects all of whose owners are gone,
/// the contents of terminating namespaces and the instances of terminating CRDs, then removes
/// terminating namespaces and CRDs that are empty. Repeats until nothing changes. Returns
/// whether anything changed.
pub fn collect_garbage(store: &mut Store) -> bool {
    let mut changed = false;
    loop {
        let uids: HashSet<&str> = store.all().map(|(_, v)| meta_str(v, "uid")).collect();
        let terminating_ns: HashSet<&str> = store
            .list(NAMESPACE_STORAGE, None)
            .filter(|(_, v)| meta::is_deleting(v))
            .map(|(k, _)| k.name.as_str())
            .collect();
        let terminating_crds: HashSet<String> = store
            .list(CRD_STORAGE, None)
            .filter(|(_, v)| meta::is_deleting(v))
            .map(|(_, v)| crd_storage(v))
            .collect();
        let victims: Vec<ObjKey> = store
            .all()
            .filter(|(k, v)| {
                if meta::is_deleting(v) {
                    return false;
                }
                let owners = meta::owner_uids(v);
                let orphaned =
                    !owners.is_empty() && owners.iter().all(|u| !uids.contains(u.as_str()));
                orphaned
                    || (!k.namespace.is_empty() && terminating_ns.contains(k.namespace.as_str()))
                    || terminating_crds.contains(&*k.storage)
            })
            .map(|(k, _)| k.clone())
            .collect();
        if victims.is_empty() {
            break;
        }
        for key in victims {
            delete_object(store, &key);
        }
        changed = true;
    }
    changed |= finish_terminating(store);
    changed
}

/// Removes terminating namespaces with no objects left and terminating CRDs with no instances.
fn finish_terminating(store: &mut Store) -> bool {
    let mut changed = false;
    let namespaces: Vec<ObjKey> = store
        .list(NAMESPACE_STORAGE, None)
        .filter(|(_, v)| meta::is_deleting(v))
        .map(|(k, _)| k.clone())
        .collect();
    for ns in namespaces {
        let occupied = store.all().any(|(k, _)| k.namespace == ns.name);
        if occupied {
            continue;
        }
        let Some(obj) = store.get(&ns).cloned() else {
            continue;
        };
        let mut last = obj.as_ref().clone();
        last["spec"]["finalizers"] = json!([]);
        if meta::finalizers(&last).is_empty() {
            store.remove(&ns, Some(last));
        } else if obj["spec"]["finalizers"] != json!([]) {
            store.put(ns, last, ChangeKind::Modified);
        } else {
            continue;
        }
        changed = true;
    }
    let crds: Vec<(ObjKey, Arc<Value>)> = store
        .list(CRD_STORAGE, None)
        .filter(|(_, v)| {
            meta::is_deleting(v) && meta::finalizers(v).iter().any(|f| f == CRD_CLEANUP)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, crd) in crds {
        if store.list(&crd_storage(&crd), None).next().is_some() {
            continue;
        }
        let mut last = crd.as_ref().clone();
        let rest: Vec<String> = meta::finalizers(&crd)
            .into_iter()
            .filter(|f| f != CRD_CLEANUP)
            .collect();
        if rest.is_empty() {
            set_meta(&mut last, "finalizers", None);
            store.remove(&key, Some(last));
        } else {
            set_meta(&mut last, "finalizers", Some(json!(rest)));
            store.put(key, last, ChangeKind::Modified);
        }
        store.rebuild_registry();
        changed = true;
    }
    changed
}
