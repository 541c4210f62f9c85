//! The run state machine (docs/design.md sections 3-6, docs/behaviours.md 1-50): pure, synchronous, no
//! I/O, no clock of its own, no `kube`, no `async`.
//!
//! Two entry points, one per caller, each returning only what that caller may do:
//!
//! - [`observe`] (a replica that is not executing the run; a reconcile) returns an
//!   [`Observed`]: `write: Option<status>`, then `approvals: Vec<ApprovalWrite>`, then `next:
//!   ObserveNext` = `Nothing | AcquireLease { takeover } | RequeueAfter { millis }`. It has no
//!   call and no lease release: an observer never starts a side effect (docs/design.md section 5).
//!   After the lease is won, the executor calls [`step`] with [`Input::LeaseAcquired`].
//! - [`step`] (the executor, holding the lease) takes one [`Input`] and returns a
//!   [`Transition`]: `seal: Option<SegmentCreate>` (a segment to create first, when the write
//!   records a step's outcome and the window is due to seal: docs/design.md section 4a), then
//!   `write: Option<status>`, then `bookkeeping: Vec<Bookkeeping>`
//!   (`Approval(ApprovalWrite::Create | ApprovalWrite::Status)` in order, then `ReleaseLease`
//!   last and only before a stop), then exactly one `next: Next` = `Call(ExternalCall)` (`Tool
//!   | Agent | Model | ReconcileHook | ListTools`, whose outcome comes back as
//!   [`Input::ToolFinished`], [`Input::AgentAnswered`], [`Input::ModelAnswered`],
//!   [`Input::Reconciled`] or [`Input::ToolsListed`]) or `Stop`. `ListTools` (a new run with MCP
//!   tools, before anything is written) is the one call that follows no write: listing changes
//!   nothing on a server (docs/design.md section 6, pinning).
//!   One durable write between two external actions, never fewer (docs/design.md section 4).
//!
//! The write of either is a compare-and-set replace of the run's status on the
//! `resourceVersion` the snapshot was read at. On a conflict (409) the rest of the value is
//! dropped, the controller re-reads the run and its Approvals and asks again (the same input
//! for [`step`]); the engine re-decides from the fresh record (and stops if this replica is no
//! longer the recorded holder or the run ended).
//!
//! Both are pure functions of (run, approvals, caller, input): applying an input again to a
//! record that already holds its effect writes nothing twice and never starts a started step
//! again (guarantee 1); a step found `executing` by its own holder is left to a takeover.
//! [`Engine`] carries both as function pointers for a caller that wants a scripted engine.
//!
//! The rooms (each names the rules it holds in its `//!` header):
//! - `inputs`: what the caller hands in (the run as read, its Approvals, the caller, the
//!   [`Input`] and the outcomes of calls, the [`Budgets`]);
//! - `effects`: what comes back ([`Transition`], [`Observed`] and what they carry: a status
//!   write, bookkeeping, one [`ExternalCall`] or a stop);
//! - `record`: the working copy of the status, events numbered without gaps, conditions, the
//!   one write a transition ends with and the object budget (docs/behaviours.md 49-50);
//! - `raw`: a record that will not decode (docs/behaviours.md 41);
//! - `observe`: the resume table for a replica that is not executing the run, and cancel
//!   (docs/behaviours.md 30, 42);
//! - `lease`: when another holder's Lease may be taken: seen unchanged for its duration plus a
//!   margin on the asking replica's monotonic clock, never by comparing clocks (docs/design.md
//!   section 4, docs/behaviours.md 30-31);
//! - `start`: a new run's first write (docs/behaviours.md 1-3), after listing its MCP servers
//!   and pinning their tools (docs/behaviours.md 60, 63); the run's tools everywhere are the
//!   effective ones of `pins::effective_tools` (`effective_run` below);
//! - `limits`: the limits before each step (docs/behaviours.md 4-6);
//! - `loop_`: starting steps and taking decisions (docs/behaviours.md 7-10);
//! - `model_calls`: model attempts, accounted by the `model` rules (docs/behaviours.md 45-48);
//!   what the model is asked is the `conversation` (no provider's shape; the provider's wire
//!   comes in through [`Budgets::model_wire`]), rendered from the whole history (the sealed
//!   steps the executor hands in as [`RunSnapshot::sealed`], then the window) and bounded by
//!   `maxContextBytes` (docs/design.md section 4a, docs/behaviours.md 59);
//! - `calls`: the policy and starting a tool (docs/behaviours.md 11-14);
//! - `outcome`: tool outcomes and late outcomes (docs/behaviours.md 15-18, 44);
//! - `approvals`: pauses and the Approval objects as the record's projection (docs/behaviours.md
//!   19, 26);
//! - `waiting`: a waiting run's latest Approval: missing, foreign, pending, rejected, expired
//!   or granted (docs/behaviours.md 23-25, 34-35);
//! - `grants`: executing a grant (docs/behaviours.md 21-22, 26);
//! - `takeover`: takeovers, interrupted steps, the reconcile hook (docs/behaviours.md 31-40);
//!   an interrupted call's first attempt and until when it may still run (`first_attempt`,
//!   `mayRunUntil`), which `waiting` waits out before a re-run (docs/behaviours.md 105-107);
//! - `by_key`: an interrupted `http` call its tool settles itself, by its status URL or its
//!   honoured idempotency keys, before the hook or a person is asked (docs/behaviours.md
//!   111-114);
//! - `by_job`: an interrupted `job` call read back from its Job by name (created, waited for,
//!   a conflict, or gone and asked about; docs/behaviours.md 116-121);
//! - `projection`: Kubernetes Events derived from the journal;
//! - `grantable`: whether an Approval can still grant, as a person deciding it sees it (the
//!   rule `agentrt approve` asks before it patches).
//!
//! The rule modules hold the pure functions the machine calls: `canonical` (canonical JSON),
//! `hash` (SHA-256 of it), `validate` (schema checks; `validate/spec`: every problem of a whole
//! spec, admission's and lint's verdict), `policy` (a run's own; `policy/admin`: the admins',
//! the most restrictive wins; `policy/when`: CEL conditions; `policy/select`: which admin policies select a run, and
//! their order), `content` (content budgets),
//! `model` (model accounting), `pins` (MCP tool definitions pinned), `archive` (the window and
//! sealed segments; `archive/chain`: a chain checked and stitched), `conversation` (what a model
//! is asked).

pub mod agent_calls;
mod approvals;
pub mod archive;
mod by_job;
mod by_key;
mod by_task;
mod calls;
pub mod canonical;
pub mod content;
pub mod conversation;
mod effects;
pub mod grantable;
mod grants;
pub mod hash;
mod inputs;
mod lease;
mod limits;
mod loop_;
pub mod model;
mod model_calls;
mod observe;
mod outcome;
pub mod pins;
pub mod policy;
mod projection;
mod raw;
mod record;
mod start;
mod takeover;
pub mod validate;
mod waiting;

#[cfg(test)]
mod tests;

use crate::api::RunPhase;

pub use approvals::{approval_name, recorded_approvals, short_hash, status_write_version};
pub use by_task::check_answer;
pub use effects::*;
pub use inputs::*;
pub use lease::{lease_liveness, LeaseLiveness};
pub use observe::{
    first_write_precedes_any_call, is_new_run, is_unwritten_status, lease_release_needed,
    lease_watch_behind, observe_needed, observer_wait, slot_wait_unread, WatchBehind, WatchedView,
    LAG_CAP_MILLIS, LAG_CAP_PRESENT_MILLIS,
};
pub use projection::{
    decode_status, kube_events, KubeEventProjection, KubeEventType, STARTED_REASON,
};
pub use raw::spec_undecodable;
pub(crate) use record::encoded_len;
pub use takeover::INTERRUPTED_NOTICE;

/// The engine's two entry points as one value, so the controller can be given a scripted
/// engine in its tests.
#[derive(Debug, Clone, Copy)]
pub struct Engine {
    /// [`step`], for the executor.
    pub step: StepFn,
    /// [`observe`], for a replica that is not executing the run.
    pub observe: ObserveFn,
}

/// The signature of [`step`].
pub type StepFn = fn(
    &RunSnapshot,
    &[ApprovalSnapshot],
    &Caller,
    &Budgets,
    Input,
) -> Result<Transition, EngineError>;

/// The signature of [`observe`].
pub type ObserveFn =
    fn(&RunSnapshot, &[ApprovalSnapshot], &Caller, &Budgets, &LeaseView) -> Observed;

impl Engine {
    /// This module's [`step`] and [`observe`].
    pub const PURE: Engine = Engine { step, observe };
}

/// Why the engine could not produce a transition. Every other failure becomes part of the
/// record (a failed step, an `internal_error` run), so this is only for a caller mistake.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EngineError {
    /// The input does not fit the run (e.g. a tool outcome for a step that is not executing).
    #[error("AgentRun {namespace}/{name}: {detail}")]
    UnexpectedInput {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What did not fit.
        detail: String,
    },
}

/// Decides what `run` does next on `input`, for the replica executing it (holding, or just
/// winning, its Lease).
///
/// `approvals` are the run's Approval objects (label `agentrt.dev/run-uid=<uid>`), `caller` the
/// replica asking and its clock, `budgets` the size limits.
///
/// # Errors
/// [`EngineError::UnexpectedInput`] when the input cannot apply to the run as stored (the
/// controller re-reads and observes instead).
pub fn step(
    run: &RunSnapshot,
    approvals: &[ApprovalSnapshot],
    caller: &Caller,
    budgets: &Budgets,
    input: Input,
) -> Result<Transition, EngineError> {
    let mut stored = match &run.record {
        Some(record) => {
            debug_assert_eq!(
                record::decode(&run.status).as_ref(),
                Ok(&**record),
                "RunSnapshot::record is not the status decoded"
            );
            record.clone()
        }
        None => match record::decode(&run.status) {
            Ok(stored) => std::sync::Arc::new(stored),
            Err(detail) => return Ok(raw::undecodable_step(run, caller, &input, detail)),
        },
    };
    if let Input::ToolsListed { listings } = &input {
        // The pins go into the working record first, so that this very transition (the first
        // step's decision and call included) sees the pinned tools.
        if stored.phase == RunPhase::Pending && stored.tool_pins.is_empty() {
            if let Ok(pins) = start::pin_listings(&run.spec, listings) {
                std::sync::Arc::make_mut(&mut stored).tool_pins = pins;
            }
        }
    }
    // docs/design.md section 5, terminal runs: nothing. A journal holding `run.finished` ended the
    // run whatever `phase` says now (a status write by hand cannot bring a run back to life).
    if ended_by_journal(&stored) {
        return Ok(Transition::stop());
    }
    let effective = effective_run(run, &stored, caller);
    let run = effective.as_ref();
    let mut txn = record::Txn::new(run, approvals, caller, budgets, stored, true);
    match input {
        Input::LeaseLost => txn.stop(),
        input => executor_input(&mut txn, input)?,
    }
    Ok(txn.finish().into_transition())
}

/// Decides what a replica that is not executing `run` does with it (a reconcile; docs/design.md
/// section 5, the resume table): it may write (cancel, expiry, rejection, a record that will
/// not decode), create a missing Approval or project a decided one, ask for the lease, or
/// requeue; it never starts a side effect (docs/design.md section 5).
///
/// `lease` is the run's Lease as this replica read it and how long it has seen it unchanged;
/// the other arguments are as for [`step`].
pub fn observe(
    run: &RunSnapshot,
    approvals: &[ApprovalSnapshot],
    caller: &Caller,
    budgets: &Budgets,
    lease: &LeaseView,
) -> Observed {
    let stored = match record::decode(&run.status) {
        Ok(stored) => std::sync::Arc::new(stored),
        Err(detail) => return raw::undecodable_observe(run, caller, lease, detail),
    };
    if ended_by_journal(&stored) {
        return Observed::default();
    }
    let effective = effective_run(run, &stored, caller);
    let run = effective.as_ref();
    let mut txn = record::Txn::new(run, approvals, caller, budgets, stored, false);
    observe::observe(&mut txn, lease);
    txn.finish().into_observation()
}

/// The run with its effective tools in `spec.tools` ([`pins::effective_tools`]) and its
/// effective limits in `spec.limits` (lowered to the admin policies' ceilings,
/// [`policy::admin::effective_limits`]): the one accessor every rule reading the run's tools or
/// limits goes through (validation, policy, the agents' conversation, loop detection,
/// approvals, the limits). Borrowed as stored when neither changes anything.
fn effective_run<'a>(
    run: &'a RunSnapshot,
    stored: &crate::api::AgentRunStatus,
    caller: &Caller,
) -> std::borrow::Cow<'a, RunSnapshot> {
    let pinned = pins::needs_pins(&run.spec) && !stored.tool_pins.is_empty();
    let limits = policy::admin::effective_limits(&run.spec.limits, &caller.admin);
    if !pinned && matches!(limits, std::borrow::Cow::Borrowed(_)) {
        return std::borrow::Cow::Borrowed(run);
    }
    let limits = limits.into_owned();
    let mut run = run.clone();
    let spec = std::sync::Arc::make_mut(&mut run.spec);
    spec.limits = limits;
    if pinned {
        spec.tools = pins::effective_tools(spec, &stored.tool_pins);
    }
    std::borrow::Cow::Owned(run)
}

/// A journal holding `run.finished` under a phase that is not terminal (a status edited by
/// hand): the run ended all the same.
fn ended_by_journal(stored: &crate::api::AgentRunStatus) -> bool {
    !stored.phase.is_terminal()
        && stored
            .events
            .iter()
            .any(|e| e.type_ == crate::api::EventType::RunFinished)
}

/// An executor's input once the run has ended (terminal, or cancelled in this very write):
/// a tool's outcome is appended late (docs/behaviours.md 44), and a Job created after the end
/// is recorded and waited for so that its outcome is too. `true` when the executor waits on
/// (the Job), `false` when it releases the lease and stops.
fn late_input(txn: &mut record::Txn, input: Input) -> Result<bool, EngineError> {
    match input {
        Input::ToolFinished {
            step,
            attempt,
            outcome,
        } => outcome::late(txn, step, attempt, outcome)?,
        Input::JobCreated {
            step,
            attempt,
            name,
            job,
        } => return Ok(by_job::created_late(txn, step, attempt, &name, &job)),
        Input::TaskCreated {
            step,
            attempt,
            task,
        } => return Ok(by_task::created_late(txn, step, attempt, task)),
        _ => {}
    }
    Ok(false)
}

/// An input from the executor (the replica holding, or just winning, the lease).
fn executor_input(txn: &mut record::Txn, input: Input) -> Result<(), EngineError> {
    // A listing comes back before the first write, when the record names no holder yet.
    let acquired = matches!(input, Input::LeaseAcquired { .. })
        || (matches!(input, Input::ToolsListed { .. }) && txn.status.phase == RunPhase::Pending);
    // Someone took the run over: this executor stops without writing (docs/behaviours.md 33).
    if !acquired && txn.holder() != Some(txn.caller.holder.as_str()) {
        txn.stop();
        return Ok(());
    }
    if txn.status.phase.is_terminal() {
        if late_input(txn, input)? {
            return Ok(());
        }
        txn.release_and_stop();
        return Ok(());
    }
    // docs/behaviours.md 43: a live loop finds the cancellation at its next write.
    if txn.run.spec.cancel {
        observe::cancel(txn);
        // A tool that returned just now: its outcome comes after `run.finished` (44).
        if late_input(txn, input)? {
            return Ok(());
        }
        txn.release_and_stop();
        return Ok(());
    }
    let phase = txn.status.phase;
    match input {
        Input::LeaseAcquired { takeover } => match phase {
            RunPhase::Pending => start::begin(txn),
            RunPhase::WaitingForApproval => waiting::waiting(txn),
            _ => takeover::take_over(txn, takeover),
        },
        Input::ToolsListed { listings } if phase == RunPhase::Pending => {
            start::listed(txn, listings)
        }
        _ if phase != RunPhase::Running => txn.release_and_stop(),
        Input::AgentAnswered { step, decision } => loop_::agent_answered(txn, step, decision)?,
        Input::ToolFinished {
            step,
            attempt,
            outcome,
        } => outcome::tool_finished(txn, step, attempt, outcome)?,
        Input::ModelAnswered {
            step,
            attempt,
            outcome,
        } => model_calls::answered(txn, step, attempt, outcome)?,
        Input::Reconciled { answer } => takeover::reconciled(txn, answer),
        Input::ToolStatusAnswered { step, answer } => by_key::answered(txn, step, answer)?,
        Input::JobCreated {
            step,
            attempt,
            name,
            job,
        } => by_job::created(txn, step, attempt, name, job)?,
        Input::TaskCreated {
            step,
            attempt,
            task,
        } => by_task::created(txn, step, attempt, task)?,
        Input::TaskInputRequired {
            step,
            attempt,
            input,
        } => by_task::input_required(txn, step, attempt, input),
        Input::LeaseLost | Input::ToolsListed { .. } => txn.stop(),
    }
    Ok(())
}
