//! Validating admission webhooks handed in by whoever starts the server (kube-apiserver's
//! ValidatingWebhookConfiguration, called in process): `agentrt dev` hands in agentrt's own
//! so that `kubectl apply` of a bad AgentRun is refused here as on a cluster with the chart
//! (docs/design.md section 8).
//!
//! Owns: when a hook is asked (a create or update of an object, after schema admission, not
//! of the status subresource; dry runs too, as for `sideEffects: None`), and the refusal's
//! Status, shaped as kube-apiserver shapes a webhook's denial: 400 `BadRequest`,
//! `admission webhook "NAME" denied the request: MESSAGE`. Must not: know what the hook checks.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use super::route::Target;
use super::status::ApiError;

/// What a hook says about an object (and, for an update, the object it replaces, as
/// kube-apiserver's `oldObject`): `None` admits it, `Some(message)` refuses it.
pub type Check = dyn Fn(&Value, Option<&Value>) -> Option<String> + Send + Sync;

/// One validating webhook, by name.
#[derive(Clone)]
pub struct ValidatingWebhook {
    /// The webhook's name, as kube-apiserver quotes it in a denial.
    pub name: String,
    /// The check, given each written object as it would be stored.
    pub check: Arc<Check>,
}

impl fmt::Debug for ValidatingWebhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidatingWebhook")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Asks every hook about `object`, written through `t` (replacing `old` on an update).
///
/// # Errors
/// The first refusal, as [`ApiError::BadRequest`] with kube-apiserver's message.
pub(super) fn admit(
    hooks: &[ValidatingWebhook],
    t: &Target,
    object: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if t.status {
        return Ok(());
    }
    for hook in hooks {
        if let Some(message) = (hook.check)(object, old) {
            return Err(ApiError::BadRequest(format!(
                "admission webhook {:?} denied the request: {message}",
                hook.name
            )));
        }
    }
    Ok(())
}
