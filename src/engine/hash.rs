//! The approval hash (DESIGN.md section 2 "The hash"): `sha256:` + hex(SHA-256(JCS of
//! {kind, capability, presentation, request})). Who decided, notes and times are not in it.

use serde_json::Value;

use super::canonical::CanonicalError;
use crate::api::ApprovalRequest;

/// The hash an Approval for this request carries. `capability` and `presentation` are JSON
/// `null` in the hashed object when absent.
///
/// # Errors
/// [`CanonicalError`] when a part cannot be encoded (the run then fails `internal_error`).
pub fn approval_hash(
    kind: &str,
    capability: Option<&Value>,
    presentation: Option<&Value>,
    request: &ApprovalRequest,
) -> Result<String, CanonicalError> {
    let _ = (kind, capability, presentation, request);
    Err(CanonicalError("not built yet".into()))
}
