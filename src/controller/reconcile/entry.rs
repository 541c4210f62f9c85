//! kube-runtime's entry points into the Observe reconcile ([`reconcile`], [`error_policy`]):
//! a success resets the run's failure backoff, a failure is counted by kind and looked at again
//! after that run's own backoff ([`super::super::failures`]); and what a reconcile does with a run
//! that does not decode ([`set_aside`], issue 34).

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::controller::Action;
use kube::Resource;

use crate::controller::cluster::{ApiError, DecodeError, HeldRun, RunKey};
use crate::controller::context::Context;
use crate::controller::failures::ReconcileError;
use crate::controller::watched::WatchedRun;

/// kube-runtime's reconcile entry point: [`super::reconcile`], and a success resets
/// the run's backoff.
///
/// # Errors
/// As [`super::reconcile`]; [`error_policy`] handles them.
pub async fn reconcile(obj: Arc<WatchedRun>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let key = RunKey {
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().unwrap_or_default(),
    };
    let action = super::reconcile(obj, ctx.clone()).await?;
    ctx.failures.reset(&key);
    Ok(action)
}

/// kube-runtime's error policy: count the failure by kind, and look at the run again after its
/// own backoff ([`crate::controller::failures::FailureBackoff::set_failure`]).
pub fn error_policy(_obj: Arc<WatchedRun>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(err.metric_label());
    let wait = ctx.failures.set_failure(err.run());
    tracing::warn!(%err, kind = err.metric_label(), retry_in = ?wait, "reconcile failed; retrying");
    Action::requeue(wait)
}

/// What a reconcile does with a run that does not decode (issue 34): a spec that does not
/// (nested past serde_json's 128 levels, or of a type the schema lets through) ends the run
/// `invalid_spec` as the engine says ([`crate::engine::spec_undecodable`]), written by a merge
/// patch of its status on the uid and resourceVersion read, without the spec; a Warning Event
/// `InvalidSpec` names the cause, and one log line (bounded, never the object's text). A run
/// whose status does not decode is left alone with one log line (nothing can be written to it
/// without risking the record). Counted in `agentrt_objects_set_aside_total` by part. Every other
/// run is served as usual: nothing here is retried blindly (a conflict looks again at once, any
/// other failure after the run's own backoff).
pub async fn set_aside(ctx: &Context, key: &RunKey, err: DecodeError) -> Action {
    let DecodeError::Spec {
        held,
        cause,
        status,
    } = &err
    else {
        ctx.metrics.set_aside(match &err {
            DecodeError::Status { .. } => "status",
            _ => "object",
        });
        tracing::warn!(run = %key, %err, "leaving a run that does not decode alone");
        return Action::await_change();
    };
    let now = ctx.settings.clock.now();
    let Some(ended) =
        crate::engine::spec_undecodable(status, &held.namespace, &held.name, cause, now)
    else {
        // Ended already (by this replica or another).
        return Action::await_change();
    };
    match ctx.api.patch_run_status(held, &ended).await {
        Ok(()) => {
            ctx.metrics.set_aside("spec");
            tracing::warn!(run = %key, %err, "set aside: the run ends invalid_spec");
            let detail = ended["reasonDetail"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            ctx.events
                .warn_about(held_reference(held), "InvalidSpec", detail);
            ctx.failures.reset(key);
            Action::await_change()
        }
        Err(ApiError::Conflict(_)) => Action::requeue(Duration::from_millis(200)),
        Err(ApiError::NotFound(_)) => Action::await_change(),
        Err(write) => {
            let wait = ctx.failures.set_failure(key);
            tracing::warn!(run = %key, %err, %write, retry_in = ?wait, "cannot end a run whose spec does not decode");
            Action::requeue(wait)
        }
    }
}

/// The reference an Event about `held` names.
fn held_reference(held: &HeldRun) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(crate::api::AgentRun::api_version(&()).into_owned()),
        kind: Some(crate::api::AgentRun::kind(&()).into_owned()),
        name: Some(held.name.clone()),
        namespace: Some(held.namespace.clone()),
        uid: Some(held.uid.clone()),
        ..Default::default()
    }
}
