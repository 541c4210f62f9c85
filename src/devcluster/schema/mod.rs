//! Structural schema admission for custom resources: pruning, defaulting, validation, CEL.
//!
//! This room owns what kube-apiserver 1.32 does to a custom resource between decoding it and
//! storing it, for CRDs of `apiextensions.k8s.io/v1`: JSON numbers normalized as Go stores them,
//! fields the schema does not declare pruned (reported per `fieldValidation`), `default:`s
//! applied, the OpenAPI v3 schema validated, `x-kubernetes-list-type` invariants checked and the
//! `x-kubernetes-validations` CEL rules run (transition rules with `oldSelf` on update), with
//! kube-apiserver's messages and field paths, and the 422 `Status` it answers with. When a CRD is
//! written ([`CompiledSchema::check`]) the rules are type-checked against the CEL types of the
//! structural schema and their cost estimated, refused as kube-apiserver v1.34 refuses them.
//!
//! It is pure and synchronous: no I/O, no clock, no async. It does not know agentrt's types, the
//! HTTP server, storage, metadata validation or which GVK an object must have; the server around it
//! (`src/devcluster/`) does. The rules come from apiextensions-apiserver (`pkg/apiserver/schema`,
//! `pkg/registry/customresource`) and kube-openapi (`pkg/validation`).

mod cel_check;
mod cel_cost;
mod cel_eval;
mod cel_lib;
mod cel_reads;
mod cel_types;
mod cel_unify;
mod cel_value;
mod embedded;
mod formats;
mod gofmt;
mod listtype;
mod node;
mod numbers;
mod openapi;
mod path;
mod prune;
mod rules;
mod status;

use serde_json::Value;

use node::{Node, Site};
use rules::{Checks, RuleEnv};

/// How unknown fields are treated (the `fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Prune unknown fields silently.
    Ignore,
    /// Prune unknown fields and return a warning for each.
    Warn,
    /// Refuse an object with unknown fields (400).
    #[default]
    Strict,
}

/// One field error, as kube-apiserver's field.Error.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// What is wrong (the cause's `reason`).
    pub kind: FieldErrorKind,
    /// The field path, e.g. `spec.tools[0].name` (`<nil>` for the whole object).
    pub field: String,
    /// The value printed after the kind, when the kind prints one.
    pub bad_value: Option<serde_json::Value>,
    /// The explanation printed last.
    pub detail: String,
}

/// The kinds of field error kube-apiserver raises for custom resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required,
    /// `Invalid value` (also kube-apiserver's FieldValueTypeInvalid, which prints the same).
    Invalid,
    /// `Unsupported value` (enum).
    NotSupported,
    /// `Duplicate value`.
    Duplicate,
    /// `Too long`.
    TooLong,
    /// `Too many`.
    TooMany,
    /// `Forbidden`.
    Forbidden,
    /// `Internal error` (no value printed).
    Internal,
    /// `Invalid value` whose bad value is a Go struct kube-apiserver prints as JSON (a CRD's
    /// `ValidationRule`): `bad_value` holds that JSON text as a string, printed as it is.
    InvalidStruct,
}

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionError {
    /// Strict field validation found unknown/duplicate fields: 400 BadRequest. Each entry is a message such as `unknown field "spec.foo"`.
    #[error("strict decoding error: {}", .0.join(", "))]
    StrictDecoding(Vec<String>),
    /// 422 Invalid with these causes.
    #[error("{}", status::aggregate(&.0.iter().map(ToString::to_string).collect::<Vec<_>>()))]
    Invalid(Vec<FieldError>),
}

/// Why a CRD version's `openAPIV3Schema` was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaError {
    /// The schema itself is malformed (the first problem found, as one message).
    Structural(String),
    /// Its CEL rules are refused: each refusal with its field path from `openAPIV3Schema`
    /// (e.g. `openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule`).
    Rules(Vec<FieldError>),
}

/// One CRD version's compiled `openAPIV3Schema`.
pub struct CompiledSchema {
    root: Node,
    env: RuleEnv,
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledSchema").finish_non_exhaustive()
    }
}

/// The detail kube-apiserver appends when schema errors keep CEL rules from running.
const RULES_NOT_CHECKED: &str = "some validation rules were not checked because the object was \
                                 invalid; correct the existing errors to complete validation";

impl CompiledSchema {
    /// Compiles a CRD version's openAPIV3Schema (the JSON under `schema.openAPIV3Schema`).
    ///
    /// # Errors
    /// When the schema is not one a CRD could declare: an unknown `type`, a bad `pattern`, a CEL
    /// rule that does not compile or type-check, a transition rule where `oldSelf` cannot be
    /// correlated, a `fieldPath` naming no field, a root that is not `type: object`, ... (the
    /// refusals of [`CompiledSchema::check`], one a line).
    pub fn compile(open_api_v3_schema: &serde_json::Value) -> Result<CompiledSchema, String> {
        Self::check(open_api_v3_schema).map_err(|e| match e {
            SchemaError::Structural(msg) => msg,
            SchemaError::Rules(errors) => errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        })
    }

    /// Compiles a CRD version's openAPIV3Schema as kube-apiserver does when the CRD is written,
    /// refusing what it refuses.
    ///
    /// # Errors
    /// [`SchemaError::Rules`] with every refusal of the CEL rules (type errors, undefined fields,
    /// unknown functions, costs over budget, ...), field paths from `openAPIV3Schema`;
    /// [`SchemaError::Structural`] for the first other problem of the schema.
    pub fn check(open_api_v3_schema: &serde_json::Value) -> Result<CompiledSchema, SchemaError> {
        let env = RuleEnv::new().map_err(|e| SchemaError::Structural(e.to_string()))?;
        let site = Site::root();
        let mut checks = Checks::new(&env);
        let root = Node::parse(open_api_v3_schema, &site, &mut checks)
            .map_err(|e| SchemaError::Structural(e.to_string()))?;
        if root.ty != Some(node::SchemaType::Object) {
            return Err(SchemaError::Structural(format!(
                "openAPIV3Schema.type: Invalid value: {}: must be object at the root",
                open_api_v3_schema.get("type").unwrap_or(&Value::Null)
            )));
        }
        checks.finish();
        if !checks.errors.is_empty() {
            return Err(SchemaError::Rules(checks.errors));
        }
        Ok(CompiledSchema { root, env })
    }

    /// Admits `object` (a whole custom resource, apiVersion/kind/metadata included) for create (`old` None) or update (`old` Some): normalizes JSON numbers as kube-apiserver stores them, prunes undeclared fields (except under x-kubernetes-preserve-unknown-fields; apiVersion/kind/metadata are kept as they are), applies `default:`s, validates. Returns warnings (for fieldValidation=Warn, e.g. `unknown field "spec.foo"`).
    ///
    /// On update, errors on values unchanged since `old` are ratcheted as kube-apiserver 1.32
    /// does: schema errors there are dropped, failures of rules that do not read `oldSelf` become
    /// warnings.
    ///
    /// # Errors
    /// [`AdmissionError::StrictDecoding`] for unknown fields under [`FieldValidation::Strict`],
    /// [`AdmissionError::Invalid`] with every field error otherwise.
    pub fn admit(
        &self,
        object: &mut serde_json::Value,
        old: Option<&serde_json::Value>,
        mode: FieldValidation,
    ) -> Result<Vec<String>, AdmissionError> {
        numbers::normalize(object);
        let unknown = prune::prune(object, &self.root);
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            // kube-apiserver writes `unknown field "%s"`: quoted, not escaped.
            let messages = unknown.iter().map(|p| format!("unknown field \"{p}\""));
            match mode {
                FieldValidation::Strict => {
                    return Err(AdmissionError::StrictDecoding(messages.collect()))
                }
                FieldValidation::Warn => warnings.extend(messages),
                FieldValidation::Ignore => {}
            }
        }
        self.decode(object);
        // The stored object is read back through the same decoding before it is compared.
        let old = old.map(|o| {
            let mut o = o.clone();
            numbers::normalize(&mut o);
            prune::prune(&mut o, &self.root);
            self.decode(&mut o);
            o
        });
        let old = old.as_ref();

        let issues = openapi::validate(&self.root, object, old);
        let blocked = issues.iter().any(openapi::Issue::blocks_rules);
        let mut errors: Vec<FieldError> = issues.into_iter().map(|i| i.error).collect();
        errors.extend(embedded::validate(&self.root, object));
        // List invariants ratchet as a whole: checked when the old object kept them.
        if old.is_none_or(|o| listtype::validate(&self.root, o).is_empty()) {
            errors.extend(listtype::validate(&self.root, object));
        }
        if self.root.has_rules {
            let blocked = blocked
                || errors.iter().any(|e| {
                    matches!(
                        e.kind,
                        FieldErrorKind::Required | FieldErrorKind::NotSupported
                    )
                });
            if blocked {
                errors.push(FieldError {
                    kind: FieldErrorKind::Invalid,
                    field: "<nil>".to_string(),
                    bad_value: None,
                    detail: RULES_NOT_CHECKED.to_string(),
                });
            } else {
                let outcome = cel_eval::run(&self.env, &self.root, object, old);
                errors.extend(outcome.errors);
                warnings.extend(outcome.warnings);
            }
        }
        if errors.is_empty() {
            Ok(warnings)
        } else {
            Err(AdmissionError::Invalid(errors))
        }
    }

    /// What kube-apiserver does after pruning, on every decode: drop non-nullable nulls without
    /// a default, then apply defaults.
    fn decode(&self, object: &mut Value) {
        prune::drop_non_nullable_nulls(object, Some(&self.root));
        prune::apply_defaults(object, &self.root);
    }
}

/// The 422 `Status` body kube-apiserver writes for these causes, e.g. message `AgentRun.agentrt.dev "x" is invalid: spec.goal: Required value`.
pub fn invalid_status(
    kind: &str,
    group: &str,
    name: &str,
    errors: &[FieldError],
) -> serde_json::Value {
    status::invalid(kind, group, name, errors)
}
