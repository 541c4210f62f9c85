//! Canonical JSON (RFC 8785, JCS) and SHA-256 digests: the bytes the policy, the loop detector
//! and the approval hash see (DESIGN.md section 2 "The hash", BEHAVIOURS.md 11).

use serde_json::Value;

/// Why a value has no canonical form.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("value cannot be encoded as canonical JSON: {0}")]
pub struct CanonicalError(pub String);

/// The RFC 8785 canonical serialization of `value`.
///
/// # Errors
/// [`CanonicalError`] for a value JCS cannot encode (e.g. a number outside IEEE 754 double).
pub fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let _ = value;
    Err(CanonicalError("not built yet".into()))
}

/// `"sha256:" + lowercase hex of SHA-256(bytes)`.
pub fn sha256_tagged(bytes: &[u8]) -> String {
    let _ = bytes;
    String::new()
}

/// `sha256_tagged(canonical_json(value))`.
///
/// # Errors
/// As [`canonical_json`].
pub fn content_hash(value: &Value) -> Result<String, CanonicalError> {
    Ok(sha256_tagged(canonical_json(value)?.as_bytes()))
}
