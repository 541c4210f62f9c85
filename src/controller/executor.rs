//! The executor: one tokio task per run this replica holds, performing each engine
//! [`Transition`] (the segment it seals, its status write, its bookkeeping in order, then its
//! one external call or stop) and feeding the call's outcome back (the types of `src/engine/mod.rs`).
//!
//! It decides nothing about the run. What it owns is *when* a side effect may start:
//! - only after the status write before it landed (a 409 re-reads the run and its Approvals and
//!   asks the engine again with the same input; never a blind retry);
//! - only while the Lease is held and unexpired by this replica's own monotonic clock (the last
//!   acknowledged renewal's send instant + duration − the skew margin; docs/design.md section 4,
//!   the holder's own check, never compared with another replica's clock); a lost Lease feeds [`Input::LeaseLost`] instead, and the outcome of
//!   a tool already running is then not recorded as the step's outcome;
//! - never once shutdown began.
//!
//! A transition that seals creates its segment before its status write (docs/design.md
//! section 4a): AlreadyExists with a spec that hashes the same is success; another spec under
//! that name is never overwritten, and the executor stops without writing.
//!
//! The crash points of the `fault-injection` feature sit here (see [`super::fault`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

mod gate;
mod waits;

use super::calls::{call_agent, call_hook, call_model, call_tool, ToolStep};
use super::cluster::{RunKey, RunState, Written};
use super::context::Context;
use super::fault::{self, FaultPoint};
use super::lease::{HeldLease, LeaseCell};
use super::segments::SegmentCache;
use super::trace;
use super::writes::MAX_CONFLICTS;
use gate::{may_start, stopped_or_lost};
use serde_json::Value;

use crate::api::AgentRunSegmentSpec;
use crate::engine::archive::segment_sha256;
use crate::engine::{
    Bookkeeping, ExternalCall, Input, ModelCall, Next, SegmentCreate, ToolOutcome, Transition,
};

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
    let uid = state.run.snapshot.uid.clone();
    if !ctx
        .executors
        .register(&key, &uid, stop.clone(), state.run.snapshot.generation)
    {
        return false;
    }
    let ctx = ctx.clone();
    let span = trace::run_span(&key, &state.run.snapshot.uid, ctx.settings.holder.as_str());
    tokio::spawn(
        async move {
            let lease = LeaseCell::new(held);
            let renewals = spawn_renewals(&ctx, &lease, &stop);
            tracing::info!("executing");
            let (phase, won_back) = drive(&ctx, &key, &lease, state, input, &stop).await;
            stop.cancel();
            let _ = renewals.await;
            for renewals in won_back {
                let _ = renewals.await;
            }
            lease.release(ctx.api.as_ref(), &ctx.settings.holder).await;
            ctx.executors.unregister(&key, &uid);
            tracing::info!("executor stopped");
            // A run left going (or in an unknown phase) is looked at again; one that ended
            // needs nobody (issue 15: a read per run fewer).
            if crate::engine::observe_needed(phase.as_deref()) {
                ctx.executors.kick(&key);
            }
        }
        .instrument(span),
    );
    true
}

/// The task renewing `lease` until it is lost or released, or `stop` fires
/// ([`LeaseCell::keep_renewed`]), counting lost leases and failed renewals.
fn spawn_renewals(
    ctx: &Arc<Context>,
    lease: &Arc<LeaseCell>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let lease = lease.clone();
    let api = ctx.api.clone();
    let holder = ctx.settings.holder.clone();
    let clock = ctx.settings.clock;
    let stop = stop.clone();
    let lost = ctx.metrics.clone();
    let failed = ctx.metrics.clone();
    tokio::spawn(
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
        .in_current_span(),
    )
}

/// Why a sealed segment was not created (docs/design.md section 4a).
#[derive(Debug, thiserror::Error)]
enum SegmentError {
    /// The API server failed; whether the create landed is unknown (a later seal creates it
    /// again: AlreadyExists with the same content is success).
    #[error("AgentRunSegment {name}: {source}")]
    Api {
        /// The segment's name.
        name: String,
        /// What failed.
        source: super::cluster::ApiError,
    },
    /// An object of that name holds other content: never overwritten. Names carry the
    /// content's hash, so this is a segment edited by hand (or a hash-prefix collision).
    #[error(
        "AgentRunSegment {name} already exists with other content (its spec hashes to {found}, \
         this seal's to {expected}); it is never overwritten: inspect it with `agentrt verify`"
    )]
    Different {
        /// The segment's name.
        name: String,
        /// The sha256 this seal's spec has.
        expected: String,
        /// What the stored spec hashes to (or why it does not decode).
        found: String,
    },
}

/// Creates the segment a transition seals; an AlreadyExists whose spec hashes the same is
/// success (a holder that died between the create and its status write, docs/behaviours.md
/// 56).
async fn create_segment(
    ctx: &Context,
    key: &RunKey,
    seal: &SegmentCreate,
) -> Result<(), SegmentError> {
    let api_error = |source| SegmentError::Api {
        name: seal.name.clone(),
        source,
    };
    match ctx.api.create_segment(&key.namespace, &seal.object).await {
        Ok(()) => {
            ctx.metrics.segments_created.inc();
            return Ok(());
        }
        Err(super::cluster::ApiError::Conflict(_)) => {}
        Err(err) => return Err(api_error(err)),
    }
    let found = ctx
        .api
        .get_segment(&key.namespace, &seal.name)
        .await
        .map_err(api_error)?;
    let found = match found {
        // Gone again between the two calls (deleted by hand): create it once more.
        None => {
            return ctx
                .api
                .create_segment(&key.namespace, &seal.object)
                .await
                .map_err(api_error)
        }
        Some(object) => serde_json::from_value::<AgentRunSegmentSpec>(object["spec"].clone())
            .map_err(|e| format!("a spec that does not decode: {e}"))
            .and_then(|spec| segment_sha256(&spec).map_err(|e| e.to_string())),
    };
    match found {
        Ok(sha256) if sha256 == seal.sha256 => Ok(()),
        Ok(found) | Err(found) => Err(SegmentError::Different {
            name: seal.name.clone(),
            expected: seal.sha256.clone(),
            found,
        }),
    }
}

/// What [`Driver::perform`] leaves the loop with.
enum Flow {
    /// Ask the engine again with this input.
    Next(Input),
    /// The executor is done.
    Stop,
}

/// One executor task's hold on its run: what performing a transition needs.
struct Driver<'a> {
    ctx: &'a Arc<Context>,
    key: &'a RunKey,
    lease: &'a Arc<LeaseCell>,
    stop: &'a CancellationToken,
    /// The run and its Approvals as last read or written.
    state: RunState,
    /// Compare-and-set conflicts in a row.
    conflicts: u32,
    /// The last transition's segment could not be created: ask the engine again for the same
    /// input without sealing, so the step's outcome is written (sealing waits for a later write)
    /// instead of being lost, which would leave a received result "unknown" to a takeover.
    unsealed: bool,
    /// The sealed segments read for an openai agent's conversation, by sha256.
    segments: SegmentCache,
    /// The lease was lost during the last tool call and won back ([`LeaseCell::regain`]): the
    /// write recording its outcome must land on the record as this replica last wrote it (a
    /// 409 means the record changed: the outcome is not recorded, the rule for an interrupted
    /// call stands).
    regained: bool,
    /// The renewal tasks started for a lease won back, awaited when the executor stops.
    won_back: Vec<tokio::task::JoinHandle<()>>,
    /// The Job whose outcome the pending [`Input::ToolFinished`] carries: released (its
    /// finalizer removed) once the write recording it landed (docs/design.md section 6, "Job
    /// tools").
    job_outcome: Option<String>,
}

/// The loop: ask the engine, perform its transition (in the span of the step it works on),
/// feed the outcome back, until it says stop. Returns the run's phase as last read or written
/// (`None` when it has none) and the renewal tasks started for a lease won back.
async fn drive(
    ctx: &Arc<Context>,
    key: &RunKey,
    lease: &Arc<LeaseCell>,
    state: RunState,
    input: Input,
    stop: &CancellationToken,
) -> (Option<String>, Vec<tokio::task::JoinHandle<()>>) {
    let mut driver = Driver {
        ctx,
        key,
        lease,
        stop,
        state,
        conflicts: 0,
        unsealed: false,
        segments: SegmentCache::default(),
        regained: false,
        won_back: Vec::new(),
        job_outcome: None,
    };
    drive_with(&mut driver, input).await;
    let phase = driver.state.run.snapshot.status["phase"]
        .as_str()
        .map(str::to_string);
    (phase, driver.won_back)
}

/// [`drive`]'s loop.
async fn drive_with(driver: &mut Driver<'_>, mut input: Input) {
    let (ctx, key, lease) = (driver.ctx, driver.key, driver.lease);
    let mut steps = trace::StepSpans::default();
    loop {
        if lease.is_lost() && input != Input::LeaseLost {
            input = Input::LeaseLost;
        }
        // docs/design.md section 4a: an openai agent's conversation is the whole history.
        let sealed = (driver.segments)
            .history(ctx, key, &driver.state.run.snapshot)
            .await;
        driver.state.run.snapshot.sealed = sealed;
        // docs/design.md section 6, admin policies: a decision waits for admin policy watches
        // that are (re)listing, then fails closed.
        ctx.settings
            .admin_policies
            .wait_fresh(super::admin_policy::FRESH_WAIT)
            .await;
        let asked = if std::mem::take(&mut driver.unsealed) {
            ctx.step_unsealed(&driver.state, input.clone())
        } else {
            ctx.step(&driver.state, input.clone())
        };
        let transition = match asked {
            Ok(transition) => transition,
            Err(err) => {
                tracing::warn!(%err, "the engine refused the input; stopping this executor");
                return;
            }
        };
        let step = trace::step_of(&transition, &driver.state.run.snapshot.status);
        let span = steps.for_step(key, step);
        match driver.perform(&input, transition).instrument(span).await {
            Flow::Next(next) => input = next,
            Flow::Stop => return,
        }
    }
}

impl Driver<'_> {
    /// Performs one transition: the write, the bookkeeping in order, then its next; says what
    /// the loop does next.
    async fn perform(&mut self, input: &Input, transition: Transition) -> Flow {
        let Transition {
            seal,
            write,
            record,
            bookkeeping,
            next,
        } = transition;
        if let Some(status) = write {
            let before_call = matches!(next, Next::Call(_));
            if let Some(flow) = self
                .write(input, seal.as_ref(), status, record, before_call)
                .await
            {
                return flow;
            }
        }
        match input {
            Input::ToolFinished { .. } => {
                if let Some(name) = self.job_outcome.take() {
                    super::calls::job::release(self.ctx, &self.key.namespace, &name).await;
                }
            }
            // A holder that stopped before releasing its Jobs left them held.
            Input::LeaseAcquired { .. } => {
                super::calls::job::release_settled(self.ctx, &self.state).await;
            }
            _ => {}
        }
        for item in bookkeeping {
            match item {
                Bookkeeping::Approval(write) => {
                    self.ctx.write_approval(self.key, write).await;
                }
                Bookkeeping::ReleaseLease => {
                    let phase = self.state.run.snapshot.status["phase"].as_str();
                    if crate::engine::lease_release_needed(phase) {
                        self.lease
                            .release(self.ctx.api.as_ref(), &self.ctx.settings.holder)
                            .await;
                    } else {
                        super::calls::job::release_settled(self.ctx, &self.state).await;
                        self.lease
                            .delete_ended(self.ctx.api.as_ref(), &self.ctx.settings.holder)
                            .await;
                    }
                }
            }
        }
        match next {
            // The lease is released on the way out.
            Next::Stop => Flow::Stop,
            Next::Call(call) => self.call(call).await,
        }
    }

    /// The segment the transition seals, then the status write; `None` when it landed and the
    /// transition goes on, else what the loop does instead (a 409 re-reads and asks again with
    /// the same input; a segment that cannot be created asks again without sealing).
    async fn write(
        &mut self,
        input: &Input,
        seal: Option<&SegmentCreate>,
        status: Value,
        record: Option<std::sync::Arc<crate::api::AgentRunStatus>>,
        before_call: bool,
    ) -> Option<Flow> {
        let (ctx, lease) = (self.ctx, self.lease);
        if lease.is_lost() && *input != Input::LeaseLost {
            // Record nothing under a lost lease; tell the engine instead.
            return Some(Flow::Next(Input::LeaseLost));
        }
        if before_call
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
            return Some(Flow::Next(Input::LeaseLost));
        }
        if let Some(seal) = seal {
            if let Err(err) = create_segment(ctx, self.key, seal).await {
                // Nothing is written without its segment. The same input is decided again
                // without sealing, so what this transition records (a tool's outcome among it)
                // is written now and the window is sealed by a later write.
                tracing::warn!(%err, "the sealed segment was not created; writing this step without sealing");
                ctx.metrics.segment_failures.inc();
                self.unsealed = true;
                return Some(Flow::Next(input.clone()));
            }
            fault::check(
                FaultPoint::AfterSegmentCreated,
                seal.object["spec"]["index"].as_i64(),
            );
            if self.state.run.snapshot.spec.agent.openai.is_some() {
                let spec = &seal.object["spec"];
                let bytes = spec["bytes"].as_u64().unwrap_or(0);
                self.segments
                    .remember(&seal.sha256, spec, usize::try_from(bytes).unwrap_or(0));
            }
        }
        match ctx.write_status(&self.state, status, record).await {
            Ok(Written::Landed(run)) => {
                self.state.run = *run;
                self.conflicts = 0;
                self.regained = false;
                None
            }
            Ok(Written::Conflict) if std::mem::take(&mut self.regained) => {
                // The record changed while the lease was lost: what this replica holds is no
                // longer the outcome of the step as recorded (docs/design.md section 5).
                tracing::warn!(
                    "the run changed while the lease was lost; the call's outcome is not recorded"
                );
                lease.mark_lost();
                Some(Flow::Next(Input::LeaseLost))
            }
            Ok(Written::Conflict) => {
                self.conflicts += 1;
                if self.conflicts > MAX_CONFLICTS {
                    tracing::warn!("too many conflicting writes in a row; stopping");
                    return Some(Flow::Stop);
                }
                match reread(ctx, self.key).await {
                    Some(fresh) if fresh.run.snapshot.uid == self.state.run.snapshot.uid => {
                        self.state = fresh;
                    }
                    Some(_) => {
                        // Deleted and created again under its name: another run, with its
                        // own Lease and executor (docs/behaviours.md 79).
                        tracing::info!("the run is gone (a new run of that name exists)");
                        return Some(Flow::Stop);
                    }
                    None => {
                        tracing::info!("the run is gone");
                        return Some(Flow::Stop);
                    }
                }
                Some(Flow::Next(input.clone()))
            }
            Ok(Written::Gone) => {
                tracing::info!("the run is gone");
                Some(Flow::Stop)
            }
            Err(err) => {
                tracing::warn!(%err, "cannot tell whether a status write landed; stopping (a takeover will settle it)");
                Some(Flow::Stop)
            }
        }
    }

    /// The one external call, if this replica may still start it; its outcome is the next
    /// input (or [`Input::LeaseLost`] when the lease was lost meanwhile).
    async fn call(&mut self, call: ExternalCall) -> Flow {
        let (ctx, lease, stop) = (self.ctx, self.lease, self.stop);
        let delay = match &call {
            ExternalCall::Model(ModelCall { delay_millis, .. })
            | ExternalCall::Agent { delay_millis, .. }
            | ExternalCall::Tool(crate::engine::ToolCall { delay_millis, .. })
            | ExternalCall::ToolStatus(crate::engine::StatusQuery { delay_millis, .. }) => {
                *delay_millis
            }
            _ => 0,
        };
        // A retry's backoff (a model's or the webhook agent's), or a call sent again by its
        // key waiting out the first attempt's mayRunUntil; the lease is checked after it.
        if delay > 0 {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = ctx.executors.shutdown.cancelled() => {}
                _ = tokio::time::sleep(Duration::from_millis(delay)) => {}
            }
        }
        // A tool call sent now has its start on the record already (the engine records
        // `step.tool_started` before the call and records no start once draining): a shutdown
        // that began in between does not hold it back, as it would not hold back a call
        // already in flight; the graceful shutdown waits for its outcome (docs/design.md
        // section 5, "graceful shutdown"). Not sending it would leave a start that no call
        // made, and the next holder would ask a person about it.
        // A Job tool's call is not held to this: the next holder reads the Job by its name and
        // creates it when absent, so no start is left for a person.
        let recorded_start =
            matches!(&call, ExternalCall::Tool(c) if c.job.is_none()) && delay == 0;
        if !may_start(ctx, lease, stop, !recorded_start) {
            return stopped_or_lost(lease);
        }
        let state = &self.state;
        let next = match call {
            ExternalCall::Tool(call) if call.job.is_some() => return self.wait_for_job(call).await,
            ExternalCall::Tool(call) if call.task.is_some() => return self.follow(call).await,
            ExternalCall::Tool(call) => {
                let step = call.step;
                let attempt = call.attempt;
                let tool = call.tool.name.clone();
                let started = std::time::Instant::now();
                let sent = call_tool(ctx, state, call)
                    .instrument(tracing::info_span!("tool", step = step.get(), tool = %tool))
                    .await;
                let outcome = match sent {
                    ToolStep::Finished(outcome) => outcome,
                    // Recorded before it is followed, under the lease as any write.
                    ToolStep::TaskCreated(task) => {
                        return Flow::Next(if lease.is_lost() {
                            Input::LeaseLost
                        } else {
                            Input::TaskCreated {
                                step,
                                attempt,
                                task,
                            }
                        });
                    }
                };
                ctx.metrics.tool_call(
                    &tool,
                    outcome_word(&outcome),
                    started.elapsed().as_secs_f64(),
                );
                if lease.is_lost() {
                    // docs/design.md section 5: a holder that lost its lease mid-call and wins
                    // it back (nobody took it) records the outcome it holds, on the record as
                    // it last wrote it; otherwise the outcome is not recorded.
                    if !stop.is_cancelled()
                        && !ctx.executors.shutdown.is_cancelled()
                        && lease
                            .regain(ctx.api.as_ref(), &ctx.settings.holder, &ctx.settings.clock)
                            .await
                    {
                        tracing::info!(
                            step = step.get(),
                            "the lease was lost during the tool call and won back; recording its outcome"
                        );
                        ctx.metrics.leases_won_back.inc();
                        self.regained = true;
                        self.won_back.push(spawn_renewals(ctx, lease, stop));
                    } else {
                        tracing::warn!(
                            step = step.get(),
                            "the lease was lost during the tool call; its outcome is not recorded"
                        );
                    }
                }
                Input::ToolFinished {
                    step,
                    attempt,
                    outcome,
                }
            }
            ExternalCall::Agent {
                step,
                request,
                attempt,
                timeout_millis,
                ..
            } => {
                let decision = call_agent(ctx, state, &request, timeout_millis)
                    .instrument(tracing::info_span!("agent", step = step.get(), attempt))
                    .await;
                Input::AgentAnswered { step, decision }
            }
            ExternalCall::Model(ModelCall {
                step,
                attempt,
                request,
                max_output_tokens,
                ..
            }) => {
                let outcome = call_model(ctx, state, step, &request, max_output_tokens)
                    .instrument(tracing::info_span!("model", step = step.get(), attempt))
                    .await;
                Input::ModelAnswered {
                    step,
                    attempt,
                    outcome,
                }
            }
            ExternalCall::ListTools { servers } => {
                let listings = tokio::select! {
                    listings = super::calls::list_servers(ctx, state, &servers) => listings,
                    _ = stop.cancelled() => return Flow::Stop,
                    _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
                };
                Input::ToolsListed { listings }
            }
            ExternalCall::ToolStatus(query) => {
                // Asking changes nothing on the tool, so shutdown need not wait for it.
                let step = query.step;
                let answer = tokio::select! {
                    answer = super::calls::ask_status(ctx, state, query)
                        .instrument(tracing::info_span!("tool_status", step = step.get())) => answer,
                    _ = stop.cancelled() => return Flow::Stop,
                    _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
                };
                Input::ToolStatusAnswered { step, answer }
            }
            ExternalCall::ReconcileHook { view } => {
                // The hook may be asked for up to its timeoutSeconds; asking changes
                // nothing, so shutdown need not wait for it (the next holder asks again).
                let answer = tokio::select! {
                    answer = call_hook(ctx, state, &view) => answer,
                    _ = stop.cancelled() => return Flow::Stop,
                    _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
                };
                fault::check(FaultPoint::AfterHookAnswered, None);
                Input::Reconciled { answer }
            }
        };
        Flow::Next(if lease.is_lost() {
            Input::LeaseLost
        } else {
            next
        })
    }
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

fn outcome_word(outcome: &ToolOutcome) -> &'static str {
    match outcome {
        ToolOutcome::Result { .. } => "result",
        ToolOutcome::Error { .. } => "error",
        ToolOutcome::Unknown { .. } => "unknown",
        ToolOutcome::Abort { .. } => "abort",
    }
}
