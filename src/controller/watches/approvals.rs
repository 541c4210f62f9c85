//! What the Approval watch keeps of each Approval, decoded on its own (issue 34; docs/design.md
//! section 2, admission; docs/behaviours.md 104): an Approval's spec is the controller's, but
//! anyone who may create Approvals can write one nested past serde_json's 128 levels or of a
//! wrong type. Decoded as one list, such an object failed the list and the watch of every
//! Approval of the scope; here its top-level parts are skipped over as raw text (no
//! recursion), its metadata read alone, and its spec and status checked each on its own text.
//! One that does not decode is set aside: a Warning Event `InvalidApproval` on it with a
//! bounded cause, counted in `agentrt_objects_set_aside_total{part="approval"}`, one log line
//! (never the object's text), and it wakes no run. The others are served as usual.
//!
//! Owns: [`WatchedApproval`] and the report of one set aside ([`SetAside`]). Must not: decide
//! anything about a run (a reconcile reads its Approvals live).

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::api::{Approval, ApprovalSpec, ApprovalStatus};
use crate::controller::cluster::bounded_cause;
use crate::controller::context::Context;

/// What a replica keeps of a watched Approval: the metadata that names it and the runs it
/// belongs to, and why it does not decode when it does not.
#[derive(Clone, Debug, Default, Serialize)]
pub struct WatchedApproval {
    /// `metadata`: only name, namespace, uid, resourceVersion and ownerReferences.
    pub metadata: ObjectMeta,
    /// Why the object does not decode (bounded, never its text); `None` for a good one.
    #[serde(skip)]
    pub undecodable: Option<Arc<str>>,
    /// `spec.kind`, and whether `status.phase` is `Pending` (or not yet written): what
    /// `agentrt_approvals_pending{kind,namespace}` counts.
    #[serde(skip)]
    pub pending_kind: Option<Arc<str>>,
}

/// The metadata fields kept ([`WatchedApproval::metadata`]).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
}

impl Metadata {
    fn parse(raw: Option<&RawValue>) -> Result<ObjectMeta, serde_json::Error> {
        let meta: Metadata = match raw {
            Some(raw) => serde_json::from_str(raw.get())?,
            None => Metadata::default(),
        };
        Ok(ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            owner_references: meta.owner_references,
            ..ObjectMeta::default()
        })
    }
}

impl<'de> Deserialize<'de> for WatchedApproval {
    /// Reads the object's top-level fields as raw text (skipping needs no recursion), then
    /// decodes each on its own: never fails for an object the API server sends.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = WatchedApproval;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an Approval object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<WatchedApproval, A::Error> {
                let (mut metadata, mut spec, mut status) = (None, None, None);
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match key.as_ref() {
                        "metadata" => metadata = Some(map.next_value::<Box<RawValue>>()?),
                        "spec" => spec = Some(map.next_value::<Box<RawValue>>()?),
                        "status" => status = Some(map.next_value::<Box<RawValue>>()?),
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                Ok(WatchedApproval::from_parts(
                    metadata.as_deref(),
                    spec.as_deref(),
                    status.as_deref(),
                ))
            }
        }
        deserializer.deserialize_map(Fields)
    }
}

impl WatchedApproval {
    fn from_parts(
        metadata: Option<&RawValue>,
        spec: Option<&RawValue>,
        status: Option<&RawValue>,
    ) -> WatchedApproval {
        let cause = |what: &str, err: &serde_json::Error| {
            Arc::from(format!("{what}: {}", bounded_cause(err)))
        };
        let (metadata, mut undecodable) = match Metadata::parse(metadata) {
            Ok(metadata) => (metadata, None),
            Err(err) => (ObjectMeta::default(), Some(cause("metadata", &err))),
        };
        let mut kind = None;
        if undecodable.is_none() {
            undecodable = match spec {
                None => Some(Arc::from("spec: missing")),
                Some(raw) => match serde_json::from_str::<ApprovalSpec>(raw.get()) {
                    Ok(spec) => {
                        kind = Some(spec.kind);
                        None
                    }
                    Err(err) => Some(cause("spec", &err)),
                },
            };
        }
        let mut pending = true;
        if let (None, Some(raw)) = (&undecodable, status) {
            match serde_json::from_str::<Option<ApprovalStatus>>(raw.get()) {
                Ok(status) => {
                    pending = status.is_none_or(|s| s.phase == crate::api::ApprovalPhase::Pending)
                }
                Err(err) => undecodable = Some(cause("status", &err)),
            }
        }
        let pending_kind = match (&undecodable, pending) {
            (None, true) => kind.map(Arc::from),
            _ => None,
        };
        WatchedApproval {
            metadata,
            undecodable,
            pending_kind,
        }
    }

    /// The reference an Event about this Approval names.
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(Approval::api_version(&()).into_owned()),
            kind: Some(Approval::kind(&()).into_owned()),
            name: self.metadata.name.clone(),
            namespace: self.metadata.namespace.clone(),
            uid: self.metadata.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

// The Approval's own group, version, kind and plural, known at compile time (as
// [`super::WatchedRun`]'s).
crate::controller::watched::resource_as!(WatchedApproval, Approval);

/// The Approvals this replica has reported set aside, by uid and resourceVersion, so a relist
/// or a resync does not report one again (at most [`SetAside::REMEMBERED`]; then it starts
/// over, and an object may be reported once more).
#[derive(Default)]
pub struct SetAside {
    reported: Mutex<HashSet<(String, String)>>,
}

impl SetAside {
    /// How many set-aside Approvals are remembered.
    pub const REMEMBERED: usize = 4096;

    /// Whether `approval` is served (it decodes); otherwise reports it once: a Warning Event
    /// `InvalidApproval` naming the cause, the metric, one log line.
    pub fn serves(&self, ctx: &Context, approval: &WatchedApproval) -> bool {
        let Some(cause) = &approval.undecodable else {
            return true;
        };
        let key = (
            approval.metadata.uid.clone().unwrap_or_default(),
            approval
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default(),
        );
        {
            let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            if reported.len() >= Self::REMEMBERED {
                reported.clear();
            }
            if !reported.insert(key) {
                return false;
            }
        }
        let name = format!(
            "{}/{}",
            approval.metadata.namespace.as_deref().unwrap_or_default(),
            approval.metadata.name.as_deref().unwrap_or_default()
        );
        ctx.metrics.set_aside("approval");
        tracing::warn!(approval = %name, %cause, "set aside an Approval that does not decode; it wakes no run");
        ctx.events.warn_about(
            approval.reference(),
            "InvalidApproval",
            format!(
                "Approval {name} does not decode ({cause}); the controller ignores it: delete it"
            ),
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    fn approval(name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "agentrt.dev/v1alpha1",
            "kind": "Approval",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                         "resourceVersion": "3",
                         "ownerReferences": [{"apiVersion": "agentrt.dev/v1alpha1", "kind": "AgentRun",
                                              "name": "run", "uid": "run-uid"}]},
            "spec": spec,
        })
    }

    fn good_spec() -> Value {
        json!({"runName": "run", "runUID": "run-uid", "stepIndex": 0, "kind": "policy",
               "request": {"run": {"namespace": "ns", "name": "run", "uid": "run-uid"},
                           "step": 0,
                           "tool": {"name": "t", "inputSchema": {"type": "object"},
                                    "sideEffect": "RemoteMutation", "timeoutSeconds": 30},
                           "args": {}},
               "hash": format!("sha256:{}", "0".repeat(64))})
    }

    fn nested(depth: usize) -> Value {
        let mut value = json!(1);
        for _ in 0..depth {
            value = json!({ "a": value });
        }
        value
    }

    fn list(items: &[Value]) -> String {
        json!({"apiVersion": "agentrt.dev/v1alpha1", "kind": "ApprovalList",
               "metadata": {"resourceVersion": "9"}, "items": items})
        .to_string()
    }

    #[derive(Deserialize)]
    struct List {
        items: Vec<WatchedApproval>,
    }

    #[test]
    fn a_good_approval_decodes_with_its_owner() {
        let decoded: List =
            serde_json::from_str(&list(&[approval("a", good_spec())])).expect("decodes");
        let kept = &decoded.items[0];
        assert_eq!(kept.undecodable, None, "{kept:?}");
        assert_eq!(kept.metadata.name.as_deref(), Some("a"));
        assert_eq!(
            kept.metadata
                .owner_references
                .as_ref()
                .map(|o| o[0].name.as_str()),
            Some("run")
        );
    }

    #[test]
    fn an_approval_nested_150_deep_or_of_a_wrong_type_is_set_aside_and_the_list_decodes() {
        let mut deep = good_spec();
        deep["request"]["args"] = nested(150);
        let mut wrong = good_spec();
        wrong["stepIndex"] = json!("zero");
        let text = list(&[
            approval("deep", deep),
            approval("good", good_spec()),
            approval("wrong", wrong),
        ]);
        let decoded: List = serde_json::from_str(&text).expect("the list decodes");
        let causes: Vec<Option<String>> = decoded
            .items
            .iter()
            .map(|a| a.undecodable.as_deref().map(str::to_string))
            .collect();
        assert!(
            causes[0]
                .as_deref()
                .is_some_and(|c| c.starts_with("spec: recursion limit")),
            "{causes:?}"
        );
        assert_eq!(causes[1], None);
        assert!(
            causes[2]
                .as_deref()
                .is_some_and(|c| c.starts_with("spec: invalid type")),
            "{causes:?}"
        );
        assert_eq!(decoded.items[0].metadata.name.as_deref(), Some("deep"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever an Approval's spec holds (deep, wide, huge strings, wrong types), the list
        /// decodes, a good Approval beside it decodes, and a cause never carries the text.
        #[test]
        fn whatever_an_approval_holds_the_list_decodes(
            depth in 0usize..300,
            width in 0usize..50,
            long in 0usize..20_000,
            wrong in any::<bool>(),
        ) {
            let mut spec = good_spec();
            spec["request"]["args"] = json!({
                "deep": nested(depth),
                "wide": (0..width).map(|i| json!({"k": i})).collect::<Vec<_>>(),
                "long": "x".repeat(long),
            });
            if wrong {
                spec["runName"] = json!({"not": "a string"});
            }
            let text = list(&[approval("odd", spec), approval("good", good_spec())]);
            let decoded: List = serde_json::from_str(&text).expect("the list decodes");
            prop_assert_eq!(decoded.items.len(), 2);
            prop_assert!(decoded.items[1].undecodable.is_none());
            let cause = decoded.items[0].undecodable.as_deref().unwrap_or_default();
            prop_assert!(cause.len() <= 400, "cause too long: {}", cause.len());
            prop_assert!(!cause.contains("xxxxxxxxxx"));
            // Under 100 levels (what an args check lets through) it decodes; past 128 it
            // cannot, and is set aside.
            if wrong || depth > 128 {
                prop_assert!(decoded.items[0].undecodable.is_some());
            } else if depth < 100 {
                prop_assert!(decoded.items[0].undecodable.is_none(), "{}", cause);
            }
        }
    }
}
