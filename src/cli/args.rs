//! The operator commands' command line (clap): what each command takes, the options every
//! command shares ([`Target`]) and the checks of names and decision notes made before any API
//! call (a usage error, exit 2).

use std::path::PathBuf;

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
    /// Act as this user (impersonation, as `kubectl --as`; your own user needs `impersonate`
    /// on it). What you decide is then recorded and checked as that user's.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Act as a member of this group as well (repeatable, as `kubectl --as-group`; needs
    /// `--as`).
    #[arg(
        long = "as-group",
        global = true,
        value_name = "GROUP",
        requires = "as_user"
    )]
    pub as_group: Vec<String>,
}

/// Which pending Approvals of the namespace `approve` and `reject` decide when no name is
/// given (docs/design.md section 2, "Approval"): those matching every filter given.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Select {
    /// A label selector, as kubectl's (`agentrt.dev/run=refund-1042`, `team=pay`).
    #[arg(short = 'l', long = "selector", conflicts_with = "name")]
    pub selector: Option<String>,
    /// The Approvals of this run.
    #[arg(long, conflicts_with = "name", value_parser = object_name)]
    pub run: Option<String>,
    /// Every pending Approval of the namespace (with `--kind`, of that kind).
    #[arg(long, conflicts_with = "name")]
    pub all_pending: bool,
    /// Only Approvals of this kind (`interrupted_side_effect`, a policy's kind, ...).
    #[arg(long, conflicts_with = "name")]
    pub kind: Option<String>,
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
    /// Approve an Approval: print it, confirm, and patch the hash printed. An `input_required`
    /// Approval (an MCP task asking for input) needs `--answer`. Without a name, approves every
    /// pending Approval that `-l`, `--run`, `--kind` or `--all-pending` select, after one
    /// confirmation listing them.
    Approve {
        /// The Approval's name, or `namespace/name`.
        #[arg(value_parser = object_ref, required_unless_present_any = ["selector", "run", "all_pending"])]
        name: Option<ObjectRef>,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        select: Select,
        /// Decide without asking (for scripts; you still get the printout).
        #[arg(short = 'y', long)]
        yes: bool,
        /// A note recorded with the decision (at most 4096 characters).
        #[arg(long, value_parser = decision_note)]
        note: Option<String>,
        /// For an `input_required` Approval only (and required there): the answer to the MCP
        /// server's question, a JSON object matching the Approval's
        /// `presentation.requestedSchema`, e.g. `--answer '{"interpretation": "snake"}'`.
        #[arg(long, value_parser = decision_answer)]
        answer: Option<serde_json::Value>,
    },
    /// Reject an Approval: print it, confirm, and patch the hash printed. The run is cancelled.
    /// Without a name, rejects every pending Approval that `-l`, `--run`, `--kind` or
    /// `--all-pending` select, after one confirmation listing them.
    Reject {
        /// The Approval's name, or `namespace/name`.
        #[arg(value_parser = object_ref, required_unless_present_any = ["selector", "run", "all_pending"])]
        name: Option<ObjectRef>,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        select: Select,
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

/// `--answer`: a JSON object (`spec.decision.answer` is one; the schema it must match is the
/// Approval's, checked once it is read).
fn decision_answer(text: &str) -> Result<serde_json::Value, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("--answer must be a JSON object: {e}"))?;
    if !value.is_object() {
        return Err(
            "--answer must be a JSON object (spec.decision.answer is one), matching the \
             Approval's requestedSchema, e.g. '{\"interpretation\": \"snake\"}'"
                .to_string(),
        );
    }
    Ok(value)
}

/// Validates a Kubernetes object name (a DNS-1123 subdomain) before any API call, so a typo is
/// a usage error (exit 2) rather than a request.
fn object_name(name: &str) -> Result<String, String> {
    if is_object_name(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "{name:?} is not a Kubernetes object name: use lowercase letters, digits, '-' and \
             '.', starting and ending with a letter or digit"
        ))
    }
}

/// Whether `name` is a Kubernetes object name: a DNS-1123 subdomain (lowercase letters, digits,
/// `-` and `.`, each dot-separated label starting and ending with a letter or digit; at most 253
/// characters).
pub(super) fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
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
