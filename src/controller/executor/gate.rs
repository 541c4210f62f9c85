//! The executor's gate before each side effect (docs/design.md section 4): the lease held and
//! unexpired by this replica's own clock, the executor not stopped, shutdown not begun.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::super::context::Context;
use super::super::lease::LeaseCell;
use super::Flow;
use crate::engine::Input;

/// The check before each side effect: the lease is held and unexpired by this replica's own
/// monotonic clock (minus the skew margin), the run's executor was not stopped, and (when
/// `refuse_draining`) shutdown has not begun.
pub(super) fn may_start(
    ctx: &Context,
    lease: &LeaseCell,
    stop: &CancellationToken,
    refuse_draining: bool,
) -> bool {
    if (refuse_draining && ctx.executors.shutdown.is_cancelled()) || stop.is_cancelled() {
        return false;
    }
    if lease.may_start_side_effect(ctx.settings.skew_margin) {
        return true;
    }
    tracing::warn!("the lease is lost or expired by this replica's clock; no side effect starts");
    lease.mark_lost();
    false
}

/// Resolves once the lease is marked lost (checked every 250 ms).
pub(super) async fn lost(lease: &LeaseCell) {
    while !lease.is_lost() {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// After a side effect was not started: tell the engine the lease is lost, or stop (shutdown).
pub(super) fn stopped_or_lost(lease: &LeaseCell) -> Flow {
    if lease.is_lost() {
        Flow::Next(Input::LeaseLost)
    } else {
        Flow::Stop
    }
}
