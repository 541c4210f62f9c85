//! The reconcile of one AgentRun by a replica that is not executing it (or is, for a cancel):
//! read the run, its Approvals and its Lease, ask [`crate::engine::observe`], and perform what
//! it returns, which by its type ([`crate::engine::Observed`]) holds no side effect: a status
//! write (cancel, expiry, rejection), Approval creation and status, then a requeue or winning
//! the Lease, after which an executor task takes the run over (docs/design.md section 5). It stays quick: no tool, agent or hook call ever happens here.

pub mod entry;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::Action;
use tracing::Instrument;

use super::cluster::RunError;
use super::cluster::{RunKey, RunState, Written};
use super::context::Context;
use super::executor;
use super::failures::ReconcileError;
use super::lease::{self, observation::LeaseRead};
use super::watched::{FreshRun, WatchedRun};
use super::writes::MAX_CONFLICTS;
use crate::engine::{Input, ObserveNext};

/// How long a run that found every executor slot taken waits at most before it is looked at
/// again; a slot that frees wakes it sooner.
const SLOT_WAIT_MILLIS: u64 = 30_000;

/// The reconcile of one run (kube-runtime calls it through [`entry::reconcile`]).
///
/// # Errors
/// When the API server fails; the run is looked at again after a backoff
/// ([`entry::error_policy`]).
pub async fn reconcile(obj: Arc<WatchedRun>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciles.inc();
    let key = RunKey {
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().unwrap_or_default(),
    };
    let action = reconcile_run(&obj, &key, &ctx).await;
    // A slot this run was kicked for and did not take goes to the next run waiting for one.
    ctx.executors.reconciled(&key);
    action
}

/// [`reconcile`] of the run `key` as the watch delivered it (`obj`).
async fn reconcile_run(
    obj: &WatchedRun,
    key: &RunKey,
    ctx: &Arc<Context>,
) -> Result<Action, ReconcileError> {
    if ctx.executors.shutdown.is_cancelled() {
        return Ok(Action::await_change());
    }
    if !crate::engine::observe_needed(obj.status.phase.as_deref()) {
        // Terminal (for good): nothing to read, nothing to do.
        return Ok(Action::await_change());
    }
    if ctx.ended.has_ended(key, obj.uid()) {
        // Read or written terminal already; the watch is behind.
        return Ok(Action::await_change());
    }
    if obj.metadata.generation.is_some()
        && ctx.executors.executing_generation(key, obj.uid()) == obj.metadata.generation
    {
        // This replica's executor works on the run and its spec did not change (no cancel): the
        // change that woke us is the executor's own; it kicks a reconcile when it stops.
        return Ok(Action::await_change());
    }
    if let Some(wait) = left_to_another(obj, key, ctx) {
        // A new run another replica ranks first for: it tries the Lease; this one after a
        // while, if the run is still new then.
        return Ok(Action::requeue(Duration::from_millis(wait)));
    }
    if let Some(wait) = held_elsewhere(obj, key, ctx) {
        // Another replica holds it, live, on its current spec: nothing to read until the
        // Lease could have expired (a cancel, a release or a takeover wakes us sooner).
        return Ok(Action::requeue(Duration::from_millis(
            wait.saturating_add(50),
        )));
    }
    if let Some(wait) = lease_watch_behind(obj, key, ctx) {
        // Recorded as held by another replica, whose Lease this replica's Lease watch has not
        // delivered yet: it wakes the run when it does; reading now could only end in a
        // create that loses.
        return Ok(Action::requeue(Duration::from_millis(wait)));
    }
    let slot = match slot_before_read(obj, key, ctx) {
        SlotBeforeRead::Full => {
            // Every slot is taken and the run is as it was created: reading it could only end
            // in waiting for a slot, so it waits without the read (a freed slot kicks it).
            return Ok(Action::requeue(Duration::from_millis(SLOT_WAIT_MILLIS)));
        }
        SlotBeforeRead::Reserved(slot) => Some(slot),
        SlotBeforeRead::NotNeeded => None,
    };
    let span = super::trace::reconcile_span(key, obj.metadata.uid.as_deref());
    let started = std::time::Instant::now();
    let action = observe_with_slot(ctx, key, obj.fresh.as_ref(), slot)
        .instrument(span)
        .await;
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    action.map_err(|err| ReconcileError::new(key.clone(), err))
}

/// When `obj` is new (no status; the Lease watch has listed and holds no Lease for it) and
/// another replica this one knows of ranks first for it ([`super::spread`]): how long to leave
/// it alone. A run that is no longer new is forgotten there.
fn left_to_another(obj: &WatchedRun, key: &RunKey, ctx: &Context) -> Option<u64> {
    let uid = obj.uid();
    // A Lease another run of this name left (owned by another uid) counts as none.
    let new =
        crate::engine::is_new_run(obj.status.phase.as_deref(), obj.status.observed_generation)
            && no_own_lease_watched(ctx, key, uid);
    if !new || ctx.executors.is_executing(key, uid) {
        ctx.spread.settled(key);
        return None;
    }
    let now = std::time::Instant::now();
    let peers = ctx.leases.holders_seen(now, super::spread::PEER_MEMORY);
    ctx.spread
        .defer(key, uid, ctx.settings.holder.as_str(), &peers, now)
}

/// Whether this replica's Lease watch has listed and holds no Lease of the run `key` of uid
/// `uid` (one another run of the name left, owned by another uid, counts as none).
fn no_own_lease_watched(ctx: &Context, key: &RunKey, uid: &str) -> bool {
    matches!(ctx.leases.cached(key), Some(cached) if lease::own(cached.as_deref(), uid).is_none())
}

/// How long a run recorded as held by another replica is left alone at most while the Lease
/// watch holds no Lease of it (milliseconds): the Lease's event wakes it sooner.
const LEASE_WATCH_WAIT_MILLIS: u64 = 2_000;

/// When the watch saw `obj` recorded as held by another replica, on its current spec, and the
/// Lease watch has listed and holds no Lease of this run ([`crate::engine::lease_watch_behind`]):
/// how long to leave it alone, once, for at most [`LEASE_WATCH_WAIT_MILLIS`]. A run for which
/// that no longer holds is forgotten there.
fn lease_watch_behind(obj: &WatchedRun, key: &RunKey, ctx: &Context) -> Option<u64> {
    let behind =
        crate::engine::lease_watch_behind(&watched_view(obj), ctx.settings.holder.as_str())
            && no_own_lease_watched(ctx, key, obj.uid());
    if !behind {
        ctx.lease_watch_behind.settled(key);
        return None;
    }
    let wait = ctx
        .lease_watch_behind
        .once(key, std::time::Instant::now(), LEASE_WATCH_WAIT_MILLIS);
    if wait.is_none() {
        tracing::debug!(
            run = %key,
            holder = ?obj.status.lease.as_ref().and_then(|lease| lease.holder.as_deref()),
            "the Lease watch still holds no Lease of a run held elsewhere; reading the run"
        );
    }
    wait
}

/// What a reconcile does about an executor slot before it reads a run ([`slot_before_read`]).
pub(super) enum SlotBeforeRead<'a> {
    /// The run may need no slot, or may not wait for one unread: go on as before.
    NotNeeded,
    /// A slot, taken for the run before it is read: its acquire uses it.
    Reserved(super::executors::SlotReservation<'a>),
    /// Every slot is taken: the run waits for one unread (registered to be kicked).
    Full,
}

/// For a run `obj` that is new and as created ([`crate::engine::slot_wait_unread`]) and not
/// executing here: a slot taken before the run is read, or, when every slot of this replica
/// is taken (`--max-concurrent-runs`, or fewer by the pace), the run registered to be kicked
/// when one frees and left unread until then. At scale on a slow API server, thousands of new
/// runs waiting for slots were otherwise each read again at every wake (issue 15); and a run
/// read after a free slot was seen, but whose slot another run took during the read (0.5-1 s
/// on a loaded kube-apiserver), was read again at each kick: 0.43 reads per run in a 3,000-run
/// `scale` (issue 15, session 17). The reservation is held through the read and used by the
/// acquire ([`observe_with_slot`]); dropped unused, it gives the slot back.
pub(super) fn slot_before_read<'a>(
    obj: &WatchedRun,
    key: &RunKey,
    ctx: &'a Context,
) -> SlotBeforeRead<'a> {
    if !crate::engine::slot_wait_unread(&watched_view(obj))
        || ctx.executors.shutdown.is_cancelled()
        || ctx.executors.is_executing(key, obj.uid())
    {
        return SlotBeforeRead::NotNeeded;
    }
    match ctx.executors.reserve_slot(key) {
        Some(slot) => SlotBeforeRead::Reserved(slot),
        None => {
            ctx.executors.wait_for_slot(key, ctx.place_for(obj.uid()));
            SlotBeforeRead::Full
        }
    }
}

/// When the watch saw `obj` held by another replica whose Lease, as the Lease watch delivered
/// it, is live by this replica's observation, and nothing changed in its spec since its last
/// status write: the milliseconds [`crate::engine::observer_wait`] says it may be left alone.
fn held_elsewhere(obj: &WatchedRun, key: &RunKey, ctx: &Context) -> Option<u64> {
    let lease = ctx.leases.cached(key)??;
    let uid = obj.uid();
    lease::own(Some(&lease), uid)?;
    let seen = ctx.observe_lease(key, Some(&lease), uid, LeaseRead::Cached);
    let now = std::time::Instant::now();
    let watch_lag_ms = ctx.watch_lag.lag_millis(now);
    // Past the minute's cap, whether the holder is up counts ([`crate::engine::WatchBehind`]).
    let presence = seen
        .holder
        .as_deref()
        .filter(|_| watch_lag_ms > crate::engine::LAG_CAP_MILLIS)
        .and_then(|holder| ctx.holder_presence(holder, now));
    let wait = crate::engine::observer_wait(
        &watched_view(obj),
        &seen,
        ctx.settings.holder.as_str(),
        &crate::engine::WatchBehind {
            lag_ms: watch_lag_ms,
            holder_presence: presence.as_ref(),
        },
    );
    // Judged again only for the debug line, and only when it is enabled.
    let expired = || {
        seen.duration_seconds.is_some_and(|duration| {
            matches!(
                crate::engine::lease_liveness(&seen, duration),
                crate::engine::LeaseLiveness::Expired
            )
        })
    };
    if wait.is_none()
        && tracing::enabled!(tracing::Level::DEBUG)
        && seen.holder.as_deref() != Some(ctx.settings.holder.as_str())
        && expired()
    {
        tracing::debug!(
            run = %key,
            phase = ?obj.status.phase,
            holder = ?seen.holder,
            unchanged_for_ms = seen.unchanged_for_ms,
            watch_lag_ms,
            "another replica's Lease of this run could have expired; reading the run"
        );
    }
    wait
}

/// What the engine's observer rules see of a watched run.
fn watched_view(obj: &WatchedRun) -> crate::engine::WatchedView<'_> {
    crate::engine::WatchedView {
        phase: obj.status.phase.as_deref(),
        generation: obj.metadata.generation,
        observed_generation: obj.status.observed_generation,
        holder: obj
            .status
            .lease
            .as_ref()
            .and_then(|lease| lease.holder.as_deref()),
    }
}

/// One Observe pass over `key`; the action says when to look again. `fresh` is the run as its
/// watch event showed it while no controller had written its status ([`FreshRun`]); the pass
/// then reads nothing of the run when [`watched_state`] allows (issue 15), and its first write,
/// a compare-and-set on that version, fails with 409 if the run changed since, after which it
/// is read.
///
/// # Errors
/// When the API server fails.
pub async fn observe(
    ctx: &Arc<Context>,
    key: &RunKey,
    fresh: Option<&FreshRun>,
) -> Result<Action, RunError> {
    observe_with_slot(ctx, key, fresh, None).await
}

/// [`observe`] with `reserved`, an executor slot taken for the run before it was read
/// ([`slot_before_read`]): an acquire of its Lease uses it rather than taking another; unused,
/// it is given back when the pass ends.
///
/// # Errors
/// When the API server fails.
async fn observe_with_slot(
    ctx: &Arc<Context>,
    key: &RunKey,
    fresh: Option<&FreshRun>,
    mut reserved: Option<super::executors::SlotReservation<'_>>,
) -> Result<Action, RunError> {
    // The Lease first, then the run: a holder releases its Lease only after its last write, so
    // a released Lease read first (live, or as the watch delivered it: a past version) is never
    // paired with a record older than that write. A run is taken from its watch event only
    // while nothing says it was started: no controller wrote its status, and it has no Lease
    // of its own (one that has, even a dead holder's, is read live, so a takeover is decided
    // from the record). Its first transition then writes before it calls anything (a run
    // with MCP tools, listed first, is read live too), and that write is fenced by the event's
    // version.
    let (mut lease_read, mut lease_source) = ctx.read_lease(key).await?;
    let unread = fresh.and_then(|fresh| watched_state(key, fresh, lease_read.as_deref()));
    let read = match unread {
        Some(state) => Ok(Some(state)),
        None => {
            // With why a run new to this replica was not kept ([`super::watches::keeps_fresh`]);
            // the fields are evaluated only when the line is enabled.
            tracing::debug!(
                run = %key,
                fresh = fresh.is_some(),
                lease = lease_read.is_some(),
                fresh_bytes = FreshRun::bytes_alive(),
                peers = ctx
                    .leases
                    .holders_seen(std::time::Instant::now(), super::spread::PEER_MEMORY)
                    .len(),
                "reading the run"
            );
            ctx.read_state(key).await
        }
    };
    let mut state = match read {
        Ok(Some(state)) => state,
        Ok(None) => return Ok(Action::await_change()),
        Err(RunError::Undecodable(detail)) => {
            return Ok(entry::set_aside(ctx, key, detail).await);
        }
        Err(err) => return Err(err),
    };
    if let Some(count) = state.run.snapshot.status["stepCount"]
        .as_i64()
        .filter(|count| *count > 0)
    {
        tracing::Span::current().record("step", count - 1);
    }
    let mut requeue: Option<u64> = None;
    let mut soonest = |millis: u64| {
        requeue = Some(requeue.map_or(millis, |current: u64| current.min(millis)));
    };
    let mut settled = false;
    'decide: for _ in 0..MAX_CONFLICTS {
        settled = true;
        let uid = state.run.snapshot.uid.clone();
        let executing = ctx.executors.is_executing(key, &uid);
        // How long this replica has seen the Lease unchanged decides whether it is expired;
        // never its renewTime against this replica's clock (docs/design.md section 4). Only
        // the run's own Lease counts: one owned by another uid (a deleted run of this name)
        // is judged as absent and replaced on acquiring (docs/behaviours.md 79).
        let seen = ctx.observe_lease(key, lease_read.as_deref(), &uid, lease_source);
        let observed = ctx.observe(&state, &seen);
        if let Some(status) = observed.write {
            match ctx.write_status(&state, status, None).await? {
                Written::Landed(run) => state.run = *run,
                Written::Conflict => {
                    settled = false;
                    (lease_read, lease_source) = ctx.read_lease(key).await?;
                    match ctx.read_state(key).await? {
                        Some(fresh) => state = fresh,
                        None => return Ok(Action::await_change()),
                    }
                    continue 'decide;
                }
                Written::Gone => return Ok(Action::await_change()),
            }
        }
        for write in observed.approvals {
            ctx.write_approval(key, write).await;
        }
        match observed.next {
            ObserveNext::Nothing => {}
            ObserveNext::RequeueAfter { millis } => soonest(millis),
            ObserveNext::AcquireLease { takeover } => {
                let busy = executing || ctx.executors.shutdown.is_cancelled();
                // The slot is taken before the acquire's request and kept until the executor
                // is registered (the end of this arm), so reconciles acquiring at once never
                // exceed the limit together.
                let mut slot = if busy {
                    None
                } else {
                    reserved.take().or_else(|| ctx.executors.reserve_slot(key))
                };
                if busy {
                    // The running executor holds (or is losing) the lease; it kicks a
                    // reconcile when it stops.
                } else if slot.is_none() {
                    // Looked at again when a slot frees (or after the safety net).
                    tracing::debug!(run = %key, "at --max-concurrent-runs; waiting for a slot");
                    ctx.executors
                        .wait_for_slot(key, ctx.place_for(&state.run.snapshot.uid));
                    soonest(SLOT_WAIT_MILLIS);
                } else if let Some(wait) = lease::held_by_another(
                    &seen,
                    &ctx.settings.holder,
                    state.run.snapshot.spec.lease_duration_seconds,
                ) {
                    // Someone holds it: look again when it would have been seen unchanged
                    // long enough (a release or a takeover wakes us sooner).
                    soonest(wait.saturating_add(50));
                } else {
                    match lease::acquire(
                        ctx.api.as_ref(),
                        &state.run,
                        lease_read.as_deref(),
                        &seen,
                        &ctx.settings.holder,
                        ctx.settings.clock.now(),
                    )
                    .await?
                    {
                        Some(held) => {
                            ctx.metrics.leases_acquired.inc();
                            tracing::info!(run = %key, takeover = takeover.is_some(), "won the lease");
                            let spawned = executor::spawn(
                                ctx,
                                key.clone(),
                                state.clone(),
                                held,
                                Input::LeaseAcquired { takeover },
                            );
                            if let (true, Some(slot)) = (spawned, slot.take()) {
                                // The executor holds the slot now: nothing frees up.
                                slot.registered();
                            }
                        }
                        None => {
                            tracing::debug!(run = %key, "another replica won the lease");
                            if lease_read.is_some() {
                                // The version tried may have been the watch's, and stale: read
                                // it live, so the next try is on what is stored (and a stale
                                // observation does not look expired again).
                                let began = LeaseRead::Live(std::time::Instant::now());
                                let fresh = ctx.api.get_lease(&key.namespace, &key.name).await?;
                                ctx.observe_lease(key, fresh.as_ref(), &uid, began);
                            }
                            // A create that lost (AlreadyExists) needs no read: the Lease
                            // watch delivers the winner's Lease, and the next look uses it.
                            soonest(500);
                        }
                    }
                }
            }
        }
        break;
    }
    if !settled {
        // Lost every write race in a row: look again soon rather than at the resync.
        soonest(1_000);
    }
    Ok(match requeue {
        Some(millis) => Action::requeue(Duration::from_millis(millis.max(50))),
        // The resync sweep looks at it again within `watches::RESYNC`.
        None => Action::await_change(),
    })
}

/// The run and its Approvals (none) from its watch event, when nothing says it was started:
/// no controller wrote its status ([`crate::engine::is_unwritten_status`]), it has no Lease of its own (`lease`, as
/// read: one that has, even a dead holder's, is read live so that a takeover is decided from
/// the record), and its first transition writes before it calls anything
/// ([`crate::engine::first_write_precedes_any_call`]: not a run with MCP tools). `None`: read
/// it live.
pub(super) fn watched_state(
    key: &RunKey,
    fresh: &FreshRun,
    lease: Option<&Lease>,
) -> Option<RunState> {
    match fresh.stored() {
        Ok(run)
            if crate::engine::is_unwritten_status(&run.snapshot.status)
                && crate::engine::first_write_precedes_any_call(&run.snapshot.spec)
                && lease::own(lease, &run.snapshot.uid).is_none() =>
        {
            Some(RunState {
                run,
                approvals: Vec::new(),
            })
        }
        Ok(_) => None,
        Err(err) => {
            tracing::debug!(run = %key, %err, "the watched run does not decode; reading it");
            None
        }
    }
}
