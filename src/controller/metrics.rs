//! Prometheus metrics and the health endpoints (`--metrics-addr`): `/metrics` in the
//! OpenMetrics text format, `/healthz` (the process serves), `/readyz` (every watch is synced:
//! it listed and has not failed since; 503 while any is not, e.g. while the API server is
//! down, so a Deployment's readiness shows a replica that cannot see new runs).
//!
//! Metrics are projections, never inputs (docs/design.md section 4). Three sources feed them:
//! - what each status write added to the record ([`Metrics::observe_write`]): steps by outcome,
//!   takeovers, interruptions by the status they interrupted, runs finished, model usage;
//! - what the controller itself saw: status-write outcomes (conflicts among them), tool call
//!   durations, lease renewals that failed, reconcile durations, failed reconciles by kind
//!   (`agentrt_reconcile_errors_total`, see `failures.rs`), leases won and lost;
//! - at scrape time, what the watches hold: runs by phase, Approvals pending by kind and
//!   namespace (`metrics/approvals`, with the time to a decision and notifications). Every replica
//!   watches every run, so these gauges are the same on each (aggregate them with `max`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use serde_json::Value;

use super::watched::WatchedRun;

pub mod approvals;
mod health;

/// What `agentrt_watch_lag_seconds` is read from at a scrape (seconds).
type LagSource = Box<dyn Fn() -> f64 + Send + Sync>;

pub use health::{serve, WatchHealth, WatchLabel};

/// One label: how something ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// The outcome word.
    pub outcome: String,
}

impl Outcome {
    fn of(word: &str) -> Outcome {
        Outcome {
            outcome: word.to_string(),
        }
    }
}

/// One label: the `reason` of an API server's Status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason (`Forbidden`, `Invalid`, ...).
    pub reason: String,
}

/// One label: the part of an object that does not decode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartLabel {
    /// `spec`, `status` or `object`.
    pub part: String,
}

/// One label: a tool's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    /// The tool.
    pub tool: String,
}

/// One label: a run phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    /// The phase.
    pub phase: String,
}

/// How a run ended: phase and terminal reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FinishedLabel {
    /// The terminal phase.
    pub phase: String,
    /// The terminal reason.
    pub reason: String,
}

/// One label: the step status an interruption found.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreviousLabel {
    /// `deciding`, `executing`, `awaiting_approval`.
    pub previous: String,
}

/// One label: the kind of a failed reconcile (`ReconcileError::metric_label`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `conflict`, `not_found`, `api`, `encode`, `decode`.
    pub kind: String,
}

/// One label: input or output tokens.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabel {
    /// `input` or `output`.
    pub direction: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn tool_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

fn reconcile_seconds() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// The phases a run can be in (docs/design.md section 2), each reported even at zero.
const PHASES: [&str; 6] = [
    "Pending",
    "Running",
    "WaitingForApproval",
    "Completed",
    "Failed",
    "Cancelled",
];

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles started.
    pub reconciles: Counter,
    /// How long reconciles took, in seconds.
    pub reconcile_duration: Histogram,
    /// Reconciles that failed, by kind (`super::failures::KINDS`).
    pub reconcile_errors: Family<KindLabel, Counter>,
    /// Run status writes by outcome (`ok`, `conflict`, `error`, `refused`).
    pub status_writes: Family<Outcome, Counter>,
    /// Status writes the API server refused (403: RBAC or a ValidatingAdmissionPolicy; 422
    /// from a policy whose reason is `Invalid`), by the Status `reason` (issue 34 item 6).
    pub status_writes_refused: Family<ReasonLabel, Counter>,
    /// Objects set aside because they do not decode, by the part that does not (`spec`,
    /// `status`, `object`; issue 34): counted where they are found (the run watch, a read of
    /// the run, a list of Approvals).
    pub objects_set_aside: Family<PartLabel, Counter>,
    /// How long run status writes took, from the request sent to its answer decoded, in
    /// seconds (every outcome; 1 ms to about 33 s in doubling buckets). The API server's
    /// answer time as this replica sees it: what `--max-concurrent-runs`' pace follows
    /// (docs/design.md section 7).
    pub status_write_duration: Histogram,
    /// AgentRunSegments this replica created (docs/design.md section 4a; one found already
    /// there with the same content is not counted).
    pub segments_created: Counter,
    /// Seals whose segment could not be created (the step was written without sealing).
    pub segment_failures: Counter,
    /// AgentRunSegments read (GET) for an openai agent's conversation: each at most once per
    /// executor while its cache holds it (`controller::segments`).
    pub segment_reads: Counter,
    /// Tool calls by outcome (`result`, `error`, `unknown`, `abort`).
    pub tool_calls: Family<Outcome, Counter>,
    /// Tool call durations by tool, in seconds.
    pub tool_call_duration: HistogramFamily<ToolLabel>,
    /// Steps that ended, by how (`done`, `failed`, `interrupted`), from the record.
    pub steps: Family<Outcome, Counter>,
    /// Runs that ended, by phase and reason, from the record.
    pub runs_finished: Family<FinishedLabel, Counter>,
    /// Runs by phase (the watched runs, at scrape time).
    pub runs: Family<PhaseLabel, Gauge>,
    /// The Approvals' metrics: pending by kind and namespace, the time to a decision, the
    /// notifications (issue 39).
    pub approvals: approvals::ApprovalMetrics,
    /// Model tokens charged, by direction, from the record.
    pub model_tokens: Family<TokenLabel, Counter>,
    /// Estimated model cost charged, in micros, from the record.
    pub model_cost_micros: Counter,
    /// Model attempts dispatched, from the record.
    pub model_calls: Counter,
    /// Takeovers this replica recorded (`lease.taken_over`).
    pub takeovers: Counter,
    /// Interrupted steps this replica recorded, by the status they were in.
    pub interruptions: Family<PreviousLabel, Counter>,
    /// Lease renewals that failed (the API server did not answer; a lost lease is
    /// `leases_lost`).
    pub lease_renew_failures: Counter,
    /// Leases won (acquisitions and takeovers).
    pub leases_acquired: Counter,
    /// Leases lost (another holder, or expired unrenewed).
    pub leases_lost: Counter,
    /// Leases lost during a tool call and won back before anyone took them (the call's
    /// outcome then recorded; docs/design.md section 5).
    pub leases_won_back: Counter,
    /// Kubernetes Events by outcome: `published`, `failed` (the API server refused it),
    /// `folded` (into a waiting Event of the same run), `dropped` (the queue behind
    /// `--event-qps` was full; `controller::projection`).
    pub kube_events: Family<Outcome, Counter>,
    /// Kubernetes Events queued or being published (waiting for `--event-qps`, or for the API
    /// server's answer).
    pub kube_events_queued: Gauge,
    /// Runs this replica executes now.
    pub executors: Gauge,
    /// The executor slots runs may take now (`--max-concurrent-runs`, or fewer while the API
    /// server answers slowly: `controller::pacing`).
    pub executor_slots: Gauge,
    /// The median status write time of the pace's last window of writes, in seconds (0 before
    /// the first window; `controller::pacing`). A `Started` Event is held longer by twenty of
    /// them (`controller::projection::EventRate::batch`).
    pub status_write_median: super::pacing::WriteMedian,
    /// Watches synced (1) or not (0), by watch and scope.
    pub watches_synced: Family<WatchLabel, Gauge>,
    /// `agentrt_watch_lag_seconds`: how far this replica's run watch runs behind its own status
    /// writes, read at each scrape from [`Metrics::watch_lag_from`]'s source
    /// (`controller::context::WatchLag`; docs/design.md section 7).
    pub watch_lag: Gauge<f64, std::sync::atomic::AtomicU64>,
    watch_lag_source: Mutex<Option<LagSource>>,
    run_stores: Mutex<Vec<Store<WatchedRun>>>,
    watches: Mutex<Vec<std::sync::Arc<WatchHealth>>>,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentrt");
        let metrics = Metrics {
            reconciles: Counter::default(),
            reconcile_duration: reconcile_seconds(),
            reconcile_errors: Family::default(),
            status_writes: Family::default(),
            status_writes_refused: Family::default(),
            objects_set_aside: Family::default(),
            status_write_duration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            segments_created: Counter::default(),
            segment_failures: Counter::default(),
            segment_reads: Counter::default(),
            tool_calls: Family::default(),
            tool_call_duration: Family::new_with_constructor(tool_seconds),
            steps: Family::default(),
            runs_finished: Family::default(),
            runs: Family::default(),
            approvals: approvals::ApprovalMetrics::default(),
            model_tokens: Family::default(),
            model_cost_micros: Counter::default(),
            model_calls: Counter::default(),
            takeovers: Counter::default(),
            interruptions: Family::default(),
            lease_renew_failures: Counter::default(),
            leases_acquired: Counter::default(),
            leases_lost: Counter::default(),
            leases_won_back: Counter::default(),
            kube_events: Family::default(),
            kube_events_queued: Gauge::default(),
            executors: Gauge::default(),
            executor_slots: Gauge::default(),
            status_write_median: super::pacing::WriteMedian::default(),
            watches_synced: Family::default(),
            watch_lag: Gauge::default(),
            watch_lag_source: Mutex::new(None),
            run_stores: Mutex::new(Vec::new()),
            watches: Mutex::new(Vec::new()),
            ready: AtomicBool::new(false),
            registry: Registry::default(),
        };
        let m = &metrics;
        registry.register("reconciles", "Reconciles started", m.reconciles.clone());
        registry.register_with_unit(
            "reconcile_duration",
            "How long reconciles took",
            Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by kind (conflict, not_found, api, encode, decode)",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "status_writes",
            "AgentRun status writes (compare-and-set) by outcome; conflict: another writer won",
            m.status_writes.clone(),
        );
        registry.register(
            "status_writes_refused",
            "AgentRun status writes the API server refused (RBAC, an admission policy), by reason",
            m.status_writes_refused.clone(),
        );
        registry.register(
            "objects_set_aside",
            "Objects set aside because a part of them does not decode, by part",
            m.objects_set_aside.clone(),
        );
        registry.register_with_unit(
            "status_write_duration",
            "How long AgentRun status writes took, request to decoded answer, every outcome",
            Unit::Seconds,
            m.status_write_duration.clone(),
        );
        registry.register(
            "segments_created",
            "AgentRunSegments created: sealed history moved out of the record",
            m.segments_created.clone(),
        );
        registry.register(
            "segment_failures",
            "Seals whose AgentRunSegment could not be created; the step was written without sealing",
            m.segment_failures.clone(),
        );
        registry.register(
            "segment_reads",
            "AgentRunSegments read for an openai agent's conversation (each once per executor while cached)",
            m.segment_reads.clone(),
        );
        registry.register("tool_calls", "Tool calls by outcome", m.tool_calls.clone());
        registry.register(
            "kube_events",
            "Kubernetes Events by outcome (published, failed, folded into a waiting Event of the same run, dropped: the queue behind --event-qps was full)",
            m.kube_events.clone(),
        );
        registry.register_with_unit(
            "watch_lag",
            "How far this replica's run watch runs behind its own status writes (the lag a replica waits out before reading a run another replica holds: up to 60 s of it, up to 10 minutes while that replica renews its presence Lease)",
            Unit::Seconds,
            m.watch_lag.clone(),
        );
        registry.register(
            "kube_events_queued",
            "Kubernetes Events queued and not yet published (waiting for --event-qps)",
            m.kube_events_queued.clone(),
        );
        registry.register_with_unit(
            "tool_call_duration",
            "Tool call durations by tool",
            Unit::Seconds,
            m.tool_call_duration.clone(),
        );
        registry.register(
            "steps",
            "Steps that ended, by outcome (done, failed, interrupted), as recorded by this replica",
            m.steps.clone(),
        );
        registry.register(
            "runs_finished",
            "Runs that ended, by phase and reason, as recorded by this replica",
            m.runs_finished.clone(),
        );
        registry.register(
            "runs",
            "Watched runs by phase (the same on every replica)",
            m.runs.clone(),
        );
        m.approvals.register(&mut registry);
        registry.register(
            "model_tokens",
            "Model tokens charged to runs by this replica, by direction",
            m.model_tokens.clone(),
        );
        registry.register(
            "model_cost_micros",
            "Estimated model cost charged to runs by this replica, in micros",
            m.model_cost_micros.clone(),
        );
        registry.register(
            "model_calls",
            "Model attempts dispatched by this replica",
            m.model_calls.clone(),
        );
        registry.register(
            "takeovers",
            "Runs this replica took over from another holder (lease.taken_over)",
            m.takeovers.clone(),
        );
        registry.register(
            "interruptions",
            "Steps this replica marked interrupted, by the status they were in",
            m.interruptions.clone(),
        );
        registry.register(
            "lease_renew_failures",
            "Lease renewals the API server did not answer",
            m.lease_renew_failures.clone(),
        );
        registry.register(
            "leases_acquired",
            "Run leases won (acquisitions and takeovers)",
            m.leases_acquired.clone(),
        );
        registry.register(
            "leases_lost",
            "Run leases lost to another holder or to expiry",
            m.leases_lost.clone(),
        );
        registry.register(
            "leases_won_back",
            "Run leases lost during a tool call and won back before anyone took them",
            m.leases_won_back.clone(),
        );
        registry.register(
            "executors",
            "Runs this replica is executing",
            m.executors.clone(),
        );
        registry.register(
            "executor_slots",
            "Executor slots runs may take now: --max-concurrent-runs, or fewer while the API server answers slowly",
            m.executor_slots.clone(),
        );
        registry.register(
            "status_write_median_seconds",
            "Median status write time of the executor slots' pace's last one-second window of writes",
            m.status_write_median.gauge(),
        );
        registry.register(
            "watches_synced",
            "Whether each watch is synced (1: listed and not failed since; 0: failed or relisting)",
            m.watches_synced.clone(),
        );
        // Series that read as zero before anything happened, so a dashboard finds them.
        for outcome in ["ok", "conflict", "error", "refused"] {
            let _ = m.status_writes.get_or_create(&Outcome::of(outcome));
        }
        for part in ["spec", "status", "object", "approval"] {
            let _ = m
                .objects_set_aside
                .get_or_create(&PartLabel { part: part.into() });
        }
        for kind in super::failures::KINDS {
            let _ = m
                .reconcile_errors
                .get_or_create(&KindLabel { kind: kind.into() });
        }
        for outcome in ["done", "failed", "interrupted"] {
            let _ = m.steps.get_or_create(&Outcome::of(outcome));
        }
        for direction in ["input", "output"] {
            let _ = m.model_tokens.get_or_create(&TokenLabel {
                direction: direction.into(),
            });
        }
        for phase in PHASES {
            let _ = m.runs.get_or_create(&PhaseLabel {
                phase: phase.into(),
            });
        }
        Metrics {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Counts one Kubernetes Event: `published`, `failed`, `folded` or `dropped`.
    pub fn kube_event(&self, outcome: &str) {
        self.kube_events.get_or_create(&Outcome::of(outcome)).inc();
    }

    /// Records how long one status write took (any outcome), in seconds.
    pub fn status_write_took(&self, seconds: f64) {
        self.status_write_duration.observe(seconds);
    }

    /// Counts one status write.
    pub fn status_write(&self, outcome: &str) {
        self.status_writes
            .get_or_create(&Outcome::of(outcome))
            .inc();
    }

    /// Counts one failed reconcile of `kind` (`ReconcileError::metric_label`).
    /// Counts a status write the API server refused, by its Status `reason`.
    pub fn status_write_refused(&self, reason: &str) {
        self.status_writes_refused
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts an object set aside because its `part` does not decode.
    pub fn set_aside(&self, part: &str) {
        self.objects_set_aside
            .get_or_create(&PartLabel {
                part: part.to_string(),
            })
            .inc();
    }

    /// Counts one failed reconcile of `kind`.
    pub fn reconcile_error(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts one tool call of `tool` that took `seconds`.
    pub fn tool_call(&self, tool: &str, outcome: &str, seconds: f64) {
        self.tool_calls.get_or_create(&Outcome::of(outcome)).inc();
        self.tool_call_duration
            .get_or_create(&ToolLabel {
                tool: tool.to_string(),
            })
            .observe(seconds);
    }

    /// Counts what one landed status write added to the record (`old` → `new`): steps that
    /// ended, takeovers, interruptions, runs finished, model usage. Reads both leniently.
    pub fn observe_write(&self, old: &Value, new: &Value) {
        // Steps are matched by `index`, not position: a sealed record's window starts later
        // (docs/design.md section 4a).
        let step_status = |status: &Value, index: Option<i64>| -> Option<String> {
            status["steps"]
                .as_array()?
                .iter()
                .rev()
                .find(|step| step["index"].as_i64() == index)
                .and_then(|step| step["status"].as_str())
                .map(str::to_string)
        };
        if let Some(steps) = new["steps"].as_array() {
            for step in steps {
                let now = step["status"].as_str().unwrap_or("");
                if matches!(now, "done" | "failed" | "interrupted")
                    && step_status(old, step["index"].as_i64()).as_deref() != Some(now)
                {
                    self.steps.get_or_create(&Outcome::of(now)).inc();
                }
            }
        }
        let last_seq = old["events"]
            .as_array()
            .and_then(|events| events.last())
            .and_then(|event| event["seq"].as_i64())
            .unwrap_or(0);
        let added = new["events"].as_array().map_or(&[][..], |events| {
            let first_new = events
                .iter()
                .rposition(|event| event["seq"].as_i64().unwrap_or(0) <= last_seq)
                .map_or(0, |i| i + 1);
            &events[first_new..]
        });
        for event in added {
            let data = &event["data"];
            match event["type"].as_str().unwrap_or("") {
                "lease.taken_over" => {
                    self.takeovers.inc();
                }
                "step.interrupted" => {
                    self.interruptions
                        .get_or_create(&PreviousLabel {
                            previous: data["previousStatus"].as_str().unwrap_or("-").to_string(),
                        })
                        .inc();
                }
                "run.finished" => {
                    self.runs_finished
                        .get_or_create(&FinishedLabel {
                            phase: data["phase"].as_str().unwrap_or("-").to_string(),
                            reason: data["reason"].as_str().unwrap_or("-").to_string(),
                        })
                        .inc();
                }
                _ => {}
            }
        }
        let grew = |field: &str| -> u64 {
            let before = old["usage"][field].as_i64().unwrap_or(0);
            let after = new["usage"][field].as_i64().unwrap_or(0);
            u64::try_from(after.saturating_sub(before)).unwrap_or(0)
        };
        for (direction, field) in [("input", "inputTokens"), ("output", "outputTokens")] {
            let tokens = grew(field);
            if tokens > 0 {
                self.model_tokens
                    .get_or_create(&TokenLabel {
                        direction: direction.into(),
                    })
                    .inc_by(tokens);
            }
        }
        self.model_cost_micros.inc_by(grew("estimatedCostMicros"));
        self.model_calls.inc_by(grew("modelCalls"));
    }

    /// Reads runs by phase from `store` (a watch's reflector) at each scrape.
    pub fn watch_runs(&self, store: Store<WatchedRun>) {
        self.lock_stores().push(store);
    }

    fn lock_stores(&self) -> std::sync::MutexGuard<'_, Vec<Store<WatchedRun>>> {
        self.run_stores.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn refresh_phases(&self) {
        let mut counts: std::collections::BTreeMap<String, i64> =
            PHASES.iter().map(|p| ((*p).to_string(), 0)).collect();
        for store in self.lock_stores().iter() {
            for run in store.state() {
                let phase = run.status.phase.as_deref().unwrap_or("Pending");
                *counts.entry(phase.to_string()).or_default() += 1;
            }
        }
        for (phase, count) in counts {
            self.runs.get_or_create(&PhaseLabel { phase }).set(count);
        }
    }

    /// The health of a new watch of `watch` (`agentruns`, `approvals`, `leases`) in `scope`
    /// (a namespace; `None` for all), reported by `agentrt_watches_synced` and `/readyz`.
    pub fn watch(&self, watch: &str, scope: Option<&str>) -> Arc<WatchHealth> {
        let label = WatchLabel {
            watch: watch.to_string(),
            scope: scope.unwrap_or("*").to_string(),
        };
        let gauge = self.watches_synced.get_or_create(&label).clone();
        let health = Arc::new(WatchHealth::new(label, gauge));
        self.watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(health.clone());
        health
    }

    /// Marks the controller started (its watches were set up); it is ready once they are all
    /// synced too.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::SeqCst);
    }

    /// Whether the controller is ready: started, and every watch synced.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
            && self
                .watches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .all(|w| w.is_synced())
    }

    /// Reads `agentrt_watch_lag_seconds` from `source` (seconds) at each scrape.
    pub fn watch_lag_from(&self, source: impl Fn() -> f64 + Send + Sync + 'static) {
        *self
            .watch_lag_source
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Box::new(source));
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.refresh_phases();
        self.approvals.refresh();
        if let Some(source) = self
            .watch_lag_source
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            self.watch_lag.set(source());
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests;
