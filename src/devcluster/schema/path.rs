//! Field paths as kube-apiserver spells them (`spec.tools[0].name`, `spec.labels[key]`). The root is
//! the empty path, which kube-apiserver prints as `<nil>`.

/// A field path under construction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct FieldPath(String);

impl FieldPath {
    /// The root of the object.
    pub(super) fn root() -> Self {
        FieldPath(String::new())
    }

    /// A named field (`parent.name`).
    pub(super) fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }

    /// A map key, as field.Path.Key writes it (`parent[key]`).
    pub(super) fn key(&self, key: &str) -> Self {
        FieldPath(format!("{}[{key}]", self.0))
    }

    /// A list index (`parent[3]`).
    pub(super) fn index(&self, index: usize) -> Self {
        FieldPath(format!("{}[{index}]", self.0))
    }

    /// The path as written inside kube-openapi's messages (`spec.x`; empty at the root).
    pub(super) fn as_str(&self) -> &str {
        &self.0
    }

    /// The path as a field error's `field` (`<nil>` at the root).
    pub(super) fn field(&self) -> String {
        if self.0.is_empty() {
            "<nil>".to_string()
        } else {
            self.0.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_spelled_like_field_path() {
        let p = FieldPath::root()
            .child("spec")
            .child("tools")
            .index(0)
            .child("name");
        assert_eq!(p.field(), "spec.tools[0].name");
        assert_eq!(
            FieldPath::root().child("spec").key("a.b").field(),
            "spec[a.b]"
        );
        assert_eq!(FieldPath::root().field(), "<nil>");
    }
}
