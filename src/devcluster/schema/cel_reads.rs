//! What of `self` (and `oldSelf`) a compiled rule reads, so the value bound to it is built from
//! that part of the object only. kube-apiserver binds `self` lazily (each field is converted to
//! CEL when the rule selects it); this server converts eagerly, so without this a rule at the
//! root of a resource (`size(self.metadata.name) <= 63`) converted the whole object, status
//! included, on every write: a third of the embedded server's CPU in `agentrt bench --workload
//! wide` (docs/performance.md, session 19). The outcome of a rule is the same either way: it
//! only ever sees the fields it selects.
//!
//! A rule's reads are the selection chains it starts at the variable (`self.metadata.name`,
//! `has(self.spec.x)`), each kept whole from where the chain ends. Any other use of the variable
//! (`self == oldSelf`, `size(self)`, `self.all(...)`, an index `self[k]`, a comprehension that
//! names a variable after it) reads all of it.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::{Map, Value};

use super::cel_value::escape;

/// The field paths (CEL names, as the rule spells them) a rule reads below a variable; `All`
/// when it reads the variable whole (or may).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reads {
    /// Every field.
    All,
    /// Only these paths, each read whole from its end (none: the rule does not read it).
    Paths(Vec<Vec<String>>),
}

impl Default for Reads {
    /// Nothing read.
    fn default() -> Reads {
        Reads::none()
    }
}

impl Reads {
    /// Nothing read yet.
    pub(super) fn none() -> Reads {
        Reads::Paths(Vec::new())
    }

    /// What `expr` reads of variable `var`, added to `self`.
    pub(super) fn add(&mut self, expr: &IdedExpr, var: &str) {
        if let Reads::Paths(paths) = self {
            if !collect(expr, var, paths) {
                *self = Reads::All;
            }
        }
    }

    /// Both reads together.
    pub(super) fn union(&mut self, other: &Reads) {
        match (&mut *self, other) {
            (Reads::All, _) => {}
            (_, Reads::All) => *self = Reads::All,
            (Reads::Paths(mine), Reads::Paths(theirs)) => mine.extend(theirs.iter().cloned()),
        }
    }

    /// `value` with only what is read kept: an object keeps the properties a path starts with
    /// (matched by their CEL name, or as a map's key), anything else is kept whole. `None`
    /// when nothing is read.
    pub(super) fn keep(&self, value: &Value) -> Option<Value> {
        match self {
            Reads::All => Some(value.clone()),
            Reads::Paths(paths) if paths.is_empty() => None,
            Reads::Paths(paths) => Some(keep_paths(value, paths)),
        }
    }
}

/// `value` with the parts `paths` select; a path that ends here keeps all of it.
fn keep_paths(value: &Value, paths: &[Vec<String>]) -> Value {
    if paths.iter().any(Vec::is_empty) {
        return value.clone();
    }
    let Value::Object(map) = value else {
        return value.clone();
    };
    let mut kept = Map::new();
    for (name, field) in map {
        let cel_name = escape(name);
        let below: Vec<Vec<String>> = paths
            .iter()
            .filter(|p| p[0] == *name || cel_name.as_deref() == Some(p[0].as_str()))
            .map(|p| p[1..].to_vec())
            .collect();
        if !below.is_empty() {
            kept.insert(name.clone(), keep_paths(field, &below));
        }
    }
    Value::Object(kept)
}

/// The fields a chain of selections from `var` spells (`var.a.b`: `[a, b]`), if `expr` is one.
fn chain(expr: &Expr, var: &str) -> Option<Vec<String>> {
    match expr {
        Expr::Ident(name) if name == var => Some(Vec::new()),
        Expr::Select(sel) => {
            let mut path = chain(&sel.operand.expr, var)?;
            path.push(sel.field.clone());
            Some(path)
        }
        _ => None,
    }
}

/// Adds the paths `expr` reads below `var` to `paths`; false when it reads `var` whole.
fn collect(expr: &IdedExpr, var: &str, paths: &mut Vec<Vec<String>>) -> bool {
    if let Some(path) = chain(&expr.expr, var) {
        if path.is_empty() {
            return false;
        }
        paths.push(path);
        return true;
    }
    match &expr.expr {
        Expr::Unspecified | Expr::Literal(_) | Expr::Ident(_) => true,
        Expr::Select(sel) => collect(&sel.operand, var, paths),
        Expr::Call(call) => {
            call.target
                .as_deref()
                .is_none_or(|target| collect(target, var, paths))
                && call.args.iter().all(|arg| collect(arg, var, paths))
        }
        Expr::Comprehension(c) => {
            let shadows =
                c.iter_var == var || c.iter_var2.as_deref() == Some(var) || c.accu_var == var;
            !shadows
                && [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]
                .into_iter()
                .all(|e| collect(e, var, paths))
        }
        Expr::List(list) => list.elements.iter().all(|e| collect(e, var, paths)),
        Expr::Map(map) => map
            .entries
            .iter()
            .all(|e| collect_entry(&e.expr, var, paths)),
        Expr::Struct(s) => s.entries.iter().all(|e| collect_entry(&e.expr, var, paths)),
    }
}

/// [`collect`] for a map literal's or a message's entry: its key and value, or its field's value.
fn collect_entry(entry: &EntryExpr, var: &str, paths: &mut Vec<Vec<String>>) -> bool {
    match entry {
        EntryExpr::MapEntry(m) => collect(&m.key, var, paths) && collect(&m.value, var, paths),
        EntryExpr::StructField(f) => collect(&f.value, var, paths),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Reads;

    fn reads(rule: &str, var: &str) -> Reads {
        let env = super::super::rules::RuleEnv::new().expect("env");
        let program = env.0.compile(rule).expect("parses");
        let mut reads = Reads::none();
        reads.add(program.expression(), var);
        reads
    }

    fn paths(list: &[&[&str]]) -> Reads {
        Reads::Paths(
            list.iter()
                .map(|p| p.iter().map(|s| s.to_string()).collect())
                .collect(),
        )
    }

    #[test]
    fn selections_from_the_variable_are_its_reads_and_any_other_use_reads_it_whole() {
        assert_eq!(
            reads("size(self.metadata.name) <= 63", "self"),
            paths(&[&["metadata", "name"]])
        );
        assert_eq!(
            reads("has(self.a.b) || self.c == 1", "self"),
            paths(&[&["a", "b"], &["c"]])
        );
        assert_eq!(reads("self == oldSelf", "self"), Reads::All);
        assert_eq!(reads("self == oldSelf", "oldSelf"), Reads::All);
        assert_eq!(reads("self.x == 1", "oldSelf"), Reads::none());
        assert_eq!(reads("size(self) > 0", "self"), Reads::All);
        assert_eq!(
            reads("self.items.all(i, i > 0)", "self"),
            paths(&[&["items"]])
        );
        assert_eq!(reads("self['a'] == 1", "self"), Reads::All);
        assert_eq!(reads("[1].all(self, self > 0) && true", "self"), Reads::All);
        assert_eq!(reads("self.a[0].b == 1", "self"), paths(&[&["a"]]));
    }

    #[test]
    fn only_what_is_read_is_kept_matched_by_cel_name_or_map_key() {
        let object = json!({
            "metadata": {"name": "r", "uid": "u", "managedFields": [{"manager": "m"}]},
            "spec": {"x-y": 1, "z": 2},
            "status": {"steps": [1, 2, 3]},
        });
        let kept = paths(&[&["metadata", "name"], &["spec", "x__dash__y"]]).keep(&object);
        assert_eq!(
            kept,
            Some(json!({"metadata": {"name": "r"}, "spec": {"x-y": 1}}))
        );
        assert_eq!(
            paths(&[&["status"]]).keep(&object),
            Some(json!({"status": {"steps": [1, 2, 3]}}))
        );
        assert_eq!(Reads::All.keep(&object), Some(object.clone()));
        assert_eq!(Reads::none().keep(&object), None);
    }
}
