//! Which Secrets a run may use (docs/design.md section 6, "Secrets"; docs/behaviours.md 84;
//! issue 34): a run's author writes which Secret a header or an API key comes from, and the
//! controller may read Secrets its author cannot, so a Secret is used only when its owner
//! consented on the Secret itself. The controller checks this each time it reads a Secret for a
//! run, so no admission webhook outage opens it.
//!
//! Owns: the consent rule and its refusal message. Must not: read anything (the caller hands in
//! the Secret's labels and annotations), or ever name a Secret's value.

use std::collections::BTreeMap;

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
