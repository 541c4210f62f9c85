//! Field ownership: `metadata.managedFields` and server-side apply, as kube-apiserver's field
//! manager and structured-merge-diff keep them.
//!
//! This room owns the managedFields entries (`{manager, operation, apiVersion, time,
//! fieldsType: FieldsV1, fieldsV1, subresource}`, their order and encoding), what an Update
//! (create, update, merge/JSON patch, `/status`) records, and what an Apply does: merge the
//! configuration, remove what the applier stopped applying and nobody else owns, take
//! ownership, and refuse with 409 when it would change a field another manager owns (unless
//! forced), with kube-apiserver's allowance for `kubectl apply --server-side` after client-side
//! applies (`last_applied`). The verbs around it (`write.rs`, `apply.rs`) decide when it runs.
//!
//! Past 10 Update entries the oldest are merged into `ancient-changes`, as kube-apiserver does.
//!
//! Simplifications: no `before-first-apply` manager for objects written before managedFields
//! were kept, and an Update entry per version but no conversion of field sets between
//! versions.

mod fieldset;
mod last_applied;
mod shape;
mod walk;

use serde_json::{json, Map, Value};

pub use fieldset::{FieldSet, Pe};
pub use shape::{builtin as builtin_shape, from_crd_schema, Shape};

use fieldset::path_text;

/// `Apply` or `Update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Every other write.
    Update,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One managedFields entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The field manager.
    pub manager: String,
    /// How it wrote.
    pub operation: Operation,
    /// The apiVersion its fields are in.
    pub api_version: String,
    /// `""` or `status`.
    pub subresource: String,
    /// When it last changed the object (RFC 3339).
    pub time: Option<String>,
    /// The fields it owns.
    pub fields: FieldSet,
}

impl Entry {
    /// Whether `self` and `other` are the same manager (Apply entries ignore the apiVersion).
    fn same_manager(&self, other: &Entry) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
            && (self.operation == Operation::Apply || self.api_version == other.api_version)
    }

    /// kube-apiserver's manager identifier (the entry as JSON without fields and time).
    fn identifier(&self) -> String {
        let mut id = format!(
            "{{\"manager\":{},\"operation\":\"{}\"",
            Value::String(self.manager.clone()),
            self.operation.name()
        );
        if self.operation == Operation::Update {
            id.push_str(&format!(
                ",\"apiVersion\":{}",
                Value::String(self.api_version.clone())
            ));
        }
        if !self.subresource.is_empty() {
            id.push_str(&format!(
                ",\"subresource\":{}",
                Value::String(self.subresource.clone())
            ));
        }
        id.push('}');
        id
    }

    /// How conflict messages name the manager: `"a"`, `"b" using v1`, `"c" with subresource
    /// "status" using v1`.
    fn display(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }
}

/// Who writes: the manager, the subresource addressed, the apiVersion spoken, the time.
#[derive(Debug, Clone)]
pub struct Writer {
    /// The field manager (`?fieldManager=` or from the User-Agent).
    pub manager: String,
    /// `""` or `status`.
    pub subresource: String,
    /// The request's apiVersion.
    pub api_version: String,
    /// Now (RFC 3339).
    pub now: String,
}

impl Writer {
    fn entry(&self, operation: Operation, fields: FieldSet) -> Entry {
        Entry {
            manager: self.manager.clone(),
            operation,
            api_version: self.api_version.clone(),
            subresource: self.subresource.clone(),
            time: Some(self.now.clone()),
            fields,
        }
    }
}

/// Reads `metadata.managedFields`; `None` when absent, not a list, or an entry does not decode.
pub fn decode(object: &Value) -> Option<Vec<Entry>> {
    let list = object.pointer("/metadata/managedFields")?.as_array()?;
    list.iter()
        .map(|e| {
            let text = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
            let operation = match text("operation")?.as_str() {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return None,
            };
            Some(Entry {
                manager: text("manager").unwrap_or_default(),
                operation,
                api_version: text("apiVersion").unwrap_or_default(),
                subresource: text("subresource").unwrap_or_default(),
                time: text("time"),
                fields: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&json!({})))?,
            })
        })
        .collect()
}

/// Whether the request sets `metadata.managedFields` to a single empty entry, which makes
/// kube-apiserver drop every entry (the write itself records none).
pub fn resets(request: &Value) -> bool {
    request
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .is_some_and(|l| l.len() == 1 && l[0].as_object().is_some_and(Map::is_empty))
}

/// The managedFields entries a write starts from: the request's own when it sends a non-empty
/// list that decodes, else the stored ones. As kube-apiserver, so clients that drop
/// managedFields do not erase them.
pub fn base_entries(request: &Value, stored: &Value) -> Vec<Entry> {
    if let Some(list) = request
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    {
        if !list.is_empty() {
            if let Some(entries) = decode(request) {
                return entries;
            }
        }
    }
    decode(stored).unwrap_or_default()
}

/// The `metadata.managedFields` JSON of `entries`, in kube-apiserver's order (Apply before
/// Update, then by time, manager, apiVersion, subresource); entries owning nothing are dropped.
pub fn encode(entries: &[Entry]) -> Value {
    let mut sorted: Vec<&Entry> = entries.iter().filter(|e| !e.fields.is_empty()).collect();
    sorted.sort_by(|a, b| {
        (a.operation != Operation::Apply)
            .cmp(&(b.operation != Operation::Apply))
            .then_with(|| a.time.cmp(&b.time))
            .then_with(|| a.manager.cmp(&b.manager))
            .then_with(|| a.api_version.cmp(&b.api_version))
            .then_with(|| a.subresource.cmp(&b.subresource))
    });
    Value::Array(
        sorted
            .into_iter()
            .map(|e| {
                let mut m = Map::new();
                m.insert("apiVersion".into(), json!(e.api_version));
                m.insert("fieldsType".into(), json!("FieldsV1"));
                m.insert("fieldsV1".into(), e.fields.to_fields_v1());
                m.insert("manager".into(), json!(e.manager));
                m.insert("operation".into(), json!(e.operation.name()));
                if !e.subresource.is_empty() {
                    m.insert("subresource".into(), json!(e.subresource));
                }
                if let Some(t) = &e.time {
                    m.insert("time".into(), json!(t));
                }
                Value::Object(m)
            })
            .collect(),
    )
}

/// The object without the fields no manager owns (apiVersion, kind, and metadata's name,
/// namespace, uid, resourceVersion, generation, creationTimestamp, selfLink, managedFields).
fn strip(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
        let meta = map
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            for field in [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "selfLink",
                "managedFields",
                "clusterName",
            ] {
                meta.remove(field);
            }
        }
    }
    copy
}

/// What a create is compared against for a built-in `kind`: its Go type's zero value, whose
/// struct fields are there even when empty (so a namespace's `spec: {}` is nobody's). `{}` for
/// kinds whose fields are all optional, and for custom resources.
pub fn zero_value(kind: &str) -> Value {
    match kind {
        "Namespace" => json!({"spec": {}, "status": {}}),
        "Lease" => json!({"spec": {}}),
        _ => json!({}),
    }
}

/// Drops `.metadata` itself (kube-apiserver never records it).
fn strip_set(mut set: FieldSet) -> FieldSet {
    set.retain(|p| p.as_slice() != [Pe::Field("metadata".into())]);
    set
}

/// What an Update (`old` to `new`, both whole objects) does to `entries`: the writer takes
/// the fields it added or changed (from everyone else) and its entry's time is set when it
/// took any; removed fields leave every entry. A write that changes nothing changes nothing.
pub fn record_update(
    mut entries: Vec<Entry>,
    old: &Value,
    new: &Value,
    shape: &Shape,
    writer: &Writer,
) -> Vec<Entry> {
    let cmp = walk::compare(&strip(old), &strip(new), shape);
    let taken = strip_set(cmp.modified.union(&cmp.added));
    for e in &mut entries {
        e.fields = e.fields.difference(&taken).difference(&cmp.removed);
    }
    if !taken.is_empty() {
        let mine = writer.entry(Operation::Update, taken.clone());
        match entries.iter_mut().find(|e| e.same_manager(&mine)) {
            Some(e) => {
                e.fields = e.fields.union(&taken);
                e.time = mine.time;
            }
            None => entries.push(mine),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    cap_updates(&mut entries);
    entries
}

/// How many Update entries an object keeps before the oldest are merged.
const MAX_UPDATE_ENTRIES: usize = 10;

/// The manager the oldest Update entries are merged into.
const ANCIENT: &str = "ancient-changes";

/// kube-apiserver's cap on Update entries: oldest first, each one after the first of its
/// apiVersion is merged into `ancient-changes` of that version (which takes its time) until
/// at most [`MAX_UPDATE_ENTRIES`] remain.
fn cap_updates(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].operation == Operation::Update)
        .collect();
    if updaters.len() <= MAX_UPDATE_ENTRIES {
        return;
    }
    updaters.sort_by(|&a, &b| {
        (entries[a].time.as_deref(), entries[a].identifier())
            .cmp(&(entries[b].time.as_deref(), entries[b].identifier()))
    });
    let mut remaining = updaters.len();
    let mut first_of_version: Vec<(String, usize)> = Vec::new();
    let mut gone = vec![false; entries.len()];
    let mut buckets: Vec<Entry> = Vec::new();
    for i in updaters {
        if remaining <= MAX_UPDATE_ENTRIES {
            break;
        }
        let version = entries[i].api_version.clone();
        let Some(&(_, first)) = first_of_version.iter().find(|(v, _)| *v == version) else {
            first_of_version.push((version, i));
            continue;
        };
        let bucket = match buckets.iter_mut().position(|b| b.api_version == version) {
            Some(b) => b,
            None => {
                gone[first] = true;
                buckets.push(Entry {
                    manager: ANCIENT.to_string(),
                    ..entries[first].clone()
                });
                buckets.len() - 1
            }
        };
        buckets[bucket].fields = buckets[bucket].fields.union(&entries[i].fields);
        buckets[bucket].time = entries[i].time.clone();
        gone[i] = true;
        remaining -= 1;
    }
    let mut kept: Vec<Entry> = std::mem::take(entries)
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !gone[*i])
        .map(|(_, e)| e)
        .collect();
    for bucket in buckets {
        match kept.iter_mut().find(|e| e.same_manager(&bucket)) {
            Some(existing) => {
                existing.fields = existing.fields.union(&bucket.fields);
                existing.time = bucket.time;
            }
            None => kept.push(bucket),
        }
    }
    *entries = kept;
}

/// Why an apply was refused.
#[derive(Debug)]
pub enum ApplyError {
    /// Fields other managers own would change: the 409 `Status` body.
    Conflict(Value),
    /// The configuration names a field its type does not declare (the path and why).
    Undeclared(String),
}

/// Server-side apply of `config` to `live` (`None` when the object does not exist yet):
/// returns the new object (its managedFields set) and whether it differs from `live`.
///
/// # Errors
/// [`ApplyError::Conflict`] when, without `force`, a field another manager owns would change;
/// [`ApplyError::Undeclared`] for a field the type does not declare.
/// (Map-list items without their keys merge by the keys they have; schema admission refuses
/// them afterwards, as kube-apiserver does.)
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    shape: &Shape,
    writer: &Writer,
    force: bool,
) -> Result<(Value, bool), ApplyError> {
    if let Some(why) = walk::undeclared(config, shape) {
        return Err(ApplyError::Undeclared(why));
    }
    let empty = json!({});
    let live_obj = live.unwrap_or(&empty);
    let mut entries = decode(live_obj).unwrap_or_default();
    let applied = strip_set(walk::to_set(&strip(config), shape));
    let mine = writer.entry(Operation::Apply, applied.clone());
    let previous = entries
        .iter()
        .position(|e| e.same_manager(&mine))
        .map(|i| entries.remove(i));
    let mut new = walk::merge(Some(live_obj), config, shape);
    if let Some(prev) = &previous {
        let mut owned = applied.clone();
        for e in &entries {
            owned = owned.union(&e.fields);
        }
        walk::prune(&mut new, shape, &prev.fields, &owned);
    }
    let cmp = walk::compare(&strip(live_obj), &strip(&new), shape);
    let changed = strip_set(cmp.modified.union(&cmp.added));
    let mut conflicts: Vec<(&Entry, FieldSet)> = entries
        .iter()
        .map(|e| (e, e.fields.intersection(&changed)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let allowed = || {
        let allowed = last_applied::allowed_conflicts(live_obj, shape)?;
        conflicts
            .iter()
            .all(|(_, c)| c.difference(&allowed).is_empty())
            .then_some(())
    };
    let kubectl_upgrade = writer.manager == last_applied::KUBECTL && allowed().is_some();
    if !force && !conflicts.is_empty() && !kubectl_upgrade {
        conflicts.sort_by_key(|(e, _)| e.identifier());
        return Err(ApplyError::Conflict(conflict_status(&conflicts)));
    }
    for e in &mut entries {
        e.fields = e.fields.difference(&changed).difference(&cmp.removed);
    }
    let content_changed = strip(live_obj) != strip(&new) || live.is_none();
    let time = match (&previous, content_changed) {
        (Some(p), false) => p.time.clone(),
        _ => mine.time.clone(),
    };
    entries.push(Entry { time, ..mine });
    entries.retain(|e| !e.fields.is_empty());
    cap_updates(&mut entries);
    if writer.manager == last_applied::KUBECTL {
        last_applied::update(&mut new, config);
    }
    if let Some(meta) = new
        .as_object_mut()
        .and_then(|o| o.get_mut("metadata"))
        .and_then(Value::as_object_mut)
    {
        meta.insert("managedFields".into(), encode(&entries));
    }
    Ok((new, content_changed))
}

/// kube-apiserver's 409 for apply conflicts.
fn conflict_status(conflicts: &[(&Entry, FieldSet)]) -> Value {
    let mut causes = Vec::new();
    let mut lines = Vec::new();
    let total: usize = conflicts.iter().map(|(_, s)| s.iter().count()).sum();
    for (entry, set) in conflicts {
        lines.push(format!("conflicts with {}:", entry.display()));
        for path in set.iter() {
            lines.push(format!("- {}", path_text(path)));
            causes.push(json!({
                "reason": "FieldManagerConflict",
                "message": format!("conflict with {}", entry.display()),
                "field": path_text(path),
            }));
        }
    }
    let message = match (total, conflicts.first()) {
        (1, Some((entry, set))) => format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            entry.display(),
            set.iter().next().map(|p| path_text(p)).unwrap_or_default()
        ),
        _ => format!("Apply failed with {total} conflicts: {}", lines.join("\n")),
    };
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": "Conflict",
        "details": {"causes": causes}, "code": 409,
    })
}

#[cfg(test)]
mod tests;
