//! Decision validation (docs/design.md section 6, docs/behaviours.md 1, 7, 8): usable JSON (nesting at
//! most 256 levels, numbers the Kubernetes API stores exactly), and tool input schemas compiled
//! with no external reference resolved.
//!
//! Owns: what "usable JSON" means for args, content and schemas, and the compiled form of a
//! tool's `inputSchema`. Must not: fetch anything (no file, no URL; the validator's retriever
//! always fails, and external `$ref`/`$schema`/`$id` are refused before compiling), or recurse
//! without bound on input (the walks keep explicit stacks bounded by [`MAX_JSON_DEPTH`]).

use serde_json::{Number, Value};

use super::canonical::ecmascript_number;

/// Deepest JSON nesting accepted in args and content.
///
/// Depth counts containers: a scalar at the top is depth 0, `[]` and `{}` are depth 1,
/// `[[1]]` is depth 2. 256 nested arrays are accepted, 257 refused.
pub const MAX_JSON_DEPTH: usize = 256;

/// Checks that `value` can be stored by the Kubernetes API exactly as given: nesting at most
/// [`MAX_JSON_DEPTH`], integers within int64, floats finite. Paths in the error start at `args`
/// (use [`check_storable_at`] to name another root).
///
/// # Errors
/// A sentence naming the problem, e.g. `args nest deeper than 256 levels`.
pub fn check_storable(value: &Value) -> Result<(), String> {
    check_storable_at(value, "args")
}

/// [`check_storable`] with the error's paths rooted at `root` (e.g. `spec.tools[1].inputSchema`).
///
/// The rules (docs/design.md section 6):
/// - depth (counted as in [`MAX_JSON_DEPTH`]) at most 256;
/// - an integer must fit int64. kube-apiserver decodes an integer that does not as a float64;
///   such an integer is refused unless that float holds it exactly *and* prints back as the
///   same digits (so `10000000000000000000` = 1e19 passes, `18446744073709551615` does not),
///   because only then does the value read back from the API server equal the value sent;
/// - a float must be finite (serde_json's floats always are, and always round-trip; an
///   integral float beyond 2^53 such as `1e300` is fine: it is stored as that same float).
///
/// The walk keeps an explicit stack and stops at depth 257, so a value nested 100,000 levels
/// (built in code) is refused without exhausting the thread's stack.
///
/// # Errors
/// One sentence naming the first problem found (in document order) and its path, e.g.
/// `args.items[3]: 18446744073709551615 does not fit int64; Kubernetes would store it as a
/// float and lose digits`, or `args nest deeper than 256 levels of arrays and objects (at
/// args.a[0]…)`.
pub fn check_storable_at(value: &Value, root: &str) -> Result<(), String> {
    let mut stack: Vec<Walk<'_>> = Vec::new();
    let mut path = JsonPath::new(root);
    match value {
        Value::Number(n) => return check_number(n, &path),
        _ => match walk_of(value) {
            Some(walk) => stack.push(walk),
            None => return Ok(()),
        },
    }
    while let Some(top) = stack.last_mut() {
        let Some((segment, child)) = top.next_child() else {
            stack.pop();
            path.pop();
            continue;
        };
        match child {
            Value::Number(n) => {
                path.push(segment);
                let checked = check_number(n, &path);
                path.pop();
                checked?;
            }
            Value::Array(_) | Value::Object(_) => {
                path.push(segment);
                if stack.len() >= MAX_JSON_DEPTH {
                    return Err(format!(
                        "{root} nest deeper than {MAX_JSON_DEPTH} levels of arrays and objects \
                         (at {}); flatten the structure",
                        path.abbreviated()
                    ));
                }
                stack.extend(walk_of(child));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Why a number is not stored exactly, or `Ok`.
fn check_number(n: &Number, path: &JsonPath) -> Result<(), String> {
    if n.is_i64() {
        return Ok(());
    }
    if let Some(u) = n.as_u64() {
        // Above i64::MAX: Kubernetes keeps it as a float64.
        #[allow(clippy::cast_precision_loss)]
        let as_float = u as f64;
        let same_digits = ecmascript_number(as_float)
            .map(|text| text == u.to_string())
            .unwrap_or(false);
        if same_digits {
            return Ok(());
        }
        return Err(format!(
            "{}: {u} does not fit int64; Kubernetes would store it as a float and lose digits \
             (send it as a string)",
            path.render()
        ));
    }
    match n.as_f64() {
        Some(f) if f.is_finite() => Ok(()),
        _ => Err(format!(
            "{}: {n} is not a finite number; Kubernetes cannot store it",
            path.render()
        )),
    }
}

/// One container being walked, with its remaining children.
enum Walk<'a> {
    Array(std::iter::Enumerate<std::slice::Iter<'a, Value>>),
    Object(serde_json::map::Iter<'a>),
}

impl<'a> Walk<'a> {
    fn next_child(&mut self) -> Option<(Segment<'a>, &'a Value)> {
        match self {
            Walk::Array(items) => items.next().map(|(i, v)| (Segment::Index(i), v)),
            Walk::Object(members) => members.next().map(|(k, v)| (Segment::Key(k), v)),
        }
    }
}

/// The walk over a container's children; `None` for a scalar.
fn walk_of(value: &Value) -> Option<Walk<'_>> {
    match value {
        Value::Array(items) => Some(Walk::Array(items.iter().enumerate())),
        Value::Object(map) => Some(Walk::Object(map.iter())),
        _ => None,
    }
}

/// One step of a path into a JSON value.
#[derive(Clone, Copy)]
enum Segment<'a> {
    Key(&'a str),
    Index(usize),
}

/// A path into a JSON value, rendered as `root.key[3]["odd key"]`.
struct JsonPath<'a> {
    root: &'a str,
    segments: Vec<Segment<'a>>,
}

impl<'a> JsonPath<'a> {
    fn new(root: &'a str) -> Self {
        JsonPath {
            root,
            segments: Vec::new(),
        }
    }

    fn push(&mut self, segment: Segment<'a>) {
        self.segments.push(segment);
    }

    fn pop(&mut self) {
        self.segments.pop();
    }

    fn render(&self) -> String {
        render_path(self.root, &self.segments)
    }

    /// The path, cut after its first 8 segments (a depth error's path is 257 segments long).
    fn abbreviated(&self) -> String {
        const SHOWN: usize = 8;
        if self.segments.len() <= SHOWN {
            return self.render();
        }
        let head: Vec<Segment<'a>> = self.segments.iter().take(SHOWN).copied().collect();
        format!("{}…", render_path(self.root, &head))
    }
}

fn render_path(root: &str, segments: &[Segment<'_>]) -> String {
    let mut out = String::from(root);
    for segment in segments {
        match segment {
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
            Segment::Key(k) if is_identifier(k) => {
                out.push('.');
                out.push_str(k);
            }
            Segment::Key(k) => {
                let quoted = serde_json::to_string(k).unwrap_or_else(|_| format!("{k:?}"));
                out.push('[');
                out.push_str(&quoted);
                out.push(']');
            }
        }
    }
    out
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
}

mod schema;
pub mod spec;
pub use schema::{ToolSchema, MAX_VIOLATIONS, MAX_VIOLATION_CHARS};
pub use spec::Problem;

/// Helpers for tests that build very deep values.
#[cfg(test)]
pub(crate) mod tests_support {
    use serde_json::Value;

    /// Drops `value` without recursion (serde_json's `Value` drops recursively, and a value
    /// nested 100,000 deep would overflow the test thread's stack).
    pub(crate) fn drop_deep(value: Value) {
        let mut pending = vec![value];
        while let Some(v) = pending.pop() {
            match v {
                Value::Array(items) => pending.extend(items),
                Value::Object(map) => pending.extend(map.into_iter().map(|(_, v)| v)),
                _ => {}
            }
        }
    }

    /// `depth` arrays nested around `1`.
    pub(crate) fn nested_arrays(depth: usize) -> Value {
        let mut v = Value::from(1);
        for _ in 0..depth {
            v = Value::Array(vec![v]);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::{drop_deep, nested_arrays};
    use super::*;
    use serde_json::json;

    #[test]
    fn scalars_are_depth_zero_and_256_nested_arrays_are_accepted() {
        assert_eq!(check_storable(&json!(1)), Ok(()));
        assert_eq!(check_storable(&json!("x")), Ok(()));
        assert_eq!(check_storable(&nested_arrays(256)), Ok(()));
        // Empty containers count as a level too.
        let mut v = json!([]);
        for _ in 0..255 {
            v = json!([v]);
        }
        assert_eq!(check_storable(&v), Ok(()));
        assert!(check_storable(&json!([v])).is_err());
    }

    #[test]
    fn nesting_deeper_than_256_levels_is_refused() {
        let err = check_storable(&nested_arrays(257)).expect_err("too deep");
        assert!(
            err.starts_with("args nest deeper than 256 levels of arrays and objects (at args[0]"),
            "{err}"
        );
        let mut v = json!({"a": 1});
        for _ in 0..256 {
            v = json!({ "a": v });
        }
        let err = check_storable(&v).expect_err("too deep");
        assert!(err.contains("(at args.a.a.a.a.a.a.a.a…)"), "{err}");
    }

    #[test]
    fn a_value_nested_100k_deep_is_refused_without_overflowing_the_stack() {
        let v = nested_arrays(100_000);
        assert!(check_storable(&v).is_err());
        drop_deep(v);
    }

    #[test]
    fn an_integer_beyond_int64_is_refused_naming_its_path() {
        let v = json!({"items": [0, 1, 2, u64::MAX]});
        assert_eq!(
            check_storable(&v),
            Err(
                "args.items[3]: 18446744073709551615 does not fit int64; Kubernetes would store \
                 it as a float and lose digits (send it as a string)"
                    .to_string()
            )
        );
    }

    #[test]
    fn int64_extremes_and_large_floats_are_stored_exactly() {
        for v in [
            json!(i64::MAX),
            json!(i64::MIN),
            json!(1e300),
            json!(-1e300),
            json!(5e-324),
            json!(0.1),
            json!(9_007_199_254_740_993i64),
        ] {
            assert_eq!(check_storable(&v), Ok(()), "{v}");
        }
    }

    #[test]
    fn an_integer_above_int64_that_a_float_prints_back_identically_is_accepted() {
        // kube-apiserver keeps it as float64 1e19 and serves it as 10000000000000000000 again.
        assert_eq!(
            check_storable(&json!(10_000_000_000_000_000_000u64)),
            Ok(())
        );
        // 2^63 + 2048 is a double, but served as 9223372036854778000: digits change.
        assert!(check_storable(&json!(9_223_372_036_854_777_856u64)).is_err());
        assert!(check_storable(&json!(9_223_372_036_854_775_808u64)).is_err());
    }

    #[test]
    fn paths_quote_keys_that_are_not_identifiers() {
        let v = json!({"a b": [{"c\"d": u64::MAX}]});
        let err = check_storable_at(&v, "content").expect_err("big");
        assert!(err.starts_with(r#"content["a b"][0]["c\"d"]: "#), "{err}");
    }
}

/// The JSON type of `value`, as an error message names it.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
