//! Schema fragments for fields whose Rust type does not say what the API server must keep:
//! free JSON (`x-kubernetes-preserve-unknown-fields`, so a real API server does not prune it),
//! JSON objects, and timestamps.

/// Any JSON value, kept as written.
pub fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"x-kubernetes-preserve-unknown-fields": true})
}

/// A JSON object, kept as written.
pub fn json_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// A JSON Schema document: a non-empty object, kept as written.
pub fn json_schema_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "minProperties": 1,
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// An RFC 3339 timestamp.
pub fn time_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "format": "date-time"})
}
