//! Compiling `x-kubernetes-validations`: each rule's CEL program (and `messageExpression`) is
//! compiled once with the `cel` crate, its `fieldPath` resolved against the schema, and the checks
//! kube-apiserver makes when a CRD is written are made here (a transition rule only where `oldSelf`
//! can be correlated, `optionalOldSelf` only on transition rules, known `reason`s).

use std::sync::Arc;

use cel::{Env, Program};
use serde_json::Value;

use super::node::{CompileError, Node, Site};
use super::path::FieldPath;

/// The CEL environment every rule is compiled and run in: the standard library plus the `cel`
/// crate's strings and lists extensions (Kubernetes' `lowerAscii`, `split`, `join`, ...).
#[derive(Clone)]
pub(super) struct RuleEnv(pub(super) Arc<Env>);

impl RuleEnv {
    /// Builds the environment.
    pub(super) fn new() -> Result<RuleEnv, CompileError> {
        let mut env = Env::stdlib();
        let ext = |e: cel::DeclarationError| CompileError::Invalid {
            path: "cel".to_string(),
            value: String::new(),
            detail: e.to_string(),
        };
        cel::extensions::strings(&mut env).map_err(ext)?;
        cel::extensions::lists(&mut env).map_err(ext)?;
        Ok(RuleEnv(Arc::new(env)))
    }
}

/// The `reason` of a rule: which field error a failure raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reason {
    Invalid,
    Forbidden,
    Required,
    Duplicate,
}

/// One compiled `x-kubernetes-validations` entry.
#[derive(Debug)]
pub(super) struct Rule {
    /// The rule as written.
    pub(super) source: String,
    pub(super) program: Program,
    /// `message`, trimmed, when set.
    pub(super) message: Option<String>,
    pub(super) message_expression: Option<Program>,
    /// `fieldPath`, normalized like kube-apiserver (`a.b`, `a[key]`), relative to the node.
    pub(super) field_path: Option<String>,
    pub(super) reason: Reason,
    /// A transition rule: it reads `oldSelf`.
    pub(super) uses_old_self: bool,
    pub(super) optional_old_self: bool,
}

impl Rule {
    /// What kube-apiserver names the rule by in errors: its message, else its text.
    pub(super) fn error_string(&self) -> String {
        match &self.message {
            Some(m) => m.clone(),
            None => self.source.trim().to_string(),
        }
    }
}

/// Compiles the `x-kubernetes-validations` list of `node`.
pub(super) fn compile_all(
    rules: &Value,
    site: &Site,
    node: &Node,
    env: &RuleEnv,
) -> Result<Vec<Rule>, CompileError> {
    let base = format!("{}.x-kubernetes-validations", site.path);
    let Some(list) = rules.as_array() else {
        return Err(CompileError::invalid(&base, rules, "must be a list"));
    };
    list.iter()
        .enumerate()
        .map(|(i, rule)| compile(rule, &format!("{base}[{i}]"), site, node, env))
        .collect()
}

fn text(
    obj: &serde_json::Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, CompileError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(CompileError::invalid(
            &format!("{path}.{key}"),
            other,
            "must be a string",
        )),
    }
}

fn compile(
    rule: &Value,
    path: &str,
    site: &Site,
    node: &Node,
    env: &RuleEnv,
) -> Result<Rule, CompileError> {
    let Some(obj) = rule.as_object() else {
        return Err(CompileError::invalid(path, rule, "must be an object"));
    };
    let source = text(obj, "rule", path)?.unwrap_or_default();
    if source.trim().is_empty() {
        return Err(CompileError::invalid(
            &format!("{path}.rule"),
            &Value::String(source),
            "rule is not specified",
        ));
    }
    let rule_err = |field: &str, value: &str, detail: String| CompileError::Rule {
        path: format!("{path}.{field}"),
        value: Value::String(value.to_string()).to_string(),
        detail,
    };
    let program = env
        .0
        .compile(&source)
        .map_err(|e| rule_err("rule", &source, e.to_string()))?;
    let uses_old_self = program.references().has_variable("oldSelf");
    let message = text(obj, "message", path)?
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty());
    if message.as_deref().is_some_and(|m| m.contains('\n')) {
        return Err(CompileError::invalid(
            &format!("{path}.message"),
            &obj["message"],
            "message must not contain line breaks",
        ));
    }
    let message_expression = match text(obj, "messageExpression", path)? {
        Some(expr) if !expr.trim().is_empty() => Some(
            env.0
                .compile(&expr)
                .map_err(|e| rule_err("messageExpression", &expr, e.to_string()))?,
        ),
        _ => None,
    };
    let reason = match text(obj, "reason", path)?.as_deref() {
        None | Some("FieldValueInvalid") => Reason::Invalid,
        Some("FieldValueForbidden") => Reason::Forbidden,
        Some("FieldValueRequired") => Reason::Required,
        Some("FieldValueDuplicate") => Reason::Duplicate,
        Some(other) => {
            return Err(CompileError::invalid(
                &format!("{path}.reason"),
                &Value::String(other.to_string()),
                "supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\"",
            ))
        }
    };
    let optional_old_self = match obj.get("optionalOldSelf") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(CompileError::invalid(
                &format!("{path}.optionalOldSelf"),
                other,
                "must be a boolean",
            ))
        }
    };
    if optional_old_self && !uses_old_self {
        return Err(CompileError::invalid(
            &format!("{path}.optionalOldSelf"),
            &Value::Bool(true),
            "may not be set if rule does not use oldSelf",
        ));
    }
    if uses_old_self && !site.correlatable {
        return Err(CompileError::invalid(
            &format!("{path}.rule"),
            &Value::String(source.clone()),
            format!(
                "oldSelf cannot be used on the uncorrelatable portion of the schema within {}",
                site.path
            ),
        ));
    }
    let field_path = match text(obj, "fieldPath", path)? {
        Some(fp) if !fp.is_empty() => Some(resolve_field_path(&fp, node).map_err(|detail| {
            CompileError::invalid(
                &format!("{path}.fieldPath"),
                &Value::String(fp.clone()),
                detail,
            )
        })?),
        _ => None,
    };
    Ok(Rule {
        source,
        program,
        message,
        message_expression,
        field_path,
        reason,
        uses_old_self,
        optional_old_self,
    })
}

/// Reads one `['quoted']` key at the start of `rest` (after the `[`), returning it and the rest
/// after the closing `]`.
fn quoted_key(rest: &str) -> Result<(String, &str), String> {
    let mut chars = rest.char_indices();
    if !matches!(chars.next(), Some((_, '\''))) {
        return Err(format!("expected single quoted string but got {rest}"));
    }
    let mut key = String::new();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                let escaped = match chars.next().map(|(_, e)| e) {
                    Some('a') => '\u{7}',
                    Some('b') => '\u{8}',
                    Some('f') => '\u{c}',
                    Some('n') => '\n',
                    Some('r') => '\r',
                    Some('t') => '\t',
                    Some('v') => '\u{b}',
                    Some('\'') => '\'',
                    Some('\\') => '\\',
                    other => {
                        return Err(format!(
                            "invalid string literal: invalid escape char \\{}",
                            other.map(String::from).unwrap_or_default()
                        ))
                    }
                };
                key.push(escaped);
            }
            '\'' => {
                let after = &rest[i + 1..];
                return after
                    .strip_prefix(']')
                    .map(|after| (key, after))
                    .ok_or_else(|| format!("expected ] but got {after}"));
            }
            c => key.push(c),
        }
    }
    Err("unexpected end of JSON path".to_string())
}

/// Resolves a rule's `fieldPath` (`.a.b`, `.a['b.c']`) against the schema of its node and returns
/// it normalized as kube-apiserver prints it.
fn resolve_field_path(field_path: &str, node: &Node) -> Result<String, String> {
    let mut path = FieldPath::root();
    let mut current = node;
    let mut rest = field_path;
    while !rest.is_empty() {
        let name = if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end == 0 {
                return Err("unexpected end of JSON path".to_string());
            }
            rest = &after[end..];
            after[..end].to_string()
        } else if let Some(after) = rest.strip_prefix('[') {
            let (key, after) = quoted_key(after)?;
            rest = after;
            key
        } else {
            return Err(format!("expected [ or . but got: {rest}"));
        };
        if current.has_properties {
            current = current
                .properties
                .get(&name)
                .ok_or("does not refer to a valid field")?;
            path = path.child(&name);
        } else if let Some(additional) = current.additional.as_deref() {
            current = additional;
            path = path.key(&name);
        } else {
            return Err("does not refer to a valid field".to_string());
        }
    }
    Ok(path.as_str().to_string())
}
