//! The CEL `when` of a policy rule (docs/design.md section 2 `spec.policy`, docs/behaviours.md 11-12):
//! compiling and running it over `tool`, `args` and `sideEffect`.
//!
//! Owns: how args become CEL values, and how the interpreter is kept from taking the process
//! down (its own thread with a large stack, panics caught). Must not: depend on how a number
//! was spelled: `args` enter CEL as the value their canonical JSON denotes, so
//! `{"amount": 250.0}` and `{"amount": 250}` are the same CEL value (`int` 250) in the loop and
//! on every re-evaluation after an approval.
//!
//! JSON → CEL: `null` → `null`, booleans → `bool`, strings → `string`, arrays → `list`, objects
//! → `map` with string keys, numbers: an integer (or an integral float, read as the integer its
//! canonical digits spell) within int64 → `int`, within uint64 above int64 → `uint`, anything
//! else → `double`. CEL comparisons (`<`, `<=`, `==`, ...) between `int`, `uint` and `double`
//! compare the numbers (as cel-go does), so `args.amount <= 100` holds for 50 and 99.5 and not
//! for 250 or 100.5. Arithmetic does not mix them: write `double(args.amount) * 1.1`.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use serde_json::{Number, Value};

use crate::api::SideEffect;
use crate::engine::canonical::ecmascript_number;
use crate::engine::validate::MAX_JSON_DEPTH;

/// The longest `when` evaluated, in characters (the CRD's `maxLength`).
pub const MAX_WHEN_CHARS: usize = 4096;

/// How deeply comprehensions (`all`, `exists`, `exists_one`, `map`, `filter`) may nest in one
/// `when`. The interpreter has no cost limit of its own, so nesting is what bounds the work: at
/// most this many nested loops over lists of the args (themselves bounded by the record), never
/// `[1,...,10].all(a, [1,...,10].all(b, ...))` nine deep (10^9 steps on a controller thread).
pub const MAX_COMPREHENSION_DEPTH: usize = 2;

/// How deeply comprehensions nest in `e`.
fn comprehension_depth(e: &cel::common::ast::IdedExpr) -> usize {
    use cel::common::ast::{EntryExpr, Expr};
    let max = |items: &mut dyn Iterator<Item = &cel::common::ast::IdedExpr>| {
        items.map(comprehension_depth).max().unwrap_or(0)
    };
    match &e.expr {
        Expr::Comprehension(c) => {
            1 + max(&mut [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ]
            .into_iter())
        }
        Expr::Call(call) => max(&mut call.target.iter().map(|t| &**t).chain(call.args.iter())),
        Expr::List(list) => max(&mut list.elements.iter()),
        Expr::Map(map) => max(&mut map.entries.iter().flat_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Struct(s) => max(&mut s.entries.iter().flat_map(|entry| match &entry.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })),
        Expr::Select(select) => comprehension_depth(&select.operand),
        _ => 0,
    }
}

/// The stack the CEL interpreter runs on. Its parser and evaluator recurse deeply (a debug
/// build overflows 2 MiB on `((((((((((((((((((((true))))))))))))))))))))` and needs more than
/// 64 MiB for `1+1+...+1` of 4096 characters); 256 MiB of address space, of which only what is
/// used is ever committed, covers every expression up to [`MAX_WHEN_CHARS`].
const CEL_STACK_BYTES: usize = 256 << 20;

/// Compiles and runs one `when` over `tool`, `args`, `sideEffect`; `Ok(bool)` or what went
/// wrong and the fix. Runs on a thread of its own with a [`CEL_STACK_BYTES`] stack, so no
/// expression can overflow the caller's stack, and a panic in the interpreter is an error.
///
/// # Errors
/// [`WhenError::Compile`] when the expression cannot be evaluated on any args (too long, not
/// CEL, nested too deeply: what [`check_when`] refuses); [`WhenError::Eval`] when it failed on
/// these args (a missing key, a wrong type, a result that is not a bool).
pub(super) fn eval_when(
    expression: &str,
    tool: &str,
    args: &Value,
    side_effect: SideEffect,
) -> Result<bool, WhenError> {
    check_length(expression).map_err(WhenError::Compile)?;
    on_cel_thread(|| eval_when_here(expression, tool, args, side_effect))
        .unwrap_or_else(|detail| Err(WhenError::Eval(detail)))
}

/// Why a `when` did not give a bool.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum WhenError {
    /// The expression itself is unusable (the spec is wrong, whatever the args).
    Compile(String),
    /// It failed on these args.
    Eval(String),
}

#[cfg(test)]
impl WhenError {
    /// What went wrong and the fix.
    pub(super) fn detail(&self) -> &str {
        match self {
            WhenError::Compile(d) | WhenError::Eval(d) => d,
        }
    }
}

/// Whether `expression` is a `when` the policy can evaluate: at most [`MAX_WHEN_CHARS`]
/// characters, CEL that parses, comprehensions nested at most [`MAX_COMPREHENSION_DEPTH`]
/// deep (docs/behaviours.md 1). Whether it holds, or fails, on some args is not judged.
///
/// # Errors
/// What is wrong and the fix, e.g. `does not compile: ...; fix its CEL syntax`.
pub fn check_when(expression: &str) -> Result<(), String> {
    check_length(expression)?;
    on_cel_thread(|| {
        let program = compile(expression)?;
        let mut unknown = std::collections::BTreeSet::new();
        undeclared(program.expression(), &mut Vec::new(), &mut unknown);
        if let Some(name) = unknown.into_iter().next() {
            return Err(format!(
                "refers to `{name}`, which is not defined; only `tool`, `args` and \
                 `sideEffect` are (write e.g. `args.{name}`)"
            ));
        }
        match result_type(program.expression()) {
            ResultType::NotBool(what) => Err(format!(
                "is {what}, never a bool; a `when` is a condition: compare it (e.g. \
                 `args.amount + 1 > 100`)"
            )),
            ResultType::Bool | ResultType::Dyn => Ok(()),
        }
    })?
}

/// What an expression evaluates to, as far as it can be told without the args: CEL's type
/// check of a rule's result, as kube-apiserver does for a CRD's `x-kubernetes-validations`.
/// `args` is a map of unknown fields, so `args.x` (and an index, a ternary of those, a
/// comprehension's result) is `Dyn`: it may hold a bool, and only evaluation can tell.
#[derive(Debug, PartialEq)]
enum ResultType {
    Bool,
    /// Never a bool: what it is instead, for the message ("an int", "a string or number").
    NotBool(&'static str),
    Dyn,
}

/// [`ResultType`] of `e`.
fn result_type(e: &cel::common::ast::IdedExpr) -> ResultType {
    use cel::common::ast::{operators, Expr, LiteralValue};
    match &e.expr {
        Expr::Literal(LiteralValue::Boolean(_)) => ResultType::Bool,
        Expr::Literal(LiteralValue::Int(_)) => ResultType::NotBool("an int"),
        Expr::Literal(LiteralValue::UInt(_)) => ResultType::NotBool("a uint"),
        Expr::Literal(LiteralValue::Double(_)) => ResultType::NotBool("a double"),
        Expr::Literal(LiteralValue::String(_)) => ResultType::NotBool("a string"),
        Expr::Literal(LiteralValue::Bytes(_)) => ResultType::NotBool("bytes"),
        Expr::Literal(LiteralValue::Null) => ResultType::NotBool("null"),
        Expr::List(_) => ResultType::NotBool("a list"),
        Expr::Map(_) | Expr::Struct(_) => ResultType::NotBool("a map"),
        Expr::Ident(name) => match name.as_str() {
            "tool" | "sideEffect" => ResultType::NotBool("a string"),
            "args" => ResultType::NotBool("a map (the args)"),
            _ => ResultType::Dyn,
        },
        // `has(args.x)` is a test; any other field of `args` may hold anything.
        Expr::Select(select) if select.test => ResultType::Bool,
        Expr::Select(_) | Expr::Comprehension(_) | Expr::Unspecified => ResultType::Dyn,
        Expr::Call(call) => match call.func_name.as_str() {
            operators::LOGICAL_AND
            | operators::LOGICAL_OR
            | operators::LOGICAL_NOT
            | operators::EQUALS
            | operators::NOT_EQUALS
            | operators::LESS
            | operators::LESS_EQUALS
            | operators::GREATER
            | operators::GREATER_EQUALS
            | operators::IN
            | "matches"
            | "startsWith"
            | "endsWith"
            | "contains"
            | "exists"
            | "all"
            | "exists_one"
            | "has"
            | "bool" => ResultType::Bool,
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO
            | operators::NEGATE => ResultType::NotBool("a number, string, list or duration"),
            "size" | "int" => ResultType::NotBool("an int"),
            "uint" => ResultType::NotBool("a uint"),
            "double" => ResultType::NotBool("a double"),
            "string" => ResultType::NotBool("a string"),
            "bytes" => ResultType::NotBool("bytes"),
            "timestamp" => ResultType::NotBool("a timestamp"),
            "duration" => ResultType::NotBool("a duration"),
            "type" => ResultType::NotBool("a type"),
            "map" | "filter" => ResultType::NotBool("a list"),
            operators::CONDITIONAL => {
                let branches: Vec<ResultType> = call.args.iter().skip(1).map(result_type).collect();
                match branches.as_slice() {
                    [ResultType::NotBool(what), ResultType::NotBool(_)] => {
                        ResultType::NotBool(what)
                    }
                    [ResultType::Bool, ResultType::Bool] => ResultType::Bool,
                    _ => ResultType::Dyn,
                }
            }
            _ => ResultType::Dyn,
        },
    }
}

/// The variables a `when` is given.
const WHEN_VARIABLES: [&str; 3] = ["tool", "args", "sideEffect"];

/// Identifiers CEL itself defines (type names, usable as values: `type(x) == int`).
const CEL_IDENTIFIERS: [&str; 11] = [
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

/// Collects into `out` every identifier in `e` that is neither a `when` variable, a CEL
/// identifier, nor bound by an enclosing comprehension (`bound`).
fn undeclared<'e>(
    e: &'e cel::common::ast::IdedExpr,
    bound: &mut Vec<&'e str>,
    out: &mut std::collections::BTreeSet<String>,
) {
    use cel::common::ast::{EntryExpr, Expr};
    match &e.expr {
        Expr::Ident(name) => {
            let name = name.as_str();
            if !name.starts_with('@')
                && !WHEN_VARIABLES.contains(&name)
                && !CEL_IDENTIFIERS.contains(&name)
                && !bound.contains(&name)
            {
                out.insert(name.to_string());
            }
        }
        Expr::Comprehension(c) => {
            undeclared(&c.iter_range, bound, out);
            undeclared(&c.accu_init, bound, out);
            let before = bound.len();
            bound.push(&c.iter_var);
            bound.extend(c.iter_var2.as_deref());
            bound.push(&c.accu_var);
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                undeclared(part, bound, out);
            }
            bound.truncate(before);
        }
        Expr::Call(call) => {
            for part in call.target.iter().map(|t| &**t).chain(call.args.iter()) {
                undeclared(part, bound, out);
            }
        }
        Expr::List(list) => {
            for item in &list.elements {
                undeclared(item, bound, out);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                match &entry.expr {
                    EntryExpr::MapEntry(m) => {
                        undeclared(&m.key, bound, out);
                        undeclared(&m.value, bound, out);
                    }
                    EntryExpr::StructField(f) => undeclared(&f.value, bound, out),
                }
            }
        }
        Expr::Struct(st) => {
            for entry in &st.entries {
                match &entry.expr {
                    EntryExpr::MapEntry(m) => {
                        undeclared(&m.key, bound, out);
                        undeclared(&m.value, bound, out);
                    }
                    EntryExpr::StructField(f) => undeclared(&f.value, bound, out),
                }
            }
        }
        Expr::Select(select) => undeclared(&select.operand, bound, out),
        _ => {}
    }
}

fn check_length(expression: &str) -> Result<(), String> {
    let chars = expression.chars().count();
    if chars > MAX_WHEN_CHARS {
        return Err(format!(
            "is {chars} characters long; at most {MAX_WHEN_CHARS} are evaluated: shorten it"
        ));
    }
    Ok(())
}

/// Runs `work` on a thread with a [`CEL_STACK_BYTES`] stack (smaller ones if that is refused),
/// a panic caught as an error.
fn on_cel_thread<T: Send>(work: impl FnOnce() -> T + Send + Copy) -> Result<T, String> {
    std::thread::scope(|scope| {
        // Should the address space for the large stack be refused (strict overcommit), smaller
        // ones still serve every ordinary expression.
        let mut last_error = None;
        for stack in [CEL_STACK_BYTES, CEL_STACK_BYTES / 4, CEL_STACK_BYTES / 16] {
            let spawned = std::thread::Builder::new()
                .name("agentrt-cel".into())
                .stack_size(stack)
                .spawn_scoped(scope, move || catch_unwind(AssertUnwindSafe(work)));
            match spawned {
                Ok(worker) => {
                    return match worker.join() {
                        Ok(Ok(result)) => Ok(result),
                        Ok(Err(_)) | Err(_) => {
                            Err("the CEL interpreter panicked evaluating it; simplify it".into())
                        }
                    };
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(format!(
            "could not start a thread to evaluate it: {}",
            last_error.map(|e| e.to_string()).unwrap_or_default()
        ))
    })
}

/// The compiled program, or why it cannot be one.
fn compile(expression: &str) -> Result<cel::Program, String> {
    let program = cel::Program::compile(expression).map_err(|e| {
        // The parser's message spans lines (the source and a caret); the first says where.
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default().trim().to_string();
        format!("{first}; the expression does not compile: fix its CEL syntax")
    })?;
    let depth = comprehension_depth(program.expression());
    if depth > MAX_COMPREHENSION_DEPTH {
        return Err(format!(
            "nests {depth} comprehensions (all, exists, exists_one, map, filter); at most \
             {MAX_COMPREHENSION_DEPTH} are evaluated, so that no rule can keep the controller \
             busy: flatten it"
        ));
    }
    Ok(program)
}

/// [`eval_when`] on the current thread.
fn eval_when_here(
    expression: &str,
    tool: &str,
    args: &Value,
    side_effect: SideEffect,
) -> Result<bool, WhenError> {
    let program = compile(expression).map_err(WhenError::Compile)?;
    let mut context = cel::Context::default();
    context.add_variable_from_value("tool", tool.to_string());
    context.add_variable_from_value("args", json_to_cel(args).map_err(WhenError::Eval)?);
    context.add_variable_from_value("sideEffect", side_effect.as_str().to_string());
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(WhenError::Eval(format!(
            "returned {} instead of a bool; make the expression a condition (e.g. \
             `args.amount <= 100`)",
            cel_type_name(&other)
        ))),
        Err(e) => Err(WhenError::Eval(format!("{e}; {}", runtime_fix(&e)))),
    }
}

/// The fix to suggest for a CEL runtime error.
fn runtime_fix(error: &cel::ExecutionError) -> &'static str {
    match error {
        cel::ExecutionError::NoSuchKey(_) => {
            "guard fields the args may lack with has(), e.g. `has(args.x) && args.x > 0`"
        }
        cel::ExecutionError::NoSuchOverload(_)
        | cel::ExecutionError::ValuesNotComparable(..)
        | cel::ExecutionError::UnsupportedBinaryOperator(..) => {
            "check the operand types: numbers compare with numbers, but arithmetic needs one \
             type (write `double(args.x) * 1.5`)"
        }
        cel::ExecutionError::UndeclaredReference(_) => {
            "only `tool`, `args` and `sideEffect` (and CEL's standard functions) are defined"
        }
        _ => "fix the expression",
    }
}

fn cel_type_name(value: &cel::Value) -> &'static str {
    match value {
        cel::Value::List(_) => "a list",
        cel::Value::Map(_) => "a map",
        cel::Value::Int(_) => "an int",
        cel::Value::UInt(_) => "a uint",
        cel::Value::Float(_) => "a double",
        cel::Value::String(_) => "a string",
        cel::Value::Bytes(_) => "bytes",
        cel::Value::Null => "null",
        _ => "a non-bool value",
    }
}

/// `value` as CEL sees it (module doc), or why it cannot be (nesting past 256 levels).
fn json_to_cel(value: &Value) -> Result<cel::Value, String> {
    to_cel(value, 0)
}

fn to_cel(value: &Value, depth: usize) -> Result<cel::Value, String> {
    Ok(match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => cel_number(n),
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => {
            check_depth(depth + 1)?;
            let list = items
                .iter()
                .map(|v| to_cel(v, depth + 1))
                .collect::<Result<Vec<_>, _>>()?;
            cel::Value::List(Arc::new(list))
        }
        Value::Object(map) => {
            check_depth(depth + 1)?;
            let mut members = HashMap::with_capacity(map.len());
            for (k, v) in map {
                members.insert(
                    cel::objects::Key::String(Arc::new(k.clone())),
                    to_cel(v, depth + 1)?,
                );
            }
            cel::Value::Map(cel::objects::Map {
                map: Arc::new(members),
            })
        }
    })
}

fn check_depth(depth: usize) -> Result<(), String> {
    if depth > MAX_JSON_DEPTH {
        return Err(format!(
            "args nest deeper than {MAX_JSON_DEPTH} levels of arrays and objects; the policy \
             cannot evaluate them"
        ));
    }
    Ok(())
}

/// The CEL number for a JSON number: the number its canonical JSON text denotes when read back
/// (an integral float is the integer its ECMAScript digits spell, e.g. `1.5409339127255203e17`
/// is `154093391272552030`), as `int` when it fits int64, `uint` when it fits uint64, else
/// `double`.
fn cel_number(n: &Number) -> cel::Value {
    if let Some(i) = n.as_i64() {
        return cel::Value::Int(i);
    }
    if let Some(u) = n.as_u64() {
        return cel::Value::UInt(u);
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    if f.is_finite() && f.fract() == 0.0 {
        if let Ok(text) = ecmascript_number(f) {
            if let Ok(i) = text.parse::<i64>() {
                return cel::Value::Int(i);
            }
            if let Ok(u) = text.parse::<u64>() {
                return cel::Value::UInt(u);
            }
        }
    }
    cel::Value::Float(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::canonical::canonical_json;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn a_when_nesting_more_comprehensions_than_the_limit_is_refused_before_it_runs() {
        let list = "[1,2,3,4,5,6,7,8,9,10]";
        let mut deep = "true".to_string();
        for v in ["a", "b", "c", "d", "e", "f", "g", "h", "i"] {
            deep = format!("{list}.all({v}, {deep})");
        }
        let started = std::time::Instant::now();
        let err = eval_when(&deep, "t", &json!({}), SideEffect::ReadOnly).expect_err("refused");
        assert!(matches!(err, WhenError::Compile(_)), "{err:?}");
        let err = err.detail();
        assert!(err.contains("nests 9 comprehensions"), "{err}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "it never ran"
        );
        let two = "args.items.all(i, i.tags.exists(t, t == 'x'))";
        let args = json!({"items": [{"tags": ["x"]}, {"tags": ["y", "x"]}]});
        assert_eq!(eval_when(two, "t", &args, SideEffect::ReadOnly), Ok(true));
        let in_a_call =
            format!("size({list}.filter(a, {list}.exists(b, {list}.all(c, c > 0)))) > 0");
        assert!(eval_when(&in_a_call, "t", &args, SideEffect::ReadOnly)
            .expect_err("refused")
            .detail()
            .contains("nests 3"));
        assert!(check_when(&in_a_call).is_err());
        assert_eq!(check_when(two), Ok(()));
    }

    #[test]
    fn check_when_refuses_what_no_args_can_evaluate_and_accepts_what_some_can() {
        let err = check_when("args.amount <=> 100 &&").expect_err("not CEL");
        assert!(err.contains("does not compile"), "{err}");
        let err = check_when("amount <= 100").expect_err("undeclared");
        assert!(err.contains("refers to `amount`"), "{err}");
        assert!(check_when(&"x".repeat(MAX_WHEN_CHARS + 1)).is_err());
        for ok in [
            "args.amount <= 100",
            "has(args.amount) && args.amount <= 100",
            "args.items.exists(i, i.sku == 'x') && tool == 'refund'",
            "args.m.all(k, args.m[k] > 0) || sideEffect == 'ReadOnly'",
            "type(args.n) == int",
            "args.flag",
            "args.flags[0]",
            "args.a > 1 ? args.flag : false",
            "true",
        ] {
            assert_eq!(check_when(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn a_when_that_can_never_be_a_bool_is_refused_naming_what_it_is() {
        for (expression, what) in [
            ("args.amount + 1", "a number, string, list or duration"),
            ("size(args.items)", "an int"),
            ("tool", "a string"),
            ("'yes'", "a string"),
            ("[args.a]", "a list"),
            ("args", "a map (the args)"),
            ("args.a > 1 ? 1 : 2", "an int"),
            ("-args.n", "a number, string, list or duration"),
        ] {
            let err = check_when(expression).expect_err(expression);
            assert!(
                err.contains(&format!("is {what}, never a bool")),
                "{expression}: {err}"
            );
        }
    }

    #[test]
    fn args_become_cel_values_with_integral_floats_as_ints() {
        let v = json_to_cel(&json!({"a": [1, 2.0, 2.5, null, true, "s"]})).expect("cel");
        let cel::Value::Map(m) = v else {
            panic!("not a map")
        };
        let key = cel::objects::Key::String(Arc::new("a".into()));
        let Some(cel::Value::List(items)) = m.map.get(&key) else {
            panic!("no list")
        };
        assert_eq!(
            items.as_slice(),
            &[
                cel::Value::Int(1),
                cel::Value::Int(2),
                cel::Value::Float(2.5),
                cel::Value::Null,
                cel::Value::Bool(true),
                cel::Value::String(Arc::new("s".into())),
            ]
        );
        assert_eq!(
            json_to_cel(&json!(u64::MAX)).expect("cel"),
            cel::Value::UInt(u64::MAX)
        );
        assert_eq!(
            json_to_cel(&json!(1e300)).expect("cel"),
            cel::Value::Float(1e300)
        );
    }

    proptest! {
        /// A number enters CEL as the value its canonical JSON denotes when read back.
        #[test]
        fn numbers_enter_cel_as_their_canonical_form(
            f in prop_oneof![
                any::<f64>().prop_filter("finite", |f| f.is_finite()),
                (-1i64 << 62..1i64 << 62).prop_map(|i| i as f64),
                Just(9_223_372_036_854_775_808.0f64),
                Just(-9_223_372_036_854_775_808.0f64),
                Just(18_446_744_073_709_551_616.0f64),
                Just(1e19f64),
                Just(-0.0f64),
            ]
        ) {
            let v = json!(f);
            let text = canonical_json(&v).expect("canonical");
            let back: Value = serde_json::from_str(&text).expect("json");
            let (Value::Number(a), Value::Number(b)) = (&v, &back) else { unreachable!() };
            prop_assert_eq!(cel_number(a), cel_number(b));
                }
    }
}
