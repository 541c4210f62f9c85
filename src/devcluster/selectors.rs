//! Label and field selectors (`labelSelector`, `fieldSelector` query parameters) for list,
//! watch and deletecollection, with kube-apiserver's grammar and semantics.
//!
//! Labels: `k=v`, `k==v`, `k!=v` (also matches objects without `k`), `k in (a,b)`,
//! `k notin (a,b)` (also matches objects without `k`), `k` (exists), `!k` (does not exist),
//! `k>n`, `k<n`; requirements are ANDed with commas. Fields: `f=v`, `f==v`, `f!=v` over the
//! fields a resource supports (`metadata.name`, `metadata.namespace` everywhere; a few more on
//! built-ins; a custom resource's CRD `selectableFields` for the version asked, a field its
//! object lacks reading as the empty string); any other field is refused as kube-apiserver
//! does (`field label not supported: <f>`, or for kinds with only metadata fields `"<f>" is
//! not a known field selector: ...`).

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use super::registry::{Builtin, ResourceType};

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    NotExists,
    Gt,
    Lt,
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

static CMP: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^([^\s!=<>(),]+)\s*(==|=|!=|>|<)\s*([^\s,()]*)$"));
static SET: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^([^\s!=<>(),]+)\s+(in|notin)\s*\(([^()]*)\)$"));
static KEY: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^([A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?)$"));
static VALUE: LazyLock<Result<Regex, regex::Error>> =
    LazyLock::new(|| Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"));

fn re(r: &'static LazyLock<Result<Regex, regex::Error>>) -> Result<&'static Regex, String> {
    r.as_ref()
        .map_err(|e| format!("internal selector grammar error: {e}"))
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn check_key(key: &str) -> Result<(), String> {
    if key.len() > 316 || !re(&KEY)?.is_match(key) {
        return Err(format!(
            "unable to parse requirement: Invalid value: {key:?}: name part must consist of \
             alphanumeric characters, '-', '_' or '.', and must start and end with an \
             alphanumeric character"
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    if value.len() > 63 || !re(&VALUE)?.is_match(value) {
        return Err(format!(
            "unable to parse requirement: Invalid value: {value:?}: a valid label must be an \
             empty string or consist of alphanumeric characters, '-', '_' or '.', and must \
             start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

impl LabelSelector {
    /// Parses a `labelSelector` query value.
    ///
    /// # Errors
    /// A kube-apiserver-style message (sent as 400 BadRequest) naming the bad requirement.
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(LabelSelector::default());
        }
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if let Some(key) = part.strip_prefix('!') {
                let key = key.trim();
                check_key(key)?;
                reqs.push(Requirement {
                    key: key.to_string(),
                    op: Op::NotExists,
                    values: Vec::new(),
                });
            } else if let Some(c) = re(&SET)?.captures(part) {
                let values: Vec<String> = c[3]
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect();
                check_key(&c[1])?;
                for v in &values {
                    check_value(v)?;
                }
                if values.is_empty() {
                    return Err(format!(
                        "unable to parse requirement: for 'in', 'notin' operators, values set \
                         can't be empty: {part:?}"
                    ));
                }
                let op = if &c[2] == "in" { Op::In } else { Op::NotIn };
                reqs.push(Requirement {
                    key: c[1].to_string(),
                    op,
                    values,
                });
            } else if let Some(c) = re(&CMP)?.captures(part) {
                check_key(&c[1])?;
                let op = match &c[2] {
                    "=" | "==" => Op::Eq,
                    "!=" => Op::NotEq,
                    ">" => Op::Gt,
                    _ => Op::Lt,
                };
                if matches!(op, Op::Gt | Op::Lt) && c[3].parse::<i64>().is_err() {
                    return Err(format!(
                        "unable to parse requirement: for 'Gt', 'Lt' operators, the value must \
                         be an integer: {part:?}"
                    ));
                }
                if !matches!(op, Op::Gt | Op::Lt) {
                    check_value(&c[3])?;
                }
                reqs.push(Requirement {
                    key: c[1].to_string(),
                    op,
                    values: vec![c[3].to_string()],
                });
            } else {
                check_key(part)?;
                reqs.push(Requirement {
                    key: part.to_string(),
                    op: Op::Exists,
                    values: Vec::new(),
                });
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the selector has no requirement.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object["metadata"]["labels"].as_object();
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| {
            let v = get(&r.key);
            match r.op {
                Op::Exists => v.is_some(),
                Op::NotExists => v.is_none(),
                Op::Eq | Op::In => v.is_some_and(|v| r.values.iter().any(|x| x == v)),
                Op::NotEq | Op::NotIn => v.is_none_or(|v| r.values.iter().all(|x| x != v)),
                Op::Gt | Op::Lt => {
                    let (Some(have), Some(want)) = (
                        v.and_then(|v| v.parse::<i64>().ok()),
                        r.values.first().and_then(|w| w.parse::<i64>().ok()),
                    ) else {
                        return false;
                    };
                    if r.op == Op::Gt {
                        have > want
                    } else {
                        have < want
                    }
                }
            }
        })
    }
}

/// A parsed field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields `rt` can be selected on in `version`: the metadata ones, a built-in's own, and a
/// custom resource's `selectableFields` (kube-apiserver's CustomResourceFieldSelectors, GA in
/// 1.32).
pub fn selectable_fields<'a>(rt: &'a ResourceType, version: &str) -> Vec<&'a str> {
    let mut fields = vec!["metadata.name", "metadata.namespace"];
    if let Some(v) = rt.version(version) {
        fields.extend(v.selectable_fields.iter().map(String::as_str));
    }
    match rt.builtin() {
        Some(Builtin::Namespace) => fields.push("status.phase"),
        Some(Builtin::Secret) => fields.push("type"),
        Some(Builtin::CoreEvent) => fields.extend([
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]),
        _ => {}
    }
    fields
}

/// How kube-apiserver words an unsupported field in a selector of `rt`: the kinds whose
/// selectable fields are only `metadata.name` and `metadata.namespace` (ConfigMaps, Leases,
/// ServiceAccounts, CRDs) say `"f" is not a known field selector: only "metadata.name",
/// "metadata.namespace"`; custom resources and kinds with fields of their own say
/// `field label not supported: f` (what kube-apiserver v1.34 answers).
pub fn unknown_field_message(rt: &ResourceType, field: &str) -> String {
    match rt.builtin() {
        Some(Builtin::ConfigMap | Builtin::Lease | Builtin::ServiceAccount | Builtin::Crd) => {
            format!(
                "\"{field}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )
        }
        _ => format!("field label not supported: {field}"),
    }
}

impl FieldSelector {
    /// Parses a `fieldSelector` query value, allowing only `supported` fields; `unknown` words
    /// the error for a field not in `supported` (see [`unknown_field_message`]).
    ///
    /// # Errors
    /// `unknown(field)` or a parse error (sent as 400 BadRequest).
    pub fn parse(
        s: &str,
        supported: &[&str],
        unknown: impl Fn(&str) -> String,
    ) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, negate, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, false, v)
            } else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(unknown(field));
            }
            terms.push((field.to_string(), negate, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the selector has no term.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name a `metadata.name=<name>` term requires, if any (kube-apiserver then reads that
    /// one key instead of listing).
    pub fn single_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(f, negate, _)| f == "metadata.name" && !negate)
            .map(|(_, _, v)| v.as_str())
    }

    /// Whether an object (in storage form) satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, negate, want)| {
            let path = if field == "source" {
                "source.component"
            } else {
                field
            };
            let mut cur = object;
            for seg in path.split('.') {
                cur = &cur[seg];
            }
            let have = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) != *negate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    fn sel(s: &str) -> LabelSelector {
        match LabelSelector::parse(s) {
            Ok(sel) => sel,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn equality_and_inequality() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        assert!(sel("app=web").matches(&o));
        assert!(sel("app==web,tier=front").matches(&o));
        assert!(!sel("app!=web").matches(&o));
        assert!(sel("missing!=x").matches(&o));
    }

    #[test]
    fn sets_and_existence() {
        let o = obj(json!({"app": "web"}));
        assert!(sel("app in (web, api)").matches(&o));
        assert!(!sel("app notin (web)").matches(&o));
        assert!(sel("other notin (web)").matches(&o));
        assert!(sel("app").matches(&o));
        assert!(sel("!other").matches(&o));
        assert!(!sel("!app").matches(&o));
        assert!(sel("app in (web),!other").matches(&o));
    }

    #[test]
    fn malformed_selectors_are_refused() {
        assert!(LabelSelector::parse("app in ()").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(LabelSelector::parse("-bad").is_err());
    }

    #[test]
    fn field_selectors_support_name_and_namespace_only() {
        let fields = ["metadata.name", "metadata.namespace"];
        let unknown = |f: &str| format!("field label not supported: {f}");
        let o = obj(json!({}));
        let Ok(f) = FieldSelector::parse(
            "metadata.name=a,metadata.namespace!=other",
            &fields,
            unknown,
        ) else {
            panic!("parses");
        };
        assert!(f.matches(&o));
        assert_eq!(
            FieldSelector::parse("spec.x=1", &fields, unknown),
            Err("field label not supported: spec.x".to_string())
        );
    }
}
