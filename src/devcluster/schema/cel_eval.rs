//! Running `x-kubernetes-validations` over an object, as apiextensions-apiserver's CEL validator
//! does: every node's rules with `self` (and, for transition rules, `oldSelf`: the old value at the
//! same path, the old item with the same keys in a map-type list), then the nodes below. A failing
//! rule raises a field error of its `reason` at its node or `fieldPath`, printing the node's type
//! as the value (`Invalid value: "object"`). On update, a failure of a rule that does not read
//! `oldSelf`, on a value unchanged since the stored object, is only a warning (ratcheting).

use std::panic::{self, AssertUnwindSafe};

use cel::{Context, ExecutionError, Program, Value as CelValue};
use serde_json::Value;

use super::cel_reads::Reads;
use super::cel_value;
use super::listtype;
use super::node::{ListType, Node};
use super::path::FieldPath;
use super::rules::{Reason, Rule, RuleEnv};
use super::{FieldError, FieldErrorKind};

/// The longest message a `messageExpression` may produce (kube-apiserver's limit).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// Errors and ratcheted warnings of one run.
#[derive(Default)]
pub(super) struct Outcome {
    pub(super) errors: Vec<FieldError>,
    pub(super) warnings: Vec<String>,
}

/// Runs every rule under `root` over `object` (`old`: the stored object on update).
pub(super) fn run(env: &RuleEnv, root: &Node, object: &Value, old: Option<&Value>) -> Outcome {
    let mut walk = Walk {
        env,
        out: Outcome::default(),
    };
    let unchanged = old == Some(object);
    walk.node(root, object, old, &FieldPath::root(), true, unchanged);
    walk.out
}

struct Walk<'a> {
    env: &'a RuleEnv,
    out: Outcome,
}

/// The bindings of one node's rules.
struct Binding {
    this: CelValue,
    old: Option<CelValue>,
}

impl Walk<'_> {
    fn node(
        &mut self,
        node: &Node,
        value: &Value,
        old: Option<&Value>,
        path: &FieldPath,
        resource_root: bool,
        parent_unchanged: bool,
    ) {
        if value.is_null() || !node.has_rules {
            return;
        }
        let unchanged = match old {
            Some(old) => old == value,
            None => parent_unchanged,
        };
        if !node.rules.is_empty() {
            // Built from what the node's rules read (`cel_reads`): a root rule reading
            // `self.metadata.name` does not convert the status; `oldSelf` only for a
            // transition rule.
            let reads = &node.rule_reads;
            let bound = |reads: &Reads, v: &Value| match reads.keep(v) {
                Some(kept) => cel_value::typed(node, &kept, resource_root),
                None => CelValue::Null,
            };
            let binding = Binding {
                this: bound(&reads.this, value),
                old: old
                    .filter(|_| reads.transition)
                    .map(|o| bound(&reads.old, o)),
            };
            for rule in &node.rules {
                self.rule(rule, node, &binding, path, unchanged);
            }
        }
        for branch in &node.all_of {
            self.node(branch, value, old, path, resource_root, parent_unchanged);
        }
        match value {
            Value::Object(map) => {
                let old_map = old.and_then(Value::as_object);
                if let Some(additional) = node.additional.as_deref() {
                    for (k, v) in map {
                        let old_v = old_map.and_then(|m| m.get(k));
                        self.node(
                            additional,
                            v,
                            old_v,
                            &path.key(k),
                            additional.embedded,
                            unchanged,
                        );
                    }
                }
                for (k, v) in map {
                    if let Some(prop) = node.properties.get(k) {
                        let old_v = old_map.and_then(|m| m.get(k));
                        self.node(prop, v, old_v, &path.child(k), prop.embedded, unchanged);
                    }
                }
            }
            Value::Array(items) => {
                let Some(item_node) = node.items.as_deref() else {
                    return;
                };
                let old_items = old.and_then(Value::as_array);
                for (i, item) in items.iter().enumerate() {
                    let old_item = match node.list_type {
                        Some(ListType::Map) => {
                            listtype::correlate(&node.list_map_keys, item, old_items)
                        }
                        _ => None,
                    };
                    self.node(
                        item_node,
                        item,
                        old_item,
                        &path.index(i),
                        item_node.embedded,
                        unchanged,
                    );
                }
            }
            _ => {}
        }
    }

    fn rule(
        &mut self,
        rule: &Rule,
        node: &Node,
        binding: &Binding,
        path: &FieldPath,
        unchanged: bool,
    ) {
        // Transition rules run only when there is an old value to compare with.
        if rule.uses_old_self && binding.old.is_none() && !rule.optional_old_self {
            return;
        }
        let mut ctx = Context::with_env(self.env.0.clone());
        ctx.add_variable_from_value("self", binding.this.clone());
        if rule.uses_old_self {
            let old = if rule.optional_old_self {
                cel_value::optional(binding.old.clone())
            } else {
                binding.old.clone().unwrap_or(CelValue::Null)
            };
            ctx.add_variable_from_value("oldSelf", old);
        }
        let type_name = Value::String(node.type_name().to_string());
        match execute(&rule.program, &ctx) {
            Ok(CelValue::Bool(true)) => {}
            Ok(_) => {
                let target = match &rule.field_path {
                    Some(fp) => path.child(fp),
                    None => path.clone(),
                };
                let detail = rule
                    .message_expression
                    .as_ref()
                    .and_then(|expr| evaluated_message(expr, &ctx))
                    .unwrap_or_else(|| match &rule.message {
                        Some(m) => m.clone(),
                        None => format!("failed rule: {}", rule.error_string()),
                    });
                let error = failure(rule.reason, &target, type_name, detail);
                if !rule.uses_old_self && unchanged {
                    self.out.warnings.push(error.to_string());
                } else {
                    self.out.errors.push(error);
                }
            }
            Err(err) => self.out.errors.push(FieldError {
                kind: FieldErrorKind::Invalid,
                field: path.field(),
                bad_value: Some(type_name),
                detail: runtime_detail(&err, rule),
            }),
        }
    }
}

/// Runs a program, turning a panic of the interpreter into an error rather than a crash.
fn execute(program: &Program, ctx: &Context) -> Result<CelValue, ExecutionError> {
    panic::catch_unwind(AssertUnwindSafe(|| program.execute(ctx))).unwrap_or_else(|_| {
        Err(ExecutionError::InternalError(
            "the CEL interpreter failed".to_string(),
        ))
    })
}

/// The message of a `messageExpression`, or `None` when kube-apiserver would fall back to the
/// rule's `message`.
fn evaluated_message(expr: &Program, ctx: &Context) -> Option<String> {
    match execute(expr, ctx) {
        Ok(CelValue::String(s)) => {
            let trimmed = s.trim();
            let fits = !trimmed.is_empty() && trimmed.len() <= MAX_MESSAGE_BYTES;
            (fits && !trimmed.contains('\n')).then(|| trimmed.to_string())
        }
        _ => None,
    }
}

fn failure(reason: Reason, path: &FieldPath, type_name: Value, detail: String) -> FieldError {
    let (kind, bad_value, detail) = match reason {
        Reason::Invalid => (FieldErrorKind::Invalid, Some(type_name), detail),
        Reason::Forbidden => (FieldErrorKind::Forbidden, None, detail),
        Reason::Required => (FieldErrorKind::Required, None, detail),
        Reason::Duplicate => (FieldErrorKind::Duplicate, Some(type_name), String::new()),
    };
    FieldError {
        kind,
        field: path.field(),
        bad_value,
        detail,
    }
}

/// The detail kube-apiserver writes when a rule errors at runtime (cel-go's error texts).
fn runtime_detail(err: &ExecutionError, rule: &Rule) -> String {
    let name = rule.error_string();
    let cause = match err {
        ExecutionError::NoSuchOverload(_)
        | ExecutionError::UnsupportedBinaryOperator(..)
        | ExecutionError::ValuesNotComparable(..)
        | ExecutionError::UnexpectedType { .. }
        | ExecutionError::UnsupportedTargetType { .. }
        | ExecutionError::NotSupportedAsMethod { .. } => {
            return format!(
                "'no such overload': call arguments did not match a supported operator, function \
                 or macro signature for rule: {name}"
            );
        }
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
        ExecutionError::Overflow(..) => "integer overflow".to_string(),
        ExecutionError::IndexOutOfBounds(CelValue::Int(i)) => format!("index out of bounds: {i}"),
        ExecutionError::FunctionError { message, .. } => message.clone(),
        other => other.to_string(),
    };
    format!("{cause} evaluating rule: {name}")
}
