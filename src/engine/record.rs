//! The run's record as one transition edits it: the decoded status, a working copy, events
//! numbered without gaps, conditions, and the one status write a transition ends with.
//!
//! Holds docs/design.md section 4 ("the AgentRun's status is the record"; one write between two
//! external actions), section 3 guarantee 8 (a status over the object budget becomes a
//! `record_too_large` write that fits, never a retry loop) and docs/behaviours.md 49-50. It must not
//! decide what a run does next; the other rooms do, through [`Txn`].
//!
//! It also owns the window's one lookup (docs/design.md section 4a): a step's index is not its
//! position in `status.steps` once the run has sealed, so every room goes through
//! [`position`], [`index_at`] and [`next_index`]; and when a write seals: an executor's write
//! that settles a step of a live run ([`Txn::finish`]). The conditions are `conditions`'.

mod conditions;
mod spec_changes;
mod window;

pub(crate) use window::{index_at, next_index, position, step_count, window_start};

use serde_json::{json, Value};

use conditions::{
    approval_conflict_condition, hints_condition, ready_condition, terminal_condition,
    waiting_condition,
};

use super::{
    ApprovalSnapshot, ApprovalWrite, Bookkeeping, Budgets, Caller, ExternalCall, Next, ObserveNext,
    Observed, PreviousHolder, RunSnapshot, Transition,
};
use crate::api::{
    AgentRunStatus, Condition, EventType, LeaseRecord, Observation, ObservationKind, RunEvent,
    RunPhase, Step, StepIndex, StepStatus, TerminalReason, Time,
};

/// Room left for what the object's measured parts do not count (the field names joining them,
/// the managedFields entry a status write adds) when the status is measured against the object
/// budget.
pub(crate) const OBJECT_MARGIN_BYTES: usize = 4096;

/// The length in bytes of `value` as the API server stores it, counted without building the
/// text (`usize::MAX` when it cannot be encoded): compact JSON with the escapes of Go's
/// `encoding/json`, which kube-apiserver encodes objects with: `<`, `>` and `&` are written as
/// `\u003c`, `\u003e` and `\u0026` (6 bytes, not 1), U+2028 and U+2029 as `\u2028` and
/// `\u2029` (6 bytes, not 3). A tool answer full of HTML is otherwise counted short of what
/// etcd is sent (docs/design.md section 3, guarantee 8).
pub(crate) fn encoded_len(value: &impl serde::Serialize) -> usize {
    /// Bytes written so far, and the last two (a U+2028 or U+2029 can span two writes).
    struct Count(usize, [u8; 2]);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let mut extra = 0;
            for &byte in bytes {
                match byte {
                    b'<' | b'>' | b'&' => extra += 5,
                    0xA8 | 0xA9 if self.1 == [0xE2, 0x80] => extra += 3,
                    _ => {}
                }
                self.1 = [self.1[1], byte];
            }
            self.0 += bytes.len() + extra;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0, [0, 0]);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// Drops the `null`s the API server drops from a status as it stores it: a field the CRD's
/// schema declares and does not mark nullable (the run's `result`, a decision's `args` and
/// `result`, an observation's `content`, an event's `data`) is pruned when `null`, and decoding
/// reads an absent one as `None` (issue 15). So a working record from which a `Some(null)`
/// is written is the record a re-read decodes, and the one handed to the next step
/// ([`super::Transition::record`]). A `null` inside those values, or in a decision's other
/// fields, has no schema and is kept as written.
pub(crate) fn drop_stored_nulls(status: &mut AgentRunStatus) {
    fn drop(value: &mut Option<Value>) {
        if value.as_ref().is_some_and(Value::is_null) {
            *value = None;
        }
    }
    drop(&mut status.result);
    for step in &mut status.steps {
        if let Some(decision) = &mut step.decision {
            drop(&mut decision.args);
            drop(&mut decision.result);
        }
        if let Some(observation) = &mut step.observation {
            drop(&mut observation.content);
        }
    }
    for event in &mut status.events {
        drop(&mut event.data);
    }
}

/// Decodes a stored status (`null` is a new run's empty status).
pub(crate) fn decode(status: &Value) -> Result<AgentRunStatus, String> {
    if status.is_null() {
        return Ok(AgentRunStatus::default());
    }
    // Decoded from the value in place: a long run's record is large, a copy of it per step adds up.
    serde::Deserialize::deserialize(status).map_err(|err| locate(status, err))
}

/// Names the part of a status that does not decode (`status.steps[2]: ...`), so the detail
/// tells an operator where to look.
fn locate(status: &Value, err: serde_json::Error) -> String {
    for (field, decode_one) in [
        (
            "steps",
            (|v: &Value| serde_json::from_value::<Step>(v.clone()).map(|_| ()))
                as fn(&Value) -> Result<(), serde_json::Error>,
        ),
        ("events", |v: &Value| {
            serde_json::from_value::<RunEvent>(v.clone()).map(|_| ())
        }),
    ] {
        if let Some(items) = status.get(field).and_then(Value::as_array) {
            for (i, item) in items.iter().enumerate() {
                if let Err(inner) = decode_one(item) {
                    return format!("status.{field}[{i}] does not decode: {inner}");
                }
            }
        }
    }
    format!("status does not decode: {err}")
}

/// One transition's view of the run: what was stored, the working copy, and what follows the
/// status write.
pub(crate) struct Txn<'a> {
    pub run: &'a RunSnapshot,
    pub approvals: &'a [ApprovalSnapshot],
    pub caller: &'a Caller,
    pub budgets: &'a Budgets,
    /// The status as stored (decoded; shared with the snapshot's [`super::RunSnapshot::record`]
    /// when it held one).
    pub stored: std::sync::Arc<AgentRunStatus>,
    /// The working copy; written when it differs from `stored`.
    pub status: AgentRunStatus,
    /// Approval writes after the status write, in order.
    pub approval_writes: Vec<ApprovalWrite>,
    /// The executor releases the Lease after the Approval writes (only with `next` = stop).
    release: bool,
    /// How an executor's transition ends; the first one asked wins (what followed it was
    /// never performed).
    next: Option<Next>,
    /// How an observer's pass ends; the first one asked wins.
    observe_next: ObserveNext,
    /// Whether the caller executes the run (holds its lease) rather than observing it.
    pub executor: bool,
    /// Whether this transition has compared the spec with `status.specHashes` yet
    /// ([`Txn::note_spec_change`]): at its first event, else at its write.
    spec_noted: bool,
}

impl<'a> Txn<'a> {
    pub fn new(
        run: &'a RunSnapshot,
        approvals: &'a [ApprovalSnapshot],
        caller: &'a Caller,
        budgets: &'a Budgets,
        stored: std::sync::Arc<AgentRunStatus>,
        executor: bool,
    ) -> Txn<'a> {
        Txn {
            run,
            approvals,
            caller,
            budgets,
            status: (*stored).clone(),
            stored,
            approval_writes: Vec::new(),
            release: false,
            next: None,
            observe_next: ObserveNext::Nothing,
            executor,
            spec_noted: false,
        }
    }

    pub fn now(&self) -> Time {
        // Cut to the millisecond, as it is written ([`Time`]).
        Time::from_millis(self.caller.now.as_millis())
    }

    /// Appends an event with the next `seq`.
    /// Absent fields of `data` (JSON `null` at its top level) are left out.
    /// A spec edited since the last write is journaled (`spec.changed`) before this
    /// transition's first event: the steps it decides already follow the new spec.
    pub fn event(&mut self, type_: EventType, step: Option<StepIndex>, mut data: Value) {
        self.note_spec_change();
        if let Value::Object(map) = &mut data {
            map.retain(|_, v| !v.is_null());
        }
        let seq = self
            .status
            .events
            .last()
            .map_or(0, |e| e.seq)
            .saturating_add(1);
        self.status.events.push(RunEvent {
            seq,
            time: self.now(),
            type_,
            step,
            data: if data.is_null() { None } else { Some(data) },
        });
    }

    /// The step at `position` in the window (`status.steps[position]`). Positions come from
    /// [`Txn::position`], [`Txn::last_position`] or a walk of the window.
    pub fn step_mut(&mut self, position: usize) -> &mut Step {
        &mut self.status.steps[position]
    }

    /// The position of the window's last step.
    pub fn last_position(&self) -> Option<usize> {
        self.status.steps.len().checked_sub(1)
    }

    /// The position of step `index` in the window ([`position`]).
    pub fn position(&self, index: StepIndex) -> Option<usize> {
        position(&self.status, index)
    }

    /// The index of the step at `position` in the window ([`index_at`]).
    pub fn index_at(&self, position: usize) -> StepIndex {
        index_at(&self.status, position)
    }

    /// The recorded holder.
    pub fn holder(&self) -> Option<&str> {
        self.status.lease.as_ref().map(|l| l.holder.as_str())
    }

    /// Records the caller as holder under a new epoch (the fence; docs/design.md section 4).
    pub fn take_lease(&mut self) {
        let epoch = self
            .status
            .lease
            .as_ref()
            .map_or(0, |l| l.epoch)
            .saturating_add(1);
        self.status.lease = Some(LeaseRecord {
            holder: self.caller.holder.clone(),
            epoch,
        });
    }

    /// Adds the step's current active segment (startedAt to now) to `activeSeconds`.
    pub fn add_active_time(&mut self, position: usize) {
        let now = self.now();
        if let Some(started) = self.status.steps[position].started_at {
            let millis = now.as_millis().saturating_sub(started.as_millis()).max(0);
            self.status.active_seconds += millis as f64 / 1000.0;
        }
    }

    /// Ends a step `failed` with `observation`, writing `step.failed`.
    pub fn fail_step(&mut self, position: usize, observation: Observation) {
        let now = self.now();
        let data = json!({"observation": observation.kind, "summary": observation.summary});
        let step = self.step_mut(position);
        step.status = StepStatus::Failed;
        step.finished_at = Some(now);
        step.observation = Some(observation);
        let index = step.index;
        self.event(EventType::StepFailed, Some(index), data);
    }

    /// Ends the run with `reason`: a step still deciding or executing fails (an executing one
    /// with an `interrupted` observation, since its outcome is not recorded), then
    /// `run.finished`.
    pub fn end_run(
        &mut self,
        reason: TerminalReason,
        detail: Option<String>,
        result: Option<Value>,
    ) {
        for index in 0..self.status.steps.len() {
            let previous = self.status.steps[index].status;
            match previous {
                StepStatus::Deciding => {
                    let now = self.now();
                    let step = self.step_mut(index);
                    step.status = StepStatus::Failed;
                    step.finished_at = Some(now);
                    let step = step.index;
                    let data = json!({"reason": reason});
                    self.event(EventType::StepFailed, Some(step), data);
                }
                StepStatus::Executing => {
                    self.fail_step(index, interrupted_observation(previous, None));
                }
                _ => {}
            }
        }
        self.status.phase = reason.phase();
        self.status.reason = Some(reason);
        self.status.reason_detail = detail.clone();
        self.status.result = result;
        self.status.finished_at = Some(self.now());
        let mut data = json!({"phase": reason.phase(), "reason": reason});
        if let Some(detail) = detail {
            data["detail"] = Value::String(detail);
        }
        self.event(EventType::RunFinished, None, data);
    }

    /// The executor is done with the run: release the lease (when it holds one) and stop.
    /// Nothing when the transition's end is already decided.
    pub fn release_and_stop(&mut self) {
        if self.next.is_none() {
            self.release = self.executor;
            self.next = Some(Next::Stop);
        }
    }

    /// The executor stops (keeping the lease to the way out).
    pub fn stop(&mut self) {
        if self.next.is_none() {
            self.next = Some(Next::Stop);
        }
    }

    /// The executor's transition ends with this external call.
    pub fn call(&mut self, call: ExternalCall) {
        debug_assert!(self.executor, "an observer never starts a side effect");
        if self.next.is_none() {
            self.next = Some(Next::Call(call));
        }
    }

    /// An observer asks for the lease.
    pub fn acquire_lease(&mut self, takeover: Option<PreviousHolder>) {
        if self.observe_next == ObserveNext::Nothing {
            self.observe_next = ObserveNext::AcquireLease { takeover };
        }
    }

    /// An observer looks again after `millis`.
    pub fn requeue_after(&mut self, millis: u64) {
        if self.observe_next == ObserveNext::Nothing {
            self.observe_next = ObserveNext::RequeueAfter { millis };
        }
    }

    /// The transition: one status write when the record changed, then what follows it.
    pub fn finish(mut self) -> Finished {
        super::approvals::cancel_spent(&mut self);
        let mut write = None;
        let mut record = None;
        let mut seal = None;
        drop_stored_nulls(&mut self.status);
        if self.status != *self.stored {
            self.note_spec_change();
            self.sync_derived();
            seal = self.seal();
            // The object budget is checked on the status as written, the sealed one.
            let status = to_value(&self.status);
            if !self.fits(&status) {
                return self.too_large(&status);
            }
            write = Some(status);
            record = Some(std::sync::Arc::new(std::mem::take(&mut self.status)));
        }
        Finished {
            seal,
            write,
            record,
            approvals: self.approval_writes,
            release: self.release,
            next: self.next.unwrap_or(Next::Stop),
            observe_next: self.observe_next,
        }
    }

    /// Seals the working copy when this is an executor's write that settles a step of a run
    /// still going and the window is due (docs/design.md section 4a, docs/behaviours.md 55):
    /// the status becomes the sealed one and the segment to create first is returned. An
    /// observer never seals, nor does a write that settles nothing (a takeover, a pause), so
    /// sealing adds a create and no status write. A window that cannot be sealed (one that
    /// does not continue its archive, edited by hand) stays as it is.
    fn seal(&mut self) -> Option<super::SegmentCreate> {
        if !self.executor || self.status.phase.is_terminal() || !self.settles_a_step() {
            return None;
        }
        let owner = super::archive::SegmentOwner {
            name: &self.run.name,
            uid: &self.run.uid,
        };
        let limits = super::archive::window_limits(
            &self.budgets.seal,
            &self.run.spec.limits,
            &self.status.steps,
        );
        let sealed = super::archive::seal(owner, &self.status, &limits).ok()??;
        let object = super::archive::segment_object(&self.run.namespace, owner, &sealed);
        let create = super::SegmentCreate {
            name: sealed.name,
            sha256: sealed.sha256,
            object,
        };
        self.status = sealed.status;
        Some(create)
    }

    /// Whether the working copy settles a step the stored record held unsettled (or did not
    /// hold): the write records a step's outcome.
    fn settles_a_step(&self) -> bool {
        self.status.steps.iter().rev().any(|step| {
            super::archive::is_settled(step.status)
                && position(&self.stored, step.index)
                    .is_none_or(|p| !super::archive::is_settled(self.stored.steps[p].status))
        })
    }

    /// The spec's length as stored ([`RunSnapshot::spec_bytes`]), else as the decoded spec
    /// encodes.
    fn spec_bytes(&self) -> usize {
        self.run
            .spec_bytes
            .unwrap_or_else(|| encoded_len(&*self.run.spec))
    }

    fn fits(&self, status: &Value) -> bool {
        let status_bytes = encoded_len(status);
        let spec_bytes = self.spec_bytes();
        status_bytes
            .saturating_add(spec_bytes)
            .saturating_add(self.run.metadata_bytes)
            .saturating_add(OBJECT_MARGIN_BYTES)
            <= self.budgets.object_bytes
    }

    /// The write that replaces a status over the object budget: the previous stored status,
    /// ended `record_too_large` (docs/behaviours.md 50). Nothing external follows.
    fn too_large(self, status: &Value) -> Finished {
        // The object budget is for the whole object: status, spec, metadata and a margin.
        let status_bytes = encoded_len(status);
        let spec_bytes = self.spec_bytes();
        let metadata_bytes = self.run.metadata_bytes;
        let attempted = status_bytes
            .saturating_add(spec_bytes)
            .saturating_add(metadata_bytes)
            .saturating_add(OBJECT_MARGIN_BYTES);
        let mut txn = Txn::new(
            self.run,
            self.approvals,
            self.caller,
            self.budgets,
            self.stored.clone(),
            self.executor,
        );
        let detail = format!(
            "AgentRun {}/{}: the object would be {attempted} bytes (status {status_bytes}, spec \
             {spec_bytes}, metadata {metadata_bytes}, {OBJECT_MARGIN_BYTES} kept as a margin), over \
             the object budget of \
             {} bytes; the run ended here instead of growing its record",
            self.run.namespace, self.run.name, self.budgets.object_bytes
        );
        txn.end_run(TerminalReason::RecordTooLarge, Some(detail), None);
        txn.sync_derived();
        drop_stored_nulls(&mut txn.status);
        let write = to_value(&txn.status);
        Finished {
            seal: None,
            write: Some(write),
            record: Some(std::sync::Arc::new(txn.status)),
            approvals: Vec::new(),
            release: self.executor,
            next: Next::Stop,
            observe_next: ObserveNext::Nothing,
        }
    }

    /// docs/behaviours.md 73: in a write after `metadata.generation` moved past
    /// `observedGeneration`, `spec.changed` {generation, fields} names the top-level spec
    /// fields whose hash differs from `status.specHashes`, which then holds the new ones. The
    /// first write of a run (or of a record from before `specHashes`) only sets them. Noted
    /// once per transition, before its first event ([`Txn::event`]) or at its write.
    fn note_spec_change(&mut self) {
        if std::mem::replace(&mut self.spec_noted, true) {
            return;
        }
        let generation = self.run.generation;
        let seen = !self.status.spec_hashes.is_empty();
        if seen && self.status.observed_generation == Some(generation) {
            return;
        }
        let now = spec_changes::spec_hashes(&self.run.spec);
        let fields = spec_changes::changed_fields(&self.status.spec_hashes, &now);
        if seen && !fields.is_empty() {
            let data = json!({"generation": generation, "fields": fields});
            self.event(EventType::SpecChanged, None, data);
        }
        self.status.spec_hashes = now;
    }

    /// A run nobody executes (waiting for a person) acknowledges an edit of its spec: when
    /// `metadata.generation` moved past the stored `observedGeneration`, this transition writes
    /// `observedGeneration` and the conditions' at the new generation, journaling
    /// `spec.changed` (docs/design.md section 2, `observedGeneration`), so `kubectl wait
    /// --for=condition=...` on an edited waiting run sees the condition of its current spec.
    pub fn acknowledge_spec_edit(&mut self) {
        let generation = self.run.generation;
        if self
            .stored
            .observed_generation
            .is_some_and(|seen| seen != generation)
        {
            self.note_spec_change();
            self.status.observed_generation = Some(generation);
        }
    }

    /// Keeps the derived fields in step with the record: `stepCount`, `currentTool`,
    /// `observedGeneration`, conditions.
    pub fn sync_derived(&mut self) {
        let generation = self.run.generation;
        self.status.step_count = step_count(&self.status);
        // A finished run has no current tool (docs/behaviours.md 74): the TOOL column is empty.
        let finished = matches!(
            self.status.phase,
            RunPhase::Completed | RunPhase::Failed | RunPhase::Cancelled
        );
        self.status.current_tool = self
            .status
            .steps
            .last()
            .filter(|_| !finished)
            .and_then(|s| s.decision.as_ref())
            .and_then(|d| d.tool.clone());
        self.status.observed_generation = Some(generation);
        let ready = ready_condition(&self.status);
        let waiting = waiting_condition(&self.status);
        let now = self.now();
        let old = std::mem::take(&mut self.status.conditions);
        let had_conflict = old.iter().any(|c| c.type_ == "ApprovalConflict");
        let conflict = approval_conflict_condition(&self.status, had_conflict);
        let hints = hints_condition(&self.status, &self.run.spec.tools);
        let terminal = terminal_condition(&self.status);
        self.status.conditions = [Some(ready), Some(waiting), conflict, hints, terminal]
            .into_iter()
            .flatten()
            .map(|(type_, status, reason, message)| {
                let last_transition_time = old
                    .iter()
                    .find(|c| c.type_ == type_ && c.status == status)
                    .map_or(now, |c| c.last_transition_time);
                Condition {
                    type_: type_.to_string(),
                    status: status.to_string(),
                    reason,
                    message,
                    last_transition_time,
                    observed_generation: Some(generation),
                }
            })
            .collect();
    }
}

/// What a [`Txn`] ends with, before it is shaped for its caller.
pub(crate) struct Finished {
    seal: Option<super::SegmentCreate>,
    write: Option<Value>,
    /// The record `write` encodes.
    record: Option<std::sync::Arc<AgentRunStatus>>,
    approvals: Vec<ApprovalWrite>,
    release: bool,
    next: Next,
    observe_next: ObserveNext,
}

impl Finished {
    /// For the executor: the write, the Approval writes and the release, then the next.
    pub fn into_transition(self) -> Transition {
        let mut bookkeeping: Vec<Bookkeeping> = self
            .approvals
            .into_iter()
            .map(Bookkeeping::Approval)
            .collect();
        if self.release && self.next == Next::Stop {
            bookkeeping.push(Bookkeeping::ReleaseLease);
        }
        Transition {
            seal: self.seal,
            write: self.write,
            record: self.record,
            bookkeeping,
            next: self.next,
        }
    }

    /// For an observer: the write, the Approval writes, then the lease or a requeue (an
    /// observer's transition never holds a call: only executor paths ask for one).
    pub fn into_observation(self) -> Observed {
        Observed {
            write: self.write,
            approvals: self.approvals,
            next: self.observe_next,
        }
    }
}

/// An `interrupted` observation naming the status the step was in (guarantee 3).
pub(crate) fn interrupted_observation(previous: StepStatus, detail: Option<&str>) -> Observation {
    let mut content = json!({"previousStatus": previous});
    if let Some(detail) = detail {
        content["detail"] = Value::String(detail.to_string());
    }
    observation(
        ObservationKind::Interrupted,
        content,
        format!(
            "interrupted while {}",
            to_value(&previous).as_str().unwrap_or_default()
        ),
    )
}

/// A small observation (engine-written content, never over the step budget).
/// Absent fields (JSON `null` at the top level of an object) are left out of the content.
pub(crate) fn observation(
    kind: ObservationKind,
    mut content: Value,
    summary: String,
) -> Observation {
    if let Value::Object(map) = &mut content {
        map.retain(|_, v| !v.is_null());
    }
    let content_hash = super::canonical::content_hash(&content).unwrap_or_default();
    Observation {
        kind,
        content: Some(content),
        summary,
        content_hash,
        truncated: None,
    }
}

/// Serializes a record type; the record types serialize infallibly (string keys, finite
/// numbers checked before they enter the record).
pub(crate) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

/// The `previousStatus` an `interrupted` observation names.
pub(crate) fn previous_status(step: &Step) -> Option<StepStatus> {
    let content = step.observation.as_ref()?.content.as_ref()?;
    serde_json::from_value(content.get("previousStatus")?.clone()).ok()
}
