//! Type-checking one parsed CEL rule against the CEL types of its schema node, as cel-go's checker
//! does when kube-apiserver compiles a CRD's rules: undeclared identifiers and functions,
//! undefined fields, field selection on scalars, calls no overload accepts, comprehension ranges
//! that are not lists or maps. It also estimates the rule's worst-case cost as cel-go's
//! `checker/cost.go` with Kubernetes' size estimator does, for `cel_cost.rs` to hold against the
//! budget. Errors are reported as cel-go prints them (`ERROR: <input>:1:5: undefined field 'x'`
//! and the caret lines under the source).

use std::sync::Arc;

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::Program;

use super::cel_cost::{self, Size};
use super::cel_lib::{self, Overload};
use super::cel_types::{Decl, DeclKind, Ty};
use super::cel_unify::{join_types, substitute, unify};

/// A variable in scope: its type and, when it is a path into the object (`self.a.b`, a
/// comprehension's element), the declaration whose sizes the cost estimate reads.
#[derive(Clone)]
pub(super) struct Var {
    pub(super) name: String,
    pub(super) ty: Ty,
    pub(super) decl: Option<Arc<Decl>>,
}

/// What checking a rule found.
pub(super) struct Outcome {
    /// The rule's result type.
    pub(super) ty: Ty,
    /// The estimated worst-case cost.
    pub(super) cost: u64,
    /// The errors, as cel-go prints them joined by new lines (empty when it checks).
    pub(super) errors: String,
}

/// One checked expression.
pub(super) struct Checked {
    pub(super) ty: Ty,
    pub(super) cost: u64,
    /// The size of the value, when known from literals or the functions that built it.
    pub(super) size: Option<Size>,
    /// The declaration the value comes from, when it is a path into the object.
    pub(super) decl: Option<Arc<Decl>>,
}

impl Checked {
    fn of(ty: Ty, cost: u64) -> Checked {
        Checked {
            ty,
            cost,
            size: None,
            decl: None,
        }
    }

    /// cel-go's `sizeEstimate`: computed size, else the declaration's, else 1 for scalars.
    pub(super) fn size(&self) -> Size {
        if let Some(s) = self.size {
            return s;
        }
        if let Some(d) = &self.decl {
            return Size {
                min: 0,
                max: d.max_elements,
            };
        }
        if self.ty.is_scalar() {
            return Size { min: 1, max: 1 };
        }
        Size {
            min: 0,
            max: u64::MAX,
        }
    }
}

struct Checker<'a> {
    program: &'a Program,
    source: &'a str,
    scopes: Vec<Var>,
    errors: Vec<(usize, String)>,
}

/// Checks `program` with `vars` in scope.
pub(super) fn check(program: &Program, source: &str, vars: Vec<Var>) -> Outcome {
    let mut checker = Checker {
        program,
        source,
        scopes: vars,
        errors: Vec::new(),
    };
    let root = checker.expr(program.expression());
    checker.errors.sort_by_key(|(offset, _)| *offset);
    let errors: Vec<String> = checker
        .errors
        .iter()
        .map(|(offset, msg)| display(source, *offset, msg))
        .collect();
    Outcome {
        ty: root.ty,
        cost: root.cost,
        errors: errors.join("\n"),
    }
}

/// The code point offset of byte offset `bytes` of `source`.
pub(super) fn char_offset(source: &str, bytes: usize) -> usize {
    source
        .char_indices()
        .take_while(|(i, _)| *i < bytes)
        .count()
}

/// cel-go's `Error.ToDisplayString`: position, message, the source line and a caret under it.
pub(super) fn display(source: &str, offset: usize, msg: &str) -> String {
    let mut line_no = 1;
    let mut line_start = 0;
    for (i, c) in source.chars().enumerate() {
        if i >= offset {
            break;
        }
        if c == '\n' {
            line_no += 1;
            line_start = i + 1;
        }
    }
    let column = offset.saturating_sub(line_start);
    let mut out = format!("ERROR: <input>:{line_no}:{}: {msg}", column + 1);
    let line: String = source
        .chars()
        .skip(line_start)
        .take_while(|c| *c != '\n')
        .collect::<String>()
        .replace('\t', " ");
    out.push_str("\n | ");
    out.push_str(&line);
    out.push_str("\n | ");
    let mut chars = line.chars();
    for _ in 0..column {
        match chars.next() {
            Some(c) if c.len_utf8() > 1 => out.push('\u{ff0e}'),
            Some(_) => out.push('.'),
            None => break,
        }
    }
    match chars.next() {
        Some(c) if c.len_utf8() > 1 => out.push('\u{ff3e}'),
        _ => out.push('^'),
    }
    out
}

/// The name of a type a bare identifier denotes (`int`, `string`, ...).
fn type_ident(name: &str) -> Option<Ty> {
    Some(match name {
        "int" => Ty::Int,
        "uint" => Ty::Uint,
        "double" => Ty::Double,
        "bool" => Ty::Bool,
        "string" => Ty::String,
        "bytes" => Ty::Bytes,
        "list" => Ty::List(Box::new(Ty::Dyn)),
        "map" => Ty::Map(Box::new(Ty::Dyn), Box::new(Ty::Dyn)),
        "null_type" => Ty::Null,
        "type" => Ty::Type(Box::new(Ty::Dyn)),
        "google.protobuf.Timestamp" => Ty::Timestamp,
        "google.protobuf.Duration" => Ty::Duration,
        _ => return None,
    })
}

/// The dotted name `expr` spells (`a.b.c`), if it is only identifiers and selections.
fn qualified_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Ident(name) => Some(name.clone()),
        Expr::Select(s) if !s.test => {
            qualified_name(&s.operand.expr).map(|q| format!("{q}.{}", s.field))
        }
        _ => None,
    }
}

impl Checker<'_> {
    /// Where expression `id` was written, in code points (the parser counts bytes, cel-go code
    /// points).
    fn offset(&self, id: u64) -> usize {
        let bytes = self
            .program
            .source_info()
            .offset_for(id)
            .map_or(0, |(start, _)| start as usize);
        char_offset(self.source, bytes)
    }

    fn error(&mut self, id: u64, msg: String) -> Checked {
        let offset = self.offset(id);
        self.errors.push((offset, msg));
        Checked::of(Ty::Error, 0)
    }

    fn lookup(&self, name: &str) -> Option<&Var> {
        self.scopes.iter().rev().find(|v| v.name == name)
    }

    fn expr(&mut self, e: &IdedExpr) -> Checked {
        match &e.expr {
            Expr::Literal(lit) => literal(lit),
            Expr::Ident(name) => {
                if let Some(var) = self.lookup(name) {
                    return Checked {
                        ty: var.ty.clone(),
                        cost: 1,
                        size: None,
                        decl: var.decl.clone(),
                    };
                }
                if let Some(t) = type_ident(name) {
                    return Checked::of(Ty::Type(Box::new(t)), 1);
                }
                self.error(
                    e.id,
                    format!("undeclared reference to '{name}' (in container '')"),
                )
            }
            Expr::Select(sel) => {
                let operand = self.expr(&sel.operand);
                let extra =
                    u64::from(sel.test || matches!(operand.ty, Ty::Map(..) | Ty::Object(_)));
                let mut out = self.select(e.id, &operand, &sel.field);
                out.cost = operand.cost.saturating_add(extra);
                if sel.test {
                    out.ty = if matches!(out.ty, Ty::Error) {
                        Ty::Error
                    } else {
                        Ty::Bool
                    };
                    out.decl = None;
                }
                out
            }
            Expr::Call(call) => self.call(e.id, call),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::List(list) => {
                let mut elem = Ty::Dyn;
                let mut cost: u64 = cel_cost::CREATE_LIST;
                for (i, item) in list.elements.iter().enumerate() {
                    let c = self.expr(item);
                    cost = cost.saturating_add(c.cost);
                    if i == 0 {
                        elem = c.ty;
                    } else {
                        elem = self.same_type(item.id, &elem, &c.ty);
                    }
                }
                let n = list.elements.len() as u64;
                Checked {
                    ty: Ty::List(Box::new(elem)),
                    cost,
                    size: Some(Size { min: n, max: n }),
                    decl: None,
                }
            }
            Expr::Map(map) => {
                let (mut key, mut value) = (Ty::Dyn, Ty::Dyn);
                let mut cost: u64 = cel_cost::CREATE_MAP;
                for (i, entry) in map.entries.iter().enumerate() {
                    if let EntryExpr::MapEntry(m) = &entry.expr {
                        let k = self.expr(&m.key);
                        let v = self.expr(&m.value);
                        cost = cost.saturating_add(k.cost).saturating_add(v.cost);
                        if i == 0 {
                            (key, value) = (k.ty, v.ty);
                        } else {
                            key = self.same_type(m.key.id, &key, &k.ty);
                            value = self.same_type(m.value.id, &value, &v.ty);
                        }
                    }
                }
                let n = map.entries.len() as u64;
                Checked {
                    ty: Ty::Map(Box::new(key), Box::new(value)),
                    cost,
                    size: Some(Size { min: n, max: n }),
                    decl: None,
                }
            }
            Expr::Struct(s) => {
                let mut cost: u64 = cel_cost::CREATE_MESSAGE;
                for entry in &s.entries {
                    if let EntryExpr::StructField(f) = &entry.expr {
                        cost = cost.saturating_add(self.expr(&f.value).cost);
                    }
                }
                Checked::of(Ty::Dyn, cost)
            }
            Expr::Unspecified => Checked::of(Ty::Dyn, 0),
        }
    }

    /// The type elements of a list or map literal share: cel-go refuses a literal mixing types
    /// (`[1, 'a']`) unless an element is `dyn`.
    fn same_type(&mut self, id: u64, expected: &Ty, found: &Ty) -> Ty {
        let mut bindings = Vec::new();
        if unify(expected, found, &mut bindings) {
            return join_types(expected, found);
        }
        self.error(
            id,
            format!(
                "expected type '{}' but found '{}'",
                expected.name(),
                found.name()
            ),
        );
        Ty::Error
    }

    /// The type of `operand.field`.
    fn select(&mut self, id: u64, operand: &Checked, field: &str) -> Checked {
        match &operand.ty {
            Ty::Object(decl) => match decl.field(field) {
                Some(f) => Checked {
                    ty: f.ty(),
                    cost: 0,
                    size: None,
                    decl: operand.decl.as_ref().map(|_| Arc::clone(f)),
                },
                None => self.error(id, format!("undefined field '{field}'")),
            },
            Ty::Map(_, v) => Checked::of((**v).clone(), 0),
            Ty::Dyn => Checked::of(Ty::Dyn, 0),
            Ty::Error => Checked::of(Ty::Error, 0),
            Ty::Optional(inner) => {
                let inner = Checked {
                    ty: (**inner).clone(),
                    cost: 0,
                    size: None,
                    decl: operand.decl.clone(),
                };
                let mut out = self.select(id, &inner, field);
                if !matches!(out.ty, Ty::Error) {
                    out.ty = Ty::Optional(Box::new(out.ty));
                }
                out
            }
            other => {
                let name = other.name();
                self.error(
                    id,
                    format!("type '{name}' does not support field selection"),
                )
            }
        }
    }

    fn call(&mut self, id: u64, call: &CallExpr) -> Checked {
        let name = call.func_name.as_str();
        // `a.b.f(x)` where `a` is no variable: the qualified function `a.b.f` (`optional.of`).
        if let Some(target) = &call.target {
            if let Some(q) = qualified_name(&target.expr) {
                let root = q.split('.').next().unwrap_or("");
                let qualified = format!("{q}.{name}");
                if self.lookup(root).is_none() && cel_lib::function(&qualified).is_some() {
                    let args: Vec<Checked> = call.args.iter().map(|a| self.expr(a)).collect();
                    return self.resolve(id, &qualified, None, args);
                }
            }
        }
        match name {
            "_&&_" | "_||_" => {
                let args: Vec<Checked> = call.args.iter().map(|a| self.expr(a)).collect();
                let cost = args.iter().fold(0u64, |s, a| s.saturating_add(a.cost));
                if args
                    .iter()
                    .all(|a| matches!(a.ty, Ty::Bool | Ty::Dyn | Ty::Error))
                {
                    return Checked::of(Ty::Bool, cost);
                }
                return self.no_overload(id, name, None, &args);
            }
            "_?_:_" if call.args.len() == 3 => {
                let args: Vec<Checked> = call.args.iter().map(|a| self.expr(a)).collect();
                let mut bindings = Vec::new();
                let ok = unify(&Ty::Bool, &args[0].ty, &mut bindings)
                    && unify(&Ty::Param("A"), &args[1].ty, &mut bindings)
                    && unify(&Ty::Param("A"), &args[2].ty, &mut bindings);
                if !ok {
                    return self.no_overload(id, name, None, &args);
                }
                let (a, b) = (args[1].size(), args[2].size());
                return Checked {
                    ty: substitute(&Ty::Param("A"), &bindings),
                    cost: args[0].cost.saturating_add(args[1].cost.max(args[2].cost)),
                    size: Some(Size {
                        min: a.min.min(b.min),
                        max: a.max.max(b.max),
                    }),
                    decl: None,
                };
            }
            "_?._" if call.args.len() == 2 => {
                let operand = self.expr(&call.args[0]);
                let field = match &call.args[1].expr {
                    Expr::Literal(LiteralValue::String(s)) => s.to_string(),
                    _ => String::new(),
                };
                let mut out = self.select(id, &operand, &field);
                out.cost = operand.cost.saturating_add(1);
                if !matches!(out.ty, Ty::Error | Ty::Optional(_)) {
                    out.ty = Ty::Optional(Box::new(out.ty));
                }
                out.decl = None;
                return out;
            }
            _ => {}
        }
        let target = call.target.as_ref().map(|t| self.expr(t));
        let args: Vec<Checked> = call.args.iter().map(|a| self.expr(a)).collect();
        self.resolve(id, name, target, args)
    }

    fn no_overload(
        &mut self,
        id: u64,
        name: &str,
        target: Option<&Ty>,
        args: &[Checked],
    ) -> Checked {
        if target.is_some_and(|t| matches!(t, Ty::Error))
            || args.iter().any(|a| matches!(a.ty, Ty::Error))
        {
            return Checked::of(Ty::Error, 0);
        }
        let list: Vec<String> = args.iter().map(|a| a.ty.name()).collect();
        let signature = match target {
            Some(t) => format!("{}.({})", t.name(), list.join(", ")),
            None => format!("({})", list.join(", ")),
        };
        self.error(
            id,
            format!("found no matching overload for '{name}' applied to '{signature}'"),
        )
    }

    fn resolve(
        &mut self,
        id: u64,
        name: &str,
        target: Option<Checked>,
        args: Vec<Checked>,
    ) -> Checked {
        let Some(function) = cel_lib::function(name) else {
            return self.error(
                id,
                format!("undeclared reference to '{name}' (in container '')"),
            );
        };
        let cost = cel_cost::call(name, target.as_ref(), &args);
        if let Some(result) = &function.lenient {
            return Checked::of(result.clone(), cost.cost);
        }
        let member = target.is_some();
        let mut all: Vec<&Ty> = Vec::new();
        if let Some(t) = &target {
            all.push(&t.ty);
        }
        all.extend(args.iter().map(|a| &a.ty));
        let mut result: Option<Ty> = None;
        for o in function
            .overloads
            .iter()
            .filter(|o: &&Overload| o.member == member)
        {
            if o.params.len() != all.len() {
                continue;
            }
            let mut bindings = Vec::new();
            if o.params
                .iter()
                .zip(&all)
                .all(|(p, a)| unify(p, a, &mut bindings))
            {
                let r = substitute(&o.result, &bindings);
                result = Some(match result {
                    None => r,
                    Some(prev) if std::mem::discriminant(&prev) == std::mem::discriminant(&r) => {
                        prev
                    }
                    Some(_) => Ty::Dyn,
                });
            }
        }
        match result {
            Some(ty) => Checked {
                ty,
                cost: cost.cost,
                size: cost.size,
                decl: None,
            },
            None => self.no_overload(id, name, target.as_ref().map(|t| &t.ty), &args),
        }
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Checked {
        let range = self.expr(&c.iter_range);
        let (elem, elem_decl) = match (&range.ty, range.decl.as_deref().map(|d| &d.kind)) {
            (Ty::List(e), Some(DeclKind::List(d))) => ((**e).clone(), Some(Arc::clone(d))),
            (Ty::Map(k, _), Some(DeclKind::Map(kd, _))) => ((**k).clone(), Some(Arc::clone(kd))),
            (Ty::List(e), _) | (Ty::Map(e, _), _) => ((**e).clone(), None),
            (Ty::Dyn, _) => (Ty::Dyn, None),
            (Ty::Error, _) => (Ty::Error, None),
            (other, _) => {
                let name = other.name();
                self.error(
                    c.iter_range.id,
                    format!(
                        "expression of type '{name}' cannot be range of a comprehension (must be list, map, or dynamic)"
                    ),
                );
                (Ty::Error, None)
            }
        };
        let init = self.expr(&c.accu_init);
        self.scopes.push(Var {
            name: c.accu_var.clone(),
            ty: init.ty.clone(),
            decl: None,
        });
        self.scopes.push(Var {
            name: c.iter_var.clone(),
            ty: elem,
            decl: elem_decl,
        });
        let cond = self.expr(&c.loop_cond);
        let step = self.expr(&c.loop_step);
        self.scopes.pop();
        // The accumulator takes the type the steps build (a `map` of strings is a list of strings).
        if let Some(accu) = self.scopes.last_mut() {
            accu.ty = join_types(&step.ty, &init.ty);
        }
        let result = self.expr(&c.result);
        self.scopes.pop();
        let count = range.size();
        let per_iteration = cond.cost.saturating_add(step.cost);
        Checked {
            ty: result.ty,
            cost: range
                .cost
                .saturating_add(init.cost)
                .saturating_add(result.cost)
                .saturating_add(count.max.saturating_mul(per_iteration)),
            size: Some(count),
            decl: None,
        }
    }
}

fn literal(lit: &LiteralValue) -> Checked {
    let (ty, size) = match lit {
        LiteralValue::Boolean(_) => (Ty::Bool, None),
        LiteralValue::Int(_) => (Ty::Int, None),
        LiteralValue::UInt(_) => (Ty::Uint, None),
        LiteralValue::Double(_) => (Ty::Double, None),
        LiteralValue::Null => (Ty::Null, None),
        LiteralValue::String(s) => {
            let n = s.chars().count() as u64;
            (Ty::String, Some(Size { min: n, max: n }))
        }
        LiteralValue::Bytes(b) => {
            let n = b.len() as u64;
            (Ty::Bytes, Some(Size { min: n, max: n }))
        }
    };
    Checked {
        ty,
        cost: 0,
        size,
        decl: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcluster::schema::cel_types::declare;
    use crate::devcluster::schema::node::{Node, Site};
    use crate::devcluster::schema::rules::{Checks, RuleEnv};
    use serde_json::json;

    /// Checks `rule` with `self` of `schema` (a resource root when `root`).
    fn outcome(schema: serde_json::Value, rule: &str) -> Outcome {
        let env = RuleEnv::new().expect("env");
        let mut checks = Checks::new(&env);
        let node = Node::parse(&schema, &Site::root(), &mut checks).expect("schema parses");
        let decl = declare(&node, false, "selfType").expect("typed");
        let program = env.0.compile(rule).expect("parses");
        let vars = vec![Var {
            name: "self".into(),
            ty: decl.ty(),
            decl: Some(decl),
        }];
        check(&program, rule, vars)
    }

    fn spec() -> serde_json::Value {
        json!({"type": "object", "properties": {
            "count": {"type": "integer"}, "name": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
            "port": {"x-kubernetes-int-or-string": true}}})
    }

    #[test]
    fn errors_point_where_cel_go_points() {
        let cases = [
            ("self.nope == 1", "ERROR: <input>:1:5: undefined field 'nope'\n | self.nope == 1\n | ....^"),
            ("has(self.nope)", "ERROR: <input>:1:4: undefined field 'nope'\n | has(self.nope)\n | ...^"),
            ("self.count == 'x'", "ERROR: <input>:1:12: found no matching overload for '_==_' applied to '(int, string)'\n | self.count == 'x'\n | ...........^"),
            ("self.name.foo()", "ERROR: <input>:1:14: undeclared reference to 'foo' (in container '')\n | self.name.foo()\n | .............^"),
            ("self.count.size() > 0", "ERROR: <input>:1:16: found no matching overload for 'size' applied to 'int.()'\n | self.count.size() > 0\n | ...............^"),
            ("self.labels.a > 'x'", "ERROR: <input>:1:15: found no matching overload for '_>_' applied to '(int, string)'\n | self.labels.a > 'x'\n | ..............^"),
            ("'é' + self.nope == 'a'", "ERROR: <input>:1:11: undefined field 'nope'\n | 'é' + self.nope == 'a'\n | .\u{ff0e}........^"),
        ];
        for (rule, expected) in cases {
            assert_eq!(outcome(spec(), rule).errors, expected, "{rule}");
        }
    }

    #[test]
    fn an_error_is_reported_once_where_it_arises() {
        let out = outcome(spec(), "self.tags.map(t, t + 1).size() > 0");
        assert_eq!(out.errors.matches("ERROR").count(), 1, "{}", out.errors);
        assert!(out.errors.contains("'_+_' applied to '(string, int)'"));
    }

    #[test]
    fn well_typed_rules_check_and_give_their_type() {
        for rule in [
            "self.tags.all(t, t.startsWith('a')) && self.tags.exists_one(t, t == 'b')",
            "self.labels.all(k, self.labels[k] > 0) && 'a' in self.labels",
            "self.port.anything == 1 && type(self.port) == string",
            "self.count < 1.5 && int(self.name) == 1 && [1, 2].size() == 2",
            "self.tags.filter(t, t != 'a').map(t, t.lowerAscii()).join(',') == 'a'",
        ] {
            let out = outcome(spec(), rule);
            assert_eq!(out.errors, "", "{rule}");
            assert!(matches!(out.ty, Ty::Bool), "{rule}");
        }
        assert!(matches!(outcome(spec(), "self.count + 1").ty, Ty::Int));
    }

    #[test]
    fn cost_follows_kube_apiserver_estimates() {
        // 1048575 items (3 MiB of `"",`) times a 3145726-byte string matched against a regex.
        let out = outcome(spec(), "self.tags.all(x, x.matches('^a'))");
        assert!(out.cost > 100 * 10_000_000, "{}", out.cost);
        // `self.tags` (2) and the result (1), then per item the loop condition (2) and step (3).
        let out = outcome(spec(), "self.tags.all(x, x == 'a')");
        assert_eq!(out.cost, 3 + 1_048_575 * 5);
        let out = outcome(spec(), "self.name.lowerAscii() == 'a'");
        assert_eq!(out.cost, 314_573 + 2 + 1);
    }
}
