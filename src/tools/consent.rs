//! Which Secrets a run may use (docs/design.md section 6, "Secrets"; docs/behaviours.md 87;
//! issue 34): a run's author writes which Secret a header or an API key comes from, and the
//! controller may read Secrets its author cannot, so a Secret is used only when its owner
//! consented on the Secret itself. The controller checks this each time it reads a Secret for a
//! run, so no admission webhook outage opens it.
//!
//! The admission webhook adds the second half of the rule (docs/design.md section 6, "Secrets"):
//! a run's creator must be able to `get` each Secret the run names; [`named_secrets`] lists them
//! with their field paths.
//!
//! Owns: the consent rule and its refusal message, and which fields of a spec name a Secret.
//! Must not: read anything (the caller hands in the Secret's labels and annotations), or ever
//! name a Secret's value.

use std::collections::BTreeMap;

use crate::api::{AgentRunSpec, HttpHeader, McpOAuth};

/// One Secret a spec names: the field naming it, by its path from the object
/// (`spec.tools[0].http.headers[1].secretKeyRef.name`), and the Secret's name (in the run's
/// namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedSecret {
    /// The field's path, ending in `.name`.
    pub field: String,
    /// The Secret's name.
    pub name: String,
}

/// Every Secret `spec` names, in the spec's order: each `http` tool's and `mcp` tool's header
/// `secretKeyRef` (and an `mcp` tool's `oauth.clientSecretRef`), each toolset's header
/// `secretKeyRef` (and its `oauth.clientSecretRef`) and the openai agent's
/// `apiKeySecretRef` (the webhook agent and the reconcile hook name none).
pub fn named_secrets(spec: &AgentRunSpec) -> Vec<NamedSecret> {
    fn headers(found: &mut Vec<NamedSecret>, at: &str, headers: &[HttpHeader]) {
        for (i, header) in headers.iter().enumerate() {
            if let Some(secret) = &header.secret_key_ref {
                found.push(NamedSecret {
                    field: format!("{at}.headers[{i}].secretKeyRef.name"),
                    name: secret.name.clone(),
                });
            }
        }
    }
    let mut found = Vec::new();
    if let Some(secret) = spec
        .agent
        .openai
        .as_ref()
        .and_then(|openai| openai.api_key_secret_ref.as_ref())
    {
        found.push(NamedSecret {
            field: "spec.agent.openai.apiKeySecretRef.name".to_string(),
            name: secret.name.clone(),
        });
    }
    fn oauth(found: &mut Vec<NamedSecret>, at: &str, oauth: Option<&McpOAuth>) {
        if let Some(oauth) = oauth {
            found.push(NamedSecret {
                field: format!("{at}.oauth.clientSecretRef.name"),
                name: oauth.client_secret_ref.name.clone(),
            });
        }
    }
    for (i, tool) in spec.tools.iter().enumerate() {
        if let Some(http) = &tool.http {
            headers(&mut found, &format!("spec.tools[{i}].http"), &http.headers);
        }
        if let Some(mcp) = &tool.mcp {
            let at = format!("spec.tools[{i}].mcp");
            headers(&mut found, &at, &mcp.headers);
            oauth(&mut found, &at, mcp.oauth.as_ref());
        }
    }
    for (i, set) in spec.tool_sets.iter().enumerate() {
        let at = format!("spec.toolSets[{i}].mcp");
        headers(&mut found, &at, &set.mcp.headers);
        oauth(&mut found, &at, set.mcp.oauth.as_ref());
    }
    found
}

/// The label a Secret's owner sets to `"true"` to let every run of the Secret's namespace use it.
pub const USABLE_BY_RUNS: &str = "agentrt.dev/usable-by-runs";

/// The annotation narrowing a Secret labelled [`USABLE_BY_RUNS`] to the runs it names:
/// comma-separated run names (spaces around a name are ignored); when present, only those runs
/// may use the Secret.
pub const USABLE_BY_RUNS_NAMES: &str = "agentrt.dev/usable-by-runs-names";

/// Whether run `run` of `namespace` may use Secret `name` of the same namespace, given the
/// Secret's labels and annotations.
///
/// # Errors
/// A sentence naming the Secret, what it lacks and the fix (the label, or the run's name added
/// to the annotation).
pub fn check(
    namespace: &str,
    name: &str,
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
    run: &str,
) -> Result<(), String> {
    let labelled = labels
        .and_then(|labels| labels.get(USABLE_BY_RUNS))
        .is_some_and(|value| value == "true");
    if !labelled {
        return Err(format!(
            "Secret {namespace}/{name} is not usable by runs: it lacks the label {USABLE_BY_RUNS}: \"true\"; \
             its owner consents with `kubectl label secret {name} -n {namespace} {USABLE_BY_RUNS}=true`"
        ));
    }
    let Some(names) = annotations.and_then(|a| a.get(USABLE_BY_RUNS_NAMES)) else {
        return Ok(());
    };
    if names.split(',').any(|listed| listed.trim() == run) {
        return Ok(());
    }
    Err(format!(
        "Secret {namespace}/{name} is usable only by the runs its annotation {USABLE_BY_RUNS_NAMES} lists \
         ({names:?}), not by run {run}; its owner adds {run} to that list"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn every_field_naming_a_secret_is_listed_with_its_path() {
        let spec: AgentRunSpec = serde_json::from_value(serde_json::json!({
            "goal": "g",
            "agent": {"openai": {"baseURL": "http://m", "model": "m",
                                 "apiKeySecretRef": {"name": "model-key", "key": "k"}}},
            "tools": [
                {"name": "a", "sideEffect": "ReadOnly", "inputSchema": {"type": "object"},
                 "http": {"url": "http://t", "headers": [
                     {"name": "X-Plain", "value": "v"},
                     {"name": "Authorization", "secretKeyRef": {"name": "db-admin", "key": "password"}}
                 ]}},
                {"name": "b", "sideEffect": "ReadOnly",
                 "mcp": {"url": "http://m/mcp", "headers": [
                     {"name": "Authorization", "secretKeyRef": {"name": "mcp-token", "key": "t"}}
                 ]}}
            ],
            "toolSets": [{"name": "gh", "mcp": {"url": "http://g/mcp", "headers": [
                {"name": "Authorization", "secretKeyRef": {"name": "gh-token", "key": "t"}}
            ]}}]
        }))
        .expect("a spec");
        let found: Vec<(String, String)> = named_secrets(&spec)
            .into_iter()
            .map(|s| (s.field, s.name))
            .collect();
        let want = [
            ("spec.agent.openai.apiKeySecretRef.name", "model-key"),
            (
                "spec.tools[0].http.headers[1].secretKeyRef.name",
                "db-admin",
            ),
            (
                "spec.tools[1].mcp.headers[0].secretKeyRef.name",
                "mcp-token",
            ),
            (
                "spec.toolSets[0].mcp.headers[0].secretKeyRef.name",
                "gh-token",
            ),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(f, n)| ((*f).to_string(), (*n).to_string()))
            .collect();
        assert_eq!(found, want);
    }

    #[test]
    fn a_secret_without_the_label_is_refused_naming_it_and_the_fix() {
        for labels in [None, Some(map(&[])), Some(map(&[(USABLE_BY_RUNS, "yes")]))] {
            let err = check("team-a", "db-admin", labels.as_ref(), None, "r").unwrap_err();
            assert!(
                err.contains("Secret team-a/db-admin")
                    && err.contains(
                        "kubectl label secret db-admin -n team-a agentrt.dev/usable-by-runs=true"
                    ),
                "{err}"
            );
        }
    }

    #[test]
    fn a_labelled_secret_serves_every_run_or_only_the_runs_its_annotation_names() {
        let labels = map(&[(USABLE_BY_RUNS, "true")]);
        assert_eq!(check("ns", "s", Some(&labels), None, "any"), Ok(()));
        let names = map(&[(USABLE_BY_RUNS_NAMES, "run-a, run-b")]);
        assert_eq!(
            check("ns", "s", Some(&labels), Some(&names), "run-b"),
            Ok(())
        );
        let err = check("ns", "s", Some(&labels), Some(&names), "run-c").unwrap_err();
        assert!(
            err.contains("not by run run-c") && err.contains(USABLE_BY_RUNS_NAMES),
            "{err}"
        );
        let none = map(&[(USABLE_BY_RUNS_NAMES, "")]);
        assert!(check("ns", "s", Some(&labels), Some(&none), "run-a").is_err());
    }
}
