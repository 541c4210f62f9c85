//! The Approvals' metrics (issue 39): `agentrt_approvals_pending{kind,namespace}` (read at each
//! scrape from the Approval watch), `agentrt_approval_decision_seconds{kind,outcome}` (from
//! creation to the status write that ended `Pending`, observed by the replica that won that
//! write), and the notifications' outcomes, queue and delivery time (`controller::notify`).

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// The pending Approvals by (kind, namespace), as one watch holds them now.
pub type PendingSource = Box<dyn Fn() -> Vec<((String, String), i64)> + Send + Sync>;

/// Pending Approvals' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PendingLabel {
    /// `spec.kind`.
    pub kind: String,
    /// The namespace.
    pub namespace: String,
}

/// A decision's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `spec.kind`.
    pub kind: String,
    /// The phase that ended `Pending`, lower case: `approved`, `rejected`, `settled`,
    /// `expired`, `cancelled`.
    pub outcome: String,
}

/// A notification's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabel {
    /// The webhook's name.
    pub webhook: String,
    /// `delivered`, `retried` (an attempt failed and another follows), `failed` (for good),
    /// `dropped` (the queue was full).
    pub outcome: String,
}

/// One label: a webhook's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabel {
    /// The webhook's name.
    pub webhook: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn decision_seconds() -> Histogram {
    // 1 s to about 4.5 days.
    Histogram::new(exponential_buckets(1.0, 3.0, 12))
}

/// The Approvals' metrics ([`super::Metrics::approvals`]).
pub struct ApprovalMetrics {
    /// Pending Approvals by kind and namespace (the watches, at scrape time).
    pub pending: Family<PendingLabel, Gauge>,
    /// Seconds from an Approval's creation to the end of `Pending`.
    pub decision_seconds: HistogramFamily<DecisionLabel>,
    /// Notifications by webhook and outcome.
    pub notifications: Family<NotifyLabel, Counter>,
    /// Notifications waiting in each webhook's queue.
    pub notifications_queued: Family<WebhookLabel, Gauge>,
    /// Seconds from a notification queued to its delivery (retries included).
    pub notification_delivery: Histogram,
    sources: Mutex<Vec<PendingSource>>,
}

impl Default for ApprovalMetrics {
    fn default() -> Self {
        ApprovalMetrics {
            pending: Family::default(),
            decision_seconds: Family::new_with_constructor(decision_seconds),
            notifications: Family::default(),
            notifications_queued: Family::default(),
            notification_delivery: Histogram::new(exponential_buckets(0.005, 2.0, 16)),
            sources: Mutex::new(Vec::new()),
        }
    }
}

impl ApprovalMetrics {
    /// Registers them (the registry has the `agentrt` prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "approvals_pending",
            "Approvals waiting for a person, by kind and namespace (the Approval watch)",
            self.pending.clone(),
        );
        registry.register_with_unit(
            "approval_decision",
            "Time from an Approval's creation to the end of Pending, by kind and outcome",
            Unit::Seconds,
            self.decision_seconds.clone(),
        );
        registry.register(
            "notifications",
            "Approval notifications by webhook and outcome (delivered, retried, failed, dropped)",
            self.notifications.clone(),
        );
        registry.register(
            "notifications_queued",
            "Approval notifications waiting in each webhook's queue",
            self.notifications_queued.clone(),
        );
        registry.register_with_unit(
            "notification_delivery",
            "Time from a notification queued to its delivery, retries included",
            Unit::Seconds,
            self.notification_delivery.clone(),
        );
    }

    /// Reads the pending Approvals from `source` (one watch) at each scrape.
    pub fn pending_from(&self, source: PendingSource) {
        self.sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(source);
    }

    /// Sets the pending gauge from the sources (a label with none left is removed).
    pub fn refresh(&self) {
        let mut counts = std::collections::BTreeMap::<(String, String), i64>::new();
        for source in self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            for (key, n) in source() {
                *counts.entry(key).or_default() += n;
            }
        }
        self.pending.clear();
        for ((kind, namespace), n) in counts {
            self.pending
                .get_or_create(&PendingLabel { kind, namespace })
                .set(n);
        }
    }

    /// One Approval left `Pending` for `outcome` after `seconds`.
    pub fn decided(&self, kind: &str, outcome: &str, seconds: f64) {
        self.decision_seconds
            .get_or_create(&DecisionLabel {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .observe(seconds);
    }

    /// `n` notifications to `webhook` ended `outcome`.
    pub fn notification(&self, webhook: &str, outcome: &str, n: u64) {
        self.notifications
            .get_or_create(&NotifyLabel {
                webhook: webhook.to_string(),
                outcome: outcome.to_string(),
            })
            .inc_by(n);
    }

    /// `webhook`'s queue grew (or shrank) by `n`.
    pub fn queued(&self, webhook: &str, n: i64) {
        self.notifications_queued
            .get_or_create(&WebhookLabel {
                webhook: webhook.to_string(),
            })
            .inc_by(n);
    }

    /// A notification was delivered `seconds` after it was queued.
    pub fn delivered_after(&self, seconds: f64) {
        self.notification_delivery.observe(seconds);
    }
}
