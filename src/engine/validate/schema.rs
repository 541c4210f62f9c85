//! A tool's `inputSchema`, compiled once and checked against args (docs/design.md section 6,
//! docs/behaviours.md 1 and 8).
//!
//! Owns: the refusal of every reference that would leave the schema document (`$ref`,
//! `$dynamicRef`, `$recursiveRef` not starting with `#`; `$id` (and draft-04 `id`) other than a
//! bare fragment; a `$schema` that is not one of the well-known JSON Schema dialect URIs), and
//! the compilation with a retriever that refuses everything. Must not: fetch a file or a URL,
//! whatever the schema says.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};

use jsonschema::{Retrieve, Uri, Validator};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{check_storable, check_storable_at, walk_of, JsonPath, Segment, Walk};
use crate::api::ToolSpec;

/// A tool's compiled input schema.
pub struct ToolSchema {
    validator: Validator,
}

impl fmt::Debug for ToolSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolSchema").finish_non_exhaustive()
    }
}

impl ToolSchema {
    /// Compiles `tools[index].inputSchema`. A `$ref`, `$schema` or `$id` that names a file or URL
    /// outside the schema itself is refused; nothing is fetched.
    ///
    /// Accepted: an object schema (after [`check_storable`]-style checks: depth ≤ 256, numbers
    /// stored exactly), `$ref`/`$dynamicRef`/`$recursiveRef` starting with `#` (a JSON pointer
    /// or anchor inside the document), `$id` that is a bare fragment (`#...`), and a `$schema`
    /// naming draft-04, -06, -07, 2019-09 or 2020-12 (with or without a trailing `#`, http or
    /// https): those name a dialect whose meta-schema is built in. Keywords whose values are
    /// data (`const`, `enum`, `default`, `examples`) are not inspected.
    ///
    /// # Errors
    /// A sentence naming the field and the fix, e.g.
    /// `spec.tools[1].inputSchema: $ref "https://x/y.json" points outside the schema; inline the
    /// definition under $defs and use "#/$defs/..."`.
    pub fn compile(index: usize, tool: &ToolSpec) -> Result<ToolSchema, String> {
        ToolSchema::compile_at(
            &format!("spec.tools[{index}].inputSchema"),
            &tool.input_schema,
        )
    }

    /// [`ToolSchema::compile`] of any schema the record holds, its errors naming `root` (e.g.
    /// `status.toolPins[0].definition.outputSchema`): an MCP tool's `outputSchema`, which a
    /// result's `structuredContent` must pass (docs/design.md section 6, "MCP revisions").
    ///
    /// # Errors
    /// As [`ToolSchema::compile`], naming `root`.
    pub fn compile_at(root: &str, schema: &Value) -> Result<ToolSchema, String> {
        if !schema.is_object() {
            return Err(format!(
                "{root}: must be a JSON Schema object (got {}); write e.g. {{\"type\": \"object\"}}",
                type_name(schema)
            ));
        }
        check_storable_at(schema, root)?;
        refuse_external_references(schema, root)?;
        let validator = jsonschema::options()
            .with_retriever(NoFetch)
            .build(schema)
            .map_err(|e| {
                let at = e.instance_path().as_str();
                let at = if at.is_empty() { "/" } else { at };
                let hint = if at.ends_with("/type") {
                    " (a type is one of array, boolean, integer, null, number, object, string)"
                } else {
                    ""
                };
                format!("{root}: is not a valid JSON Schema (at {at}): {e}{hint}; fix the schema")
            })?;
        Ok(ToolSchema { validator })
    }

    /// [`ToolSchema::compile`], once per distinct schema in this process: the compiled schema
    /// is kept by the SHA-256 of the schema's JSON text (up to [`COMPILED_KEPT`] of them; past
    /// that the kept ones are dropped and kept again as they are used), so a run's steps check
    /// their args without compiling the same `inputSchema` each time (docs/performance.md,
    /// session 20). A schema that does not compile is not kept.
    ///
    /// # Errors
    /// Those of [`ToolSchema::compile`], the same sentence each time.
    pub fn compiled(index: usize, tool: &ToolSpec) -> Result<Arc<ToolSchema>, String> {
        static KEPT: LazyLock<Mutex<HashMap<[u8; 32], Arc<ToolSchema>>>> =
            LazyLock::new(|| Mutex::new(HashMap::new()));
        let text = serde_json::to_vec(&tool.input_schema).map_err(|e| e.to_string())?;
        let key: [u8; 32] = Sha256::digest(&text).into();
        if let Some(schema) = KEPT.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(schema.clone());
        }
        let schema = Arc::new(ToolSchema::compile(index, tool)?);
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() >= COMPILED_KEPT {
            kept.clear();
        }
        kept.insert(key, schema.clone());
        Ok(schema)
    }

    /// Checks `args` against the schema.
    ///
    /// `args` are first held to [`check_storable`] (depth and numbers), whose one sentence is
    /// then the only violation; this also bounds the validator's recursion.
    ///
    /// # Errors
    /// One line per violation, each `"<instance path>: <message>"` with the path a JSON pointer
    /// (`/` for the args themselves), e.g. `/amount: "x" is not of type "number"`. The lines are
    /// sorted (by path, array indices numerically, then message) and deduplicated, so the same args always give the same list; each is cut to
    /// [`MAX_VIOLATION_CHARS`] characters (a message quotes the offending value, which may be
    /// large), and past [`MAX_VIOLATIONS`] lines the rest are counted in a last line
    /// `… and N more violations`.
    pub fn check(&self, args: &Value) -> Result<(), Vec<String>> {
        check_storable(args).map_err(|e| vec![e])?;
        let mut found: Vec<(String, String)> = self
            .validator
            .iter_errors(args)
            .map(|e| {
                let at = e.instance_path().as_str();
                let at = if at.is_empty() { "/" } else { at };
                (at.to_string(), e.to_string())
            })
            .collect();
        if found.is_empty() {
            return Ok(());
        }
        found.sort_by(|a, b| pointer_order(&a.0, &b.0).then_with(|| a.1.cmp(&b.1)));
        found.dedup();
        let mut lines: Vec<String> = found
            .into_iter()
            .map(|(at, message)| bounded_line(format!("{at}: {message}")))
            .collect();
        if lines.len() > MAX_VIOLATIONS {
            let more = lines.len() - MAX_VIOLATIONS;
            lines.truncate(MAX_VIOLATIONS);
            lines.push(format!("… and {more} more violations"));
        }
        Err(lines)
    }
}

/// Most compiled schemas [`ToolSchema::compiled`] keeps in a process.
pub const COMPILED_KEPT: usize = 256;

/// Most violation lines [`ToolSchema::check`] returns (then one line counting the rest).
pub const MAX_VIOLATIONS: usize = 50;

/// Longest violation line [`ToolSchema::check`] returns, in characters (then `…`).
pub const MAX_VIOLATION_CHARS: usize = 512;

/// Orders JSON pointers segment by segment, array indices numerically (`/2` before `/10`).
fn pointer_order(a: &str, b: &str) -> std::cmp::Ordering {
    let segments = |p: &'_ str| -> Vec<(Option<u64>, String)> {
        p.split('/')
            .map(|s| (s.parse::<u64>().ok(), s.to_string()))
            .collect()
    };
    let (a, b) = (segments(a), segments(b));
    for (x, y) in a.iter().zip(b.iter()) {
        let order = match (x.0, y.0) {
            (Some(i), Some(j)) => i.cmp(&j),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => x.1.cmp(&y.1),
        };
        if order.is_ne() {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

fn bounded_line(line: String) -> String {
    match line.char_indices().nth(MAX_VIOLATION_CHARS) {
        None => line,
        Some((cut, _)) => format!("{}…", &line[..cut]),
    }
}

/// A retriever that fetches nothing: every external resource is an error.
struct NoFetch;

impl Retrieve for NoFetch {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!(
            "{uri} is outside the schema and agentrt fetches nothing; inline it under $defs"
        )
        .into())
    }
}

/// The `$schema` values that name a dialect with a built-in meta-schema.
fn is_known_dialect(uri: &str) -> bool {
    matches!(
        uri.strip_suffix('#').unwrap_or(uri),
        "https://json-schema.org/draft/2020-12/schema"
            | "http://json-schema.org/draft/2020-12/schema"
            | "https://json-schema.org/draft/2019-09/schema"
            | "http://json-schema.org/draft/2019-09/schema"
            | "https://json-schema.org/draft-07/schema"
            | "http://json-schema.org/draft-07/schema"
            | "https://json-schema.org/draft-06/schema"
            | "http://json-schema.org/draft-06/schema"
            | "https://json-schema.org/draft-04/schema"
            | "http://json-schema.org/draft-04/schema"
    )
}

fn is_draft4(uri: &str) -> bool {
    matches!(
        uri.strip_suffix('#').unwrap_or(uri),
        "https://json-schema.org/draft-04/schema" | "http://json-schema.org/draft-04/schema"
    )
}

/// Keywords whose value maps names to subschemas.
const NAME_MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose value is data, not a schema.
const DATA: [&str; 4] = ["const", "enum", "default", "examples"];

/// What a container in the schema document is.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    /// A (sub)schema: its keys are keywords.
    Schema,
    /// A map from names to subschemas (`properties`, `$defs`, ...).
    NameMap,
    /// An array of subschemas (`allOf`, `prefixItems`, draft-04 `items`, ...).
    List,
}

/// Walks the schema (already bounded to depth 256) and refuses references that leave it.
fn refuse_external_references(schema: &Value, root: &str) -> Result<(), String> {
    let draft4 = schema
        .get("$schema")
        .and_then(Value::as_str)
        .is_some_and(is_draft4);
    let mut path = JsonPath::new(root);
    let mut stack: Vec<(Role, Walk<'_>)> = Vec::new();
    stack.extend(walk_of(schema).map(|w| (Role::Schema, w)));
    while let Some((role, walk)) = stack.last_mut() {
        let role = *role;
        let Some((segment, child)) = walk.next_child() else {
            stack.pop();
            path.pop();
            continue;
        };
        if role == Role::Schema {
            if let (Segment::Key(keyword), Value::String(text)) = (segment, child) {
                path.push(segment);
                let refused = refusal(keyword, text, draft4);
                if let Some(why) = refused {
                    return Err(format!("{}: {why}", render_parent(&path)));
                }
                path.pop();
                continue;
            }
            if let Segment::Key(keyword) = segment {
                if DATA.contains(&keyword) {
                    continue;
                }
            }
        }
        let child_role = match (role, segment, child) {
            (Role::Schema, Segment::Key(k), Value::Object(_)) if NAME_MAPS.contains(&k) => {
                Role::NameMap
            }
            (_, _, Value::Object(_)) => Role::Schema,
            (Role::Schema, _, Value::Array(_)) => Role::List,
            // Arrays inside name maps (draft-04 `dependencies: {a: ["b"]}`) and nested arrays
            // hold names or data.
            _ => continue,
        };
        path.push(segment);
        stack.extend(walk_of(child).map(|w| (child_role, w)));
    }
    Ok(())
}

/// Why `keyword: text` in a schema object leaves the schema, if it does.
fn refusal(keyword: &str, text: &str, draft4: bool) -> Option<String> {
    match keyword {
        "$ref" | "$dynamicRef" | "$recursiveRef" if !text.starts_with('#') => Some(format!(
            "{keyword} {} points outside the schema; inline the definition under $defs and use \
             \"#/$defs/...\"",
            quote(text)
        )),
        "$id" if !text.starts_with('#') => Some(format!(
            "$id {} names a location outside the schema and nothing is fetched; remove it (use \
             $anchor or \"#/$defs/...\" to refer within the schema)",
            quote(text)
        )),
        "id" if draft4 && !text.starts_with('#') => Some(format!(
            "id {} (draft-04) names a location outside the schema and nothing is fetched; remove \
             it",
            quote(text)
        )),
        "$schema" if !is_known_dialect(text) => Some(format!(
            "$schema {} is not a JSON Schema dialect agentrt knows and nothing is fetched; use \
             \"https://json-schema.org/draft/2020-12/schema\" (or draft-04/06/07, 2019-09) or \
             remove it",
            quote(text)
        )),
        _ => None,
    }
}

/// The path of the schema object holding the keyword at the end of `path`.
fn render_parent(path: &JsonPath<'_>) -> String {
    let n = path.segments.len().saturating_sub(1);
    super::render_path(path.root, &path.segments[..n])
}

fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| format!("{text:?}"))
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SideEffect;
    use serde_json::json;

    fn tool(schema: Value) -> ToolSpec {
        ToolSpec {
            job: None,
            name: "issue_refund".into(),
            description: "Refund an order.".into(),
            input_schema: schema,
            side_effect: SideEffect::RemoteMutation,
            timeout_seconds: 30,
            terminal: false,
            http: None,
            mcp: None,
        }
    }

    fn refund_schema() -> Value {
        json!({
            "type": "object",
            "required": ["order", "amount"],
            "properties": {"order": {"type": "integer"}, "amount": {"type": "number"}}
        })
    }

    fn compiled(schema: Value) -> ToolSchema {
        ToolSchema::compile(1, &tool(schema)).expect("compiles")
    }

    #[test]
    fn valid_args_pass_the_schema() {
        let s = compiled(refund_schema());
        assert_eq!(s.check(&json!({"order": 1042, "amount": 250})), Ok(()));
        assert_eq!(s.check(&json!({"order": 1042, "amount": 250.5})), Ok(()));
    }

    #[test]
    fn a_schema_is_compiled_once_and_a_different_one_apart() {
        let refund = tool(refund_schema());
        let first = ToolSchema::compiled(1, &refund).expect("compiles");
        let again = ToolSchema::compiled(3, &refund).expect("compiles");
        assert!(Arc::ptr_eq(&first, &again), "the same schema is kept");
        assert!(first.check(&json!({"order": 1, "amount": 2})).is_ok());
        let other = ToolSchema::compiled(1, &tool(json!({"type": "object", "required": ["x"]})))
            .expect("compiles");
        assert!(!Arc::ptr_eq(&first, &other), "another schema is its own");
        assert!(other.check(&json!({"order": 1, "amount": 2})).is_err());
        // A schema that does not compile says so each time, with the index it is given.
        let bad = tool(json!({"type": "banana"}));
        for index in [2, 5] {
            let err = ToolSchema::compiled(index, &bad).expect_err("refused");
            assert!(
                err.starts_with(&format!("spec.tools[{index}].inputSchema")),
                "{err}"
            );
        }
    }

    #[test]
    fn a_type_mismatch_names_the_instance_path() {
        let s = compiled(refund_schema());
        assert_eq!(
            s.check(&json!({"order": 1042, "amount": "x"})),
            Err(vec![r#"/amount: "x" is not of type "number""#.to_string()])
        );
    }

    #[test]
    fn every_violation_is_reported_in_a_stable_order() {
        let s = compiled(refund_schema());
        let args = json!({"order": "a"});
        let first = s.check(&args).expect_err("invalid");
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(first
            .iter()
            .any(|l| l.starts_with("/: ") && l.contains("amount")));
        assert!(first.iter().any(|l| l.starts_with("/order: ")));
        for _ in 0..5 {
            assert_eq!(s.check(&args).expect_err("invalid"), first);
        }
    }

    #[test]
    fn a_missing_required_property_is_reported_at_the_root() {
        let s = compiled(refund_schema());
        assert_eq!(
            s.check(&json!({"order": 1042})),
            Err(vec![r#"/: "amount" is a required property"#.to_string()])
        );
    }

    #[test]
    fn args_too_deep_or_with_unstorable_numbers_fail_the_check() {
        let s = compiled(json!({"type": "object"}));
        let err = s.check(&json!({"n": u64::MAX})).expect_err("big");
        assert_eq!(err.len(), 1);
        assert!(err[0].starts_with("args.n: 18446744073709551615 does not fit int64"));
        let deep = crate::engine::validate::tests_support::nested_arrays(300);
        assert!(s.check(&json!({ "d": deep })).is_err());
    }

    #[test]
    fn violations_are_bounded_in_number_and_length() {
        let s = compiled(json!({"type": "array", "items": {"type": "integer"}}));
        let args: Vec<String> = (0..120).map(|i| format!("{i:03}")).collect();
        let lines = s.check(&json!(args)).expect_err("invalid");
        assert_eq!(lines.len(), MAX_VIOLATIONS + 1);
        assert_eq!(lines[0], r#"/0: "000" is not of type "integer""#);
        assert_eq!(lines[10], r#"/10: "010" is not of type "integer""#);
        assert_eq!(lines[49], r#"/49: "049" is not of type "integer""#);
        assert_eq!(lines[MAX_VIOLATIONS], "… and 70 more violations");
        let lines = s.check(&json!(["é".repeat(10_000)])).expect_err("invalid");
        assert_eq!(lines[0].chars().count(), MAX_VIOLATION_CHARS + 1);
        assert!(lines[0].starts_with("/0: \"ééé") && lines[0].ends_with('…'));
    }

    #[test]
    fn an_external_ref_is_refused_naming_the_field_and_the_fix() {
        let err = ToolSchema::compile(1, &tool(json!({"$ref": "https://example.com/x.json"})))
            .expect_err("refused");
        assert_eq!(
            err,
            "spec.tools[1].inputSchema: $ref \"https://example.com/x.json\" points outside the \
             schema; inline the definition under $defs and use \"#/$defs/...\""
        );
        let err = ToolSchema::compile(
            0,
            &tool(json!({"properties": {"a": {"$ref": "other.json#/x"}}})),
        )
        .expect_err("refused");
        assert!(
            err.starts_with("spec.tools[0].inputSchema.properties.a: $ref \"other.json#/x\""),
            "{err}"
        );
        let err = ToolSchema::compile(0, &tool(json!({"allOf": [{"$ref": "file:///etc/x"}]})))
            .expect_err("refused");
        assert!(
            err.starts_with("spec.tools[0].inputSchema.allOf[0]: $ref"),
            "{err}"
        );
        let err = ToolSchema::compile(0, &tool(json!({"$dynamicRef": "http://x/y#meta"})))
            .expect_err("refused");
        assert!(
            err.contains("$dynamicRef \"http://x/y#meta\" points outside"),
            "{err}"
        );
    }

    #[test]
    fn a_ref_to_defs_inside_the_schema_is_accepted() {
        let s = compiled(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"amount": {"$ref": "#/$defs/money"}},
            "$defs": {"money": {"type": "number", "minimum": 0}}
        }));
        assert_eq!(s.check(&json!({"amount": 3})), Ok(()));
        assert_eq!(
            s.check(&json!({"amount": -1})),
            Err(vec!["/amount: -1 is less than the minimum of 0".to_string()])
        );
    }

    #[test]
    fn well_known_dialects_are_accepted_and_nothing_else() {
        for uri in [
            "https://json-schema.org/draft/2020-12/schema",
            "https://json-schema.org/draft/2019-09/schema",
            "http://json-schema.org/draft-07/schema#",
            "http://json-schema.org/draft-06/schema#",
            "http://json-schema.org/draft-04/schema#",
        ] {
            let s = compiled(json!({"$schema": uri, "type": "object"}));
            assert!(s.check(&json!(1)).is_err(), "{uri}");
        }
        let err = ToolSchema::compile(
            2,
            &tool(json!({"$schema": "https://example.com/my-meta", "type": "object"})),
        )
        .expect_err("refused");
        assert!(
            err.starts_with(
                "spec.tools[2].inputSchema: $schema \"https://example.com/my-meta\" is not a \
                 JSON Schema dialect"
            ),
            "{err}"
        );
    }

    #[test]
    fn an_id_naming_a_url_is_refused_and_a_fragment_id_is_accepted() {
        let err = ToolSchema::compile(
            3,
            &tool(json!({"$id": "http://example.com/s.json", "type": "object"})),
        )
        .expect_err("refused");
        assert!(
            err.starts_with("spec.tools[3].inputSchema: $id \"http://example.com/s.json\""),
            "{err}"
        );
        let err = ToolSchema::compile(
            3,
            &tool(json!({"$defs": {"a": {"$id": "a.json", "type": "string"}}})),
        )
        .expect_err("refused");
        assert!(
            err.starts_with("spec.tools[3].inputSchema.$defs.a: $id"),
            "{err}"
        );
        let err = ToolSchema::compile(
            0,
            &tool(json!({"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x/"})),
        )
        .expect_err("refused");
        assert!(err.contains("id \"http://x/\" (draft-04)"), "{err}");
        compiled(json!({"$schema": "http://json-schema.org/draft-07/schema#",
                        "definitions": {"a": {"$id": "#a", "type": "string"}},
                        "properties": {"x": {"$ref": "#a"}}}));
    }

    #[test]
    fn property_names_and_data_that_look_like_keywords_are_not_references() {
        let s = compiled(json!({
            "type": "object",
            "properties": {"$ref": {"type": "string"}, "$id": {"type": "string"}, "id": {}},
            "default": {"$ref": "https://example.com/x.json"},
            "examples": [{"$id": "http://example.com"}],
            "enum": [{"$schema": "x"}, {"$ref": "http://y"}, {"$id": "z", "$ref": "w"}]
        }));
        assert!(s.check(&json!({"$ref": "w", "$id": "z"})).is_ok());
    }

    #[test]
    fn a_schema_that_is_not_an_object_is_refused() {
        let err = ToolSchema::compile(1, &tool(json!(true))).expect_err("refused");
        assert_eq!(
            err,
            "spec.tools[1].inputSchema: must be a JSON Schema object (got a boolean); write e.g. \
             {\"type\": \"object\"}"
        );
        assert!(ToolSchema::compile(1, &tool(json!("x"))).is_err());
    }

    #[test]
    fn a_schema_that_does_not_compile_is_refused_naming_the_field() {
        let err = ToolSchema::compile(4, &tool(json!({"type": "banana"}))).expect_err("refused");
        assert!(
            err.starts_with("spec.tools[4].inputSchema: is not a valid JSON Schema"),
            "{err}"
        );
        let err =
            ToolSchema::compile(4, &tool(json!({"$ref": "#/$defs/missing"}))).expect_err("refused");
        assert!(err.starts_with("spec.tools[4].inputSchema: "), "{err}");
    }

    #[test]
    fn a_schema_nested_too_deep_or_with_big_integers_is_refused() {
        let mut deep = json!({"type": "string"});
        for _ in 0..200 {
            deep = json!({ "properties": { "a": deep } });
        }
        let err = ToolSchema::compile(0, &tool(deep)).expect_err("too deep");
        assert!(
            err.starts_with("spec.tools[0].inputSchema nest deeper than 256 levels"),
            "{err}"
        );
        let err = ToolSchema::compile(0, &tool(json!({"maximum": u64::MAX}))).expect_err("big");
        assert!(
            err.starts_with("spec.tools[0].inputSchema.maximum: 18446744073709551615"),
            "{err}"
        );
    }

    #[test]
    fn a_reference_hidden_in_data_is_still_not_fetched() {
        // The walk skips `default` (data), but a pointer into it makes it a schema: the
        // validator's retriever refuses the external reference found there.
        let err = ToolSchema::compile(
            5,
            &tool(json!({"$ref": "#/default", "default": {"$ref": "https://example.com/x.json"}})),
        )
        .expect_err("refused");
        assert!(err.starts_with("spec.tools[5].inputSchema: "), "{err}");
        assert!(err.contains("https://example.com/x.json"), "{err}");
    }

    #[test]
    fn the_retriever_fetches_nothing() {
        let uri = jsonschema::uri::from_str("https://example.com/x.json").expect("uri");
        let err = NoFetch.retrieve(&uri).expect_err("refused");
        assert!(err.to_string().contains("agentrt fetches nothing"));
    }
}
