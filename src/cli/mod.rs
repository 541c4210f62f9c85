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

pub mod escape;
mod history;
pub mod lint;
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
    /// List Approvals (pending only unless --all-phases) in the namespace (as kubectl: -n, else the
    /// kubeconfig context's, else `default`), or in all with -A.
    Approvals {
        #[command(flatten)]
        target: Target,
        /// All namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// Every phase: include decided, expired, executed and cancelled Approvals (not only
        /// pending ones). `--all` is an older spelling of it; `-A` is about namespaces.
        #[arg(long = "all-phases", alias = "all")]
        all_phases: bool,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show a run (every step and an events timeline, sealed segments stitched in and checked)
    /// or an Approval. Exits 1 naming the first missing or altered segment.
    Show {
        /// `run` or `approval`.
        #[arg(value_enum)]
        what: ShowWhat,
        /// Its name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        name: ObjectRef,
        #[command(flatten)]
        target: Target,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show every event of a run (sealed segments stitched in and checked).
    Events {
        /// The run's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        run: ObjectRef,
        #[command(flatten)]
        target: Target,
        #[arg(short = 'o', long, value_enum, default_value_t)]
        output: Output,
    },
    /// Check a run's chain of sealed segments against its record: print what was checked, or
    /// exit 1 naming the first missing or altered segment.
    Verify {
        /// The run's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        run: ObjectRef,
        #[command(flatten)]
        target: Target,
    },
    /// Approve an Approval: print it, confirm, and patch the hash printed.
    Approve {
        /// The Approval's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        name: ObjectRef,
        #[command(flatten)]
        target: Target,
        /// Decide without asking (for scripts; you still get the printout).
        #[arg(short = 'y', long)]
        yes: bool,
        /// A note recorded with the decision (at most 4096 characters).
        #[arg(long, value_parser = decision_note)]
        note: Option<String>,
    },
    /// Reject an Approval: print it, confirm, and patch the hash printed. The run is cancelled.
    Reject {
        /// The Approval's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        name: ObjectRef,
        #[command(flatten)]
        target: Target,
        /// Decide without asking.
        #[arg(short = 'y', long)]
        yes: bool,
        /// Why (becomes the run's reasonDetail; at most 4096 characters).
        #[arg(long, value_parser = decision_note)]
        note: Option<String>,
    },
    /// Settle an `interrupted_side_effect` Approval without running anything: say whether the
    /// interrupted call took effect. `--took-effect --result '{...}'` records that JSON object
    /// as the call's result (checked and bounded as a tool's answer) and the run goes on;
    /// `--did-not-take-effect` records the step as not executed and the agent decides again,
    /// once the first attempt can no longer be running. Prints the Approval, asks, and patches
    /// the hash printed, as `approve` does. Only an `interrupted_side_effect` Approval takes it.
    Settle {
        /// The Approval's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        name: ObjectRef,
        #[command(flatten)]
        target: Target,
        /// The call took effect: record `--result` as its outcome.
        #[arg(long, conflicts_with = "did_not_take_effect", requires = "result")]
        took_effect: bool,
        /// The call did not take effect: record the step as not executed.
        #[arg(long, conflicts_with = "result")]
        did_not_take_effect: bool,
        /// With `--took-effect`: the call's result, a JSON object (as the tool would have
        /// answered it).
        #[arg(long, value_parser = decision_result)]
        result: Option<serde_json::Value>,
        /// Decide without asking.
        #[arg(short = 'y', long)]
        yes: bool,
        /// A note recorded with the decision (at most 4096 characters).
        #[arg(long, value_parser = decision_note)]
        note: Option<String>,
    },
    /// Check AgentRun manifests offline, as `kubectl apply` would (with the controller's
    /// webhook): print every problem as `FILE: NAMESPACE/NAME: field: message` and exit 1, or
    /// print `N runs ok`. Other kinds of document are skipped with a note.
    ///
    /// Admin policies: the AgentPolicy and ClusterAgentPolicy documents among the files, in
    /// --policy files, or (with --policies-from-cluster) the cluster's are linted themselves
    /// (a `when` that is not CEL, an unknown side-effect class) and a run over a ceiling of one
    /// that selects it is refused as the webhook refuses it, naming the field and the policy.
    /// A Namespace document among the files gives its labels to namespaceSelector. A document
    /// without a namespace is in -n's, else `default` (with --policies-from-cluster: -n's, else
    /// the context's).
    Lint {
        /// Files to check (`-` reads standard input; a directory: its .yaml, .yml and .json
        /// files, as `kubectl apply -f DIR`); each may hold many YAML documents.
        #[arg(
            short = 'f',
            long = "filename",
            num_args = 1..,
            required_unless_present_any = ["paths"]
        )]
        files: Vec<String>,
        /// More files to check, as -f.
        #[arg(value_name = "FILE")]
        paths: Vec<String>,
        /// A file (or directory) of AgentPolicy and ClusterAgentPolicy objects the runs are
        /// checked against (linted too); repeat for more.
        #[arg(long = "policy", value_name = "FILE")]
        policies: Vec<String>,
        /// Also check against the admin policies in the cluster (the kubeconfig's): every
        /// ClusterAgentPolicy, the AgentPolicies and labels of the runs' namespaces.
        #[arg(long)]
        policies_from_cluster: bool,
        #[command(flatten)]
        target: Target,
    },
    /// Cancel a run (sets spec.cancel; a running tool is not interrupted).
    Cancel {
        /// The run's name, or `namespace/name`.
        #[arg(value_parser = object_ref)]
        run: ObjectRef,
        #[command(flatten)]
        target: Target,
        /// Why (kept in the annotation agentrt.dev/cancel-note).
        #[arg(long)]
        note: Option<String>,
    },
}

/// A decision's `--note`, refused before the API server is contacted when it is longer than
/// the Approval schema's limit (`spec.decision.note`, [`crate::api::DECISION_NOTE_MAX_CHARS`]
/// characters).
fn decision_note(text: &str) -> Result<String, String> {
    let chars = text.chars().count();
    if chars > crate::api::DECISION_NOTE_MAX_CHARS {
        return Err(format!(
            "the note is {chars} characters; an Approval's spec.decision.note holds at most {}: \
             shorten it",
            crate::api::DECISION_NOTE_MAX_CHARS
        ));
    }
    Ok(text.to_string())
}

/// `--result`: a JSON object (`spec.decision.result` is typed `object`).
fn decision_result(text: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("--result must be a JSON object: {e}"))?;
    if !value.is_object() {
        return Err(
            "--result must be a JSON object (spec.decision.result is one): wrap another value, \
             e.g. '{\"value\": ...}'"
                .to_string(),
        );
    }
    Ok(value)
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

/// An object named on the command line: `name`, or `namespace/name` as kubectl prints it
/// (`-A` lists show the namespace); the namespace then wins over the context's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// The namespace given with the name, if any.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

/// Parses `name` or `namespace/name` (a DNS-1123 label, then an object name) before any API
/// call, so a typo is a usage error (exit 2).
fn object_ref(text: &str) -> Result<ObjectRef, String> {
    match text.split_once('/') {
        None => Ok(ObjectRef {
            namespace: None,
            name: object_name(text)?,
        }),
        Some((namespace, name)) => {
            let label = !namespace.is_empty()
                && namespace.len() <= 63
                && namespace
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !namespace.starts_with('-')
                && !namespace.ends_with('-');
            if !label {
                return Err(format!(
                    "{namespace:?} (before the '/' in {text:?}) is not a namespace name: use \
                     lowercase letters, digits and '-', at most 63, starting and ending with a \
                     letter or digit"
                ));
            }
            Ok(ObjectRef {
                namespace: Some(namespace.to_string()),
                name: object_name(name)?,
            })
        }
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
                None => emit(&render::approvals_table(&approvals, every_namespace))?,
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
            yes,
            note,
        } => {
            decide(&target, &name, Verdict::Approved, yes, note, None).await?;
        }
        OperatorCommand::Reject {
            name,
            target,
            yes,
            note,
        } => {
            decide(&target, &name, Verdict::Rejected, yes, note, None).await?;
        }
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
            decide(&target, &name, verdict, yes, note, result).await?;
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
    object: &ObjectRef,
    verdict: Verdict,
    yes: bool,
    note: Option<String>,
    result: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let session = connect_for(target, object).await?;
    let name = object.name.as_str();
    let approval = get_approval(&session, name).await?;
    // Refuse what can no longer grant before printing anything of the prompt.
    if let Some(why) = refusal(&session, &approval).await? {
        bail!("Approval {}/{name} {why}", session.namespace);
    }
    let settles = matches!(verdict, Verdict::TookEffect | Verdict::DidNotTakeEffect);
    if settles && approval.spec.kind != crate::api::INTERRUPTED_SIDE_EFFECT {
        bail!(
            "Approval {}/{name} is of kind {}: only an interrupted_side_effect Approval can be \
             settled; use approve or reject",
            session.namespace,
            escape::escape_bounded(&approval.spec.kind, 128)
        );
    }
    let mut stdout = std::io::stdout();
    write!(stdout, "{}", render::approval_details(&approval))?;
    writeln!(
        stdout,
        "{}",
        render::decision_line(&approval, verdict, result.as_ref())
    )?;
    stdout.flush()?;
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
    if let Some(result) = result {
        decision["result"] = result;
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": approval.metadata.resource_version},
        "spec": {"decision": decision},
    });
    let patched = Api::<Approval>::namespaced(session.client, &session.namespace)
        .patch(name, &cli_patch_params(), &Patch::Merge(&patch))
        .await;
    if let Err(err) = patched {
        // Only a conflict (the object moved on) or the hash rule says the Approval changed.
        let changed = matches!(&err, kube::Error::Api(status)
            if status.code == 409 || status.message.contains("spec.decision.hash"));
        let hint = if changed {
            " (did it change since it was printed?)"
        } else {
            ""
        };
        bail!(
            "the API server refused the decision on Approval {}/{name}{hint}: {}",
            session.namespace,
            crate::api::server_message(&err)
        );
    }
    emit(&format!(
        "approval {}/{name} {}\n",
        session.namespace,
        past(verdict)
    ))?;
    Ok(())
}

/// Why `approval` cannot be decided now, as the end of a sentence starting with its name
/// (docs/behaviours.md 42, 67): it is decided, not `Pending`, past its expiry, or its run,
/// read live, no longer awaits it. `None` when it may be decided.
async fn refusal(session: &Session, approval: &Approval) -> anyhow::Result<Option<String>> {
    if approval.spec.decision.is_some() {
        return Ok(Some(
            "is already decided; a decision is written once".to_string(),
        ));
    }
    if let Some(status) = &approval.status {
        if status.phase != ApprovalPhase::Pending {
            let why = status
                .reason
                .as_deref()
                .map(|r| format!(" ({})", escape::escape_bounded(r, 200)))
                .unwrap_or_default();
            return Ok(Some(format!(
                "is {:?}{why}, not Pending: it can no longer grant, so nothing was decided",
                status.phase
            )));
        }
        if let Some(expires_at) = status.expires_at {
            if expires_at.0 <= jiff::Timestamp::now() {
                return Ok(Some(format!(
                    "expired at {expires_at}; a decision now would grant nothing"
                )));
            }
        }
    }
    Ok(run_refuses(session, approval)
        .await?
        .map(|why| format!("can no longer grant: {why}; nothing was decided")))
}

/// Why the Approval's run says it can no longer grant, read live from the run (docs/design.md
/// section 2: only the latest Approval of a step awaiting approval, of a run that has not
/// ended or been cancelled, can grant): the run (`spec.runName`) is gone or being deleted, it
/// is another run of the same name (its uid is not `spec.runUID` or the ownerReference's), it
/// ended or has `spec.cancel: true`, or the step has moved on or awaits a later Approval.
/// `None` when it may still grant.
async fn run_refuses(session: &Session, approval: &Approval) -> anyhow::Result<Option<String>> {
    let ns = &session.namespace;
    let run_name = &approval.spec.run_name;
    let run_uid = approval.spec.run_uid.as_str();
    let owner_uid = approval
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "AgentRun" && o.name == *run_name)
        .map(|o| o.uid.as_str());
    let Some(run) = Api::<AgentRun>::namespaced(session.client.clone(), ns)
        .get_opt(run_name)
        .await
        .with_context(|| format!("cannot read AgentRun {ns}/{run_name}"))?
    else {
        // Deleted (with --cascade=orphan the Approval outlives it and loses its
        // ownerReference): nothing will ever act on a decision.
        return Ok(Some(format!(
            "its run AgentRun {ns}/{run_name} (uid {}) is gone",
            escape::escape_bounded(run_uid, 80)
        )));
    };
    if run.metadata.deletion_timestamp.is_some() {
        return Ok(Some(format!("its run {ns}/{run_name} is being deleted")));
    }
    let uid_matches = |uid: &str| run.metadata.uid.as_deref() == Some(uid);
    if !uid_matches(run_uid) || owner_uid.is_some_and(|u| !uid_matches(u)) {
        return Ok(Some(format!(
            "it belongs to an earlier run named {run_name} (uid {}), not AgentRun {ns}/{run_name}",
            escape::escape_bounded(&approval.spec.run_uid, 80)
        )));
    }
    let cancelled = run
        .spec
        .cancel
        .then(|| format!("its run {ns}/{run_name} is being cancelled (spec.cancel: true)"));
    let Some(status) = run.status.as_ref() else {
        return Ok(cancelled);
    };
    if status.phase.is_terminal() {
        let reason = status
            .reason
            .and_then(|r| serde_json::to_value(r).ok())
            .and_then(|r| r.as_str().map(|r| format!(" {r}")))
            .unwrap_or_default();
        return Ok(Some(format!(
            "its run {ns}/{run_name} ended {:?}{reason}",
            status.phase
        )));
    }
    if cancelled.is_some() {
        return Ok(cancelled);
    }
    let name = approval.metadata.name.as_deref().unwrap_or_default();
    let step = status
        .steps
        .iter()
        .find(|s| s.index == approval.spec.step_index);
    if let Some(step) = step {
        let latest = step.approvals.last().map(|a| a.name.as_str());
        if latest.is_some_and(|latest| latest != name) {
            return Ok(Some(format!(
                "step {} of run {ns}/{run_name} now awaits {}",
                step.index,
                latest.unwrap_or_default()
            )));
        }
        if step.status != crate::api::StepStatus::AwaitingApproval {
            return Ok(Some(format!(
                "step {} of run {ns}/{run_name} is no longer awaiting approval",
                step.index
            )));
        }
    }
    Ok(None)
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
        Verdict::TookEffect | Verdict::DidNotTakeEffect => "settle",
    }
}

fn past(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approved",
        Verdict::Rejected => "rejected",
        Verdict::TookEffect => "settled: took effect",
        Verdict::DidNotTakeEffect => "settled: did not take effect",
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

/// `n` and the noun in its number: `1 run`, `2 runs`, `0 runs`.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The field manager of the CLI's writes (a decision, `spec.cancel`): `kubectl-agentrt`.
fn cli_patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some("kubectl-agentrt".to_string()),
        ..PatchParams::default()
    }
}
