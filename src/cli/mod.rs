//! The operator CLI, also installed as the kubectl plugin `kubectl-agentrt` (docs/design.md section 2
//! "Approval", docs/behaviours.md 51-53): list and show runs and approvals, approve, reject, cancel.
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

pub mod escape;
mod history;
mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::api::{AgentRun, Approval, ApprovalPhase, Verdict};

/// Options every CLI command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Path to a kubeconfig (default: $KUBECONFIG or ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
}

/// Output format of list and show commands.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// Human-readable.
    #[default]
    Text,
    /// The objects as JSON.
    Json,
    /// The objects as YAML.
    Yaml,
}

/// `value` as `-o json` or `-o yaml` prints it (`None` for the text format).
fn encoded<T: serde::Serialize>(value: &T, output: Output) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Text => None,
        Output::Json => Some(format!("{}\n", serde_json::to_string_pretty(value)?)),
        Output::Yaml => Some(serde_yaml::to_string(value)?),
    })
}

/// The operator commands.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum OperatorCommand {
    /// List AgentRuns.
    Runs {
        #[command(flatten)]
        target: Target,
        /// All namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// List Approvals (pending only unless --all).
    Approvals {
        #[command(flatten)]
        target: Target,
        /// All namespaces (the default is every namespace when -n is not given).
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Include decided, expired and executed Approvals.
        #[arg(long)]
        all: bool,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show a run (every step and an events timeline, sealed segments stitched in and checked)
    /// or an Approval. Exits 1 naming the first missing or altered segment.
    Show {
        /// `run` or `approval`.
        #[arg(value_enum)]
        what: ShowWhat,
        /// Its name.
        #[arg(value_parser = object_name)]
        name: String,
        #[command(flatten)]
        target: Target,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show every event of a run (sealed segments stitched in and checked).
    Events {
        /// The run's name.
        #[arg(value_parser = object_name)]
        run: String,
        #[command(flatten)]
        target: Target,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Check a run's chain of sealed segments against its record: print what was checked, or
    /// exit 1 naming the first missing or altered segment.
    Verify {
        /// The run's name.
        #[arg(value_parser = object_name)]
        run: String,
        #[command(flatten)]
        target: Target,
    },
    /// Approve an Approval: print it, confirm, and patch the hash printed.
    Approve {
        /// The Approval's name.
        #[arg(value_parser = object_name)]
        name: String,
        #[command(flatten)]
        target: Target,
        /// Decide without asking (for scripts; you still get the printout).
        #[arg(short = 'y', long)]
        yes: bool,
        /// A note recorded with the decision.
        #[arg(long)]
        note: Option<String>,
    },
    /// Reject an Approval: print it, confirm, and patch the hash printed. The run is cancelled.
    Reject {
        /// The Approval's name.
        #[arg(value_parser = object_name)]
        name: String,
        #[command(flatten)]
        target: Target,
        /// Decide without asking.
        #[arg(short = 'y', long)]
        yes: bool,
        /// Why (becomes the run's reasonDetail).
        #[arg(long)]
        note: Option<String>,
    },
    /// Cancel a run (sets spec.cancel; a running tool is not interrupted).
    Cancel {
        /// The run's name.
        #[arg(value_parser = object_name)]
        run: String,
        #[command(flatten)]
        target: Target,
        /// Why (kept in the annotation agentrt.dev/cancel-note).
        #[arg(long)]
        note: Option<String>,
    },
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

/// Validates a Kubernetes object name (a DNS-1123 subdomain) before any API call, so a typo is
/// a usage error (exit 2) rather than a request.
fn object_name(name: &str) -> Result<String, String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if valid {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a Kubernetes object name: use lowercase letters, digits, '-' and \
             '.', starting and ending with a letter or digit"
        ))
    }
}

/// What `show` shows.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShowWhat {
    /// An AgentRun.
    Run,
    /// An Approval.
    Approval,
}

struct Session {
    client: Client,
    namespace: String,
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
    let client = Client::try_from(config)?;
    Ok(Session { client, namespace })
}

/// Runs one operator command.
///
/// # Errors
/// When the API server cannot be reached, the object does not exist, the person does not
/// confirm, or the API server refuses the decision (e.g. the Approval changed since it was
/// printed).
pub async fn run(command: OperatorCommand) -> anyhow::Result<()> {
    match command {
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
            all,
            output,
        } => {
            let every_namespace = all_namespaces || target.namespace.is_none();
            let session = connect(&target).await?;
            let api: Api<Approval> = scoped(&session, every_namespace);
            let approvals: Vec<Approval> = api
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|a| all || is_pending(a))
                .collect();
            match encoded(&approvals, output)? {
                Some(text) => emit(&text)?,
                None => emit(&render::approvals_table(&approvals, every_namespace))?,
            }
        }
        OperatorCommand::Show {
            what,
            name,
            target,
            output,
        } => {
            let session = connect(&target).await?;
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
            let session = connect(&target).await?;
            // A missing or altered segment: print the window's events, then exit 1 naming it.
            let history = history::whole_run(&session, &run).await?;
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
            let session = connect(&target).await?;
            let history = history::whole_run(&session, &run).await?.whole()?;
            emit(&history::verify_report(&history))?;
        }
        OperatorCommand::Approve {
            name,
            target,
            yes,
            note,
        } => {
            decide(&target, &name, Verdict::Approved, yes, note).await?;
        }
        OperatorCommand::Reject {
            name,
            target,
            yes,
            note,
        } => {
            decide(&target, &name, Verdict::Rejected, yes, note).await?;
        }
        OperatorCommand::Cancel { run, target, note } => {
            let session = connect(&target).await?;
            let api = Api::<AgentRun>::namespaced(session.client, &session.namespace);
            let mut patch = serde_json::json!({"spec": {"cancel": true}});
            if let Some(note) = note {
                patch["metadata"] =
                    serde_json::json!({"annotations": {"agentrt.dev/cancel-note": note}});
            }
            api.patch(&run, &PatchParams::default(), &Patch::Merge(&patch))
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

fn is_pending(approval: &Approval) -> bool {
    approval.spec.decision.is_none()
        && approval
            .status
            .as_ref()
            .is_none_or(|s| s.phase == ApprovalPhase::Pending)
}

async fn get_approval(session: &Session, name: &str) -> anyhow::Result<Approval> {
    Api::<Approval>::namespaced(session.client.clone(), &session.namespace)
        .get(name)
        .await
        .with_context(|| format!("Approval {}/{name}", session.namespace))
}

async fn decide(
    target: &Target,
    name: &str,
    verdict: Verdict,
    yes: bool,
    note: Option<String>,
) -> anyhow::Result<()> {
    let session = connect(target).await?;
    let approval = get_approval(&session, name).await?;
    let mut stdout = std::io::stdout();
    write!(stdout, "{}", render::approval_details(&approval))?;
    writeln!(stdout, "{}", render::decision_line(&approval, verdict))?;
    stdout.flush()?;
    if approval.spec.decision.is_some() {
        bail!(
            "Approval {}/{name} is already decided; a decision is written once",
            session.namespace
        );
    }
    if let Some(status) = &approval.status {
        if status.phase != ApprovalPhase::Pending {
            bail!(
                "Approval {}/{name} is {:?}, not Pending; it can no longer be decided",
                session.namespace,
                status.phase
            );
        }
        if let Some(expires_at) = status.expires_at {
            if expires_at.0 <= jiff::Timestamp::now() {
                bail!(
                    "Approval {}/{name} expired at {expires_at}; a decision now would grant nothing",
                    session.namespace
                );
            }
        }
    }
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            bail!("not deciding: standard input is not a terminal; pass --yes to decide without a prompt");
        }
        write!(stdout, "Type yes to {}: ", verb(verdict))?;
        stdout.flush()?;
        let mut answer = String::new();
        stdin.lock().read_line(&mut answer)?;
        if answer.trim() != "yes" {
            bail!("not decided: you typed {:?}, not yes", answer.trim());
        }
    }
    pause_for_tests();
    let approver = whoami(&session.client).await;
    let mut decision = serde_json::json!({"verdict": verdict, "hash": approval.spec.hash});
    if let Some(approver) = approver {
        decision["approver"] = serde_json::Value::String(approver);
    }
    if let Some(note) = note {
        decision["note"] = serde_json::Value::String(note);
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": approval.metadata.resource_version},
        "spec": {"decision": decision},
    });
    Api::<Approval>::namespaced(session.client, &session.namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!(
                "the API server refused the decision on Approval {}/{name} (did it change since it was printed?)",
                session.namespace
            )
        })?;
    emit(&format!(
        "approval {}/{name} {}\n",
        session.namespace,
        past(verdict)
    ))?;
    Ok(())
}

/// Tests make the window between printing and patching wide enough to change the Approval in
/// it (`AGENTRT_TEST_PAUSE_BEFORE_DECIDE_MS`); unset in normal use.
fn pause_for_tests() {
    if let Some(ms) = std::env::var("AGENTRT_TEST_PAUSE_BEFORE_DECIDE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn verb(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approve",
        Verdict::Rejected => "reject",
    }
}

fn past(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approved",
        Verdict::Rejected => "rejected",
    }
}

/// The authenticated user, from a SelfSubjectReview (authentication.k8s.io/v1); `None` when the
/// API server does not offer it.
async fn whoami(client: &Client) -> Option<String> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = SelfSubjectReview::default();
    match api.create(&kube::api::PostParams::default(), &review).await {
        Ok(answer) => answer
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username),
        Err(err) => {
            tracing::debug!("SelfSubjectReview failed, deciding without approver: {err}");
            None
        }
    }
}
