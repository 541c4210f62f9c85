//! `approve`, `reject` and `settle` (docs/design.md section 2 "Approval"): the Approval
//! printed first, the decision only with `--yes` or a typed `yes`, patched with the hash
//! printed and the resourceVersion read as a precondition; refused before any patch when the
//! Approval can no longer grant or its run can no longer use it.

use super::*;
use crate::engine::grantable::{self, ApprovalRefusal, RunRefusal};

pub(super) fn is_pending(approval: &Approval) -> bool {
    approval.spec.decision.is_none()
        && approval
            .status
            .as_ref()
            .is_none_or(|s| s.phase == ApprovalPhase::Pending)
}

pub(super) async fn get_approval(session: &Session, name: &str) -> anyhow::Result<Approval> {
    Api::<Approval>::namespaced(session.client.clone(), &session.namespace)
        .get(name)
        .await
        .with_context(|| format!("Approval {}/{name}", session.namespace))
}

/// What a decision carries besides its verdict and note ([`write_decision`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Given {
    /// `TookEffect`'s `result` (docs/design.md section 5).
    Result(serde_json::Value),
    /// The answer approving an `input_required` Approval (docs/design.md section 6, "MCP
    /// tasks").
    Answer(serde_json::Value),
}

/// Why `answer` cannot approve `approval`: an `input_required` Approval without one, or with
/// one that does not match its `presentation.requestedSchema`, or an answer given to another
/// kind; as the end of a sentence starting with the Approval's name. `None` when it can
/// (docs/design.md section 6, "MCP tasks"). Shared by the CLI and the console.
pub fn answer_refused(approval: &Approval, answer: Option<&serde_json::Value>) -> Option<String> {
    let wanted = approval.spec.kind == crate::api::INPUT_REQUIRED;
    let presentation = approval
        .spec
        .presentation
        .clone()
        .unwrap_or(serde_json::Value::Null);
    let schema = presentation
        .get("requestedSchema")
        .cloned()
        .unwrap_or(serde_json::json!({}));
    match (wanted, answer) {
        (false, None) => None,
        (false, Some(_)) => Some(format!(
            "is of kind {}: --answer is for an input_required Approval only",
            escape::escape_bounded(&approval.spec.kind, 128)
        )),
        (true, None) => Some(format!(
            "asks for input: approve it with --answer '<a JSON object>' matching its \
             requestedSchema {}",
            escape::escape_bounded(&schema.to_string(), 1024)
        )),
        (true, Some(answer)) => {
            let checked = crate::engine::check_answer(&presentation, answer);
            checked.err().map(|violations| {
                format!(
                    "asks for an answer matching its requestedSchema, and --answer does not: {}",
                    escape::escape_bounded(&violations.join("; "), 1024)
                )
            })
        }
    }
}

pub(super) async fn decide(
    target: &Target,
    object: &ObjectRef,
    verdict: Verdict,
    yes: bool,
    note: Option<String>,
    given: Option<Given>,
) -> anyhow::Result<()> {
    let result = match &given {
        Some(Given::Result(result)) => Some(result.clone()),
        _ => None,
    };
    let answer = match &given {
        Some(Given::Answer(answer)) => Some(answer),
        _ => None,
    };
    let session = connect_for(target, object).await?;
    let name = object.name.as_str();
    let approval = get_approval(&session, name).await?;
    // Refuse what can no longer grant before printing anything of the prompt.
    if let Some(why) = refusal(&session, &approval).await? {
        bail!("Approval {}/{name} {why}", session.namespace);
    }
    if verdict == Verdict::Approved {
        if let Some(why) = answer_refused(&approval, answer) {
            bail!("Approval {}/{name} {why}", session.namespace);
        }
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
    let shown = Shown {
        name: name.to_string(),
        hash: approval.spec.hash.clone(),
        resource_version: approval.metadata.resource_version.clone(),
    };
    if let Err(refused) = write_decision(
        &session.client,
        &session.namespace,
        &shown,
        verdict,
        note,
        given,
    )
    .await
    {
        let hint = if refused.changed {
            " (did it change since it was printed?)"
        } else {
            ""
        };
        bail!(
            "the API server refused the decision on Approval {}/{name}{hint}: {}",
            session.namespace,
            refused.message
        );
    }
    emit(&format!(
        "approval {}/{name} {}\n",
        session.namespace,
        past(verdict)
    ))?;
    Ok(())
}

/// `approve`/`reject` without a name (docs/design.md section 2, "Approval"): every pending
/// Approval of the namespace that `select` matches, listed once (name, kind, run and step,
/// tool, short hash, or why it is skipped: it can no longer grant, or an `input_required` one
/// has no matching `--answer`), one confirmation (or `--yes`), then each decided with the hash
/// and resourceVersion listed, exactly as `approve NAME` would. Errs when nothing matches, or
/// when the API server refused any (each refusal printed).
pub(super) async fn decide_many(
    target: &Target,
    select: &super::args::Select,
    verdict: Verdict,
    yes: bool,
    note: Option<String>,
    given: Option<Given>,
) -> anyhow::Result<()> {
    let session = super::connect(target).await?;
    let ns = session.namespace.clone();
    let mut labels: Vec<String> = select.selector.iter().cloned().collect();
    if let Some(run) = &select.run {
        labels.push(format!("agentrt.dev/run={run}"));
    }
    let mut params = kube::api::ListParams::default();
    if !labels.is_empty() {
        params = params.labels(&labels.join(","));
    }
    let listed = Api::<Approval>::namespaced(session.client.clone(), &ns)
        .list(&params)
        .await
        .with_context(|| format!("cannot list the Approvals of namespace {ns}"))?;
    let mut chosen: Vec<Approval> = listed
        .items
        .into_iter()
        .filter(is_pending)
        .filter(|a| select.kind.as_ref().is_none_or(|k| &a.spec.kind == k))
        .collect();
    chosen.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
    });
    if chosen.is_empty() {
        bail!("no pending Approval in namespace {ns} matches; nothing was decided");
    }
    let answer = match &given {
        Some(Given::Answer(answer)) => Some(answer),
        _ => None,
    };
    let mut decidable = Vec::new();
    let mut stdout = std::io::stdout();
    writeln!(
        stdout,
        "Pending Approvals in {} that match:",
        escape::escape_bounded(&ns, 253)
    )?;
    for approval in chosen {
        let name = approval.metadata.name.clone().unwrap_or_default();
        let mut skip = refusal(&session, &approval).await?;
        if skip.is_none() && verdict == Verdict::Approved {
            skip = answer_refused(&approval, answer);
        }
        let line = format!(
            "  {} {} run {} step {} tool {} hash {}",
            escape::escape_bounded(&name, 253),
            escape::escape_bounded(&approval.spec.kind, 64),
            escape::escape_bounded(&approval.spec.run_name, 253),
            approval.spec.step_index,
            escape::escape_bounded(&approval.spec.request.tool.name, 128),
            crate::engine::short_hash(&approval.spec.hash),
        );
        match skip {
            Some(why) => writeln!(
                stdout,
                "{line}
    skipped: it {why}"
            )?,
            None => {
                writeln!(stdout, "{line}")?;
                decidable.push(approval);
            }
        }
    }
    if decidable.is_empty() {
        bail!("none of the matching Approvals can be decided now; nothing was decided");
    }
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            bail!("not deciding: standard input is not a terminal; pass --yes to decide without a prompt");
        }
        write!(
            stdout,
            "Type yes to {} these {}: ",
            verb(verdict),
            decidable.len()
        )?;
        stdout.flush()?;
        let mut typed = String::new();
        stdin.lock().read_line(&mut typed)?;
        if typed.trim() != "yes" {
            bail!("not decided: you typed {:?}, not yes", typed.trim());
        }
    }
    let mut refused = 0;
    for approval in &decidable {
        let name = approval.metadata.name.clone().unwrap_or_default();
        let shown = Shown {
            name: name.clone(),
            hash: approval.spec.hash.clone(),
            resource_version: approval.metadata.resource_version.clone(),
        };
        let wrote = write_decision(
            &session.client,
            &ns,
            &shown,
            verdict,
            note.clone(),
            given.clone(),
        )
        .await;
        match wrote {
            Ok(()) => emit(&format!(
                "approval {ns}/{name} {}
",
                past(verdict)
            ))?,
            Err(err) => {
                refused += 1;
                let hint = if err.changed {
                    " (did it change since it was listed?)"
                } else {
                    ""
                };
                emit(&format!(
                    "approval {ns}/{name} refused{hint}: {}
",
                    err.message
                ))?;
            }
        }
    }
    if refused > 0 {
        bail!(
            "the API server refused {refused} of {} decisions",
            decidable.len()
        );
    }
    Ok(())
}

/// What a person was shown of an Approval and decides on: its name, the `spec.hash` shown and
/// the `metadata.resourceVersion` read (`None`: no precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    /// The Approval's name (in the namespace the decision is written to).
    pub name: String,
    /// The `spec.hash` shown, written as `spec.decision.hash`.
    pub hash: String,
    /// The `metadata.resourceVersion` read, sent as the patch's precondition.
    pub resource_version: Option<String>,
}

/// The API server refused a decision (docs/design.md section 2 "Approval").
#[derive(Debug, Clone, thiserror::Error)]
#[error("the API server refused the decision on Approval {namespace}/{name}: {message}")]
pub struct DecisionRefused {
    /// The Approval's namespace.
    pub namespace: String,
    /// The Approval's name.
    pub name: String,
    /// Whether the refusal says the Approval changed since it was shown (409 Conflict on the
    /// resourceVersion, or the `spec.decision.hash` rule).
    pub changed: bool,
    /// The API server's message ([`crate::api::server_message`]).
    pub message: String,
}

/// Writes a decision as `kubectl agentrt approve` does: one merge patch (field manager
/// `kubectl-agentrt`) of `spec.decision` (`verdict`, the hash shown, the approver from a
/// SelfSubjectReview when the server offers it, `note`, and `result` or `answer` as `given`
/// says) with the resourceVersion
/// shown as a precondition, so an Approval changed since it was shown is refused by the API
/// server. Shared by the CLI and `agentrt console` (docs/design.md section 2, "Console").
///
/// # Errors
/// [`DecisionRefused`] when the API server refuses the patch (a conflict, the hash rule, RBAC,
/// an unreachable server).
pub async fn write_decision(
    client: &Client,
    namespace: &str,
    shown: &Shown,
    verdict: Verdict,
    note: Option<String>,
    given: Option<Given>,
) -> Result<(), DecisionRefused> {
    let approver = whoami(client).await;
    let mut decision = serde_json::json!({"verdict": verdict, "hash": shown.hash});
    if let Some(approver) = approver {
        decision["approver"] = serde_json::Value::String(approver);
    }
    if let Some(note) = note {
        decision["note"] = serde_json::Value::String(note);
    }
    match given {
        Some(Given::Result(result)) => decision["result"] = result,
        Some(Given::Answer(answer)) => decision["answer"] = answer,
        None => {}
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": shown.resource_version},
        "spec": {"decision": decision},
    });
    let patched = Api::<Approval>::namespaced(client.clone(), namespace)
        .patch(&shown.name, &cli_patch_params(), &Patch::Merge(&patch))
        .await;
    patched.map(|_| ()).map_err(|err| DecisionRefused {
        namespace: namespace.to_string(),
        name: shown.name.clone(),
        // Only a conflict (the object moved on) or the hash rule says the Approval changed.
        changed: matches!(&err, kube::Error::Api(status)
            if status.code == 409 || status.message.contains("spec.decision.hash")),
        message: crate::api::server_message(&err),
    })
}

/// Why `approval` cannot be decided now, as the end of a sentence starting with its name
/// (docs/behaviours.md 42, 67): it is decided, not `Pending`, past its expiry, or its run,
/// read live, no longer awaits it. `None` when it may be decided. The rule is the engine's
/// ([`crate::engine::grantable`]); the words are this CLI's.
pub(super) async fn refusal(
    session: &Session,
    approval: &Approval,
) -> anyhow::Result<Option<String>> {
    let now = crate::api::Time(jiff::Timestamp::now());
    if let Some(refusal) = grantable::approval_cannot_grant(approval, now) {
        return Ok(Some(match refusal {
            ApprovalRefusal::Decided => {
                "is already decided; a decision is written once".to_string()
            }
            ApprovalRefusal::NotPending { phase, reason } => {
                let why = reason
                    .as_deref()
                    .map(|r| format!(" ({})", escape::escape_bounded(r, 200)))
                    .unwrap_or_default();
                format!("is {phase:?}{why}, not Pending: it can no longer grant, so nothing was decided")
            }
            ApprovalRefusal::Expired { at } => {
                format!("expired at {at}; a decision now would grant nothing")
            }
        }));
    }
    Ok(run_refuses(session, approval)
        .await?
        .map(|why| format!("can no longer grant: {why}; nothing was decided")))
}

/// Why the Approval's run says it can no longer grant, read live from the run
/// ([`grantable::run_cannot_use`]), in words. `None` when it may still grant.
pub(super) async fn run_refuses(
    session: &Session,
    approval: &Approval,
) -> anyhow::Result<Option<String>> {
    let ns = &session.namespace;
    let run_name = &approval.spec.run_name;
    let run = Api::<AgentRun>::namespaced(session.client.clone(), ns)
        .get_opt(run_name)
        .await
        .with_context(|| format!("cannot read AgentRun {ns}/{run_name}"))?;
    let uid = || escape::escape_bounded(&approval.spec.run_uid, 80);
    Ok(
        grantable::run_cannot_use(approval, run.as_ref()).map(|refusal| match refusal {
            RunRefusal::Gone => {
                format!("its run AgentRun {ns}/{run_name} (uid {}) is gone", uid())
            }
            RunRefusal::BeingDeleted => format!("its run {ns}/{run_name} is being deleted"),
            RunRefusal::EarlierRun => format!(
                "it belongs to an earlier run named {run_name} (uid {}), not AgentRun {ns}/{run_name}",
                uid()
            ),
            RunRefusal::Ended { phase, reason } => {
                let reason = reason.map(|r| format!(" {r}")).unwrap_or_default();
                format!("its run {ns}/{run_name} ended {phase:?}{reason}")
            }
            RunRefusal::BeingCancelled => {
                format!("its run {ns}/{run_name} is being cancelled (spec.cancel: true)")
            }
            RunRefusal::Superseded { step, latest } => {
                format!("step {step} of run {ns}/{run_name} now awaits {latest}")
            }
            RunRefusal::NotAwaiting { step } => {
                format!("step {step} of run {ns}/{run_name} is no longer awaiting approval")
            }
        }),
    )
}

/// Tests make the window between printing and patching wide enough to change the Approval in
/// it (`AGENTRT_TEST_PAUSE_BEFORE_DECIDE_MS`); unset in normal use.
pub(super) fn pause_for_tests() {
    if let Some(ms) = std::env::var("AGENTRT_TEST_PAUSE_BEFORE_DECIDE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

pub(super) fn verb(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approve",
        Verdict::Rejected => "reject",
        Verdict::TookEffect | Verdict::DidNotTakeEffect => "settle",
    }
}

pub(super) fn past(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::Approved => "approved",
        Verdict::Rejected => "rejected",
        Verdict::TookEffect => "settled: took effect",
        Verdict::DidNotTakeEffect => "settled: did not take effect",
    }
}

/// The authenticated user, from a SelfSubjectReview (authentication.k8s.io/v1); `None` when the
/// API server does not offer it.
pub(super) async fn whoami(client: &Client) -> Option<String> {
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
/// The field manager of the CLI's writes (a decision, `spec.cancel`): `kubectl-agentrt`.
pub(super) fn cli_patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some("kubectl-agentrt".to_string()),
        ..PatchParams::default()
    }
}
