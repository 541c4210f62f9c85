//! Sets of field paths, as structured-merge-diff's `fieldpath.Set`, and their `FieldsV1`
//! encoding (`f:name`, `k:{"name":"x"}`, `v:"x"`, `i:0`, `.` for a node that is itself a
//! member), plus the path text of conflict messages (`.spec.ports[name="a"].port`).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pe {
    /// A field of a map or struct.
    Field(String),
    /// An item of a `map` list, by its key fields (name, compact JSON value), sorted by name.
    Key(Vec<(String, String)>),
    /// An item of a `set` list, by its value (compact JSON).
    Value(String),
    /// An item of a list by position (lists that are neither atomic nor keyed).
    Index(usize),
}

impl Pe {
    /// The `FieldsV1` key of this step.
    fn encode(&self) -> String {
        match self {
            Pe::Field(name) => format!("f:{name}"),
            Pe::Key(fields) => format!("k:{}", key_json(fields)),
            Pe::Value(json) => format!("v:{json}"),
            Pe::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a `FieldsV1` key (not `.`).
    fn decode(key: &str) -> Option<Pe> {
        let (prefix, rest) = key.split_at_checked(2)?;
        match prefix {
            "f:" => Some(Pe::Field(rest.to_string())),
            "v:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                Some(Pe::Value(v.to_string()))
            }
            "k:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                let fields = v
                    .as_object()?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect();
                Some(Pe::Key(fields))
            }
            "i:" => rest.parse().ok().map(Pe::Index),
            _ => None,
        }
    }
}

fn key_json(fields: &[(String, String)]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// A path from the object's root.
pub type Path = Vec<Pe>;

/// The text structured-merge-diff prints for a path: `.spec.ports[name="a",protocol="TCP"]`,
/// `.spec.tags[="x"]`, `.spec.args[0]`.
pub fn path_text(path: &[Pe]) -> String {
    let mut out = String::new();
    for pe in path {
        match pe {
            Pe::Field(name) => {
                out.push('.');
                out.push_str(name);
            }
            Pe::Key(fields) => {
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                out.push_str(&format!("[{}]", parts.join(",")));
            }
            Pe::Value(json) => out.push_str(&format!("[={json}]")),
            Pe::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A set of paths (each a member; a member's ancestors are not members unless inserted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    paths: BTreeSet<Path>,
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    /// Adds `path`.
    pub fn insert(&mut self, path: Path) {
        self.paths.insert(path);
    }

    /// Whether `path` is a member.
    pub fn contains(&self, path: &[Pe]) -> bool {
        self.paths.contains(path)
    }

    /// Whether `path` or a path below it is a member.
    pub fn covers(&self, path: &[Pe]) -> bool {
        self.paths
            .range(path.to_vec()..)
            .next()
            .is_some_and(|p| p.starts_with(path))
    }

    /// Whether a path strictly below `path` is a member.
    pub fn has_below(&self, path: &[Pe]) -> bool {
        self.paths
            .range(path.to_vec()..)
            .find(|p| p.as_slice() != path)
            .is_some_and(|p| p.starts_with(path))
    }

    /// Whether there are no members.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The members, in order.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.paths.iter()
    }

    /// Members of either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        FieldSet {
            paths: self.paths.union(&other.paths).cloned().collect(),
        }
    }

    /// Members of `self` not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        FieldSet {
            paths: self.paths.difference(&other.paths).cloned().collect(),
        }
    }

    /// Members of both.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        FieldSet {
            paths: self.paths.intersection(&other.paths).cloned().collect(),
        }
    }

    /// Keeps the members `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(&Path) -> bool) {
        self.paths.retain(|p| keep(p));
    }

    /// The `FieldsV1` JSON of the set.
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Node {
            member: bool,
            children: std::collections::BTreeMap<Pe, Node>,
        }
        fn render(node: &Node) -> Value {
            let mut map = Map::new();
            if node.member && !node.children.is_empty() {
                map.insert(".".into(), Value::Object(Map::new()));
            }
            for (pe, child) in &node.children {
                map.insert(pe.encode(), render(child));
            }
            Value::Object(map)
        }
        let mut root = Node::default();
        for path in &self.paths {
            let mut node = &mut root;
            for pe in path {
                node = node.children.entry(pe.clone()).or_default();
            }
            node.member = true;
        }
        render(&root)
    }

    /// Reads a `FieldsV1` JSON object; `None` when it is not one.
    pub fn from_fields_v1(value: &Value) -> Option<FieldSet> {
        fn walk(value: &Value, path: &mut Path, out: &mut FieldSet) -> Option<()> {
            let map = value.as_object()?;
            if map.is_empty() {
                if !path.is_empty() {
                    out.insert(path.clone());
                }
                return Some(());
            }
            for (key, child) in map {
                if key == "." {
                    if !path.is_empty() {
                        out.insert(path.clone());
                    }
                    continue;
                }
                path.push(Pe::decode(key)?);
                walk(child, path, out)?;
                path.pop();
            }
            Some(())
        }
        let mut out = FieldSet::new();
        walk(value, &mut Vec::new(), &mut out)?;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(name: &str) -> Pe {
        Pe::Field(name.into())
    }

    #[test]
    fn fields_v1_round_trips_with_dots_keys_and_values() {
        let v1 = json!({
            "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
            "f:spec": {
                "f:ports": {"k:{\"name\":\"http\",\"protocol\":\"TCP\"}":
                    {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}}},
                "f:tags": {"v:\"a\"": {}},
                "f:args": {}
            }
        });
        let set = FieldSet::from_fields_v1(&v1).unwrap();
        assert!(set.contains(&[f("metadata"), f("labels")]));
        assert!(!set.contains(&[f("metadata")]));
        let key = Pe::Key(vec![
            ("name".into(), "\"http\"".into()),
            ("protocol".into(), "\"TCP\"".into()),
        ]);
        assert!(set.contains(&[f("spec"), f("ports"), key.clone()]));
        assert_eq!(set.to_fields_v1(), v1);
        assert_eq!(
            path_text(&[f("spec"), f("ports"), key, f("port")]),
            ".spec.ports[name=\"http\",protocol=\"TCP\"].port"
        );
        assert_eq!(
            path_text(&[f("spec"), f("tags"), Pe::Value("\"a\"".into())]),
            ".spec.tags[=\"a\"]"
        );
    }

    #[test]
    fn covers_and_has_below() {
        let mut set = FieldSet::new();
        set.insert(vec![f("spec"), f("a")]);
        assert!(set.covers(&[f("spec")]));
        assert!(set.has_below(&[f("spec")]));
        assert!(set.covers(&[f("spec"), f("a")]));
        assert!(!set.has_below(&[f("spec"), f("a")]));
        assert!(!set.covers(&[f("status")]));
        assert!(!set.covers(&[f("spec"), f("ab")]));
    }
}
