//! `agentrt lint -f FILE...` (docs/behaviours.md 1): the verdict `kubectl apply` would give an
//! AgentRun, offline. Every document of every file (`-` is standard input; YAML with `---`
//! between documents, or JSON) that is an `agentrt.dev` AgentRun is decoded as the API server
//! would (serde's defaults are the CRD's) and checked by
//! [`engine::validate::spec`](crate::engine::validate::spec), the rules the webhook and the
//! engine apply; any other document is skipped with a note on standard error.
//!
//! Owns: reading the files and the report's lines, `FILE: NAMESPACE/NAME: field: message`.
//! Must not: contact an API server.

use std::io::Read;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::Value;

use crate::engine::validate::spec;

/// What linting the files found.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// One line per problem: `FILE: NAMESPACE/NAME: field: message`.
    pub problems: Vec<String>,
    /// One line per skipped document: `FILE: document N (KIND NAME) is not an AgentRun; skipped`.
    pub notes: Vec<String>,
    /// AgentRuns checked.
    pub runs: usize,
}

/// Lints `files` (`-` reads standard input; a directory stands for its `.yaml`, `.yml` and
/// `.json` files in name order, not those of its subdirectories, as `kubectl apply -f DIR`).
///
/// # Errors
/// A file or directory that cannot be read, or a file that is not YAML/JSON (naming it and the
/// document).
pub fn lint_files(files: &[String]) -> anyhow::Result<Report> {
    let mut report = Report::default();
    for file in &expand_directories(files)? {
        let text = if file == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read standard input")?;
            text
        } else {
            std::fs::read_to_string(file).with_context(|| format!("cannot read {file}"))?
        };
        let shown = if file == "-" {
            "<stdin>"
        } else {
            file.as_str()
        };
        lint_text(shown, &text, &mut report)?;
    }
    Ok(report)
}

/// `files` with each directory replaced by its manifest files (`.yaml`, `.yml`, `.json`), sorted.
fn expand_directories(files: &[String]) -> anyhow::Result<Vec<String>> {
    let mut expanded = Vec::new();
    for file in files {
        let path = std::path::Path::new(file);
        if file == "-" || !path.is_dir() {
            expanded.push(file.clone());
            continue;
        }
        let mut inside = Vec::new();
        for entry in std::fs::read_dir(path).with_context(|| format!("cannot read {file}"))? {
            let entry = entry.with_context(|| format!("cannot read {file}"))?;
            let manifest = entry.path();
            let is_manifest = manifest
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
            if is_manifest && manifest.is_file() {
                inside.push(manifest.display().to_string());
            }
        }
        inside.sort();
        expanded.extend(inside);
    }
    Ok(expanded)
}

/// Lints the documents of one file's `text`, shown as `file`, into `report`.
///
/// # Errors
/// A document that is not YAML (naming the file and the document's number, from 1).
pub fn lint_text(file: &str, text: &str, report: &mut Report) -> anyhow::Result<()> {
    for (n, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let number = n + 1;
        let value = Value::deserialize(document)
            .with_context(|| format!("{file}: document {number} is not YAML or JSON"))?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        let kind = value["kind"].as_str().unwrap_or("");
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        let group = value["apiVersion"]
            .as_str()
            .and_then(|v| v.split('/').next())
            .unwrap_or("");
        if kind != "AgentRun" || group != "agentrt.dev" {
            report.notes.push(format!(
                "{file}: document {number} ({} {}) is not an AgentRun; skipped",
                if kind.is_empty() { "no kind" } else { kind },
                if name.is_empty() { "-" } else { name },
            ));
            continue;
        }
        report.runs += 1;
        let namespace = value["metadata"]["namespace"].as_str().unwrap_or("default");
        let object = format!("{namespace}/{}", if name.is_empty() { "-" } else { name });
        if name.is_empty() && value["metadata"]["generateName"].is_null() {
            report.problems.push(format!(
                "{file}: {object}: metadata.name: must be set; name the run"
            ));
        }
        match crate::api::decode_spec(&value["spec"]) {
            Ok(decoded) => {
                report
                    .problems
                    .extend(decoded.unknown_fields.iter().map(|field| {
                        format!(
                            "{file}: {object}: {field}: unknown field; kubectl apply refuses it \
                             (`kubectl explain agentrun.spec` lists the fields)"
                        )
                    }));
                report.problems.extend(
                    spec::run(name, &decoded.spec)
                        .into_iter()
                        .map(|p| format!("{file}: {object}: {p}")),
                );
            }
            Err(err) => report.problems.push(format!(
                "{file}: {object}: {err}; compare it with `kubectl explain agentrun.spec`"
            )),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: &str = r#"
apiVersion: agentrt.dev/v1alpha1
kind: AgentRun
metadata: {name: weather, namespace: demo}
spec:
  goal: Say the weather.
  agent: {scripted: {decisions: [{kind: complete, result: {}}]}}
  tools:
  - name: get weather!
    sideEffect: ReadOnly
    inputSchema: {type: objekt}
    http: {url: "ftp://x/y"}
"#;

    #[test]
    fn every_problem_of_every_run_is_a_line_and_other_kinds_are_skipped_with_a_note() {
        let text =
            format!("{RUN}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\n---\n");
        let mut report = Report::default();
        lint_text("a.yaml", &text, &mut report).expect("lints");
        assert_eq!(report.runs, 1);
        assert_eq!(report.problems.len(), 3, "{:?}", report.problems);
        assert!(report.problems[0].starts_with(
            "a.yaml: demo/weather: spec.tools[0].name: \"get weather!\" is not a valid function name"
        ));
        assert!(report.problems[1].starts_with("a.yaml: demo/weather: spec.tools[0].http.url: "));
        assert!(report.problems[2].starts_with("a.yaml: demo/weather: spec.tools[0].inputSchema: "));
        assert_eq!(
            report.notes,
            vec!["a.yaml: document 2 (ConfigMap c) is not an AgentRun; skipped"]
        );
    }

    #[test]
    fn a_spec_that_does_not_decode_is_a_problem_naming_the_field_by_its_path() {
        let mut report = Report::default();
        let text = RUN.replace("sideEffect: ReadOnly", "sideEffect: Harmless");
        lint_text("b.yaml", &text, &mut report).expect("lints");
        assert_eq!(report.problems.len(), 1);
        assert!(
            report.problems[0].starts_with("b.yaml: demo/weather: spec.tools[0].sideEffect: "),
            "{:?}",
            report.problems
        );
        let mut report = Report::default();
        let text = RUN.replace("  tools:\n", "  limits: {maxSteps: ten}\n  tools:\n");
        lint_text("c.yaml", &text, &mut report).expect("lints");
        assert_eq!(report.problems.len(), 1);
        assert!(
            report.problems[0].starts_with(
                "c.yaml: demo/weather: spec.limits.maxSteps: invalid type: string \"ten\", \
                 expected an integer"
            ),
            "{:?}",
            report.problems
        );
    }

    #[test]
    fn a_field_no_agentrun_has_is_a_problem_as_kubectl_apply_refuses_it() {
        let mut report = Report::default();
        let text = RUN.replace("  tools:\n", "  limit: {maxSteps: 3}\n  tools:\n");
        lint_text("d.yaml", &text, &mut report).expect("lints");
        assert!(
            report.problems[0].starts_with("d.yaml: demo/weather: spec.limit: unknown field"),
            "{:?}",
            report.problems
        );
        // The other problems are still reported.
        assert_eq!(report.problems.len(), 4, "{:?}", report.problems);
    }
}
