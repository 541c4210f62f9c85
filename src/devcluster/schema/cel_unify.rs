//! Matching CEL types against overload signatures: binding type parameters (`A` in
//! `_==_(A, A)`), `dyn` and already-failed expressions matching anything, and the common type of
//! two branches or literal elements. It owns the rules of type compatibility the checker
//! (`cel_check.rs`) applies, not the overloads themselves (`cel_lib.rs`).

use std::sync::Arc;

use super::cel_types::Ty;

/// Whether `arg` can be passed where `param` is expected, binding type parameters.
pub(super) fn unify(param: &Ty, arg: &Ty, bindings: &mut Vec<(&'static str, Ty)>) -> bool {
    match (param, arg) {
        (_, Ty::Error | Ty::Dyn) | (Ty::Dyn | Ty::Error, _) => {
            if let Ty::Param(p) = param {
                if !bindings.iter().any(|(n, _)| n == p) {
                    bindings.push((p, arg.clone()));
                }
            }
            true
        }
        (Ty::Param(p), _) => match bindings.iter().position(|(n, _)| n == p) {
            Some(i) => {
                let bound = bindings[i].1.clone();
                if matches!(bound, Ty::Dyn | Ty::Error) {
                    bindings[i].1 = arg.clone();
                    true
                } else {
                    unify(&bound, arg, bindings)
                }
            }
            None => {
                bindings.push((p, arg.clone()));
                true
            }
        },
        (Ty::List(a), Ty::List(b)) | (Ty::Optional(a), Ty::Optional(b)) => unify(a, b, bindings),
        (Ty::Type(_), Ty::Type(_)) => true,
        (Ty::Map(ka, va), Ty::Map(kb, vb)) => unify(ka, kb, bindings) && unify(va, vb, bindings),
        (Ty::Object(a), Ty::Object(b)) => Arc::ptr_eq(a, b) || a.name == b.name,
        (Ty::Opaque(a), Ty::Opaque(b)) => a == b,
        (Ty::Null, Ty::Null | Ty::Object(_) | Ty::Optional(_) | Ty::Opaque(_))
        | (Ty::Object(_) | Ty::Optional(_) | Ty::Opaque(_), Ty::Null) => true,
        (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
    }
}

/// `ty` with its bound type parameters replaced (unbound ones become `dyn`).
pub(super) fn substitute(ty: &Ty, bindings: &[(&'static str, Ty)]) -> Ty {
    match ty {
        Ty::Param(p) => bindings
            .iter()
            .find(|(n, _)| n == p)
            .map_or(Ty::Dyn, |(_, t)| t.clone()),
        Ty::List(e) => Ty::List(Box::new(substitute(e, bindings))),
        Ty::Optional(e) => Ty::Optional(Box::new(substitute(e, bindings))),
        Ty::Type(e) => Ty::Type(Box::new(substitute(e, bindings))),
        Ty::Map(k, v) => Ty::Map(
            Box::new(substitute(k, bindings)),
            Box::new(substitute(v, bindings)),
        ),
        other => other.clone(),
    }
}

/// The common type of two branches or list elements (`dyn` when they differ).
pub(super) fn join_types(a: &Ty, b: &Ty) -> Ty {
    let mut bindings = Vec::new();
    if matches!(a, Ty::Dyn | Ty::Error) {
        return b.clone();
    }
    if unify(a, b, &mut bindings) {
        a.clone()
    } else {
        Ty::Dyn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_parameter_binds_once_and_dyn_yields_to_a_concrete_type() {
        let mut b = Vec::new();
        assert!(unify(&Ty::Param("A"), &Ty::Int, &mut b));
        assert!(!unify(&Ty::Param("A"), &Ty::String, &mut b));
        let mut b = Vec::new();
        assert!(unify(&Ty::Param("A"), &Ty::Dyn, &mut b));
        assert!(unify(&Ty::Param("A"), &Ty::String, &mut b));
        assert!(
            matches!(substitute(&Ty::List(Box::new(Ty::Param("A"))), &b), Ty::List(e) if matches!(*e, Ty::String))
        );
    }

    #[test]
    fn numbers_of_different_kinds_do_not_unify() {
        assert!(!unify(&Ty::Int, &Ty::Double, &mut Vec::new()));
        assert!(unify(&Ty::Int, &Ty::Error, &mut Vec::new()));
        assert!(matches!(join_types(&Ty::Int, &Ty::String), Ty::Dyn));
    }
}
