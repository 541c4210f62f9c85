//! `agentrt lint -f FILE...` (docs/behaviours.md 1, 101): the verdict `kubectl apply` would give
//! an AgentRun, offline. Every document of every file (`-` is standard input; YAML with `---`
//! between documents, or JSON) that is an `agentrt.dev` AgentRun is decoded as the API server
//! would (serde's defaults are the CRD's) and checked by
//! [`engine::validate::spec`](crate::engine::validate::spec), the rules the webhook and the
//! engine apply.
//!
//! Admin policies (docs/design.md section 6, admin policies): the `AgentPolicy` and
//! `ClusterAgentPolicy` documents among the files, in `--policy` files, or read from the cluster
//! (`--policies-from-cluster`, [`cluster`]) are linted themselves (their rules as a run's, an
//! unknown side-effect class or outcome named by its path) and select the runs as the
//! controller selects them ([`engine::policy::select`](crate::engine::policy::select)); a run
//! over a ceiling is refused by
//! [`ceiling_refusals`](crate::engine::policy::admin::ceiling_refusals), the webhook's rule, in
//! the webhook's words. A ClusterAgentPolicy's `namespaceSelector` is matched against the
//! labels of a `Namespace` document among the files (or the cluster's), else against the
//! `kubernetes.io/metadata.name` label every namespace carries, with a note. Any other document
//! is skipped with a note on standard error.
//!
//! Owns: reading the files and the report's lines, `FILE: NAMESPACE/NAME: field: message`.
//! Must not: contact an API server (but [`cluster`], when asked).

pub mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use anyhow::Context as _;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::api::{AgentPolicy, AgentPolicySpec, ClusterAgentPolicy, ClusterAgentPolicySpec};
use crate::engine::policy::admin::{ceiling_refusals, policy_problems, AdminPolicy};
use crate::engine::policy::select::select;
use crate::engine::validate::spec;

/// The label kube-apiserver puts on every namespace: its name.
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What linting the files found.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    /// One line per problem: `FILE: NAMESPACE/NAME: field: message` (for a policy
    /// `FILE: AgentPolicy NAMESPACE/NAME: field: message`).
    pub problems: Vec<String>,
    /// One line per skipped document: `FILE: document N (KIND NAME) is not an AgentRun; skipped`,
    /// and what a reader should know of how a policy was applied.
    pub notes: Vec<String>,
    /// AgentRuns checked.
    pub runs: usize,
    /// Admin policies (AgentPolicy, ClusterAgentPolicy) read and checked.
    pub policies: usize,
}

/// One document, and where it was read.
#[derive(Debug, Clone)]
struct Document {
    file: String,
    value: Value,
}

/// The documents of every file, sorted by what they are, before anything is checked (a
/// policy in a later file applies to a run in an earlier one).
#[derive(Debug, Default)]
pub struct Documents {
    runs: Vec<Document>,
    policies: Vec<Document>,
    /// Namespace name → its labels, from Namespace documents (or the cluster).
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Policies read from the cluster (not linted again, not counted).
    cluster_policies: Vec<ClusterAgentPolicy>,
    namespaced_policies: Vec<AgentPolicy>,
    notes: Vec<String>,
}

impl Documents {
    /// The namespaces the runs are in (`default_namespace` for one that names none).
    pub fn run_namespaces(&self, default_namespace: &str) -> BTreeSet<String> {
        self.runs
            .iter()
            .map(|d| namespace_of(&d.value, default_namespace))
            .collect()
    }

    /// Adds the admin policies and a namespace's labels read from a cluster.
    pub fn add_from_cluster(
        &mut self,
        cluster: Vec<ClusterAgentPolicy>,
        namespaced: Vec<AgentPolicy>,
        namespaces: BTreeMap<String, BTreeMap<String, String>>,
    ) {
        self.cluster_policies.extend(cluster);
        self.namespaced_policies.extend(namespaced);
        self.namespaces.extend(namespaces);
    }
}

/// Lints `files` (`-` reads standard input; a directory stands for its `.yaml`, `.yml` and
/// `.json` files in name order, not those of its subdirectories, as `kubectl apply -f DIR`)
/// under the admin policies among them and in `policy_files`; a document without a namespace is
/// in `default_namespace`.
///
/// # Errors
/// A file or directory that cannot be read, or a file that is not YAML/JSON (naming it and the
/// document).
pub fn lint_files(
    files: &[String],
    policy_files: &[String],
    default_namespace: &str,
) -> anyhow::Result<Report> {
    let documents = read_files(files, policy_files)?;
    Ok(check(documents, default_namespace))
}

/// Reads `files` and `policy_files` (as [`lint_files`]) into documents to [`check`].
///
/// # Errors
/// As [`lint_files`].
pub fn read_files(files: &[String], policy_files: &[String]) -> anyhow::Result<Documents> {
    let mut documents = Documents::default();
    for (list, policies_only) in [(files, false), (policy_files, true)] {
        for file in &expand_directories(list)? {
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
            read_text(shown, &text, policies_only, &mut documents)?;
        }
    }
    Ok(documents)
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

/// Lints the documents of one file's `text`, shown as `file`, into `report` (the admin
/// policies among them apply to its runs; a document without a namespace is in `default`).
///
/// # Errors
/// A document that is not YAML (naming the file and the document's number, from 1).
pub fn lint_text(file: &str, text: &str, report: &mut Report) -> anyhow::Result<()> {
    let mut documents = Documents::default();
    read_text(file, text, false, &mut documents)?;
    let found = check(documents, "default");
    report.problems.extend(found.problems);
    report.notes.extend(found.notes);
    report.runs += found.runs;
    report.policies += found.policies;
    Ok(())
}

/// Sorts the documents of `text` into `documents`; with `policies_only` (a `--policy` file) an
/// AgentRun is skipped with a note.
fn read_text(
    file: &str,
    text: &str,
    policies_only: bool,
    documents: &mut Documents,
) -> anyhow::Result<()> {
    for (n, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let number = n + 1;
        let value = Value::deserialize(document)
            .with_context(|| format!("{file}: document {number} is not YAML or JSON"))?;
        if value.is_null() {
            continue; // an empty document (`---` at the end)
        }
        let kind = value["kind"].as_str().unwrap_or("");
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        let api_version = value["apiVersion"].as_str().unwrap_or("");
        let group = api_version.split('/').next().unwrap_or("");
        let skipped = |what: &str| {
            format!(
                "{file}: document {number} ({} {}) is not {what}; skipped",
                if kind.is_empty() { "no kind" } else { kind },
                if name.is_empty() { "-" } else { name },
            )
        };
        let document = Document {
            file: file.to_string(),
            value: value.clone(),
        };
        match (group, kind) {
            ("agentrt.dev", "AgentPolicy" | "ClusterAgentPolicy") => {
                documents.policies.push(document)
            }
            ("v1", "Namespace") if !name.is_empty() => {
                documents
                    .namespaces
                    .insert(name.to_string(), labels_of(&value["metadata"]));
            }
            ("agentrt.dev", "AgentRun") if !policies_only => documents.runs.push(document),
            _ if policies_only => documents
                .notes
                .push(skipped("an AgentPolicy or ClusterAgentPolicy")),
            _ => documents.notes.push(skipped("an AgentRun")),
        }
    }
    Ok(())
}

/// `metadata.labels` as a map (values that are not strings left out).
fn labels_of(metadata: &Value) -> BTreeMap<String, String> {
    metadata["labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn namespace_of(value: &Value, default_namespace: &str) -> String {
    value["metadata"]["namespace"]
        .as_str()
        .unwrap_or(default_namespace)
        .to_string()
}

/// Decodes an admin policy's `spec` as the API server would, naming a field that does not
/// decode by its path; each field no such policy has is a problem too.
fn decode_policy_spec<T: DeserializeOwned>(spec: &Value) -> Result<T, Vec<String>> {
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let decoded: Result<T, _> = {
        let tracked = serde_path_to_error::Deserializer::new(spec, &mut track);
        serde_ignored::deserialize(tracked, |path| unknown.push(format!("spec.{path}")))
    };
    let mut problems: Vec<String> = unknown
        .into_iter()
        .map(|field| {
            if field.starts_with("spec.sideEffects.") {
                format!(
                    "{field}: unknown side-effect class; use ReadOnly, LocalMutation, \
                     RemoteMutation or Destructive"
                )
            } else {
                format!(
                    "{field}: unknown field; kubectl apply refuses it (`kubectl explain \
                     agentpolicy.spec` lists the fields)"
                )
            }
        })
        .collect();
    match decoded {
        Ok(spec) if problems.is_empty() => Ok(spec),
        Ok(_) => Err(problems),
        Err(err) => {
            let path = track.path().to_string();
            let field = if path == "." || path.is_empty() {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            problems.push(format!("{field}: {err}"));
            Err(problems)
        }
    }
}

/// Checks the documents: each admin policy, then each run (its spec, then its limits against
/// the ceilings of the admin policies that select it).
pub fn check(documents: Documents, default_namespace: &str) -> Report {
    let mut report = Report {
        notes: documents.notes.clone(),
        ..Report::default()
    };
    let mut cluster = documents.cluster_policies.clone();
    let mut namespaced = documents.namespaced_policies.clone();
    for document in &documents.policies {
        let value = &document.value;
        let file = &document.file;
        let kind = value["kind"].as_str().unwrap_or("");
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        report.policies += 1;
        let shown = if kind == "AgentPolicy" {
            format!(
                "AgentPolicy {}/{}",
                namespace_of(value, default_namespace),
                if name.is_empty() { "-" } else { name }
            )
        } else {
            format!(
                "ClusterAgentPolicy {}",
                if name.is_empty() { "-" } else { name }
            )
        };
        if name.is_empty() {
            report.problems.push(format!(
                "{file}: {shown}: metadata.name: must be set; name the policy"
            ));
        }
        let admin = if kind == "AgentPolicy" {
            decode_policy_spec::<AgentPolicySpec>(&value["spec"]).map(|spec| {
                let mut policy = AgentPolicy::new(name, spec);
                policy.metadata.namespace = Some(namespace_of(value, default_namespace));
                policy.metadata.labels = Some(labels_of(&value["metadata"]));
                let admin = AdminPolicy::from_namespaced(&policy);
                namespaced.push(policy);
                admin
            })
        } else {
            decode_policy_spec::<ClusterAgentPolicySpec>(&value["spec"]).map(|spec| {
                let policy = ClusterAgentPolicy::new(name, spec);
                let admin = AdminPolicy::from_cluster(&policy);
                cluster.push(policy);
                admin
            })
        };
        match admin {
            Ok(admin) => report.problems.extend(
                policy_problems(&admin)
                    .into_iter()
                    .map(|p| format!("{file}: {shown}: {p}")),
            ),
            Err(problems) => report.problems.extend(
                problems
                    .into_iter()
                    .map(|p| format!("{file}: {shown}: {p}")),
            ),
        }
    }
    let mut noted = BTreeSet::new();
    for document in &documents.runs {
        let (file, value) = (&document.file, &document.value);
        report.runs += 1;
        let name = value["metadata"]["name"].as_str().unwrap_or("");
        let namespace = namespace_of(value, default_namespace);
        let object = format!("{namespace}/{}", if name.is_empty() { "-" } else { name });
        if name.is_empty() && value["metadata"]["generateName"].is_null() {
            report.problems.push(format!(
                "{file}: {object}: metadata.name: must be set; name the run"
            ));
        }
        if let Some(problem) = (!name.is_empty()).then(|| run_name_problem(name)).flatten() {
            report.problems.push(format!("{file}: {object}: {problem}"));
        }
        let decoded = crate::api::decode_spec(&value["spec"]);
        // Every field the schema refuses, not only the first serde stops at (that one is said
        // in serde's words, as the webhook says it).
        let first = decoded.as_ref().err().map(|err| {
            report.problems.push(format!(
                "{file}: {object}: {err}; compare it with `kubectl explain agentrun.spec`"
            ));
            err.split(": ").next().unwrap_or_default().to_string()
        });
        report.problems.extend(
            schema_problems(&value["spec"])
                .into_iter()
                .filter(|(path, _)| first.as_deref() != Some(path.as_str()))
                .map(|(path, problem)| format!("{file}: {object}: {path}: {problem}")),
        );
        if let Ok(decoded) = decoded {
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
            let mut namespace_labels = documents
                .namespaces
                .get(&namespace)
                .cloned()
                .unwrap_or_default();
            namespace_labels.insert(NAME_LABEL.to_string(), namespace.clone());
            let known = documents.namespaces.contains_key(&namespace);
            for policy in cluster
                .iter()
                .filter(|p| p.spec.namespace_selector.is_some())
            {
                let policy_name = policy.metadata.name.clone().unwrap_or_default();
                if !known && noted.insert((namespace.clone(), policy_name.clone())) {
                    report.notes.push(format!(
                        "the labels of namespace {namespace} are not among the files: \
                         ClusterAgentPolicy {policy_name}'s namespaceSelector was matched \
                         against {NAME_LABEL}={namespace} only (add the Namespace manifest, \
                         or pass --policies-from-cluster)"
                    ));
                }
            }
            let admins = select(
                &cluster,
                &namespaced,
                &namespace,
                &labels_of(&value["metadata"]),
                Some(&namespace_labels),
            );
            report.problems.extend(
                ceiling_refusals(&decoded.spec.limits, &admins)
                    .into_iter()
                    .map(|v| format!("{file}: {object}: {v}")),
            );
        }
    }
    report
}

#[cfg(test)]
mod tests;

/// The AgentRun CRD's schema of `spec` as a JSON Schema validator, built once: the OpenAPI
/// schema of `agentrt crds` with `nullable: true` read as JSON Schema says it (`type` also
/// `null`); the `x-kubernetes-*` extensions are left to the API server.
fn spec_schema() -> Option<&'static jsonschema::Validator> {
    static SCHEMA: std::sync::OnceLock<Option<jsonschema::Validator>> = std::sync::OnceLock::new();
    SCHEMA
        .get_or_init(|| {
            let crd = serde_json::to_value(crate::api::agentrun_crd()).ok()?;
            let mut spec = crd
                .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/spec")?
                .clone();
            nullable_as_json_schema(&mut spec);
            jsonschema::validator_for(&spec).ok()
        })
        .as_ref()
}

/// `nullable: true` as JSON Schema says it, everywhere in `schema`.
fn nullable_as_json_schema(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.get("nullable") == Some(&Value::Bool(true)) {
                if let Some(Value::String(kind)) = map.get("type").cloned() {
                    map.insert("type".into(), serde_json::json!([kind, "null"]));
                }
            }
            map.values_mut().for_each(nullable_as_json_schema);
        }
        Value::Array(items) => items.iter_mut().for_each(nullable_as_json_schema),
        _ => {}
    }
}

/// Every place where `spec` breaks the CRD's schema, as `(path, problem)`: the path as
/// `spec.tools[0].name`, the problem in the schema's words with the value bounded (a type, an
/// enum, a bound). The API server refuses each of these; serde stops at the first.
fn schema_problems(spec: &Value) -> Vec<(String, String)> {
    let Some(validator) = spec_schema() else {
        return Vec::new();
    };
    validator
        .iter_errors(spec)
        .map(|err| {
            let mut path = String::from("spec");
            for part in err.instance_path().as_str().split('/').skip(1) {
                let part = part.replace("~1", "/").replace("~0", "~");
                if part.bytes().all(|b| b.is_ascii_digit()) && !part.is_empty() {
                    path.push_str(&format!("[{part}]"));
                } else {
                    path.push('.');
                    path.push_str(&part);
                }
            }
            let problem = super::escape::escape_bounded(&err.to_string(), 200);
            (path, problem)
        })
        .collect()
}

/// Why `name` is not a name the API server gives an AgentRun: a DNS-1123 subdomain, and at most
/// 63 characters ([`crate::api::RUN_NAME_RULE`]); `None` when it is one.
fn run_name_problem(name: &str) -> Option<String> {
    if !super::args::is_object_name(name) {
        return Some(format!(
            "metadata.name: {:?} is not a valid name: use lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit",
            super::escape::escape_bounded(name, 80)
        ));
    }
    (name.chars().count() > 63).then(|| {
        "metadata.name: must be no more than 63 characters: it is the value of the run's \
         Approvals' label agentrt.dev/run; choose a shorter name"
            .to_string()
    })
}
