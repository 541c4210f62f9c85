//! The console's handlers (docs/design.md section 2, "Console"): the inbox, one Approval, the
//! decisions, the event stream and the inbox's script. Every read and write is a request of the
//! caller's user ([`Console::client`]); a refusal of the API server is shown as its message,
//! with its status. Must not: decide without the session's CSRF token, or patch anything but
//! through [`crate::cli::write_decision`].

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::{Extension, Form};
use futures::{Stream, StreamExt as _};
use kube::api::{Api, ListParams};
use kube::runtime::{watcher, WatchStreamExt as _};
use minijinja::context;
use serde::Deserialize;

use super::guard::{same, Session};
use super::{view, Console};
use crate::api::{Approval, Verdict};
use crate::cli::escape::escape_bounded;

/// The inbox's filters, from the query string (empty: any).
#[derive(Deserialize, Debug, Default)]
pub(super) struct Filters {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    phase: String,
}

fn page(console: &Console, template: &str, status: StatusCode, ctx: minijinja::Value) -> Response {
    match console
        .templates
        .get_template(template)
        .and_then(|t| t.render(ctx))
    {
        Ok(html) => (status, Html(html)).into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the console cannot render {template}: {err:#}\n"),
        )
            .into_response(),
    }
}

/// The API server's refusal as a page with its status (403 stays 403).
fn api_error(console: &Console, what: &str, err: &kube::Error) -> Response {
    let status = match err {
        kube::Error::Api(s) => StatusCode::from_u16(s.code).unwrap_or(StatusCode::BAD_GATEWAY),
        _ => StatusCode::BAD_GATEWAY,
    };
    let message = escape_bounded(&crate::api::server_message(err), 1000);
    page(console, "error.html", status, context! { what, message })
}

fn approvals_api(console: &Console) -> Api<Approval> {
    match &console.scope {
        Some(ns) => Api::namespaced(console.client.clone(), ns),
        None => Api::all(console.client.clone()),
    }
}

/// `GET /`: every Approval the user can list in the scope, pending first, oldest first,
/// filtered by kind, namespace and phase.
pub(super) async fn inbox(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Query(filters): Query<Filters>,
) -> Response {
    let mut approvals = match approvals_api(&console).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(err) => return api_error(&console, "listing Approvals", &err),
    };
    let kinds: std::collections::BTreeSet<String> =
        approvals.iter().map(|a| a.spec.kind.clone()).collect();
    approvals.retain(|a| {
        (filters.kind.is_empty() || a.spec.kind == filters.kind)
            && (filters.namespace.is_empty()
                || a.metadata.namespace.as_deref() == Some(filters.namespace.as_str()))
            && (filters.phase.is_empty() || format!("{:?}", view::phase(a)) == filters.phase)
    });
    view::inbox_order(&mut approvals);
    let rows: Vec<view::Row> = approvals.iter().map(view::row).collect();
    let kinds: Vec<String> = kinds.iter().map(|k| escape_bounded(k, 64)).collect();
    page(
        &console,
        "inbox.html",
        StatusCode::OK,
        context! {
            rows,
            kinds,
            phases => ["Pending", "Approved", "Rejected", "Expired", "Executed", "Cancelled"],
            filter_kind => filters.kind,
            filter_namespace => filters.namespace,
            filter_phase => filters.phase,
            scope => console.scope.clone(),
            csrf => session.csrf,
        },
    )
}

/// `GET /approvals/{namespace}/{name}`: one Approval, the request it is bound to, its
/// presentation, the rule that asked, and its run's timeline.
pub(super) async fn approval(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    if let Some(refused) = out_of_scope(&console, &namespace) {
        return refused;
    }
    let api: Api<Approval> = Api::namespaced(console.client.clone(), &namespace);
    let approval = match api.get(&name).await {
        Ok(a) => a,
        Err(err) => return api_error(&console, "reading the Approval", &err),
    };
    let detail = view::detail(&approval);
    let (timeline, history_fault) =
        match crate::cli::run_with_history(&console.client, &namespace, &approval.spec.run_name)
            .await
        {
            Ok((run, fault)) => (Some(crate::cli::render::run_details(&run)), fault),
            Err(err) => (None, Some(format!("{err:#}"))),
        };
    let cannot = match crate::cli::why_not_decidable(&console.client, &approval).await {
        Ok(why) => why,
        Err(err) => Some(format!("{err:#}")),
    };
    page(
        &console,
        "approval.html",
        StatusCode::OK,
        context! {
            a => detail,
            timeline,
            history_fault => history_fault.map(|f| escape_bounded(&f, 1000)),
            cannot => cannot.map(|c| escape_bounded(&c, 1000)),
            csrf => session.csrf,
        },
    )
}

/// One decision's outcome, as the page reports it.
#[derive(serde::Serialize, Debug)]
struct Outcome {
    key: String,
    decided: bool,
    message: String,
}

/// `POST /decide`: approve or reject the Approvals the form names (its button
/// `act=approve:<ns>/<name>` names one, `act=approve` the checked `sel` boxes), each with the
/// hash (`hash:<key>`) and resourceVersion (`rv:<key>`) the page showed, through the CLI's
/// patch. Refused (403) without the session's CSRF token.
pub(super) async fn decide(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
    Form(fields): Form<Vec<(String, String)>>,
) -> Response {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if !field("csrf").is_some_and(|c| same(c, &session.csrf)) {
        return (
            StatusCode::FORBIDDEN,
            "refused: the form has no valid CSRF token; reload the page\n",
        )
            .into_response();
    }
    let act = field("act").unwrap_or("");
    let (verb, one) = act
        .split_once(':')
        .map_or((act, None), |(v, k)| (v, Some(k)));
    let verdict = match verb {
        "approve" => Verdict::Approved,
        "reject" => Verdict::Rejected,
        _ => return (StatusCode::BAD_REQUEST, "act must be approve or reject\n").into_response(),
    };
    let keys: Vec<String> = match one {
        Some(key) => vec![key.to_string()],
        None => fields
            .iter()
            .filter(|(k, _)| k == "sel")
            .map(|(_, v)| v.clone())
            .collect(),
    };
    let note = field("note")
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    if note
        .as_ref()
        .is_some_and(|n| n.chars().count() > crate::api::DECISION_NOTE_MAX_CHARS)
    {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "the reason holds at most {} characters\n",
                crate::api::DECISION_NOTE_MAX_CHARS
            ),
        )
            .into_response();
    }
    let mut outcomes = Vec::new();
    for key in keys {
        let shown = (field(&format!("hash:{key}")), field(&format!("rv:{key}")));
        let outcome = match (key.split_once('/'), shown) {
            (Some((ns, name)), (Some(hash), rv)) => {
                let shown = crate::cli::Shown {
                    name: name.to_string(),
                    hash: hash.to_string(),
                    resource_version: rv.filter(|r| !r.is_empty()).map(str::to_string),
                };
                let answer = field(&format!("answer:{key}"))
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(serde_json::from_str::<serde_json::Value>);
                match answer.transpose() {
                    Ok(answer) => {
                        decide_one(&console, ns, &shown, verdict, note.clone(), answer).await
                    }
                    Err(err) => Err(format!("not decided: the answer is not JSON: {err}")),
                }
            }
            _ => Err("the form did not say which request was shown (no hash)".to_string()),
        };
        outcomes.push(match outcome {
            Ok(()) => Outcome {
                key: escape_bounded(&key, 300),
                decided: true,
                message: match verdict {
                    Verdict::Approved => "approved",
                    _ => "rejected",
                }
                .to_string(),
            },
            Err(message) => Outcome {
                key: escape_bounded(&key, 300),
                decided: false,
                message: escape_bounded(&message, 1000),
            },
        });
    }
    let status = if outcomes.iter().any(|o| !o.decided) {
        StatusCode::CONFLICT
    } else {
        StatusCode::OK
    };
    page(&console, "decided.html", status, context! { outcomes })
}

/// `-n`'s scope holds for every page and decision, not only for the inbox: an Approval of
/// another namespace is refused (403) naming the scope.
fn out_of_scope(console: &Console, namespace: &str) -> Option<Response> {
    let scope = console.scope.as_deref()?;
    (scope != namespace).then(|| {
        (
            StatusCode::FORBIDDEN,
            format!(
                "refused: this console was started with -n {}; {} is outside it\n",
                escape_bounded(scope, 253),
                escape_bounded(namespace, 253)
            ),
        )
            .into_response()
    })
}

/// One decision: refused before any patch when the Approval, read live, can no longer grant
/// (the CLI's words) or an `input_required` Approval's answer is missing or does not match its
/// schema, else the CLI's patch with what was shown; the API server's refusal in words.
async fn decide_one(
    console: &Console,
    namespace: &str,
    shown: &crate::cli::Shown,
    verdict: Verdict,
    note: Option<String>,
    answer: Option<serde_json::Value>,
) -> Result<(), String> {
    if let Some(scope) = console.scope.as_deref().filter(|s| *s != namespace) {
        return Err(format!(
            "not decided: this console was started with -n {}; {} is outside it",
            escape_bounded(scope, 253),
            escape_bounded(namespace, 253)
        ));
    }
    let api: Api<Approval> = Api::namespaced(console.client.clone(), namespace);
    let live = api
        .get(&shown.name)
        .await
        .map_err(|e| format!("cannot read it: {}", crate::api::server_message(&e)))?;
    if let Some(why) = crate::cli::why_not_decidable(&console.client, &live)
        .await
        .map_err(|e| format!("{e:#}"))?
    {
        return Err(format!("not decided: it {why}"));
    }
    let given = match verdict {
        Verdict::Approved => {
            if let Some(why) = crate::cli::answer_refused(&live, answer.as_ref()) {
                return Err(format!("not decided: it {why}"));
            }
            answer.map(crate::cli::Given::Answer)
        }
        _ => None,
    };
    crate::cli::write_decision(&console.client, namespace, shown, verdict, note, given)
        .await
        .map_err(|refused| {
            let changed = if refused.changed {
                "the request changed since the page showed it; reload and look again. "
            } else {
                ""
            };
            format!("refused by the API server: {changed}{}", refused.message)
        })
}

/// `GET /events`: server-sent events from a kube watch of the scope's Approvals, held by the
/// server as the user; one `approval` event (data `namespace/name`) per change.
pub(super) async fn events(
    State(console): State<Arc<Console>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    // Backed off on errors (a watch the user may not make is retried slowly, not in a loop).
    let stream = watcher(approvals_api(&console), watcher::Config::default())
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(a) | watcher::Event::Delete(a)) => {
                    Some(Ok(Event::default().event("approval").data(view::key(&a))))
                }
                Ok(watcher::Event::InitDone) => Some(Ok(Event::default().event("ready").data("-"))),
                Ok(_) => None,
                Err(err) => Some(Ok(Event::default()
                    .event("watch-error")
                    .data(escape_bounded(&err.to_string(), 500)))),
            }
        });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// `GET /console.js`: the inbox's keyboard shortcuts and live updates.
pub(super) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("templates/console.js"),
    )
        .into_response()
}
