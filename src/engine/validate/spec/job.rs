//! A Job tool's pod template as the whole-spec check sees it (docs/design.md section 6, "Job
//! tools"): what a Job would refuse, and what agentrt sets on the Job and its Pod (the names,
//! the namespace, the owner, the finalizer, the `AGENTRT_*` env, `agentrt.dev/` keys), found
//! at apply rather than at the call.

use serde_json::Value;

use super::Problems;

/// A Job tool's pod template: a Pod template as a Job takes it (it decodes as a
/// `PodTemplateSpec`), with at least one container, each with an image, and a `restartPolicy`
/// of `Never` (the default) or `OnFailure` (docs/design.md section 6, "Job tools").
pub(super) fn job_template(out: &mut Problems, field: &str, template: &Value) {
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    let decoded = match serde_json::from_value::<PodTemplateSpec>(template.clone()) {
        Ok(decoded) => decoded,
        Err(err) => {
            out.add(
                field,
                format!(
                    "is not a Pod template ({err}); write it as a Job's spec.template: \
                     {{spec: {{containers: [{{name: main, image: ...}}]}}}}"
                ),
            );
            return;
        }
    };
    let Some(spec) = decoded.spec else {
        out.add(
            format!("{field}.spec"),
            "is missing; write {containers: [{name: main, image: ...}]}",
        );
        return;
    };
    if spec.containers.is_empty() {
        out.add(
            format!("{field}.spec.containers"),
            "is empty; a Job tool runs its first container",
        );
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, container) in spec.containers.iter().enumerate() {
        let at = format!("{field}.spec.containers[{i}]");
        if container.image.as_deref().is_none_or(str::is_empty) {
            out.add(
                format!("{at}.image"),
                "is missing; name the image the call runs",
            );
        }
        if !is_dns_label(&container.name) {
            out.add(
                format!("{at}.name"),
                format!(
                    "{:?} is not a container name; use lowercase letters, digits and - (1-63)",
                    container.name
                ),
            );
        } else if !names.insert(container.name.as_str()) {
            out.add(
                format!("{at}.name"),
                format!(
                    "{} is taken by another container; rename one",
                    container.name
                ),
            );
        }
        for (k, env) in container.env.iter().flatten().enumerate() {
            if env.name.starts_with("AGENTRT_") {
                out.add(
                    format!("{at}.env[{k}].name"),
                    format!(
                        "{} is set by agentrt for each call (AGENTRT_ARGS, \
                         AGENTRT_IDEMPOTENCY_KEY, AGENTRT_RUN, AGENTRT_STEP); rename it",
                        env.name
                    ),
                );
            }
        }
    }
    if spec.ephemeral_containers.is_some() {
        out.add(
            format!("{field}.spec.ephemeralContainers"),
            "a Pod is not created with ephemeral containers; remove them",
        );
    }
    if let Some(meta) = &decoded.metadata {
        for (member, set) in [
            ("namespace", meta.namespace.is_some()),
            ("name", meta.name.is_some()),
            ("ownerReferences", meta.owner_references.is_some()),
            ("finalizers", meta.finalizers.is_some()),
        ] {
            if set {
                out.add(
                    format!("{field}.metadata.{member}"),
                    "is set by the Job (the run's namespace, a name from the run, owned by \
                     the Job); remove it",
                );
            }
        }
        let agentrt_keys = meta
            .labels
            .iter()
            .flatten()
            .map(|(k, _)| ("labels", k))
            .chain(
                meta.annotations
                    .iter()
                    .flatten()
                    .map(|(k, _)| ("annotations", k)),
            );
        for (member, key) in agentrt_keys {
            if key.starts_with("agentrt.dev/") {
                out.add(
                    format!("{field}.metadata.{member}"),
                    format!("{key}: agentrt.dev/ keys are agentrt's own; use another prefix"),
                );
            }
        }
    }
    if let Some(policy) = spec.restart_policy.as_deref() {
        if policy != "Never" && policy != "OnFailure" {
            out.add(
                format!("{field}.spec.restartPolicy"),
                format!(
                    "must be Never or OnFailure for a Job (got {policy}); leave it out for Never"
                ),
            );
        }
    }
}

/// A Kubernetes DNS-1123 label: lowercase letters, digits and `-`, 1 to 63, starting and
/// ending with a letter or digit.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}
