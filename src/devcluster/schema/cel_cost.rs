//! The static cost estimate of CEL rules, and the budgets kube-apiserver holds a CRD's rules to:
//! what each call costs in the worst case (cel-go's `checker/cost.go` and Kubernetes'
//! `library/cost.go`: string traversal at 0.1 per byte, regexes at 0.25 per pattern byte, list
//! creation at 10, ...), the per-rule limit (10,000,000, times how many times the rule's node can
//! occur in one object), the limit for all rules of a schema (100,000,000), and the
//! `estimated rule cost exceeds budget by factor of ...` messages.

use super::cel_check::Checked;
use super::cel_types::Ty;

/// cel-go's `StringTraversalCostFactor`.
const STRING_TRAVERSAL: f64 = 0.1;
/// cel-go's `RegexStringLengthCostFactor`.
const REGEX_LENGTH: f64 = 0.25;
/// Creating a list literal.
pub(super) const CREATE_LIST: u64 = 10;
/// Creating a map literal.
pub(super) const CREATE_MAP: u64 = 30;
/// Creating a message literal.
pub(super) const CREATE_MESSAGE: u64 = 40;
/// kube-apiserver's `StaticEstimatedCostLimit`: the most one rule may cost.
pub(super) const RULE_LIMIT: u64 = 10_000_000;
/// kube-apiserver's `StaticEstimatedCRDCostLimit`: the most all rules of a schema may cost.
pub(super) const SCHEMA_LIMIT: u64 = 100_000_000;
/// Rules cheaper than this are never named among the most expensive.
const NOTABLE: u64 = 100_000;

/// The bounds of a value's size (characters, bytes, items, entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Size {
    pub(super) min: u64,
    pub(super) max: u64,
}

/// What a call costs and, when known, the size of what it returns.
pub(super) struct CallCost {
    pub(super) cost: u64,
    pub(super) size: Option<Size>,
}

/// `ceil(n * factor)`, saturating.
fn scaled(n: u64, factor: f64) -> u64 {
    let v = (n as f64 * factor).ceil();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

/// The cost of calling `name` on `target` with `args`, the arguments' own costs included.
pub(super) fn call(name: &str, target: Option<&Checked>, args: &[Checked]) -> CallCost {
    let arg_sum = target
        .into_iter()
        .chain(args)
        .fold(0u64, |s, a| s.saturating_add(a.cost));
    let plain = |c: u64| CallCost {
        cost: c.saturating_add(arg_sum),
        size: None,
    };
    let string_like = |c: &Checked| {
        matches!(
            c.ty,
            Ty::String | Ty::Bytes | Ty::Dyn | Ty::Error | Ty::Param(_)
        )
    };
    match (name, target, args) {
        ("startsWith" | "endsWith", Some(_), [prefix]) => {
            plain(scaled(prefix.size().max, STRING_TRAVERSAL))
        }
        ("@in", None, [_, list]) if matches!(list.ty, Ty::List(_)) => plain(list.size().max),
        ("matches", Some(s), [re]) => {
            let text = scaled(s.size().max.saturating_add(1), STRING_TRAVERSAL);
            plain(text.saturating_mul(scaled(re.size().max, REGEX_LENGTH)))
        }
        ("find" | "findAll", Some(s), [re, ..]) => {
            let text = scaled(s.size().max.saturating_add(1), STRING_TRAVERSAL);
            plain(text.saturating_mul(scaled(re.size().max, REGEX_LENGTH)))
        }
        ("contains" | "indexOf" | "lastIndexOf", Some(s), [sub, ..])
            if matches!(s.ty, Ty::String) =>
        {
            plain(
                scaled(s.size().max, STRING_TRAVERSAL)
                    .saturating_mul(scaled(sub.size().max, STRING_TRAVERSAL)),
            )
        }
        ("indexOf" | "lastIndexOf" | "isSorted" | "sum" | "min" | "max", Some(list), _) => {
            plain(list.size().max)
        }
        ("_==_" | "_!=_", None, [a, b]) => {
            plain(scaled(a.size().max.min(b.size().max), STRING_TRAVERSAL))
        }
        ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b]) if string_like(a) && string_like(b) => {
            if a.ty.is_scalar() || b.ty.is_scalar() {
                plain(1)
            } else {
                plain(scaled(a.size().max.min(b.size().max), STRING_TRAVERSAL))
            }
        }
        ("_+_", None, [a, b]) => {
            let (sa, sb) = (a.size(), b.size());
            let size = Size {
                min: sa.min.saturating_add(sb.min),
                max: sa.max.saturating_add(sb.max),
            };
            match a.ty {
                Ty::String | Ty::Bytes => CallCost {
                    cost: scaled(size.max, STRING_TRAVERSAL).saturating_add(arg_sum),
                    size: Some(size),
                },
                Ty::List(_) => CallCost {
                    cost: 1u64.saturating_add(arg_sum),
                    size: Some(size),
                },
                _ => plain(1),
            }
        }
        ("lowerAscii" | "upperAscii" | "substring" | "trim" | "reverse", Some(s), _) => {
            let size = s.size();
            CallCost {
                cost: scaled(size.max, STRING_TRAVERSAL).saturating_add(arg_sum),
                size: Some(size),
            }
        }
        ("replace" | "split", Some(s), _) => {
            let size = s.size();
            CallCost {
                cost: scaled(size.max, 2.0 * STRING_TRAVERSAL).saturating_add(arg_sum),
                size: Some(Size {
                    min: 0,
                    max: size.max,
                }),
            }
        }
        ("join", Some(list), _) => {
            // Every element may be as long as the element type allows.
            let elements = list.size().max;
            let element = match &list.decl.as_deref().map(|d| &d.kind) {
                Some(super::cel_types::DeclKind::List(e)) => e.max_elements,
                _ => u64::MAX,
            };
            let size = elements.saturating_mul(element).saturating_add(elements);
            CallCost {
                cost: scaled(size, STRING_TRAVERSAL).saturating_add(arg_sum),
                size: Some(Size { min: 0, max: size }),
            }
        }
        (
            "url" | "quantity" | "isQuantity" | "ip" | "isIP" | "cidr" | "isCIDR" | "isURL"
            | "semver" | "isSemver",
            None,
            [s, ..],
        ) => plain(scaled(s.size().max, STRING_TRAVERSAL)),
        _ => plain(1),
    }
}

/// kube-apiserver's `getCostErrorMessage`.
pub(super) fn exceeds(what: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_string()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{what} exceeds budget by factor of {factor} (try simplifying the rule, or adding \
         maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

/// The cost of all rules of one schema, and the most expensive of them (by field path).
///
/// Among rules of equal cost the first four observed are named; kube-apiserver observes them in
/// Go's (random) map order, so which of several equally expensive rules it names can differ.
#[derive(Debug, Default)]
pub(super) struct TotalCost {
    pub(super) total: u64,
    /// At most four, most expensive first.
    pub(super) most_expensive: Vec<(String, u64)>,
}

impl TotalCost {
    /// Counts one rule's (or message expression's) cost.
    pub(super) fn observe(&mut self, path: &str, cost: u64) {
        self.total = self.total.saturating_add(cost);
        if cost < NOTABLE {
            return;
        }
        self.most_expensive.push((path.to_string(), cost));
        self.most_expensive
            .sort_by_key(|(_, cost)| std::cmp::Reverse(*cost));
        self.most_expensive.truncate(4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_print_like_kube_apiserver() {
        assert!(exceeds("estimated rule cost", 31_457_400, RULE_LIMIT).contains("factor of 3.1x"));
        assert!(
            exceeds("estimated rule cost", 12_000_000, RULE_LIMIT).contains("factor of 1.200000x")
        );
        assert!(exceeds("estimated rule cost", u64::MAX, RULE_LIMIT)
            .contains("factor of more than 100x"));
    }

    #[test]
    fn only_the_four_most_expensive_are_named() {
        let mut t = TotalCost::default();
        for (i, c) in [5, 200_000, 300_000, 400_000, 500_000, 600_000]
            .iter()
            .enumerate()
        {
            t.observe(&format!("r{i}"), *c);
        }
        assert_eq!(t.total, 2_000_005);
        let names: Vec<&str> = t.most_expensive.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["r5", "r4", "r3", "r2"]);
    }
}
