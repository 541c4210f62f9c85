//! The approval hash (docs/design.md section 2 "The hash"): `sha256:` + hex(SHA-256(JCS of
//! {kind, capability, presentation, request})). Who decided, notes and times are not in it.
//!
//! Owns: exactly which fields an approval is bound to. Must not: hash a stand-in for what is
//! stored (the caller passes the request as read back from the API server; since canonical
//! JSON writes `250.0` and `250` alike, the number spellings kube-apiserver normalizes do not
//! change the hash).

use serde_json::{json, Value};

use super::canonical::{canonical_json, sha256_tagged, CanonicalError};
use crate::api::ApprovalRequest;

/// The hash an Approval for this request carries. `capability` and `presentation` are JSON
/// `null` in the hashed object when absent.
///
/// The hashed object is `{"kind", "capability", "presentation", "request"}` where `request`
/// serializes as [`ApprovalRequest`] does: `{run: {namespace, name, uid}, step, tool: {name,
/// description, inputSchema, sideEffect, timeoutSeconds, terminal}, args}`. Result shape:
/// `sha256:` + 64 lowercase hex digits.
///
/// # Errors
/// [`CanonicalError`] when a part cannot be encoded (the run then fails `internal_error`).
pub fn approval_hash(
    kind: &str,
    capability: Option<&Value>,
    presentation: Option<&Value>,
    request: &ApprovalRequest,
) -> Result<String, CanonicalError> {
    let request = serde_json::to_value(request)
        .map_err(|e| CanonicalError(format!("approval request: {e}")))?;
    let hashed = json!({
        "kind": kind,
        "capability": capability.cloned().unwrap_or(Value::Null),
        "presentation": presentation.cloned().unwrap_or(Value::Null),
        "request": request,
    });
    Ok(sha256_tagged(canonical_json(&hashed)?.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApprovalDecision, ApprovalSpec, RunRef, SideEffect, ToolRef, Verdict};
    use sha2::{Digest, Sha256};

    fn request(args: Value) -> ApprovalRequest {
        ApprovalRequest {
            run: RunRef {
                namespace: "default".into(),
                name: "refund-1042".into(),
                uid: "6f1c2a1e-0000-4000-8000-000000001042".into(),
            },
            step: crate::api::StepIndex(1),
            tool: ToolRef {
                name: "issue_refund".into(),
                description: "Refund an order.".into(),
                input_schema: json!({
                    "type": "object",
                    "required": ["order", "amount"],
                    "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}
                }),
                side_effect: SideEffect::RemoteMutation,
                timeout_seconds: 30,
                terminal: false,
                pin_sha256: None,
            },
            args,
        }
    }

    const PINNED: &str = "sha256:c447af0ad36847997f028955e7142cd80c98f37e6e65965e63ed69d83cdad9c8";

    /// The canonical text of the pinned request, written out by hand.
    const PINNED_TEXT: &str = concat!(
        r#"{"capability":{"maxAmount":250},"kind":"policy","presentation":null,"#,
        r#""request":{"args":{"amount":250,"order":1042},"#,
        r#""run":{"name":"refund-1042","namespace":"default","uid":"6f1c2a1e-0000-4000-8000-000000001042"},"#,
        r#""step":1,"#,
        r#""tool":{"description":"Refund an order.","#,
        r#""inputSchema":{"properties":{"amount":{"type":"number"},"order":{"type":"integer"}},"required":["order","amount"],"type":"object"},"#,
        r#""name":"issue_refund","sideEffect":"RemoteMutation","terminal":false,"timeoutSeconds":30}}}"#
    );

    fn pinned() -> String {
        approval_hash(
            "policy",
            Some(&json!({"maxAmount": 250})),
            None,
            &request(json!({"order": 1042, "amount": 250})),
        )
        .expect("hash")
    }

    #[test]
    fn the_approval_hash_of_a_fixed_request_never_changes() {
        assert_eq!(pinned(), PINNED);
    }

    #[test]
    fn the_pinned_hash_is_sha256_of_the_hand_written_canonical_text() {
        let independent = format!("sha256:{}", hex::encode(Sha256::digest(PINNED_TEXT)));
        assert_eq!(independent, PINNED);
    }

    #[test]
    fn who_decided_notes_and_times_do_not_change_the_hash() {
        let req = request(json!({"order": 1042, "amount": 250}));
        let mut spec = ApprovalSpec {
            run_name: "refund-1042".into(),
            run_uid: req.run.uid.clone(),
            step_index: crate::api::StepIndex(1),
            kind: "policy".into(),
            request: req,
            capability: Some(json!({"maxAmount": 250})),
            presentation: None,
            reason: Some("refunds need a person".into()),
            hash: PINNED.into(),
            decision: None,
        };
        let before = approval_hash(
            &spec.kind,
            spec.capability.as_ref(),
            spec.presentation.as_ref(),
            &spec.request,
        )
        .expect("hash");
        spec.decision = Some(ApprovalDecision {
            verdict: Verdict::Approved,
            hash: PINNED.into(),
            approver: Some("alice".into()),
            note: Some("ok, damaged on arrival".into()),
            result: None,
            answer: None,
        });
        spec.reason = Some("a different reason".into());
        let after = approval_hash(
            &spec.kind,
            spec.capability.as_ref(),
            spec.presentation.as_ref(),
            &spec.request,
        )
        .expect("hash");
        assert_eq!(before, after);
        assert_eq!(after, PINNED);
    }

    #[test]
    fn a_float_spelled_integer_hashes_as_the_integer_kubernetes_stores() {
        let as_float = approval_hash(
            "policy",
            Some(&json!({"maxAmount": 250.0})),
            None,
            &request(json!({"order": 1042.0, "amount": 250.0})),
        )
        .expect("hash");
        assert_eq!(as_float, PINNED);
        // Read back from the API server as text, the hash is the same again.
        let stored: Value =
            serde_json::from_str(r#"{"order": 1042, "amount": 250}"#).expect("json");
        let read_back = approval_hash(
            "policy",
            Some(&json!({"maxAmount": 250})),
            None,
            &request(stored),
        )
        .expect("hash");
        assert_eq!(read_back, PINNED);
    }

    #[test]
    fn every_hashed_field_changes_the_hash() {
        let base = pinned();
        let cap = Some(json!({"maxAmount": 250}));
        let other = [
            approval_hash(
                "other",
                cap.as_ref(),
                None,
                &request(json!({"order": 1042, "amount": 250})),
            ),
            approval_hash(
                "policy",
                None,
                None,
                &request(json!({"order": 1042, "amount": 250})),
            ),
            approval_hash(
                "policy",
                cap.as_ref(),
                Some(&json!({"title": "x"})),
                &request(json!({"order": 1042, "amount": 250})),
            ),
            approval_hash(
                "policy",
                cap.as_ref(),
                None,
                &request(json!({"order": 1042, "amount": 251})),
            ),
            {
                let mut r = request(json!({"order": 1042, "amount": 250}));
                r.tool.timeout_seconds = 31;
                approval_hash("policy", cap.as_ref(), None, &r)
            },
            {
                let mut r = request(json!({"order": 1042, "amount": 250}));
                r.step = crate::api::StepIndex(2);
                approval_hash("policy", cap.as_ref(), None, &r)
            },
        ];
        for (i, h) in other.into_iter().enumerate() {
            assert_ne!(h.expect("hash"), base, "variant {i}");
        }
    }

    #[test]
    fn integers_beyond_two_to_the_53_do_not_collide() {
        let a = approval_hash(
            "policy",
            None,
            None,
            &request(json!({"n": 9_007_199_254_740_992i64})),
        );
        let b = approval_hash(
            "policy",
            None,
            None,
            &request(json!({"n": 9_007_199_254_740_993i64})),
        );
        assert_ne!(a.expect("hash"), b.expect("hash"));
    }
}
