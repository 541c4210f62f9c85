//! `approve`, `reject` and `settle` (docs/design.md section 2 "Approval"): the Approval
//! printed first, the decision only with `--yes` or a typed `yes`, patched with the hash
//! printed and the resourceVersion read as a precondition; refused before any patch when the
//! Approval can no longer grant or its run can no longer use it.

use super::*;

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

pub(super) async fn decide(
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
pub(super) async fn refusal(
    session: &Session,
    approval: &Approval,
) -> anyhow::Result<Option<String>> {
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
pub(super) async fn run_refuses(
    session: &Session,
    approval: &Approval,
) -> anyhow::Result<Option<String>> {
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
