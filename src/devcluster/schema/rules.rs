//! Compiling `x-kubernetes-validations`: each rule's CEL program (and `messageExpression`) is
//! parsed once with the `cel` crate, type-checked against the CEL types of its schema node
//! (`cel_check.rs`) and its cost estimated (`cel_cost.rs`), its `fieldPath` resolved against the
//! schema, and the checks kube-apiserver makes when a CRD is written are made here (a transition
//! rule only where `oldSelf` can be correlated, `optionalOldSelf` only on transition rules, known
//! `reason`s). Refusals are collected with kube-apiserver's messages and field paths.

use std::sync::Arc;

use cel::{Env, Program};
use serde_json::Value;

use super::cel_check::{self, Var};
use super::cel_cost::{self, TotalCost};
use super::cel_reads::Reads;
use super::cel_types::{self, Decl, Ty};
use super::gofmt;
use super::node::{CompileError, Node, Site};
use super::path::FieldPath;
use super::{FieldError, FieldErrorKind};

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
    /// What the rule and its `messageExpression` read of `self`.
    pub(super) reads_self: Reads,
    /// What they read of `oldSelf`.
    pub(super) reads_old_self: Reads,
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

/// What compiling a schema's rules collects: the environment, every refusal of a rule (as
/// kube-apiserver reports it, field paths from `openAPIV3Schema`), and the rules' total cost.
pub(super) struct Checks<'a> {
    pub(super) env: &'a RuleEnv,
    pub(super) errors: Vec<FieldError>,
    pub(super) total: TotalCost,
}

impl<'a> Checks<'a> {
    /// Nothing collected yet.
    pub(super) fn new(env: &'a RuleEnv) -> Checks<'a> {
        Checks {
            env,
            errors: Vec::new(),
            total: TotalCost::default(),
        }
    }

    /// The refusals for the schema as a whole: the total cost over its budget.
    pub(super) fn finish(&mut self) {
        if self.total.total <= cel_cost::SCHEMA_LIMIT {
            return;
        }
        for (path, _) in &self.total.most_expensive {
            self.errors.push(FieldError {
                kind: FieldErrorKind::Forbidden,
                field: path.clone(),
                bad_value: None,
                detail: "contributed to estimated rule cost total exceeding cost limit for \
                         entire OpenAPIv3 schema"
                    .to_string(),
            });
        }
        self.errors.push(FieldError {
            kind: FieldErrorKind::Forbidden,
            field: "openAPIV3Schema".to_string(),
            bad_value: None,
            detail: cel_cost::exceeds(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                self.total.total,
                cel_cost::SCHEMA_LIMIT,
            ),
        });
    }

    fn push(
        &mut self,
        kind: FieldErrorKind,
        field: String,
        bad_value: Option<Value>,
        detail: String,
    ) {
        self.errors.push(FieldError {
            kind,
            field,
            bad_value,
            detail,
        });
    }
}

/// Compiles the `x-kubernetes-validations` list of `node`. Rules kube-apiserver would refuse
/// (type errors, cost) are left out and their refusals collected in `checks`.
pub(super) fn compile_all(
    rules: &Value,
    site: &Site,
    node: &Node,
    checks: &mut Checks<'_>,
) -> Result<Vec<Rule>, CompileError> {
    let base = format!("{}.x-kubernetes-validations", site.path);
    let Some(list) = rules.as_array() else {
        return Err(CompileError::invalid(&base, rules, "must be a list"));
    };
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let in_branch = [".allOf[", ".anyOf[", ".oneOf[", ".not."]
        .iter()
        .any(|b| site.path.contains(b))
        || site.path.ends_with(".not");
    if in_branch {
        // Structural schemas keep rules out of allOf/anyOf/oneOf/not.
        checks.push(
            FieldErrorKind::Forbidden,
            base,
            None,
            "must be empty to be structural".to_string(),
        );
        return Ok(Vec::new());
    }
    let Some(decl) = cel_types::declare(node, site.resource_root, "selfType") else {
        checks.push(
            FieldErrorKind::Internal,
            base,
            None,
            "internal error: failed to construct type information for x-kubernetes-validations \
             rules: unable to convert structural schema to CEL declarations"
                .to_string(),
        );
        return Ok(Vec::new());
    };
    let mut compiled = Vec::new();
    for (i, rule) in list.iter().enumerate() {
        let at = RuleSite {
            path: format!("{base}[{i}]"),
            site,
            node,
            decl: &decl,
        };
        if let Some(rule) = compile(rule, &at, checks)? {
            compiled.push(rule);
        }
    }
    Ok(compiled)
}

/// Where one rule is compiled: its path, its node and the node's CEL type.
struct RuleSite<'a> {
    path: String,
    site: &'a Site,
    node: &'a Node,
    decl: &'a Arc<Decl>,
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

/// The rule as kube-apiserver prints it in refusals: its internal `ValidationRule` struct as
/// JSON, e.g. `{"Rule":"self.x \u003e 0","Message":"","MessageExpression":"","Reason":null,...}`.
fn rule_json(obj: &serde_json::Map<String, Value>) -> Value {
    let s = |key: &str| gofmt::json_string(obj.get(key).and_then(Value::as_str).unwrap_or(""));
    let reason = match obj.get("reason").and_then(Value::as_str) {
        Some(r) => gofmt::json_string(r),
        None => "null".to_string(),
    };
    let optional = match obj.get("optionalOldSelf").and_then(Value::as_bool) {
        Some(b) => b.to_string(),
        None => "null".to_string(),
    };
    Value::String(format!(
        "{{\"Rule\":{},\"Message\":{},\"MessageExpression\":{},\"Reason\":{reason},\"FieldPath\":{},\"OptionalOldSelf\":{optional}}}",
        s("rule"),
        s("message"),
        s("messageExpression"),
        s("fieldPath"),
    ))
}

/// The text cel-go gives for syntax errors: each at its position, with the caret lines.
fn syntax_errors(source: &str, errors: &cel::ParseErrors) -> String {
    // The parser gives 1-based lines and byte columns.
    let line_starts: Vec<usize> = std::iter::once(0)
        .chain(source.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    errors
        .errors
        .iter()
        .map(|e| {
            let line = usize::try_from(e.pos.0.max(1) - 1).unwrap_or(0);
            let column = usize::try_from(e.pos.1.max(1) - 1).unwrap_or(0);
            let bytes = line_starts.get(line).copied().unwrap_or(0) + column;
            cel_check::display(source, cel_check::char_offset(source, bytes), &e.msg)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The variables a rule sees: `self` and `oldSelf` (optional with `optionalOldSelf`).
fn rule_vars(decl: &Arc<Decl>, optional_old_self: bool) -> Vec<Var> {
    let ty = decl.ty();
    let old_ty = if optional_old_self {
        Ty::Optional(Box::new(ty.clone()))
    } else {
        ty.clone()
    };
    vec![
        Var {
            name: "self".into(),
            ty,
            decl: Some(Arc::clone(decl)),
        },
        Var {
            name: "oldSelf".into(),
            ty: old_ty,
            decl: Some(Arc::clone(decl)),
        },
    ]
}

/// How many times a rule at `site` can run for one object: the node's cardinality, or when a list
/// or map above it is unbounded, as many values of its smallest size as fit in a request.
fn cardinality(site: &Site, decl: &Decl) -> u64 {
    site.cardinality.unwrap_or_else(|| {
        let size = decl.min_size.saturating_add(1).max(1);
        u64::try_from(cel_types::MAX_REQUEST_SIZE_BYTES / size).unwrap_or(0)
    })
}

fn compile(
    rule: &Value,
    at: &RuleSite<'_>,
    checks: &mut Checks<'_>,
) -> Result<Option<Rule>, CompileError> {
    let path = at.path.as_str();
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
    let refusals = checks.errors.len();
    let has_message = obj
        .get("message")
        .and_then(Value::as_str)
        .is_some_and(|m| !m.trim().is_empty());
    if source.contains('\n') && !has_message {
        // kube-apiserver refuses this before compiling the rule.
        checks.push(
            FieldErrorKind::Required,
            format!("{path}.message"),
            None,
            "message must be specified if rule contains line breaks".to_string(),
        );
        return Ok(None);
    }
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
    let env = checks.env;
    let vars = rule_vars(at.decl, optional_old_self);
    let program = match env.0.compile(&source) {
        Ok(program) => {
            let outcome = cel_check::check(&program, &source, vars.clone());
            if !outcome.errors.is_empty() {
                checks.push(
                    FieldErrorKind::InvalidStruct,
                    format!("{path}.rule"),
                    Some(rule_json(obj)),
                    format!("compilation failed: {}", outcome.errors),
                );
                None
            } else if !matches!(outcome.ty, Ty::Bool) {
                checks.push(
                    FieldErrorKind::InvalidStruct,
                    format!("{path}.rule"),
                    Some(rule_json(obj)),
                    "cel expression must evaluate to a bool".to_string(),
                );
                None
            } else {
                // kube-apiserver compares each rule's cost, times how often it can run, with the
                // per-rule budget, and adds it to the schema's total.
                let cost = outcome.cost.saturating_mul(cardinality(at.site, at.decl));
                if cost > cel_cost::RULE_LIMIT {
                    checks.push(
                        FieldErrorKind::Forbidden,
                        format!("{path}.rule"),
                        None,
                        cel_cost::exceeds("estimated rule cost", cost, cel_cost::RULE_LIMIT),
                    );
                }
                checks.total.observe(&format!("{path}.rule"), cost);
                Some(program)
            }
        }
        Err(e) => {
            checks.push(
                FieldErrorKind::InvalidStruct,
                format!("{path}.rule"),
                Some(rule_json(obj)),
                format!("compilation failed: {}", syntax_errors(&source, &e)),
            );
            None
        }
    };
    let uses_old_self = program
        .as_ref()
        .is_some_and(|p| p.references().has_variable("oldSelf"));
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
        Some(expr) if !expr.trim().is_empty() => {
            compile_message_expression(&expr, obj, path, vars, checks)
        }
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
    // Set at all (even to false) on a rule that does not read oldSelf: refused.
    let optional_set = obj.get("optionalOldSelf").is_some_and(Value::is_boolean);
    if optional_set && !uses_old_self {
        checks.push(
            FieldErrorKind::Invalid,
            format!("{path}.optionalOldSelf"),
            Some(Value::Bool(optional_old_self)),
            "may not be set if oldSelf is not used in rule".to_string(),
        );
    }
    if uses_old_self && !at.site.correlatable {
        checks.push(
            FieldErrorKind::Invalid,
            format!("{path}.rule"),
            Some(Value::String(source.clone())),
            format!(
                "oldSelf cannot be used on the uncorrelatable portion of the schema within {}",
                at.site.path
            ),
        );
    }
    let field_path = match text(obj, "fieldPath", path)? {
        Some(fp) if !fp.is_empty() => Some(resolve_field_path(&fp, at.node).map_err(|detail| {
            CompileError::invalid(
                &format!("{path}.fieldPath"),
                &Value::String(fp.clone()),
                detail,
            )
        })?),
        _ => None,
    };
    let Some(program) = program else {
        return Ok(None);
    };
    if checks.errors.len() > refusals {
        return Ok(None);
    }
    let reads = |var: &str| {
        let mut reads = Reads::none();
        reads.add(program.expression(), var);
        if let Some(expr) = &message_expression {
            reads.add(expr.expression(), var);
        }
        reads
    };
    let (reads_self, reads_old_self) = (reads("self"), reads("oldSelf"));
    Ok(Some(Rule {
        source,
        program,
        message,
        message_expression,
        field_path,
        reason,
        uses_old_self,
        optional_old_self,
        reads_self,
        reads_old_self,
    }))
}

/// Compiles and checks a rule's `messageExpression`: it must compile against the node's types,
/// give a string, and keep within the per-expression budget.
fn compile_message_expression(
    expr: &str,
    obj: &serde_json::Map<String, Value>,
    path: &str,
    vars: Vec<Var>,
    checks: &mut Checks<'_>,
) -> Option<Program> {
    let field = format!("{path}.messageExpression");
    let program = match checks.env.0.compile(expr) {
        Ok(p) => p,
        Err(e) => {
            let detail = format!(
                "messageExpression compilation failed: {}",
                syntax_errors(expr, &e)
            );
            checks.push(
                FieldErrorKind::InvalidStruct,
                field,
                Some(rule_json(obj)),
                detail,
            );
            return None;
        }
    };
    let outcome = cel_check::check(&program, expr, vars);
    if !outcome.errors.is_empty() {
        let detail = format!("messageExpression compilation failed: {}", outcome.errors);
        checks.push(
            FieldErrorKind::InvalidStruct,
            field,
            Some(rule_json(obj)),
            detail,
        );
        return None;
    }
    if !matches!(outcome.ty, Ty::String) {
        let detail = "messageExpression must evaluate to a string".to_string();
        checks.push(
            FieldErrorKind::InvalidStruct,
            field,
            Some(rule_json(obj)),
            detail,
        );
        return None;
    }
    if outcome.cost > cel_cost::RULE_LIMIT {
        let detail = cel_cost::exceeds(
            "estimated messageExpression cost",
            outcome.cost,
            cel_cost::RULE_LIMIT,
        );
        checks.push(FieldErrorKind::Forbidden, field.clone(), None, detail);
    }
    checks.total.observe(&field, outcome.cost);
    Some(program)
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
