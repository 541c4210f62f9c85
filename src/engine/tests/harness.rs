//! A fake controller for the engine's tests: it holds one run as stored, its Approvals and its
//! Lease, keeps a clock, and performs effects the way docs/design.md section 4 says the controller
//! does (a status write replaces the stored status; an Approval is created once; a Lease is
//! won by compare-and-set). Tests read like the rules: `h.reconcile("a")`, `h.result(...)`,
//! `h.approve(...)`.

use std::collections::BTreeMap;

use serde_json::{json, Value};

pub use crate::api::StepIndex;
use crate::api::{AgentRun, AgentRunSpec, AgentRunStatus, RunEvent, Step, Time};
use crate::engine::{
    observe, step, ApprovalSnapshot, ApprovalWrite, Bookkeeping, Budgets, Caller, ExternalCall,
    Input, LeaseView, ModelCall, Next, ObserveNext, Observed, PreviousHolder, RunSnapshot,
    SegmentCreate, ToolCall, ToolOutcome, Transition,
};

/// What a test asks the engine: an executor's [`Input`] or an observer's look.
#[derive(Debug, Clone)]
pub enum Ask {
    /// [`step`] with this input.
    Step(Input),
    /// [`observe`] with this Lease view.
    Observe(LeaseView),
}

impl From<Input> for Ask {
    fn from(input: Input) -> Ask {
        Ask::Step(input)
    }
}

/// An observer's look at the run with the Lease as `lease` (reads like the old input).
pub struct Observe {
    pub lease: LeaseView,
}

impl From<Observe> for Ask {
    fn from(observe: Observe) -> Ask {
        Ask::Observe(observe.lease)
    }
}

/// A transition or an observation as one flat list, in the order the controller performs it,
/// so tests can assert it as words ([`kinds`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Create a sealed segment (before the status write it rides with).
    CreateSegment(SegmentCreate),
    WriteStatus {
        status: Value,
    },
    CreateApproval {
        approval: Value,
    },
    WriteApprovalStatus {
        name: String,
        status: Value,
        resource_version: Option<String>,
        hash: String,
    },
    AcquireLease {
        takeover: Option<PreviousHolder>,
    },
    CallTool(ToolCall),
    CallAgent {
        step: StepIndex,
        request: Value,
        attempt: u32,
        delay_millis: u64,
        timeout_millis: u64,
    },
    CallModel {
        step: StepIndex,
        attempt: i64,
        request: Value,
        max_output_tokens: Option<i64>,
        delay_millis: u64,
    },
    CallReconcileHook {
        view: Value,
    },
    AskToolStatus(crate::engine::StatusQuery),
    ListTools {
        servers: Vec<crate::api::McpServer>,
    },
    ReleaseLease,
    RequeueAfter {
        millis: u64,
    },
    Stop,
}

fn approval_effect(write: ApprovalWrite) -> Effect {
    match write {
        ApprovalWrite::Create { approval } => Effect::CreateApproval { approval },
        ApprovalWrite::Status {
            name,
            status,
            resource_version,
            hash,
            ..
        } => Effect::WriteApprovalStatus {
            name,
            status,
            resource_version,
            hash,
        },
    }
}

/// An executor transition, flattened.
pub fn transition_effects(transition: Transition) -> Vec<Effect> {
    assert!(
        transition.seal.is_none() || transition.write.is_some(),
        "a seal rides on a status write"
    );
    if let Some(record) = &transition.record {
        // The record handed back to the next step is exactly what its write decodes to.
        let write = transition
            .write
            .as_ref()
            .expect("a record rides on a write");
        assert_eq!(
            crate::engine::decode_status(write).as_ref(),
            Ok(&**record),
            "Transition::record is not the write decoded"
        );
    }
    let mut effects: Vec<Effect> = transition
        .seal
        .map(Effect::CreateSegment)
        .into_iter()
        .collect();
    effects.extend(
        transition
            .write
            .map(|status| Effect::WriteStatus { status }),
    );
    for item in transition.bookkeeping {
        effects.push(match item {
            Bookkeeping::Approval(write) => approval_effect(write),
            Bookkeeping::ReleaseLease => Effect::ReleaseLease,
        });
    }
    effects.push(match transition.next {
        Next::Stop => Effect::Stop,
        Next::Call(ExternalCall::Tool(call)) => Effect::CallTool(call),
        Next::Call(ExternalCall::Agent {
            step,
            request,
            attempt,
            delay_millis,
            timeout_millis,
        }) => Effect::CallAgent {
            step,
            request,
            attempt,
            delay_millis,
            timeout_millis,
        },
        Next::Call(ExternalCall::Model(ModelCall {
            step,
            attempt,
            request,
            max_output_tokens,
            delay_millis,
        })) => Effect::CallModel {
            step,
            attempt,
            request,
            max_output_tokens,
            delay_millis,
        },
        Next::Call(ExternalCall::ReconcileHook { view }) => Effect::CallReconcileHook { view },
        Next::Call(ExternalCall::ToolStatus(query)) => Effect::AskToolStatus(query),
        Next::Call(ExternalCall::ListTools { servers }) => Effect::ListTools { servers },
    });
    effects
}

/// An observation, flattened.
pub fn observed_effects(observed: Observed) -> Vec<Effect> {
    let mut effects: Vec<Effect> = observed
        .write
        .map(|status| Effect::WriteStatus { status })
        .into_iter()
        .collect();
    effects.extend(observed.approvals.into_iter().map(approval_effect));
    match observed.next {
        ObserveNext::Nothing => {}
        ObserveNext::AcquireLease { takeover } => effects.push(Effect::AcquireLease { takeover }),
        ObserveNext::RequeueAfter { millis } => effects.push(Effect::RequeueAfter { millis }),
    }
    effects
}

/// The fixtures under `tests/fixtures/engine/`.
pub const REFUND: &str = include_str!("../../../tests/fixtures/engine/refund.yaml");
pub const TOOLS: &str = include_str!("../../../tests/fixtures/engine/tools.yaml");
pub const WEBHOOK: &str = include_str!("../../../tests/fixtures/engine/webhook.yaml");
pub const OPENAI: &str = include_str!("../../../tests/fixtures/engine/openai.yaml");

/// 2026-01-01T00:00:00Z.
pub const T0: i64 = 1_767_225_600_000;

/// The run's Lease as the fake API server holds it.
#[derive(Debug, Clone)]
pub struct FakeLease {
    pub holder: String,
    pub renewed_at: Time,
    pub duration_seconds: i64,
}

pub struct Harness {
    pub run: RunSnapshot,
    pub approvals: BTreeMap<String, Value>,
    pub lease: Option<FakeLease>,
    pub now: Time,
    /// The caller is shutting down gracefully (`Caller::draining`).
    pub draining: bool,
    /// The admin policies handed in with each call (`Caller::admin`).
    pub admin: std::sync::Arc<crate::engine::policy::admin::AdminPolicies>,
    pub budgets: Budgets,
    /// The sealed segments created, by name (whole objects).
    pub segments: BTreeMap<String, Value>,
    /// Every status written, in order.
    pub writes: Vec<Value>,
    /// Every tool call performed, in order.
    pub tool_calls: Vec<ToolCall>,
    /// When each of `tool_calls` was sent (the harness clock, the one true time, plus the
    /// call's delay).
    pub tool_call_times: Vec<Time>,
    /// The calls whose outcome came back (a result or an error): they ran no longer.
    pub answered: std::collections::BTreeSet<(crate::api::StepIndex, i64)>,
    /// The tool call whose outcome is awaited.
    pub pending_tool: Option<ToolCall>,
    /// The agent request awaited (step, body).
    pub pending_agent: Option<(StepIndex, Value)>,
    /// The reconcile hook view awaited.
    pub pending_hook: Option<Value>,
    /// The status URL question awaited.
    pub pending_status: Option<crate::engine::StatusQuery>,
    /// (step, attempt) a status URL said never arrived (404).
    pub never_arrived: std::collections::BTreeSet<(StepIndex, i64)>,
    /// The servers of an asked-for listing not yet answered.
    pub pending_listing: Option<Vec<crate::api::McpServer>>,
    /// The model attempt awaited (step, attempt).
    pub pending_model: Option<(StepIndex, i64)>,
    /// Stop after performing this many more effects (a crash point); `None` performs all.
    pub crash_after: Option<usize>,
    /// Every Job a `job` tool's call created, by name, with the result it reports
    /// (docs/design.md section 6, "Job tools"); a Job in `jobs_gone` was removed since.
    pub jobs: BTreeMap<String, Value>,
    /// The Jobs someone removed (by hand, past the finalizer) before a replica read them.
    pub jobs_gone: std::collections::BTreeSet<String>,
}

impl Harness {
    /// A run from a manifest, with no status yet.
    pub fn new(manifest: &str) -> Harness {
        let run: AgentRun = serde_yaml::from_str(manifest).expect("the fixture decodes");
        Harness::from_spec(run.metadata.name.as_deref().unwrap_or("run"), run.spec)
    }

    /// A run of the `tools` fixture with these scripted decisions.
    pub fn scripted(decisions: Vec<Value>) -> Harness {
        let mut h = Harness::new(TOOLS);
        h.spec_mut()
            .agent
            .scripted
            .as_mut()
            .expect("scripted")
            .decisions = decisions;
        h
    }

    pub fn from_spec(name: &str, spec: AgentRunSpec) -> Harness {
        Harness {
            run: RunSnapshot {
                namespace: "default".into(),
                name: name.into(),
                uid: "uid-1".into(),
                generation: 1,
                spec: std::sync::Arc::new(spec),
                spec_bytes: None,
                metadata_bytes: 0,
                status: Value::Null,
                record: None,
                created_by: None,
                sealed: Default::default(),
            },
            approvals: BTreeMap::new(),
            lease: None,
            now: Time::from_millis(T0),
            draining: false,
            admin: Default::default(),
            // The openai agent's wire, as the controller hands it in (docs/behaviours.md 46).
            budgets: Budgets {
                model_wire: crate::agents::openai::WIRE,
                ..Budgets::default()
            },
            segments: BTreeMap::new(),
            writes: Vec::new(),
            tool_calls: Vec::new(),
            tool_call_times: Vec::new(),
            answered: Default::default(),
            pending_tool: None,
            pending_agent: None,
            pending_hook: None,
            pending_status: None,
            never_arrived: Default::default(),
            pending_listing: None,
            pending_model: None,
            crash_after: None,
            jobs: BTreeMap::new(),
            jobs_gone: Default::default(),
        }
    }

    pub fn spec_mut(&mut self) -> &mut AgentRunSpec {
        std::sync::Arc::make_mut(&mut self.run.spec)
    }

    pub fn advance(&mut self, seconds: i64) {
        self.now = self.now.plus_seconds(seconds);
    }

    pub fn advance_millis(&mut self, millis: i64) {
        self.now = Time::from_millis(self.now.as_millis() + millis);
    }

    fn caller(&self, holder: &str) -> Caller {
        Caller {
            holder: holder.into(),
            now: self.now,
            draining: self.draining,
            admin: self.admin.clone(),
        }
    }

    /// The Lease as a replica that saw each of its writes as it happened sees it: unchanged
    /// since its last renewal (the harness has one clock), judged with no margin.
    pub fn lease_view(&self) -> LeaseView {
        match &self.lease {
            None => LeaseView::default(),
            Some(l) => LeaseView {
                holder: Some(l.holder.clone()),
                renewed_at: Some(l.renewed_at),
                duration_seconds: Some(l.duration_seconds),
                unchanged_for_ms: u64::try_from(self.now.as_millis() - l.renewed_at.as_millis())
                    .unwrap_or(0),
                takeover_margin_ms: 0,
            },
        }
    }

    pub fn snapshots(&self) -> Vec<ApprovalSnapshot> {
        self.approvals
            .iter()
            .map(|(name, object)| ApprovalSnapshot {
                name: name.clone(),
                object: object.clone(),
            })
            .collect()
    }

    /// The sealed steps an executor hands in for an openai agent (docs/design.md section 4a):
    /// the segments `context_segments` names, each checked against the record, as created.
    pub fn sealed_history(&self) -> crate::engine::archive::SealedHistory {
        use crate::engine::archive::{context_segments, verify_segment, SealedHistory};
        let mut history = SealedHistory::default();
        let archive = crate::engine::decode_status(&self.run.status)
            .ok()
            .and_then(|s| s.archive);
        let (Some(agent), Some(archive)) = (self.run.spec.agent.openai.as_ref(), archive) else {
            return history;
        };
        let budget = usize::try_from(agent.max_context_bytes).unwrap_or(0);
        for entry in context_segments(&archive, budget) {
            let read = self
                .segments
                .get(&entry.name)
                .and_then(|object| verify_segment(entry, &object["spec"]).ok());
            match read {
                Some(segment) => history.segments.push(std::sync::Arc::new(segment.steps)),
                None => history.unreadable.push((entry.first_step, entry.last_step)),
            }
        }
        history
    }

    /// Calls the engine without performing anything.
    pub fn decide(&self, holder: &str, ask: impl Into<Ask>) -> Vec<Effect> {
        let (approvals, caller) = (self.snapshots(), self.caller(holder));
        match ask.into() {
            Ask::Step(input) => {
                // As the executor steps: with the record of its last write handed back (here
                // decoded from it, when it decodes), and an openai agent's sealed history.
                let run = RunSnapshot {
                    sealed: if self.run.spec.agent.openai.is_some() {
                        self.sealed_history()
                    } else {
                        Default::default()
                    },
                    record: crate::engine::decode_status(&self.run.status)
                        .ok()
                        .map(std::sync::Arc::new),
                    ..self.run.clone()
                };
                transition_effects(
                    step(&run, &approvals, &caller, &self.budgets, input)
                        .expect("the engine accepts the input"),
                )
            }
            Ask::Observe(lease) => observed_effects(observe(
                &self.run,
                &approvals,
                &caller,
                &self.budgets,
                &lease,
            )),
        }
    }

    /// Calls the engine and performs the effects in order (up to a crash point, if set).
    /// Returns the effects the engine asked for.
    pub fn step(&mut self, holder: &str, ask: impl Into<Ask>) -> Vec<Effect> {
        let effects = self.decide(holder, ask);
        for effect in &effects {
            if let Some(left) = self.crash_after.as_mut() {
                if *left == 0 {
                    break;
                }
                *left -= 1;
            }
            self.perform(holder, effect);
        }
        effects
    }

    /// Whether the process crashed (its crash point was reached).
    pub fn crashed(&self) -> bool {
        self.crash_after == Some(0)
    }

    fn perform(&mut self, holder: &str, effect: &Effect) {
        match effect {
            Effect::CreateSegment(create) => {
                // AlreadyExists is success only with the same content (docs/design.md 4a).
                let stored = self
                    .segments
                    .entry(create.name.clone())
                    .or_insert_with(|| create.object.clone());
                assert_eq!(
                    stored["spec"], create.object["spec"],
                    "{}: another segment under the same name",
                    create.name
                );
            }
            Effect::WriteStatus { status } => {
                self.run.status = status.clone();
                self.writes.push(status.clone());
            }
            Effect::CreateApproval { approval } => {
                let name = approval["metadata"]["name"]
                    .as_str()
                    .expect("an Approval has a name")
                    .to_string();
                self.approvals.entry(name).or_insert_with(|| {
                    let mut created = approval.clone();
                    created["metadata"]["resourceVersion"] = Value::String("1".into());
                    created
                });
            }
            Effect::WriteApprovalStatus {
                name,
                status,
                resource_version,
                hash,
            } => {
                if let Some(object) = self.approvals.get_mut(name) {
                    assert_eq!(
                        object["spec"]["hash"].as_str(),
                        Some(hash.as_str()),
                        "{name}: the engine wrote the status of another request's Approval"
                    );
                    // The property the engine holds: an Approval's phase only moves forward,
                    // and a write names the version it read.
                    let phase = |v: &Value| {
                        serde_json::from_value::<crate::api::ApprovalPhase>(v.clone())
                            .unwrap_or_default()
                    };
                    let (from, to) = (phase(&object["status"]["phase"]), phase(&status["phase"]));
                    assert!(
                        from.may_become(to),
                        "{name}: the engine asked for {from:?} -> {to:?}"
                    );
                    let stored = object["metadata"]["resourceVersion"]
                        .as_str()
                        .map(str::to_string);
                    if resource_version.is_some() && *resource_version != stored {
                        // Stale: the API server would answer 409 and nothing changes.
                        return;
                    }
                    object["status"] = status.clone();
                    let next = stored.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
                    object["metadata"]["resourceVersion"] = Value::String(next.to_string());
                }
            }
            Effect::CallTool(call) if call.job.is_some() => {
                // A Job tool's executor creates or reads its Job: what it performs is decided
                // by the test playing it (a Job created counts as the call performed).
                self.pending_tool = Some(call.clone());
            }
            Effect::CallTool(call) => {
                self.tool_calls.push(call.clone());
                // Sent once its delay is over (a call sent again by its key waits out the
                // first attempt).
                let delay = i64::try_from(call.delay_millis).unwrap_or(i64::MAX);
                self.tool_call_times.push(Time::from_millis(
                    self.now.as_millis().saturating_add(delay),
                ));
                self.pending_tool = Some(call.clone());
            }
            Effect::CallAgent { step, request, .. } => {
                self.pending_agent = Some((*step, request.clone()));
            }
            Effect::CallReconcileHook { view } => self.pending_hook = Some(view.clone()),
            Effect::AskToolStatus(query) => self.pending_status = Some(query.clone()),
            Effect::ListTools { servers } => self.pending_listing = Some(servers.clone()),
            Effect::CallModel { step, attempt, .. } => self.pending_model = Some((*step, *attempt)),
            Effect::ReleaseLease => {
                if self.lease.as_ref().is_some_and(|l| l.holder == holder) {
                    self.lease = None;
                }
            }
            Effect::AcquireLease { .. } | Effect::RequeueAfter { .. } | Effect::Stop => {}
        }
    }

    /// Wins the Lease by compare-and-set for `holder` if it is free, expired or its own.
    pub fn win_lease(&mut self, holder: &str) -> bool {
        let free = match &self.lease {
            None => true,
            Some(l) => {
                l.holder == holder || l.renewed_at.plus_seconds(l.duration_seconds) <= self.now
            }
        };
        if free {
            self.lease = Some(FakeLease {
                holder: holder.into(),
                renewed_at: self.now,
                duration_seconds: self.run.spec.lease_duration_seconds,
            });
        }
        free
    }

    /// The controller's reconcile: Observe, and when the engine asks for the lease, win it and
    /// call `LeaseAcquired`. Returns the effects of the last engine call.
    pub fn reconcile(&mut self, holder: &str) -> Vec<Effect> {
        let lease = self.lease_view();
        let effects = self.step(holder, Observe { lease });
        if self.crashed() {
            return effects;
        }
        let takeover = effects.iter().find_map(|e| match e {
            Effect::AcquireLease { takeover } => Some(takeover.clone()),
            _ => None,
        });
        match takeover {
            Some(takeover) if self.win_lease(holder) => {
                self.step(holder, Input::LeaseAcquired { takeover })
            }
            _ => effects,
        }
    }

    /// The lease expires (its holder died): the clock moves past it.
    pub fn expire_lease(&mut self) {
        if let Some(l) = &self.lease {
            let expiry = l.renewed_at.plus_seconds(l.duration_seconds);
            if expiry > self.now {
                self.now = expiry;
            }
        }
    }

    fn pending(&mut self) -> ToolCall {
        self.pending_tool.take().expect("a tool call is pending")
    }

    /// The pending listing answers: `listing(url)` for each server asked.
    pub fn list_tools(
        &mut self,
        holder: &str,
        listing: impl Fn(&str) -> Result<Vec<Value>, String>,
    ) -> Vec<Effect> {
        let servers = self.pending_listing.take().expect("a listing is pending");
        let listings = servers
            .iter()
            .map(|s| crate::engine::ServerListing {
                protocol: Some("2026-07-28".into()),
                server_info: Some(serde_json::json!({"name": "shop", "version": "1.0"})),
                url: s.url.clone(),
                tools: listing(&s.url),
            })
            .collect();
        self.step(holder, Input::ToolsListed { listings })
    }

    pub fn finish_tool(&mut self, holder: &str, outcome: ToolOutcome) -> Vec<Effect> {
        let call = self.pending();
        if !matches!(outcome, ToolOutcome::Unknown { .. }) {
            self.answered.insert((call.step, call.attempt));
        }
        self.step(
            holder,
            Input::ToolFinished {
                step: call.step,
                attempt: call.attempt,
                outcome,
            },
        )
    }

    /// The pending tool answers 2xx with `content`.
    pub fn result(&mut self, holder: &str, content: Value) -> Vec<Effect> {
        self.finish_tool(
            holder,
            ToolOutcome::Result {
                status: 200,
                content,
                duration_ms: 5,
            },
        )
    }

    /// The pending tool answers non-2xx with `body`.
    pub fn error(&mut self, holder: &str, body: Value) -> Vec<Effect> {
        self.finish_tool(
            holder,
            ToolOutcome::Error {
                failure: crate::api::ToolFailure::HttpStatus,
                status: Some(500),
                content: body,
                duration_ms: 5,
            },
        )
    }

    /// The pending tool's outcome is unknown (timeout after sending).
    pub fn unknown(&mut self, holder: &str) -> Vec<Effect> {
        self.finish_tool(
            holder,
            ToolOutcome::Unknown {
                detail: "timed out after 10s".into(),
                duration_ms: 10_000,
            },
        )
    }

    /// A person decides the Approval, patching the hash it was shown.
    pub fn decide_approval(&mut self, name: &str, verdict: &str, note: Option<&str>) {
        let object = self.approvals.get_mut(name).expect("the Approval exists");
        let hash = object["spec"]["hash"].clone();
        object["spec"]["decision"] = json!({
            "verdict": verdict,
            "hash": hash,
            "approver": "alice",
            "note": note,
        });
        if note.is_none() {
            if let Some(d) = object["spec"]["decision"].as_object_mut() {
                d.remove("note");
            }
        }
    }

    pub fn approve(&mut self, name: &str) {
        self.decide_approval(name, "Approved", None);
    }

    pub fn reject(&mut self, name: &str, note: &str) {
        self.decide_approval(name, "Rejected", Some(note));
    }

    pub fn status(&self) -> AgentRunStatus {
        crate::engine::decode_status(&self.run.status).expect("the status decodes")
    }

    pub fn steps(&self) -> Vec<Step> {
        self.status().steps
    }

    /// The whole history: the window stitched with the segments created, the chain checked
    /// (what `agentrt show run -o json` prints).
    pub fn whole(&self) -> AgentRunStatus {
        let status = self.status();
        let fetched = self
            .segments
            .iter()
            .map(|(name, object)| (name.clone(), object["spec"].clone()))
            .collect();
        let verified =
            crate::engine::archive::verify_chain(&self.run.uid, status.archive.as_ref(), &fetched)
                .expect("the chain is intact");
        crate::engine::archive::stitch(&status, &verified).expect("the history stitches")
    }

    /// Seal constantly: more than `seal_steps` settled steps seal all but `keep_steps`.
    pub fn seal_often(&mut self, seal_steps: usize, keep_steps: usize) {
        self.budgets.seal = crate::engine::archive::SealLimits {
            seal_steps,
            keep_steps,
            ..crate::engine::archive::SealLimits::default()
        };
    }

    pub fn events(&self) -> Vec<RunEvent> {
        self.status().events
    }

    /// The journal as `type` or `type@step` words.
    pub fn journal(&self) -> Vec<String> {
        self.events().iter().map(word).collect()
    }

    /// The journal entries after the first `from`.
    pub fn journal_from(&self, from: usize) -> Vec<String> {
        self.events().iter().skip(from).map(word).collect()
    }

    /// The last `n` journal entries.
    pub fn journal_tail(&self, n: usize) -> Vec<String> {
        let journal = self.journal();
        journal[journal.len().saturating_sub(n)..].to_vec()
    }

    /// The data of the last event of `type_`.
    pub fn last_event(&self, type_: &str) -> Value {
        self.events()
            .iter()
            .rev()
            .find(|e| type_name(e) == type_)
            .and_then(|e| e.data.clone())
            .unwrap_or(Value::Null)
    }

    pub fn approval(&self, name: &str) -> &Value {
        self.approvals.get(name).expect("the Approval exists")
    }
}

fn type_name(event: &RunEvent) -> String {
    serde_json::to_value(event.type_)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn word(event: &RunEvent) -> String {
    match event.step {
        Some(step) => format!("{}@{step}", type_name(event)),
        None => type_name(event),
    }
}

/// The effects as words: `WriteStatus`, `CallTool(send#1)`, ...
pub fn kinds(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .map(|e| match e {
            Effect::CreateSegment(create) => format!(
                "CreateSegment({})",
                create.object["spec"]["index"].as_i64().unwrap_or(-1)
            ),
            Effect::WriteStatus { .. } => "WriteStatus".to_string(),
            Effect::CreateApproval { approval } => {
                format!(
                    "CreateApproval({})",
                    approval["metadata"]["name"].as_str().unwrap_or("")
                )
            }
            Effect::WriteApprovalStatus { name, status, .. } => format!(
                "WriteApprovalStatus({name}:{})",
                status["phase"].as_str().unwrap_or("")
            ),
            Effect::AcquireLease { takeover: None } => "AcquireLease".to_string(),
            Effect::AcquireLease { takeover: Some(_) } => "AcquireLease(takeover)".to_string(),
            Effect::CallTool(call) => format!("CallTool({}#{})", call.tool.name, call.attempt),
            Effect::CallAgent { step, .. } => format!("CallAgent({step})"),
            Effect::CallReconcileHook { .. } => "CallReconcileHook".to_string(),
            Effect::AskToolStatus(query) => format!("AskToolStatus({})", query.tool.name),
            Effect::ListTools { servers } => format!("ListTools({})", servers.len()),
            Effect::CallModel {
                step,
                attempt,
                delay_millis,
                ..
            } => format!("CallModel({step}#{attempt}+{delay_millis}ms)"),
            Effect::ReleaseLease => "ReleaseLease".to_string(),
            Effect::RequeueAfter { millis } => format!("RequeueAfter({millis})"),
            Effect::Stop => "Stop".to_string(),
        })
        .collect()
}

/// Shorthand for a tool-call decision.
pub fn call(tool: &str, args: Value) -> Value {
    json!({"kind": "tool_call", "tool": tool, "args": args})
}

pub fn complete(result: Value) -> Value {
    json!({"kind": "complete", "result": result})
}

/// Words for a list of `&str`.
pub fn words(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A previous holder for a takeover input.
pub fn previous(holder: &str, expired_at: Time) -> PreviousHolder {
    PreviousHolder {
        holder: Some(holder.into()),
        expired_at: Some(expired_at),
        stopped_by: None,
    }
}
