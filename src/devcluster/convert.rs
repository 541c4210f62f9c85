//! Version conversion between what a client reads or writes and what is stored.
//!
//! Custom resources use conversion strategy `None`: the object is the same in every served
//! version and only `apiVersion` is rewritten. `events.k8s.io/v1` Events are stored as core
//! `v1` Events (as kube-apiserver does), with the field renames of the upstream conversion
//! (`regarding` = `involvedObject`, `note` = `message`, `deprecatedCount` = `count`, ...).
//! Every other built-in has one version, stored as written.

use serde_json::{Map, Value};

use super::registry::{Builtin, ResourceType};

/// `events.k8s.io/v1` field name → core `v1` field name.
const EVENT_RENAMES: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(map: &mut Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = map.remove(from) {
        map.insert(to.to_string(), v);
    }
}

fn set_type(object: &mut Value, api_version: String, kind: &str) {
    if let Some(map) = object.as_object_mut() {
        map.insert("apiVersion".into(), Value::String(api_version));
        map.insert("kind".into(), Value::String(kind.to_string()));
    }
}

/// The stored object as `version` of `rt` presents it.
pub fn from_storage(rt: &ResourceType, version: &str, stored: &Value) -> Value {
    let mut object = stored.clone();
    if rt.builtin() == Some(Builtin::Event) {
        if let Some(map) = object.as_object_mut() {
            for (new, core) in EVENT_RENAMES {
                rename(map, core, new);
            }
        }
    }
    set_type(&mut object, rt.api_version(version), &rt.kind);
    object
}

/// An object written as `version` of `rt`, in the form it is stored.
pub fn to_storage(rt: &ResourceType, object: Value) -> Value {
    let mut object = object;
    match rt.builtin() {
        Some(Builtin::Event) => {
            if let Some(map) = object.as_object_mut() {
                for (new, core) in EVENT_RENAMES {
                    rename(map, new, core);
                }
            }
            set_type(&mut object, "v1".to_string(), "Event");
        }
        _ => set_type(&mut object, rt.api_version(&rt.storage_version), &rt.kind),
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::registry::Registry;
    use serde_json::json;

    #[test]
    fn events_api_is_stored_as_a_core_event() {
        let registry = Registry::builtins();
        let Some(rt) = registry.find("events.k8s.io", "v1", "events") else {
            panic!("events.k8s.io served");
        };
        let written = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "regarding": {"name": "x"}, "note": "hello", "reason": "Started"});
        let stored = to_storage(&rt, written.clone());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "x");
        assert_eq!(stored["message"], "hello");
        assert_eq!(from_storage(&rt, "v1", &stored), written);
    }
}
