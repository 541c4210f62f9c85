//! The operator CLI, also installed as the kubectl plugin `kubectl-agentrt` (docs/design.md section 2
//! "Approval", docs/behaviours.md 51-53, 67-68): list and show runs and approvals, approve, reject,
//! cancel. As kubectl: the namespace is `-n`, else the kubeconfig context's, else `default`;
//! `-A` lists all; `namespace/name` ([`ObjectRef`]) is accepted wherever a name is.
//! `show run`, `events` and `verify` read a run's whole history: its sealed segments checked
//! against the record's chain and stitched with the window (`history`; docs/design.md section
//! 4a, docs/behaviours.md 58); a missing or altered segment is an error (exit 1) naming it, after
//! `show` and `events` printed the window.
//!
//! Approving is the moment a person lets a side effect happen, so `approve` and `reject` print
//! the Approval first (every model- or server-chosen string escaped and bounded by
//! [`escape`]), end with a line this CLI writes itself, decide only with `--yes` or a typed
//! `yes` at a real terminal, and patch the hash they printed, with the resourceVersion they
//! read as a precondition: a change in between is refused by the API server.
//!
//! Exit codes: 0 success, 1 error, 2 usage (clap validates arguments before any API call).
//!
//! Files:
//! - `args`: the command line (clap) and the checks made before any API call.
//! - `decide`: approve, reject and settle (the engine's rule of whether an Approval can still
//!   grant, worded here).
//! - `render`: tables and `show`; `escape`: escaping and bounding what a person reads.
//! - `history`: a run's whole history, segments checked and stitched.
//! - `lint`: manifests checked offline (`lint/cluster`: the admin policies read from a cluster).
//! - This file: connecting as kubectl does and running each command.

mod args;
mod decide;
pub mod escape;
mod history;
pub mod lint;
pub mod render;

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context as _};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::api::{AgentRun, Approval, ApprovalPhase, Verdict};

pub use args::{ObjectRef, OperatorCommand, Output, ShowWhat, Target};
use decide::*;
pub use decide::{answer_refused, write_decision, DecisionRefused, Given, Shown};

/// `value` as `-o json` or `-o yaml` prints it (`None` for the text format).
fn encoded<T: serde::Serialize>(value: &T, output: Output) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Text => None,
        Output::Json => Some(format!("{}\n", serde_json::to_string_pretty(value)?)),
        Output::Yaml => Some(serde_yaml::to_string(value)?),
    })
}

/// Writes `text` to standard output. A reader that went away (`agentrt runs | head`) is not an
/// error: the output is simply not wanted any more.
///
/// # Errors
/// Any other write error.
pub fn emit(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

struct Session {
    client: Client,
    namespace: String,
}

/// [`connect`] for a command about `object`: its `namespace/` prefix, when given, is the
/// namespace (an `-n` naming another is refused).
///
/// # Errors
/// `-n` and the prefix disagree, or as [`connect`].
async fn connect_for(target: &Target, object: &ObjectRef) -> anyhow::Result<Session> {
    if let (Some(flag), Some(prefix)) = (&target.namespace, &object.namespace) {
        if flag != prefix {
            bail!(
                "{prefix}/{} names namespace {prefix} but -n {flag} was given; give one of them",
                object.name
            );
        }
    }
    let mut session = connect(target).await?;
    if let Some(namespace) = &object.namespace {
        session.namespace = namespace.clone();
    }
    Ok(session)
}

async fn connect(target: &Target) -> anyhow::Result<Session> {
    let options = KubeConfigOptions {
        context: target.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match &target.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options).await?
        }
        None if target.context.is_some() => Config::from_kubeconfig(&options).await?,
        None => Config::infer()
            .await
            .context("no Kubernetes configuration found; set KUBECONFIG or pass --kubeconfig")?,
    };
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let mut config = config;
    if let Some(user) = &target.as_user {
        // Impersonation, as kubectl's --as and --as-group.
        config.auth_info.impersonate = Some(user.clone());
        if !target.as_group.is_empty() {
            config.auth_info.impersonate_groups = Some(target.as_group.clone());
        }
    }
    let client = Client::try_from(config)?;
    Ok(Session { client, namespace })
}

/// A client acting as the kubeconfig's user (as kubectl connects: `--kubeconfig`, else
/// `$KUBECONFIG` or `~/.kube/config`, or in-cluster; `--context`) and the namespace commands
/// default to (`-n`, else the context's, else `default`). For `agentrt console`.
///
/// # Errors
/// No configuration is found, or the kubeconfig cannot be read.
pub async fn connect_as_user(target: &Target) -> anyhow::Result<(Client, String)> {
    let session = connect(target).await?;
    Ok((session.client, session.namespace))
}

/// AgentRun `namespace/name` with its whole history stitched in (`show run`'s reading,
/// docs/design.md section 4a); with a missing or altered segment, the run as stored and the
/// fault in words.
///
/// # Errors
/// The run cannot be read, or its segments cannot be listed or read.
pub async fn run_with_history(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<(AgentRun, Option<String>)> {
    let session = Session {
        client: client.clone(),
        namespace: namespace.to_string(),
    };
    let history = history::whole_run(&session, name).await?;
    Ok((history.run, history.fault.map(|f| format!("{f:#}"))))
}

/// Why `approval` can no longer be decided, worded as `approve` words it (decided, not
/// Pending, expired, or its run, read live, no longer awaits it); `None` when it may be.
///
/// # Errors
/// Its run cannot be read.
pub async fn why_not_decidable(
    client: &Client,
    approval: &Approval,
) -> anyhow::Result<Option<String>> {
    let session = Session {
        client: client.clone(),
        namespace: approval.metadata.namespace.clone().unwrap_or_default(),
    };
    refusal(&session, approval).await
}

/// Runs one operator command.
///
/// # Errors
/// When the API server cannot be reached, the object does not exist, the person does not
/// confirm, or the API server refuses the decision (e.g. the Approval changed since it was
/// printed).
pub async fn run(command: OperatorCommand) -> anyhow::Result<()> {
    match command {
        OperatorCommand::Lint {
            mut files,
            paths,
            policies,
            policies_from_cluster,
            target,
        } => {
            files.extend(paths);
            let mut documents = lint::read_files(&files, &policies)?;
            let namespace = match policies_from_cluster {
                true => lint::cluster::add_from_cluster(&target, &mut documents).await?,
                false => target.namespace.clone().unwrap_or_else(|| "default".into()),
            };
            let report = lint::check(documents, &namespace);
            for note in &report.notes {
                eprintln!("note: {note}");
            }
            if !report.problems.is_empty() {
                emit(&format!("{}\n", report.problems.join("\n")))?;
                let policies = match report.policies {
                    0 => String::new(),
                    n => format!(" and {}", plural(n, "admin policy", "admin policies")),
                };
                bail!(
                    "{} in {}{policies}; fix them before applying",
                    plural(report.problems.len(), "problem", "problems"),
                    plural(report.runs, "run", "runs")
                );
            }
            let runs = plural(report.runs, "run", "runs");
            match report.policies {
                0 => emit(&format!("{runs} ok\n"))?,
                n => emit(&format!(
                    "{runs} ok, {} ok\n",
                    plural(n, "admin policy", "admin policies")
                ))?,
            }
        }
        OperatorCommand::Runs {
            target,
            all_namespaces,
            output,
        } => {
            let session = connect(&target).await?;
            let api: Api<AgentRun> = scoped(&session, all_namespaces);
            let runs = api.list(&ListParams::default()).await?.items;
            match encoded(&runs, output)? {
                Some(text) => emit(&text)?,
                None => emit(&render::runs_table(&runs, all_namespaces))?,
            }
        }
        OperatorCommand::Approvals {
            target,
            all_namespaces,
            all_phases,
            output,
        } => {
            let every_namespace = all_namespaces;
            let session = connect(&target).await?;
            let api: Api<Approval> = scoped(&session, every_namespace);
            let approvals: Vec<Approval> = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|a| all_phases || is_pending(a))
                .collect();
            match encoded(&approvals, output)? {
                Some(text) => emit(&text)?,
                None => emit(&render::approvals_table(
                    &approvals,
                    every_namespace,
                    jiff::Timestamp::now(),
                ))?,
            }
        }
        OperatorCommand::Show {
            what,
            name,
            target,
            output,
        } => {
            let session = connect_for(&target, &name).await?;
            let name = name.name;
            match what {
                ShowWhat::Run => {
                    // A missing or altered segment: print the window, then exit 1 naming it.
                    let history = history::whole_run(&session, &name).await?;
                    match encoded(&history.run, output)? {
                        Some(text) => emit(&text)?,
                        None => emit(&render::run_details(&history.run))?,
                    }
                    history.whole()?;
                }
                ShowWhat::Approval => {
                    let approval = get_approval(&session, &name).await?;
                    match encoded(&approval, output)? {
                        Some(text) => emit(&text)?,
                        None => emit(&render::approval_details(&approval))?,
                    }
                }
            }
        }
        OperatorCommand::Events {
            run,
            target,
            output,
        } => {
            let session = connect_for(&target, &run).await?;
            // A missing or altered segment: print the window's events, then exit 1 naming it.
            let history = history::whole_run(&session, &run.name).await?;
            let events = history
                .run
                .status
                .clone()
                .map(|s| s.events)
                .unwrap_or_default();
            match encoded(&events, output)? {
                Some(text) => emit(&text)?,
                None => emit(&render::events_timeline(&events))?,
            }
            history.whole()?;
        }
        OperatorCommand::Verify { run, target } => {
            let session = connect_for(&target, &run).await?;
            let history = history::whole_run(&session, &run.name).await?.whole()?;
            emit(&history::verify_report(&history))?;
        }
        OperatorCommand::Approve {
            name,
            target,
            select,
            yes,
            note,
            answer,
        } => {
            let given = answer.map(decide::Given::Answer);
            match name {
                Some(name) => decide(&target, &name, Verdict::Approved, yes, note, given).await?,
                None => {
                    decide::decide_many(&target, &select, Verdict::Approved, yes, note, given)
                        .await?
                }
            }
        }
        OperatorCommand::Reject {
            name,
            target,
            select,
            yes,
            note,
        } => match name {
            Some(name) => decide(&target, &name, Verdict::Rejected, yes, note, None).await?,
            None => {
                decide::decide_many(&target, &select, Verdict::Rejected, yes, note, None).await?
            }
        },
        OperatorCommand::Settle {
            name,
            target,
            took_effect,
            did_not_take_effect,
            result,
            yes,
            note,
        } => {
            let verdict = match (took_effect, did_not_take_effect) {
                (true, false) => Verdict::TookEffect,
                (false, true) => Verdict::DidNotTakeEffect,
                _ => bail!("settle needs exactly one of --took-effect (with --result) and --did-not-take-effect"),
            };
            let given = result.map(decide::Given::Result);
            decide(&target, &name, verdict, yes, note, given).await?;
        }
        OperatorCommand::Cancel { run, target, note } => {
            let session = connect_for(&target, &run).await?;
            let run = run.name;
            let api = Api::<AgentRun>::namespaced(session.client, &session.namespace);
            let found = api
                .get(&run)
                .await
                .with_context(|| format!("cannot read AgentRun {}/{run}", session.namespace))?;
            // A finished run has nothing to cancel: say so, write nothing, succeed.
            if let Some(status) = found.status.as_ref().filter(|s| finished(s.phase)) {
                let word = |v: serde_json::Result<serde_json::Value>| {
                    v.ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_else(|| "-".into())
                };
                emit(&format!(
                    "agentrun {}/{run} already finished ({}, {}); nothing to cancel\n",
                    session.namespace,
                    word(serde_json::to_value(status.phase)),
                    word(serde_json::to_value(status.reason)),
                ))?;
                return Ok(());
            }
            let mut patch = serde_json::json!({"spec": {"cancel": true}});
            if let Some(note) = note {
                patch["metadata"] =
                    serde_json::json!({"annotations": {"agentrt.dev/cancel-note": note}});
            }
            api.patch(&run, &cli_patch_params(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("cannot cancel AgentRun {}/{run}", session.namespace))?;
            emit(&format!(
                "agentrun {}/{run} cancel requested\n",
                session.namespace
            ))?;
        }
    }
    Ok(())
}

/// Whether `phase` is one a run never leaves (docs/design.md section 2).
fn finished(phase: crate::api::RunPhase) -> bool {
    use crate::api::RunPhase;
    matches!(
        phase,
        RunPhase::Completed | RunPhase::Failed | RunPhase::Cancelled
    )
}

fn scoped<K>(session: &Session, all_namespaces: bool) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    if all_namespaces {
        Api::all(session.client.clone())
    } else {
        Api::namespaced(session.client.clone(), &session.namespace)
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
