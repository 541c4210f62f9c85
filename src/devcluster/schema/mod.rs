//! Structural schema admission for custom resources: pruning, defaulting, validation, CEL.
//!
//! STUB. This file is the interface between the embedded API server core (which calls it) and
//! the schema engine (owned by another branch, which replaces this body keeping the signatures).
//! Until then `compile` accepts every schema, `admit` admits every object unchanged, and
//! `invalid_status` writes kube-apiserver's 422 `Status` for the causes it is given.

use serde_json::{json, Value};

/// How unknown fields are treated (the `fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and return a warning for each.
    Warn,
    /// Refuse the request when it carries unknown or duplicate fields.
    #[default]
    Strict,
}

/// One field error, as kube-apiserver's field.Error.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// What is wrong.
    pub kind: FieldErrorKind,
    /// The JSON path of the field, e.g. `spec.goal`.
    pub field: String,
    /// The offending value, when there is one to show.
    pub bad_value: Option<Value>,
    /// Free text appended to the message.
    pub detail: String,
}

/// The kinds of field errors kube-apiserver reports (field.ErrorType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`
    Required,
    /// `Invalid value`
    Invalid,
    /// `Unsupported value`
    NotSupported,
    /// `Duplicate value`
    Duplicate,
    /// `Too long`
    TooLong,
    /// `Too many`
    TooMany,
    /// `Forbidden`
    Forbidden,
}

/// Why an object was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmissionError {
    /// Strict field validation found unknown/duplicate fields: 400 BadRequest. Each entry is a
    /// message such as `unknown field "spec.foo"`.
    StrictDecoding(Vec<String>),
    /// 422 Invalid with these causes.
    Invalid(Vec<FieldError>),
}

/// One CRD version's compiled `openAPIV3Schema`.
pub struct CompiledSchema {
    _schema: Value,
}

impl CompiledSchema {
    /// Compiles a CRD version's openAPIV3Schema (the JSON under `schema.openAPIV3Schema`).
    ///
    /// # Errors
    /// A message saying what in the schema cannot be compiled (the stub never fails).
    pub fn compile(open_api_v3_schema: &Value) -> Result<CompiledSchema, String> {
        Ok(CompiledSchema {
            _schema: open_api_v3_schema.clone(),
        })
    }

    /// Admits `object` (a whole custom resource, apiVersion/kind/metadata included) for create
    /// (`old` None) or update (`old` Some): normalizes JSON numbers as kube-apiserver stores
    /// them, prunes undeclared fields (except under x-kubernetes-preserve-unknown-fields;
    /// metadata/apiVersion/kind are kept), applies `default:`s, validates. Returns warnings (for
    /// fieldValidation=Warn, e.g. `unknown field "spec.foo"`).
    ///
    /// # Errors
    /// [`AdmissionError::StrictDecoding`] or [`AdmissionError::Invalid`] (the stub never fails).
    pub fn admit(
        &self,
        object: &mut Value,
        old: Option<&Value>,
        mode: FieldValidation,
    ) -> Result<Vec<String>, AdmissionError> {
        let _ = (object, old, mode);
        Ok(Vec::new())
    }
}

/// The 422 `Status` body kube-apiserver writes for these causes, e.g. message
/// `AgentRun.agentrt.dev "x" is invalid: spec.goal: Required value`.
pub fn invalid_status(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Value {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let mut messages: Vec<String> = Vec::new();
    let mut causes = Vec::new();
    for error in errors {
        let body = error_body(error);
        let full = format!("{}: {}", error.field, body);
        if !messages.contains(&full) {
            messages.push(full);
        }
        causes.push(json!({
            "reason": cause_type(error.kind),
            "message": body,
            "field": error.field,
        }));
    }
    let message = match messages.len() {
        0 => format!("{qualified} {name:?} is invalid"),
        1 => format!("{qualified} {name:?} is invalid: {}", messages[0]),
        _ => format!("{qualified} {name:?} is invalid: [{}]", messages.join(", ")),
    };
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "details": {"name": name, "group": group, "kind": kind, "causes": causes},
        "code": 422,
    })
}

fn cause_type(kind: FieldErrorKind) -> &'static str {
    match kind {
        FieldErrorKind::Required => "FieldValueRequired",
        FieldErrorKind::Invalid => "FieldValueInvalid",
        FieldErrorKind::NotSupported => "FieldValueNotSupported",
        FieldErrorKind::Duplicate => "FieldValueDuplicate",
        FieldErrorKind::TooLong => "FieldValueTooLong",
        FieldErrorKind::TooMany => "FieldValueTooMany",
        FieldErrorKind::Forbidden => "FieldValueForbidden",
    }
}

fn error_body(error: &FieldError) -> String {
    let mut body = match error.kind {
        FieldErrorKind::Required => "Required value".to_string(),
        FieldErrorKind::Forbidden => "Forbidden".to_string(),
        FieldErrorKind::TooLong => "Too long".to_string(),
        other => {
            let label = match other {
                FieldErrorKind::Invalid => "Invalid value",
                FieldErrorKind::NotSupported => "Unsupported value",
                FieldErrorKind::Duplicate => "Duplicate value",
                _ => "Too many",
            };
            match &error.bad_value {
                Some(value) => format!("{label}: {value}"),
                None => label.to_string(),
            }
        }
    };
    if !error.detail.is_empty() {
        body.push_str(": ");
        body.push_str(&error.detail);
    }
    body
}
