//! A run's whole history for the operator CLI (docs/design.md section 4a "Reading",
//! docs/behaviours.md 58): the run, its segments fetched from the API server, the chain checked
//! against `status.archive` (`engine::archive::verify_chain`) and the steps and events stitched
//! back as if nothing were sealed.
//!
//! Owns: fetching the segments (listed by their run-uid label, then any the chain names that
//! the list did not return fetched by name, so a hand-made replacement without the label is
//! still found and reported as altered; `status.archive` keeps only the newest entries, the
//! older segments are reached through each one's `previous`). Must not: repair or skip
//! anything; a missing or altered segment is an error naming it (`show` and `events` print the
//! window first, then exit 1).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

use super::Session;
use crate::api::{AgentRun, AgentRunSegment, SEGMENT_RUN_UID_LABEL};
use crate::engine::archive::{stitch, verify_chain, ChainFault, ChainReport, Verified};

/// Segments listed per request.
const PAGE: u32 = 50;

/// A run with its whole history stitched in, and what the check covered.
pub(super) struct History {
    /// The run, `status.steps` and `status.events` whole; with a [`History::fault`], the run as
    /// stored (its window only).
    pub run: AgentRun,
    /// What the chain check covered.
    pub report: ChainReport,
    /// The window as stored: `(steps, events)` in `status`, before stitching.
    pub window: (Vec<i64>, Vec<i64>),
    /// Why the whole history could not be read (a missing or altered segment, named), if so.
    pub fault: Option<anyhow::Error>,
}

impl History {
    /// The whole history, or the fault naming the first missing or altered segment.
    ///
    /// # Errors
    /// [`History::fault`].
    pub(super) fn whole(self) -> anyhow::Result<History> {
        match self.fault {
            Some(fault) => Err(fault),
            None => Ok(self),
        }
    }
}

/// Reads AgentRun `name` and its segments, checks the chain and stitches the whole history.
/// A chain that is not intact is [`History::fault`], with the run as stored, so a caller can
/// still print the window.
///
/// # Errors
/// When the run cannot be read or the segments cannot be listed or read.
pub(super) async fn whole_run(session: &Session, name: &str) -> anyhow::Result<History> {
    let ns = &session.namespace;
    let mut run = Api::<AgentRun>::namespaced(session.client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("cannot read AgentRun {ns}/{name}"))?;
    let uid = run.metadata.uid.clone().unwrap_or_default();
    let status = run.status.clone().unwrap_or_default();
    let window = (
        status.steps.iter().map(|s| s.index.get()).collect(),
        status.events.iter().map(|e| e.seq).collect(),
    );
    let checked = match verified_chain(session, &uid, status.archive.as_ref()).await? {
        Ok(verified) => stitch(&status, &verified).map(|whole| (whole, verified.report)),
        Err(fault) => Err(fault),
    };
    match checked {
        Ok((whole, report)) => {
            run.status = Some(whole);
            Ok(History {
                run,
                report,
                window,
                fault: None,
            })
        }
        Err(fault) => Ok(History {
            run,
            report: ChainReport::default(),
            window,
            fault: Some(
                anyhow::Error::new(fault)
                    .context(format!("AgentRun {ns}/{name}: its history is not intact")),
            ),
        }),
    }
}

/// The run's chain checked ([`verify_chain`]) over its segments: listed by the run-uid label,
/// then each one the chain names that the list did not return read by name (a hand-made
/// replacement without the label is still found, and reported as altered).
async fn verified_chain(
    session: &Session,
    uid: &str,
    archive: Option<&crate::api::Archive>,
) -> anyhow::Result<Result<Verified, ChainFault>> {
    let ns = &session.namespace;
    let resource = ApiResource::erase::<AgentRunSegment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(session.client.clone(), ns, &resource);
    let mut fetched = BTreeMap::new();
    if archive.is_some_and(|a| !a.segments.is_empty()) {
        let selector = format!("{SEGMENT_RUN_UID_LABEL}={uid}");
        let mut params = ListParams::default().labels(&selector).limit(PAGE);
        loop {
            let page = api.list(&params).await.with_context(|| {
                format!("cannot list the AgentRunSegments of run uid {uid} in {ns}")
            })?;
            for object in page.items {
                if let Some(name) = object.metadata.name.clone() {
                    fetched.insert(
                        name,
                        object.data.get("spec").cloned().unwrap_or(Value::Null),
                    );
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    let mut asked = BTreeSet::new();
    loop {
        match verify_chain(uid, archive, &fetched) {
            Err(ChainFault::Missing { name, .. }) if asked.insert(name.clone()) => {
                if let Some(object) = api
                    .get_opt(&name)
                    .await
                    .with_context(|| format!("cannot read AgentRunSegment {ns}/{name}"))?
                {
                    let spec = object.data.get("spec").cloned().unwrap_or(Value::Null);
                    fetched.insert(name, spec);
                }
            }
            checked => return Ok(checked),
        }
    }
}

/// What `agentrt verify` prints for an intact history.
pub(super) fn verify_report(history: &History) -> String {
    let run = &history.run;
    let report = &history.report;
    let range = |r: Option<(i64, i64)>| match r {
        Some((a, b)) => format!("{a}..{b}"),
        None => "none".to_string(),
    };
    let span = |items: &[i64]| match (items.first(), items.last()) {
        (Some(a), Some(b)) => format!("{a}..{b}"),
        _ => "none".to_string(),
    };
    let status = run.status.clone().unwrap_or_default();
    let mut out = format!(
        "AgentRun {}/{}: history intact\n",
        super::render::esc(run.metadata.namespace.as_deref().unwrap_or("")),
        super::render::esc(run.metadata.name.as_deref().unwrap_or(""))
    );
    out.push_str(&format!(
        "  segments: {} checked: each present, hashing to the sha256 the record or the next \
         segment names, chained to the one before\n",
        report.segments
    ));
    out.push_str(&format!(
        "  sealed:   steps {}, events seq {}\n",
        range(report.sealed_steps),
        range(report.sealed_seqs)
    ));
    out.push_str(&format!(
        "  window:   steps {}, events seq {}\n",
        span(&history.window.0),
        span(&history.window.1)
    ));
    out.push_str(&format!(
        "  whole:    {} steps, {} events, seq 1..{} without gaps\n",
        status.steps.len(),
        status.events.len(),
        status.events.len()
    ));
    out.push_str(&format!(
        "  head:     {}\n",
        if report.head.is_empty() {
            "(nothing sealed)"
        } else {
            &report.head
        }
    ));
    out
}
