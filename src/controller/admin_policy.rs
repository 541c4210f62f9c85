//! The admin policies this replica hands the engine with each call (docs/design.md section 6,
//! admin policies): `AgentPolicy` (in each watched namespace, or all), `ClusterAgentPolicy` and
//! the Namespaces' labels (for `namespaceSelector`), each kept by a kube-runtime reflector.
//!
//! Freshness: a decision reads the stores at the moment the engine is asked (never a copy taken
//! earlier), and only while every watch has listed and has had no error since its last event:
//! so it never uses a list older than the last change this replica's watches delivered. Before
//! each executor step, [`AdminPolicyView::wait_fresh`] waits up to [`FRESH_WAIT`] for watches
//! that are listing or relisting. A watch that has not listed, or whose last answer was an error
//! (RBAC forbidden, the API server down, the CRD missing), makes the policies
//! [`AdminPolicies::Unavailable`]: the engine then pauses every call on an Approval (fail
//! closed), never proceeds as if there were none.
//!
//! Owns: the three watches and selecting a run's policies from them
//! (`engine::policy::select`). Must not: decide anything about a run.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::api::{AgentPolicy, ClusterAgentPolicy};
use crate::engine::policy::admin::AdminPolicies;
use crate::engine::policy::select::select;

use super::metrics::WatchHealth;
use super::relist::recovering;

/// How long an executor waits, before a step, for admin policy watches that are (re)listing.
pub const FRESH_WAIT: Duration = Duration::from_secs(10);

/// One watch's state: listed at least once, and the last error since its last good event.
#[derive(Debug, Default)]
struct Health {
    name: String,
    listed: AtomicBool,
    error: Mutex<Option<String>>,
}

impl Health {
    fn new(name: String) -> Arc<Health> {
        Arc::new(Health {
            name,
            ..Health::default()
        })
    }

    /// Keeps one item of the watch: a completed list or a change clears the error (and the
    /// first completed list marks it listed); an error is kept until then. The start of a
    /// relist changes nothing: it has not answered yet.
    fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        match item {
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(event) => {
                if let Ok(mut error) = self.error.lock() {
                    *error = None;
                }
                if matches!(event, watcher::Event::InitDone) {
                    self.listed.store(true, Ordering::Release);
                }
            }
            Err(err) => {
                tracing::warn!(watch = %self.name, %err, "admin policy watch failed");
                if let Ok(mut error) = self.error.lock() {
                    *error = Some(err.to_string());
                }
            }
        }
    }

    fn problem(&self) -> Option<String> {
        let error = self.error.lock().ok().and_then(|e| e.clone());
        match error {
            Some(error) => Some(format!("the {} watch failed: {error}", self.name)),
            None if !self.listed.load(Ordering::Acquire) => {
                Some(format!("the {} watch has not listed yet", self.name))
            }
            None => None,
        }
    }
}

/// What the controller knows of the admin policies: the stores and the watches' health, or
/// nothing at all ([`AdminPolicyView::none`], for tests and a controller without them).
#[derive(Clone, Default)]
pub struct AdminPolicyView {
    watched: Option<Arc<Watched>>,
}

struct Watched {
    namespaced: Vec<Store<AgentPolicy>>,
    cluster: Store<ClusterAgentPolicy>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    health: Vec<Arc<Health>>,
}

impl std::fmt::Debug for AdminPolicyView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminPolicyView")
            .field("watched", &self.watched.is_some())
            .finish()
    }
}

impl AdminPolicyView {
    /// No admin policies, ever (a controller that does not watch them: unit tests).
    pub fn none() -> AdminPolicyView {
        AdminPolicyView::default()
    }

    /// Starts the watches: AgentPolicies in each of `scopes` (`None`: all namespaces),
    /// ClusterAgentPolicies and Namespaces' metadata; they stop at `shutdown`.
    pub fn watch(
        client: &Client,
        scopes: &[Option<String>],
        shutdown: &CancellationToken,
    ) -> AdminPolicyView {
        let mut health = Vec::new();
        let mut namespaced = Vec::new();
        for scope in scopes {
            let api: Api<AgentPolicy> = match scope {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            let name = match scope {
                Some(ns) => format!("AgentPolicy (namespace {ns})"),
                None => "AgentPolicy".to_string(),
            };
            let (store, writer) = reflector::store();
            let h = Health::new(name);
            spawn_watch(
                move || watcher(api.clone(), watcher::Config::default()),
                writer,
                h.clone(),
                shutdown.clone(),
            );
            health.push(h);
            namespaced.push(store);
        }
        let (cluster, writer) = reflector::store();
        let h = Health::new("ClusterAgentPolicy".into());
        let api = Api::<ClusterAgentPolicy>::all(client.clone());
        spawn_watch(
            move || watcher(api.clone(), watcher::Config::default()),
            writer,
            h.clone(),
            shutdown.clone(),
        );
        health.push(h);
        let (namespaces, writer) = reflector::store();
        let h = Health::new("Namespace".into());
        let api = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
        spawn_watch(
            move || watcher(api.clone(), watcher::Config::default()),
            writer,
            h.clone(),
            shutdown.clone(),
        );
        health.push(h);
        AdminPolicyView {
            watched: Some(Arc::new(Watched {
                namespaced,
                cluster,
                namespaces,
                health,
            })),
        }
    }

    /// Why the admin policies cannot be used now (module doc); `None` when they can.
    pub fn problem(&self) -> Option<String> {
        let watched = self.watched.as_ref()?;
        let problems: Vec<String> = watched.health.iter().filter_map(|h| h.problem()).collect();
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// Waits up to `limit` for every watch to have listed with no error since (module doc).
    pub async fn wait_fresh(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.problem().is_some() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The admin policies that select a run in `namespace` whose metadata is `metadata` (the
    /// run's labels are read from it), from the stores as they are now.
    pub fn for_run(&self, namespace: &str, metadata: &Value) -> AdminPolicies {
        let Some(watched) = self.watched.as_ref() else {
            return AdminPolicies::default();
        };
        if let Some(problem) = self.problem() {
            tracing::warn!(%problem, "admin policies unavailable; calls wait for a person");
            return AdminPolicies::Unavailable(problem);
        }
        let run_labels = labels_of(metadata);
        let cluster: Vec<ClusterAgentPolicy> = watched
            .cluster
            .state()
            .iter()
            .map(|p| (**p).clone())
            .collect();
        let namespaced: Vec<AgentPolicy> = watched
            .namespaced
            .iter()
            .flat_map(|store| store.state())
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .map(|p| (*p).clone())
            .collect();
        let namespace_labels = watched
            .namespaces
            .get(&reflector::ObjectRef::new(namespace))
            .map(|ns| ns.metadata.labels.clone().unwrap_or_default());
        select(
            &cluster,
            &namespaced,
            namespace,
            &run_labels,
            namespace_labels.as_ref(),
        )
    }
}

/// `metadata.labels` as a map (absent or not strings: none).
fn labels_of(metadata: &Value) -> BTreeMap<String, String> {
    metadata
        .get("labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Drives one reflector until shutdown, its watches begun by `start` and kept in `writer`'s
/// store. It recovers as the run watches do (`relist::recovering`: a fresh list after any
/// error, at once after a 410 Gone, otherwise a backoff bounded by `watches::BACKOFF_MAX`), so
/// after an API server outage the admin policies are usable again about when the runs are
/// watched again. `health` keeps its state: an error marks it failed until a list completes or a
/// change arrives; the first completed list marks it listed.
fn spawn_watch<K, F, S>(
    start: F,
    writer: reflector::store::Writer<K>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    F: Fn() -> S + Send + Sync + 'static,
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let sync = Arc::new(WatchHealth::unreported(&health.name));
    let observed = health.clone();
    let stream = recovering(sync, move || {
        let observed = observed.clone();
        start().inspect(move |item| observed.observe(item))
    })
    .reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return,
                next = stream.next() => next,
            };
            if next.is_none() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_view_without_watches_has_no_policies_and_no_problem() {
        let view = AdminPolicyView::none();
        assert_eq!(view.problem(), None);
        assert_eq!(
            view.for_run("ns", &json!({"labels": {"a": "b"}})),
            AdminPolicies::default()
        );
    }

    #[test]
    fn a_watch_that_failed_or_never_listed_is_a_problem() {
        let h = Health::new("AgentPolicy".into());
        assert_eq!(
            h.problem().as_deref(),
            Some("the AgentPolicy watch has not listed yet")
        );
        h.listed.store(true, Ordering::Release);
        assert_eq!(h.problem(), None);
        *h.error.lock().expect("lock") = Some("403 forbidden".into());
        assert_eq!(
            h.problem().as_deref(),
            Some("the AgentPolicy watch failed: 403 forbidden")
        );
    }

    #[test]
    fn a_relist_that_has_not_answered_keeps_the_error_and_a_completed_list_clears_it() {
        let h = Health::new("Namespace".into());
        let failed: Result<watcher::Event<()>, watcher::Error> =
            Err(watcher::Error::NoResourceVersion);
        h.observe(&failed);
        h.observe(&Ok(watcher::Event::<()>::Init));
        assert!(h.problem().is_some_and(|p| p.contains("failed")));
        h.observe(&Ok(watcher::Event::<()>::InitDone));
        assert_eq!(h.problem(), None);
    }

    #[test]
    fn labels_are_read_from_the_runs_metadata() {
        let labels = labels_of(&json!({"labels": {"team": "a", "n": 1}}));
        assert_eq!(labels.len(), 1);
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert!(labels_of(&json!({})).is_empty());
    }
}
