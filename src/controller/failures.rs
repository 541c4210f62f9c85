//! Why a reconcile failed ([`ReconcileError`]) and its per-run backoff ([`FailureBackoff`]),
//! which kube-runtime's error policy ([`super::reconcile::entry::error_policy`]) applies: each failure is counted by kind in `agentrt_reconcile_errors_total`
//! ([`ReconcileError::metric_label`]) and the run is looked at again after a backoff of its own
//! ([`FailureBackoff`]: doubling per failure in a row of that run, reset by its next successful
//! reconcile), as kube-rs's controller-rs does with `set_failure`. A failing run never slows
//! another's reconciles, and a run the API server keeps failing is not asked about every 2 s.
//!
//! Nothing here decides anything about a run: a retry only reads the run again and asks the
//! engine (docs/design.md section 7).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::cluster::RunKey;
use super::cluster::{ApiError, DecodeError, RunError};

/// The wait after a run's first failed reconcile in a row (2 s), doubled after each further
/// one.
pub const BACKOFF_FIRST: Duration = Duration::from_secs(2);
/// The longest wait between a failing run's reconciles (30 s). A run's own changes, its
/// Approvals' and its Lease's still wake it sooner.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Why a reconcile failed (it is retried by [`super::reconcile::entry::error_policy`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server failed.
    #[error("AgentRun {run}: {source}")]
    Api {
        /// The run.
        run: RunKey,
        /// What failed.
        source: ApiError,
    },
    /// The run, as read, does not decode (the message names the run already).
    #[error("{source}")]
    Undecodable {
        /// The run.
        run: RunKey,
        /// What is wrong with it.
        source: DecodeError,
    },
}

impl ReconcileError {
    /// The failure `err` of a reconcile of `run`.
    pub fn new(run: RunKey, err: RunError) -> ReconcileError {
        match err {
            RunError::Api(source) => ReconcileError::Api { run, source },
            RunError::Undecodable(source) => ReconcileError::Undecodable { run, source },
        }
    }

    /// The run whose reconcile failed.
    pub fn run(&self) -> &RunKey {
        match self {
            ReconcileError::Api { run, .. } | ReconcileError::Undecodable { run, .. } => run,
        }
    }

    /// The `kind` label of `agentrt_reconcile_errors_total`: `conflict`, `not_found`, `api`,
    /// `encode` ([`ApiError::metric_label`]) or `decode`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Api { source, .. } => source.metric_label(),
            ReconcileError::Undecodable { .. } => "decode",
        }
    }
}

/// Every `kind` [`ReconcileError::metric_label`] can give, reported even at zero.
pub const KINDS: [&str; 6] = [
    "conflict",
    "not_found",
    "refused",
    "api",
    "encode",
    "decode",
];

/// Failed reconciles in a row, per run; and refused status writes in a row, per run.
#[derive(Debug, Default)]
pub struct FailureBackoff {
    failures: Mutex<HashMap<RunKey, u32>>,
    /// Status writes the API server refused (403) in a row, per run: reset only by a write
    /// that lands, not by a reconcile that succeeds (an executor that stops on a refusal
    /// kicks a reconcile that succeeds in acquiring the Lease again).
    refusals: Mutex<HashMap<RunKey, u32>>,
}

impl FailureBackoff {
    /// Counts one more refused status write of `key` in a row; the wait before the next
    /// attempt: [`BACKOFF_FIRST`] doubled per earlier refusal in the row, at most
    /// [`BACKOFF_MAX`] (issue 34 item 6: a refused write is not retried blindly).
    pub fn refused(&self, key: &RunKey) -> (u32, Duration) {
        let mut refusals = self
            .refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let row = refusals.entry(key.clone()).or_insert(0);
        *row = row.saturating_add(1);
        let doublings = (*row - 1).min(16);
        let wait = BACKOFF_FIRST
            .saturating_mul(1 << doublings)
            .min(BACKOFF_MAX);
        (*row, wait)
    }

    /// Forgets `key`'s refused writes (a status write landed).
    pub fn write_landed(&self, namespace: &str, name: &str) {
        let mut refusals = self
            .refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !refusals.is_empty() {
            refusals.remove(&RunKey::new(namespace, name));
        }
    }

    /// Counts one more failure of `key` in a row; the wait before its next reconcile:
    /// [`BACKOFF_FIRST`] doubled per earlier failure in the row, at most [`BACKOFF_MAX`].
    pub fn set_failure(&self, key: &RunKey) -> Duration {
        let mut failures = self.lock();
        let row = failures.entry(key.clone()).or_insert(0);
        *row = row.saturating_add(1);
        let doublings = (*row - 1).min(16);
        BACKOFF_FIRST
            .saturating_mul(1 << doublings)
            .min(BACKOFF_MAX)
    }

    /// Forgets `key`'s failures (its reconcile succeeded).
    pub fn reset(&self, key: &RunKey) {
        self.lock().remove(key);
    }

    /// How many reconciles of `key` failed in a row.
    pub fn failures(&self, key: &RunKey) -> u32 {
        self.lock().get(key).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunKey, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> RunKey {
        RunKey::new("ns", name)
    }

    #[test]
    fn the_backoff_doubles_per_run_is_bounded_and_resets_on_success() {
        let backoff = FailureBackoff::default();
        let waits: Vec<Duration> = (0..8).map(|_| backoff.set_failure(&key("a"))).collect();
        assert_eq!(
            waits[..5],
            [2, 4, 8, 16, 30].map(Duration::from_secs),
            "{waits:?}"
        );
        assert!(waits.iter().all(|w| *w <= BACKOFF_MAX));
        assert_eq!(backoff.failures(&key("a")), 8);
        // Another run's failures are its own.
        assert_eq!(backoff.set_failure(&key("b")), BACKOFF_FIRST);
        backoff.reset(&key("a"));
        assert_eq!(backoff.failures(&key("a")), 0);
        assert_eq!(backoff.set_failure(&key("a")), BACKOFF_FIRST);
        assert_eq!(backoff.failures(&key("b")), 1);
    }

    #[test]
    fn a_refused_write_backs_off_per_run_until_a_write_lands() {
        let backoff = FailureBackoff::default();
        let waits: Vec<Duration> = (0..6).map(|_| backoff.refused(&key("a")).1).collect();
        assert_eq!(waits, [2, 4, 8, 16, 30, 30].map(Duration::from_secs));
        // A successful reconcile does not reset it; a landed write does.
        backoff.reset(&key("a"));
        assert_eq!(backoff.refused(&key("a")), (7, BACKOFF_MAX));
        assert_eq!(backoff.refused(&key("b")), (1, BACKOFF_FIRST));
        backoff.write_landed("ns", "a");
        assert_eq!(backoff.refused(&key("a")), (1, BACKOFF_FIRST));
        let refused = ReconcileError::new(
            key("a"),
            RunError::Api(ApiError::Refused {
                reason: "Forbidden".into(),
                message: "ValidatingAdmissionPolicy 'deny' denied request".into(),
            }),
        );
        assert_eq!(refused.metric_label(), "refused");
    }

    #[test]
    fn a_failure_is_labelled_by_its_kind() {
        let conflict =
            ReconcileError::new(key("a"), RunError::Api(ApiError::Conflict("stale".into())));
        assert_eq!(conflict.metric_label(), "conflict");
        assert_eq!(conflict.to_string(), "AgentRun ns/a: conflict: stale");
        let unreachable = ReconcileError::new(
            key("a"),
            RunError::Api(ApiError::Kube(kube::Error::Service(
                "connection refused".into(),
            ))),
        );
        assert_eq!(unreachable.metric_label(), "api");
        assert!(
            std::error::Error::source(&unreachable).is_some(),
            "the kube error is kept as the source"
        );
        let undecodable = super::super::cluster::StoredRun::from_object(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "a", "uid": "u", "resourceVersion": "1"},
            "spec": {"goal": 1},
        }))
        .expect_err("a spec that does not decode");
        let undecodable = ReconcileError::new(key("a"), undecodable.into());
        assert_eq!(undecodable.metric_label(), "decode");
        assert!(
            undecodable
                .to_string()
                .starts_with("AgentRun ns/a: spec does not decode: "),
            "{undecodable}"
        );
        for err in [conflict, unreachable, undecodable] {
            assert!(KINDS.contains(&err.metric_label()));
        }
    }

    #[test]
    fn failures_are_counted_by_kind_in_the_metric() {
        let metrics = super::super::metrics::Metrics::default();
        let text = metrics.encode();
        for kind in KINDS {
            let series = format!("agentrt_reconcile_errors_total{{kind=\"{kind}\"}} 0");
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        metrics.reconcile_error("api");
        metrics.reconcile_error("api");
        metrics.reconcile_error("decode");
        let text = metrics.encode();
        for series in [
            "agentrt_reconcile_errors_total{kind=\"api\"} 2",
            "agentrt_reconcile_errors_total{kind=\"decode\"} 1",
            "agentrt_reconcile_errors_total{kind=\"conflict\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }
}
