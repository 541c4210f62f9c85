//! The executor: one tokio task per run this replica holds, performing the engine's effects
//! strictly in order and feeding each outcome back (the effect protocol of `src/engine/mod.rs`).
//!
//! It decides nothing about the run. What it owns is *when* a side effect may start:
//! - only after the status write before it landed (a 409 re-reads the run and its Approvals and
//!   asks the engine again with the same input; never a blind retry);
//! - only while the Lease is held and unexpired by this replica's own monotonic clock (the last
//!   acknowledged renewal's send instant + duration − the skew margin; DESIGN.md section 4,
//!   the holder's own check, never compared with another replica's clock); a lost Lease feeds [`Input::LeaseLost`] instead, and the outcome of
//!   a tool already running is then not recorded as the step's outcome;
//! - never once shutdown began.
//!
//! The crash points of the `fault-injection` feature sit here (see [`super::fault`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::calls::{call_agent, call_hook, call_model, call_tool};
use super::context::{Context, RunKey, RunState, Written, MAX_CONFLICTS};
use super::fault::{self, FaultPoint};
use super::lease::{HeldLease, LeaseCell};
use super::trace;
use crate::engine::{Effect, Input, ToolOutcome};

/// Starts executing `key` under `held`, beginning with `input` (normally
/// [`Input::LeaseAcquired`]). False when this replica already executes the run (the lease is
/// then left to the running executor).
pub fn spawn(
    ctx: &Arc<Context>,
    key: RunKey,
    state: RunState,
    held: HeldLease,
    input: Input,
) -> bool {
    let stop = CancellationToken::new();
    if !ctx
        .executors
        .register(&key, stop.clone(), state.run.snapshot.generation)
    {
        return false;
    }
    let ctx = ctx.clone();
    let span = trace::run_span(&key, &state.run.snapshot.uid, ctx.settings.holder.as_str());
    tokio::spawn(
        async move {
            let lease = LeaseCell::new(held);
            let renewals = tokio::spawn({
                let lease = lease.clone();
                let api = ctx.api.clone();
                let holder = ctx.settings.holder.clone();
                let clock = ctx.settings.clock;
                let stop = stop.clone();
                let lost = ctx.metrics.clone();
                let failed = ctx.metrics.clone();
                async move {
                    lease
                        .keep_renewed(
                            api,
                            holder,
                            clock,
                            stop,
                            move || {
                                lost.leases_lost.inc();
                            },
                            move || {
                                failed.lease_renew_failures.inc();
                            },
                        )
                        .await;
                }
                .in_current_span()
            });
            tracing::info!("executing");
            drive(&ctx, &key, &lease, state, input, &stop).await;
            stop.cancel();
            let _ = renewals.await;
            lease.release(ctx.api.as_ref(), &ctx.settings.holder).await;
            ctx.executors.unregister(&key);
            tracing::info!("executor stopped");
            ctx.executors.kick(&key);
        }
        .instrument(span),
    );
    true
}

/// What [`perform`] leaves the loop with.
enum Flow {
    /// Ask the engine again with this input.
    Next(Input),
    /// The executor is done.
    Stop,
}

/// The loop: ask the engine, perform its effects (in the span of the step they work on), feed
/// the outcome back, until it says stop.
async fn drive(
    ctx: &Arc<Context>,
    key: &RunKey,
    lease: &Arc<LeaseCell>,
    mut state: RunState,
    mut input: Input,
    stop: &CancellationToken,
) {
    let mut conflicts = 0u32;
    let mut steps = trace::StepSpans::default();
    loop {
        if lease.is_lost() && input != Input::LeaseLost {
            input = Input::LeaseLost;
        }
        let transition = match ctx.step(&state, input.clone()) {
            Ok(transition) => transition,
            Err(err) => {
                tracing::warn!(%err, "the engine refused the input; stopping this executor");
                return;
            }
        };
        let step = trace::step_of(&transition.effects, &state.run.snapshot.status);
        let span = steps.for_step(key, step);
        let flow = perform(
            ctx,
            key,
            lease,
            &mut state,
            &input,
            transition.effects,
            stop,
            &mut conflicts,
        )
        .instrument(span)
        .await;
        match flow {
            Flow::Next(next) => input = next,
            Flow::Stop => return,
        }
    }
}

/// Performs one transition's effects in order; says what the loop does next.
#[allow(clippy::too_many_arguments)]
async fn perform(
    ctx: &Arc<Context>,
    key: &RunKey,
    lease: &Arc<LeaseCell>,
    state: &mut RunState,
    input: &Input,
    effects: Vec<Effect>,
    stop: &CancellationToken,
    conflicts: &mut u32,
) -> Flow {
    let starts_side_effect = effects.iter().any(|effect| {
        matches!(
            effect,
            Effect::CallTool(_)
                | Effect::CallAgent { .. }
                | Effect::CallModel { .. }
                | Effect::CallReconcileHook { .. }
        )
    });
    for effect in effects {
        match effect {
            Effect::WriteStatus { status } => {
                if lease.is_lost() && *input != Input::LeaseLost {
                    // Record nothing under a lost lease; tell the engine instead.
                    return Flow::Next(Input::LeaseLost);
                }
                if starts_side_effect
                    && !lease
                        .renew_if_half_spent(
                            ctx.api.as_ref(),
                            &ctx.settings.holder,
                            &ctx.settings.clock,
                            ctx.settings.skew_margin,
                            || {
                                ctx.metrics.lease_renew_failures.inc();
                            },
                        )
                        .await
                {
                    // Do not record a start this replica could not make.
                    lease.mark_lost();
                    ctx.metrics.leases_lost.inc();
                    return Flow::Next(Input::LeaseLost);
                }
                match ctx.write_status(state, &status).await {
                    Ok(Written::Landed(run)) => {
                        state.run = *run;
                        *conflicts = 0;
                    }
                    Ok(Written::Conflict) => {
                        *conflicts += 1;
                        if *conflicts > MAX_CONFLICTS {
                            tracing::warn!("too many conflicting writes in a row; stopping");
                            return Flow::Stop;
                        }
                        match reread(ctx, key).await {
                            Some(fresh) => *state = fresh,
                            None => return Flow::Stop,
                        }
                        return Flow::Next(input.clone());
                    }
                    Ok(Written::Gone) => {
                        tracing::info!("the run is gone");
                        return Flow::Stop;
                    }
                    Err(err) => {
                        tracing::warn!(%err, "cannot tell whether a status write landed; stopping (a takeover will settle it)");
                        return Flow::Stop;
                    }
                }
            }
            Effect::CreateApproval { approval } => {
                ctx.create_approval(key, &approval).await;
            }
            Effect::WriteApprovalStatus {
                name,
                status,
                resource_version,
                hash,
            } => {
                ctx.write_approval_status(&key.namespace, &name, &status, resource_version, &hash)
                    .await;
            }
            Effect::AcquireLease { takeover } => {
                // This executor holds the lease already.
                return Flow::Next(Input::LeaseAcquired { takeover });
            }
            Effect::CallTool(call) => {
                if !may_start(ctx, lease, stop) {
                    return stopped_or_lost(lease);
                }
                let step = call.step;
                let attempt = call.attempt;
                let tool = call.tool.name.clone();
                let started = std::time::Instant::now();
                let outcome = call_tool(ctx, state, call)
                    .instrument(tracing::info_span!("tool", step, tool = %tool))
                    .await;
                ctx.metrics.tool_call(
                    &tool,
                    outcome_word(&outcome),
                    started.elapsed().as_secs_f64(),
                );
                return Flow::Next(if lease.is_lost() {
                    tracing::warn!(
                        step,
                        "the lease was lost during the tool call; its outcome is not recorded"
                    );
                    Input::LeaseLost
                } else {
                    Input::ToolFinished {
                        step,
                        attempt,
                        outcome,
                    }
                });
            }
            Effect::CallAgent { step, request } => {
                if !may_start(ctx, lease, stop) {
                    return stopped_or_lost(lease);
                }
                let decision = call_agent(ctx, state, &request).await;
                return Flow::Next(if lease.is_lost() {
                    Input::LeaseLost
                } else {
                    Input::AgentAnswered { step, decision }
                });
            }
            Effect::CallModel {
                step,
                attempt,
                request,
                max_output_tokens,
                delay_millis,
            } => {
                if delay_millis > 0 {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = ctx.executors.shutdown.cancelled() => {}
                        _ = tokio::time::sleep(Duration::from_millis(delay_millis)) => {}
                    }
                }
                if !may_start(ctx, lease, stop) {
                    return stopped_or_lost(lease);
                }
                let outcome = call_model(ctx, state, step, &request, max_output_tokens)
                    .instrument(tracing::info_span!("model", step, attempt))
                    .await;
                return Flow::Next(if lease.is_lost() {
                    Input::LeaseLost
                } else {
                    Input::ModelAnswered {
                        step,
                        attempt,
                        outcome,
                    }
                });
            }
            Effect::CallReconcileHook { view } => {
                if !may_start(ctx, lease, stop) {
                    return stopped_or_lost(lease);
                }
                // The hook may be asked for up to its timeoutSeconds; asking changes
                // nothing, so shutdown need not wait for it (the next holder asks again).
                let answer = tokio::select! {
                    answer = call_hook(ctx, state, &view) => answer,
                    _ = stop.cancelled() => return Flow::Stop,
                    _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
                };
                fault::check(FaultPoint::AfterHookAnswered, None);
                return Flow::Next(if lease.is_lost() {
                    Input::LeaseLost
                } else {
                    Input::Reconciled { answer }
                });
            }
            Effect::ReleaseLease => {
                lease.release(ctx.api.as_ref(), &ctx.settings.holder).await;
            }
            Effect::RequeueAfter { millis } => ctx.executors.kick_after(key, millis),
            Effect::Stop => return Flow::Stop,
        }
    }
    // The transition ended without an external action: the lease is released on the way out.
    Flow::Stop
}

/// After a lost write race: the run and its Approvals as stored now (None: gone or unreadable).
async fn reread(ctx: &Context, key: &RunKey) -> Option<RunState> {
    for attempt in 0..5u32 {
        match ctx.read_state(key).await {
            Ok(Some(state)) => return Some(state),
            Ok(None) => return None,
            Err(err) => {
                tracing::info!(%err, "cannot re-read the run; retrying");
                tokio::time::sleep(Duration::from_millis(100 * (1 << attempt))).await;
            }
        }
    }
    None
}

/// The check before each side effect: the lease is held and unexpired by this replica's own
/// monotonic clock (minus the skew margin), and shutdown has not begun.
fn may_start(ctx: &Context, lease: &LeaseCell, stop: &CancellationToken) -> bool {
    if ctx.executors.shutdown.is_cancelled() || stop.is_cancelled() {
        return false;
    }
    if lease.may_start_side_effect(ctx.settings.skew_margin) {
        return true;
    }
    tracing::warn!("the lease is lost or expired by this replica's clock; no side effect starts");
    lease.mark_lost();
    false
}

/// After a side effect was not started: tell the engine the lease is lost, or stop (shutdown).
fn stopped_or_lost(lease: &LeaseCell) -> Flow {
    if lease.is_lost() {
        Flow::Next(Input::LeaseLost)
    } else {
        Flow::Stop
    }
}

fn outcome_word(outcome: &ToolOutcome) -> &'static str {
    match outcome {
        ToolOutcome::Result { .. } => "result",
        ToolOutcome::Error { .. } => "error",
        ToolOutcome::Unknown { .. } => "unknown",
        ToolOutcome::Abort { .. } => "abort",
    }
}
