//! What kube-apiserver does for `kubectl apply --server-side` (field manager `kubectl`) on an
//! object kubectl's client-side apply wrote: conflicts on fields the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation names are allowed while that
//! configuration still matches the object (so the first server-side apply after client-side
//! ones does not fail), and the annotation, when present, is rewritten to the new
//! configuration (kubectl then moves the old entries over itself).

use serde_json::Value;

use super::fieldset::FieldSet;
use super::shape::Shape;
use super::{strip, strip_set, walk};

/// The annotation kubectl's client-side apply keeps.
const ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The only manager these rules are for.
pub(super) const KUBECTL: &str = "kubectl";

fn annotation(object: &Value) -> Option<&str> {
    object
        .pointer("/metadata/annotations")?
        .get(ANNOTATION)?
        .as_str()
        .filter(|s| !s.is_empty())
}

/// The fields whose conflicts are allowed: those of the last-applied configuration, when every
/// one of them still has its value in `live`.
pub(super) fn allowed_conflicts(live: &Value, shape: &Shape) -> Option<FieldSet> {
    let last: Value = serde_json::from_str(annotation(live)?).ok()?;
    if !last.is_object() {
        return None;
    }
    let (last, live) = (strip(&last), strip(live));
    let cmp = walk::compare(&last, &live, shape);
    (cmp.modified.is_empty() && cmp.removed.is_empty())
        .then(|| strip_set(walk::to_set(&last, shape)))
}

/// Rewrites the annotation of `object`, when it has one, to `config` (without the annotation),
/// as kube-apiserver encodes it: compact JSON and a newline.
pub(super) fn update(object: &mut Value, config: &Value) {
    if annotation(object).is_none() {
        return;
    }
    let mut config = config.clone();
    if let Some(meta) = config.get_mut("metadata").and_then(Value::as_object_mut) {
        let now_empty = meta
            .get_mut("annotations")
            .and_then(Value::as_object_mut)
            .map(|a| {
                a.remove(ANNOTATION);
                a.is_empty()
            });
        if now_empty == Some(true) {
            meta.remove("annotations");
        }
    }
    let text = format!("{config}\n");
    if let Some(annotations) = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.insert(ANNOTATION.into(), Value::String(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_annotation_follows_the_configuration_and_allows_its_fields() {
        let shape = super::super::shape::from_crd_schema(None);
        let mut live = json!({"metadata": {"name": "a", "annotations": {ANNOTATION:
            "{\"metadata\":{\"annotations\":{},\"name\":\"a\"},\"spec\":{\"x\":1}}\n"}},
            "spec": {"x": 1, "y": 2}});
        let allowed = allowed_conflicts(&live, &shape).expect("matches the object");
        assert!(allowed.covers(&[super::super::Pe::Field("spec".into())]));
        let config = json!({"metadata": {"name": "a", "annotations": {ANNOTATION: "old"}},
                            "spec": {"x": 2}});
        update(&mut live, &config);
        assert_eq!(
            live["metadata"]["annotations"][ANNOTATION],
            "{\"metadata\":{\"name\":\"a\"},\"spec\":{\"x\":2}}\n"
        );
        // Once the object has moved on from it, it allows nothing.
        live["spec"]["x"] = json!(3);
        assert!(allowed_conflicts(&live, &shape).is_none());
    }
}
