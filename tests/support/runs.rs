//! A scenario's runs and Approvals, read and driven through the [`TestCluster`] they live in
//! (its client and its namespace): `cluster.create_run(&yaml)`, `cluster.wait_phase(...)`,
//! `cluster.run_awaiting_approval(...)`, `cluster.decide(...)`, `cluster.cancel_run(...)`. Each
//! is the [`super::controller`] function of the same name with the cluster's client and
//! namespace filled in, so that a scenario reads as its story.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{DynamicObject, ListParams};
use kube::Api;
use serde_json::Value;

use super::cluster::{eventually, TestCluster};
use super::controller;

/// How long [`TestCluster::run_awaiting_approval`] waits for the Approval (a controller's first
/// reconcile of a fresh run takes well under a second; a loaded machine, more).
pub const APPROVAL_WAIT: Duration = Duration::from_secs(60);

/// The name of an Approval (or any object read back); panics when it has none.
pub fn name_of(object: &DynamicObject) -> String {
    object.metadata.name.clone().expect("name")
}

impl TestCluster {
    /// Creates the AgentRun in `yaml` in the test's namespace; panics when the API server
    /// refuses it.
    pub async fn create_run(&self, yaml: &str) -> DynamicObject {
        controller::create_run(&self.client(), self.namespace(), yaml).await
    }

    /// The status of run `run` (`null` while absent).
    pub async fn run_status(&self, run: &str) -> Value {
        controller::status(&self.client(), self.namespace(), run).await
    }

    /// Waits up to `timeout` for run `run`'s status to satisfy `done` and returns it; panics
    /// with the status (saying it waited for `what`) when it does not.
    pub async fn wait_status(
        &self,
        run: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        controller::wait_status(&self.client(), self.namespace(), run, timeout, what, done).await
    }

    /// Waits up to `timeout` for run `run` to be in `phase` and returns its status; panics with
    /// the status when it is not by then.
    pub async fn wait_phase(&self, run: &str, phase: &str, timeout: Duration) -> Value {
        controller::wait_phase(&self.client(), self.namespace(), run, phase, timeout).await
    }

    /// Waits up to `timeout` for an Approval of run `run` whose kind is `kind`; panics with the
    /// run's status when there is none by then.
    pub async fn wait_approval(&self, run: &str, kind: &str, timeout: Duration) -> DynamicObject {
        controller::wait_approval(&self.client(), self.namespace(), run, kind, timeout).await
    }

    /// Creates the AgentRun in `yaml` (named `run`) and waits up to [`APPROVAL_WAIT`] for its
    /// Approval of kind `kind`, which it returns: the start of every scenario about a person's
    /// decision. Panics when the run is refused or no such Approval comes (a controller must be
    /// running).
    pub async fn run_awaiting_approval(&self, yaml: &str, run: &str, kind: &str) -> DynamicObject {
        self.create_run(yaml).await;
        self.wait_approval(run, kind, APPROVAL_WAIT).await
    }

    /// Asserts that run `run` has no Approval (nobody was asked), naming the kinds of those it
    /// has.
    pub async fn assert_no_approval(&self, run: &str) {
        let approvals = self.approvals_of(run).await;
        assert!(
            approvals.is_empty(),
            "nobody should have been asked: {:?}",
            approvals
                .iter()
                .map(|a| a.data["spec"]["kind"].clone())
                .collect::<Vec<_>>()
        );
    }

    /// The run's Approvals, sorted by name.
    pub async fn approvals_of(&self, run: &str) -> Vec<DynamicObject> {
        controller::approvals(&self.client(), self.namespace(), run).await
    }

    /// Approval `name` as it is now; panics when it cannot be read.
    pub async fn approval(&self, name: &str) -> DynamicObject {
        controller::approvals_api(&self.client(), self.namespace())
            .get(name)
            .await
            .unwrap_or_else(|err| panic!("approval {name}: {err}"))
    }

    /// Waits up to `timeout` for Approval `name` to be in `status.phase` `phase` and returns
    /// it; panics naming the phase when it is not by then.
    pub async fn wait_approval_phase(
        &self,
        name: &str,
        phase: &str,
        timeout: Duration,
    ) -> DynamicObject {
        let api = controller::approvals_api(&self.client(), self.namespace());
        eventually(&format!("the Approval {phase}"), timeout, || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                api.get(&name)
                    .await
                    .ok()
                    .filter(|a| a.data["status"]["phase"] == phase)
            }
        })
        .await
    }

    /// Decides `approval` `verdict` (`Approved`, `Rejected`) with its own hash, approver
    /// `test`; panics when the API server refuses the decision.
    pub async fn decide(&self, approval: &DynamicObject, verdict: &str) {
        controller::decide(&self.client(), self.namespace(), approval, verdict).await
    }

    /// Waits up to `timeout` (polling every 300 ms) for a Warning Event with reason `reason`
    /// about the object named `object` in the test's namespace, and returns it; panics saying
    /// so, with `context()` (a controller's log, say), when there is none by then.
    pub async fn wait_warning_event(
        &self,
        object: &str,
        reason: &str,
        timeout: Duration,
        context: impl Fn() -> String,
    ) -> Event {
        let events: Api<Event> = Api::namespaced(self.client(), self.namespace());
        let deadline = Instant::now() + timeout;
        loop {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
                .await
                .expect("events list");
            if let Some(event) = list.items.into_iter().find(|e| {
                e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason)
            }) {
                return event;
            }
            assert!(
                Instant::now() < deadline,
                "no Warning Event {reason} on {object} within {timeout:?}:\n{}",
                context()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Asks run `run` to stop: `kubectl patch agentrun RUN --type merge -p
    /// {"spec":{"cancel":true}}`; panics when kubectl fails. Does not wait.
    pub fn cancel_run(&self, run: &str) {
        self.merge_patch_ok("agentrun", run, r#"{"spec":{"cancel":true}}"#);
    }
}
