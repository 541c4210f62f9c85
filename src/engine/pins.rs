//! Pins of MCP tool definitions (docs/design.md section 6 "Pinning"; docs/behaviours.md 60,
//! 61, 64): the pure rules the engine applies to what a server lists.
//!
//! Owns: reading one entry of a `tools/list` answer into a [`ToolDefinition`]; a pin's SHA-256
//! (over the canonical JSON, RFC 8785, of the definition as recorded, so a number spelled `1.0`
//! or `1`, or members in another order, pin alike); comparing a server's current definition
//! with a pin; expanding a toolset against a server's listing (include globs, overrides, the
//! names `<set>__<tool>`); and which server annotations claim more danger than the manifest's
//! side-effect class.
//!
//! Must not: do I/O, trust an annotation (the class is always the manifest's), or decide when
//! pins are written or compared: that is the run's state machine.
//!
//! ## When annotations disagree with the manifest ([`hint_disagreements`])
//! Only a hint the server states counts as a claim; an absent hint (whose MCP default may be
//! alarming, e.g. `destructiveHint` defaults to true) claims nothing, so a server that sends no
//! annotations never disagrees. A hint that claims *less* danger than the manifest never
//! disagrees either: the manifest is stricter, and it wins.
//!
//! | the server states | manifest class | disagrees |
//! |---|---|---|
//! | `readOnlyHint: false` | `ReadOnly` | yes: it says the tool changes its environment |
//! | `destructiveHint: true` (and not `readOnlyHint: true`) | `ReadOnly`, `LocalMutation`, `RemoteMutation` | yes: it says a change may destroy something |
//! | `openWorldHint: true` and `readOnlyHint: false` | `ReadOnly`, `LocalMutation` | yes: it says the tool changes things beyond the agent's environment |
//! | `readOnlyHint: true` | any | no (claims less) |
//! | `destructiveHint: false`, `idempotentHint` (either value) | any | no |
//! | `destructiveHint: true` with `readOnlyHint: true` | any | no: MCP gives `destructiveHint` meaning only when the tool is not read-only |

use std::collections::BTreeSet;

use serde_json::Value;

use crate::api::{
    AgentRunSpec, McpServer, McpTool, SideEffect, ToolAnnotations, ToolDefinition, ToolPin,
    ToolSet, ToolSpec,
};
use crate::engine::canonical::{content_hash, CanonicalError};
use crate::engine::policy::glob_matches;

/// The longest name a tool may have where a model sees it (OpenAI-compatible function names).
pub const MAX_FUNCTION_NAME: usize = 64;

/// What joins a toolset's name and a server tool's name: `<set>__<tool>`.
pub const SET_SEPARATOR: &str = "__";

/// The `timeoutSeconds` of a toolset's tool that no override sets (as `spec.tools[]`'s default).
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 30;

/// Why a listing cannot be pinned or a toolset expanded. Each message names the field or the
/// server's tool, and what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PinError {
    /// An entry of `tools/list` is not a tool definition.
    #[error("{server}: tools/list entry {index} is not a tool definition: {detail}")]
    InvalidDefinition {
        /// The server's URL.
        server: String,
        /// Its position in the listing.
        index: usize,
        /// What is wrong with it.
        detail: String,
    },
    /// The server does not list the tool an `mcp` tool names.
    #[error("{field}: the server {server} lists no tool {server_tool:?}; set mcp.tool to one of its tools")]
    NotListed {
        /// `spec.tools[i]`.
        field: String,
        /// The server's URL.
        server: String,
        /// The name looked for.
        server_tool: String,
    },
    /// An expanded name is not a valid function name.
    #[error("{field}: the tool {name:?} is not a valid function name (letters, digits, '_' and '-', at most {MAX_FUNCTION_NAME} characters); leave the server's tool {server_tool:?} out with include, or shorten the set's name")]
    InvalidName {
        /// `spec.toolSets[i]`.
        field: String,
        /// `<set>__<tool>`.
        name: String,
        /// The server's name of the tool.
        server_tool: String,
    },
    /// Two of the run's tools would have the same name.
    #[error("{field}: the tool name {name:?} is already taken by {other}; rename one of them")]
    DuplicateName {
        /// Where the second one comes from.
        field: String,
        /// The name.
        name: String,
        /// Where the first one comes from.
        other: String,
    },
    /// An override names a tool the set does not bring in.
    #[error("{field}: the override names {server_tool:?}, which the server {server} does not list among the set's included tools; fix the name or remove the override")]
    UnusedOverride {
        /// `spec.toolSets[i].overrides[j]`.
        field: String,
        /// The server's URL.
        server: String,
        /// The name the override gives.
        server_tool: String,
    },
    /// A glob in `include` is empty.
    #[error("{field}: an empty glob matches no tool; remove it, or write \"*\" for every tool")]
    EmptyGlob {
        /// `spec.toolSets[i].include[j]`.
        field: String,
    },
    /// The definition has no canonical form (never expected for parsed JSON).
    #[error("{tool}: {source}")]
    Canonical {
        /// The run's tool name.
        tool: String,
        /// Why.
        source: CanonicalError,
    },
}

/// Reads the entries of a `tools/list` answer's `tools` array (all pages, in order) into
/// definitions, keeping exactly what is pinned: name, title, description, inputSchema,
/// annotations, outputSchema and execution (other members, such as `icons` or `_meta`, are
/// not pinned).
///
/// # Errors
/// [`PinError::InvalidDefinition`] for an entry that is not an object with a string `name` and
/// an object `inputSchema`, or whose title, description, annotations, outputSchema or
/// execution have the wrong type.
pub fn definitions(server: &str, listed: &[Value]) -> Result<Vec<ToolDefinition>, PinError> {
    listed
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            definition(entry).map_err(|detail| PinError::InvalidDefinition {
                server: server.to_string(),
                index,
                detail,
            })
        })
        .collect()
}

fn definition(entry: &Value) -> Result<ToolDefinition, String> {
    let object = entry.as_object().ok_or("not a JSON object")?;
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .ok_or("name is not a string")?;
    let text = |member: &str| -> Result<Option<String>, String> {
        match object.get(member) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{name}: {member} is not a string")),
        }
    };
    let input_schema = match object.get("inputSchema") {
        Some(schema @ Value::Object(_)) => schema.clone(),
        _ => return Err(format!("{name}: inputSchema is not a JSON object")),
    };
    let annotations = match object.get("annotations") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            serde_json::from_value::<ToolAnnotations>(value.clone())
                .map_err(|err| format!("{name}: annotations: {err}"))?,
        ),
    };
    let object_member = |member: &str| -> Result<Option<Value>, String> {
        match object.get(member) {
            None | Some(Value::Null) => Ok(None),
            Some(value @ Value::Object(_)) => Ok(Some(value.clone())),
            Some(_) => Err(format!("{name}: {member} is not a JSON object")),
        }
    };
    Ok(ToolDefinition {
        name: name.to_string(),
        title: text("title")?,
        description: text("description")?,
        input_schema,
        annotations,
        output_schema: object_member("outputSchema")?,
        execution: object_member("execution")?,
    })
}

/// `sha256:<hex>` of the canonical JSON of `definition` as the record stores it.
///
/// # Errors
/// [`CanonicalError`] when it has no canonical form (not for parsed JSON).
pub fn definition_sha256(definition: &ToolDefinition) -> Result<String, CanonicalError> {
    let value = serde_json::to_value(definition).map_err(|err| CanonicalError(err.to_string()))?;
    content_hash(&value)
}

/// The pin of `definition` for the run's tool `tool` on `server`.
///
/// # Errors
/// [`PinError::Canonical`] when the definition has no canonical form.
pub fn pin(tool: &str, server: &str, definition: ToolDefinition) -> Result<ToolPin, PinError> {
    let sha256 = definition_sha256(&definition).map_err(|source| PinError::Canonical {
        tool: tool.to_string(),
        source,
    })?;
    Ok(ToolPin {
        tool: tool.to_string(),
        server: server.to_string(),
        server_tool: definition.name.clone(),
        sha256,
        definition,
        protocol_version: None,
        server_info: None,
    })
}

/// A tool result's `structuredContent` against the pin's `outputSchema` (docs/design.md
/// section 6, "MCP revisions"): `Ok` when it passes or the pin has no outputSchema.
///
/// # Errors
/// The violations, one line each as [`crate::engine::validate::ToolSchema::check`] gives them,
/// or the one sentence saying the schema does not compile.
pub fn check_output(pin: &ToolPin, structured_content: &Value) -> Result<(), Vec<String>> {
    let Some(schema) = pin.definition.output_schema.as_ref() else {
        return Ok(());
    };
    let root = format!("the outputSchema of {}", pin.server_tool);
    crate::engine::validate::ToolSchema::compile_at(&root, schema)
        .map_err(|err| vec![err])?
        .check(structured_content)
}

/// The identity the pin recorded when the server now says it is another (`now`: its
/// `{name, version}`, `None` when unknown); `None` when it is the same or the pin recorded
/// none (docs/design.md section 6, "MCP revisions").
pub fn another_server<'a>(pin: &'a ToolPin, now: Option<&Value>) -> Option<&'a Value> {
    let pinned = pin.server_info.as_ref()?;
    (Some(pinned) != now).then_some(pinned)
}

/// How a server's current definition stands to a pin (docs/behaviours.md 61).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinCheck {
    /// The same definition: the call may go ahead.
    Unchanged,
    /// The server lists the tool with another definition: the call is refused
    /// (`definition_changed`).
    Changed {
        /// The pin's hash.
        pinned: String,
        /// The current definition's hash.
        current: String,
    },
    /// The server no longer lists the tool: the call is refused as a changed definition.
    Gone,
}

/// Compares the server's current listing with `pin`: finds the pinned server tool by name and
/// compares the hash of its definition. A pin with neither `protocolVersion` nor an
/// `outputSchema` or `execution` in its definition may have been made by an agentrt that
/// pinned neither: the current definition is compared without them, so an upgrade of the
/// controller does not change a run's pins.
///
/// # Errors
/// [`PinError::Canonical`] when the current definition has no canonical form.
pub fn check(pin: &ToolPin, current: &[ToolDefinition]) -> Result<PinCheck, PinError> {
    let Some(definition) = current.iter().find(|d| d.name == pin.server_tool) else {
        return Ok(PinCheck::Gone);
    };
    let reduced;
    let old_pin = pin.protocol_version.is_none()
        && pin.definition.output_schema.is_none()
        && pin.definition.execution.is_none();
    let definition = if old_pin {
        reduced = ToolDefinition {
            output_schema: None,
            execution: None,
            ..definition.clone()
        };
        &reduced
    } else {
        definition
    };
    let now = definition_sha256(definition).map_err(|source| PinError::Canonical {
        tool: pin.tool.clone(),
        source,
    })?;
    Ok(if now == pin.sha256 {
        PinCheck::Unchanged
    } else {
        PinCheck::Changed {
            pinned: pin.sha256.clone(),
            current: now,
        }
    })
}

/// The pin of `spec.tools[index]`, an `mcp` tool, from its server's listing.
///
/// # Errors
/// [`PinError::NotListed`] when the server lists no tool of the name `mcp.tool` (default: the
/// tool's name); [`PinError::Canonical`] as [`pin`].
pub fn pin_tool(
    index: usize,
    tool: &ToolSpec,
    mcp: &McpTool,
    listed: &[ToolDefinition],
) -> Result<ToolPin, PinError> {
    let server_tool = mcp.tool.as_deref().unwrap_or(&tool.name);
    let definition = listed
        .iter()
        .find(|d| d.name == server_tool)
        .ok_or_else(|| PinError::NotListed {
            field: format!("spec.tools[{index}] ({})", tool.name),
            server: mcp.url.clone(),
            server_tool: server_tool.to_string(),
        })?;
    pin(&tool.name, &mcp.url, definition.clone())
}

/// One tool a toolset brings in: the run's tool, as if it were written in `spec.tools`, and its
/// pin.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpandedTool {
    /// Named `<set>__<server tool>`, described and schema'd by the server's definition, with
    /// the set's (or the override's) side-effect class, timeout and terminal flag, and an `mcp`
    /// executor naming the server tool.
    pub spec: ToolSpec,
    /// The pin of the server's definition.
    pub pin: ToolPin,
}

/// Whether `name` is a valid function name: 1 to 64 of `[A-Za-z0-9_-]`.
pub fn is_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_FUNCTION_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Expands `spec.toolSets[index]` against its server's listing: the listed tools whose names
/// match an `include` glob (none: every tool), in the server's order, each with the set's
/// side-effect class unless an override sets its own.
///
/// # Errors
/// [`PinError::EmptyGlob`]; [`PinError::InvalidName`] for an included tool whose
/// `<set>__<tool>` is not a valid function name; [`PinError::UnusedOverride`] for an override
/// naming no included tool; [`PinError::Canonical`] as [`pin`].
pub fn expand_tool_set(
    index: usize,
    set: &ToolSet,
    listed: &[ToolDefinition],
) -> Result<Vec<ExpandedTool>, PinError> {
    let field = format!("spec.toolSets[{index}] ({})", set.name);
    if let Some(j) = set.include.iter().position(String::is_empty) {
        return Err(PinError::EmptyGlob {
            field: format!("{field}.include[{j}]"),
        });
    }
    let included: Vec<&ToolDefinition> = listed
        .iter()
        .filter(|d| set.include.is_empty() || set.include.iter().any(|g| glob_matches(g, &d.name)))
        .collect();
    for (j, o) in set.overrides.iter().enumerate() {
        if !included.iter().any(|d| d.name == o.tool) {
            return Err(PinError::UnusedOverride {
                field: format!("{field}.overrides[{j}]"),
                server: set.mcp.url.clone(),
                server_tool: o.tool.clone(),
            });
        }
    }
    included
        .into_iter()
        .map(|definition| {
            let name = format!("{}{SET_SEPARATOR}{}", set.name, definition.name);
            if !is_function_name(&name) {
                return Err(PinError::InvalidName {
                    field: field.clone(),
                    name,
                    server_tool: definition.name.clone(),
                });
            }
            let over = set.overrides.iter().find(|o| o.tool == definition.name);
            let spec = ToolSpec {
                job: None,
                name: name.clone(),
                description: definition.description.clone().unwrap_or_default(),
                input_schema: definition.input_schema.clone(),
                side_effect: over.and_then(|o| o.side_effect).unwrap_or(set.side_effect),
                timeout_seconds: over
                    .and_then(|o| o.timeout_seconds)
                    .unwrap_or(DEFAULT_TIMEOUT_SECONDS),
                terminal: over.and_then(|o| o.terminal).unwrap_or(false),
                http: None,
                mcp: Some(Box::new(McpTool {
                    url: set.mcp.url.clone(),
                    tool: Some(definition.name.clone()),
                    headers: set.mcp.headers.clone(),
                    on_cancel: None,
                    oauth: set.mcp.oauth.clone(),
                })),
            };
            let pin = pin(&name, &set.mcp.url, definition.clone())?;
            Ok(ExpandedTool { spec, pin })
        })
        .collect()
}

/// Expands every toolset of `spec` (`listings[i]` is the listing of `spec.toolSets[i]`'s
/// server) and checks that no two of the run's tools share a name.
///
/// # Errors
/// As [`expand_tool_set`]; [`PinError::DuplicateName`] when an expanded name equals a
/// `spec.tools[]` name or another expanded one.
pub fn expand_tool_sets(
    spec: &AgentRunSpec,
    listings: &[Vec<ToolDefinition>],
) -> Result<Vec<ExpandedTool>, PinError> {
    let mut taken: Vec<(String, String)> = spec
        .tools
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.clone(), format!("spec.tools[{i}]")))
        .collect();
    let mut names: BTreeSet<String> = taken.iter().map(|(n, _)| n.clone()).collect();
    let mut out = Vec::new();
    for (index, set) in spec.tool_sets.iter().enumerate() {
        let listed = listings.get(index).map(Vec::as_slice).unwrap_or(&[]);
        for tool in expand_tool_set(index, set, listed)? {
            let field = format!("spec.toolSets[{index}] ({})", set.name);
            if !names.insert(tool.spec.name.clone()) {
                let other = taken
                    .iter()
                    .find(|(n, _)| *n == tool.spec.name)
                    .map(|(_, f)| f.clone())
                    .unwrap_or_default();
                return Err(PinError::DuplicateName {
                    field,
                    name: tool.spec.name.clone(),
                    other,
                });
            }
            taken.push((tool.spec.name.clone(), field));
            out.push(tool);
        }
    }
    Ok(out)
}

/// Whether `spec` has MCP tools or toolsets, whose definitions are pinned before `run.started`.
pub fn needs_pins(spec: &AgentRunSpec) -> bool {
    !spec.tool_sets.is_empty() || spec.tools.iter().any(|t| t.mcp.is_some())
}

/// Whether a pinned definition allows calling the tool as a task (`execution.taskSupport`
/// `optional` or `required`; docs/design.md section 6, "MCP tasks"): then a call to a server
/// that offers tasks is sent as one.
pub fn allows_tasks(pin: &ToolPin) -> bool {
    let support = pin
        .definition
        .execution
        .as_ref()
        .and_then(|e| e.get("taskSupport"))
        .and_then(Value::as_str);
    matches!(support, Some("optional" | "required"))
}

/// The servers to list before `run.started`: every `mcp` tool's and toolset's, each URL once,
/// in the order the spec names them (the headers and oauth are the first naming's).
pub fn servers(spec: &AgentRunSpec) -> Vec<McpServer> {
    let named = spec
        .tools
        .iter()
        .filter_map(|t| t.mcp.as_deref())
        .map(|m| McpServer {
            url: m.url.clone(),
            headers: m.headers.clone(),
            oauth: m.oauth.clone(),
        })
        .chain(spec.tool_sets.iter().map(|s| s.mcp.clone()));
    let mut out: Vec<McpServer> = Vec::new();
    for server in named {
        if !out.iter().any(|s| s.url == server.url) {
            out.push(server);
        }
    }
    out
}

/// Pins every MCP tool of `spec` from its server's listing (`listing(url)`): the `mcp` tools
/// of `spec.tools` in order, then each toolset's expanded tools.
///
/// # Errors
/// As [`pin_tool`] and [`expand_tool_sets`].
pub fn pin_all<'a>(
    spec: &AgentRunSpec,
    listing: impl Fn(&str) -> &'a [ToolDefinition],
) -> Result<Vec<ToolPin>, PinError> {
    let mut pins = Vec::new();
    for (index, tool) in spec.tools.iter().enumerate() {
        if let Some(mcp) = tool.mcp.as_deref() {
            pins.push(pin_tool(index, tool, mcp, listing(&mcp.url))?);
        }
    }
    let listings: Vec<Vec<ToolDefinition>> = spec
        .tool_sets
        .iter()
        .map(|set| listing(&set.mcp.url).to_vec())
        .collect();
    pins.extend(
        expand_tool_sets(spec, &listings)?
            .into_iter()
            .map(|t| t.pin),
    );
    Ok(pins)
}

/// The run's tools as the engine sees them everywhere (docs/design.md section 6: the pin is
/// what the agent is shown and what the args are checked against): `spec.tools` in order, an
/// `mcp` tool given its pin's inputSchema and description where the spec leaves them out, then
/// each toolset's tools rebuilt from their pins. Without pins (before `run.started`, or a run
/// with no MCP tools) this is `spec.tools` as written.
pub fn effective_tools(spec: &AgentRunSpec, pins: &[ToolPin]) -> Vec<ToolSpec> {
    let mut tools: Vec<ToolSpec> = spec
        .tools
        .iter()
        .map(|tool| {
            let mut tool = tool.clone();
            if tool.mcp.is_some() {
                if let Some(pin) = pins.iter().find(|p| p.tool == tool.name) {
                    let empty = match &tool.input_schema {
                        Value::Null => true,
                        Value::Object(map) => map.is_empty(),
                        _ => false,
                    };
                    if empty {
                        tool.input_schema = pin.definition.input_schema.clone();
                    }
                    if tool.description.is_empty() {
                        tool.description = pin.definition.description.clone().unwrap_or_default();
                    }
                }
            }
            tool
        })
        .collect();
    for (index, set) in spec.tool_sets.iter().enumerate() {
        let prefix = format!("{}{SET_SEPARATOR}", set.name);
        let pinned: Vec<ToolDefinition> = pins
            .iter()
            .filter(|p| p.server == set.mcp.url && p.tool.starts_with(&prefix))
            .map(|p| p.definition.clone())
            .collect();
        if let Ok(expanded) = expand_tool_set(index, set, &pinned) {
            tools.extend(expanded.into_iter().map(|t| t.spec));
        }
    }
    tools
}

/// One server hint that claims more danger than the manifest's class (the module's table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HintDisagreement {
    /// The hint: `readOnlyHint`, `destructiveHint` or `openWorldHint`.
    pub hint: &'static str,
    /// What it claims, in words, for a condition's message.
    pub claim: &'static str,
    /// The manifest's class, which decides the policy all the same.
    pub manifest: SideEffect,
}

/// The hints of `annotations` that claim more danger than `manifest` (the module's table);
/// empty when they agree or claim nothing (docs/behaviours.md 64: the run then gets a
/// `ToolHintsDisagree` condition, and the class stays the manifest's).
pub fn hint_disagreements(
    annotations: Option<&ToolAnnotations>,
    manifest: SideEffect,
) -> Vec<HintDisagreement> {
    let Some(a) = annotations else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let says_read_only = a.read_only_hint == Some(true);
    let says_mutates = a.read_only_hint == Some(false);
    if says_mutates && manifest == SideEffect::ReadOnly {
        out.push(HintDisagreement {
            hint: "readOnlyHint",
            claim: "the server says the tool changes its environment (readOnlyHint: false)",
            manifest,
        });
    }
    if a.destructive_hint == Some(true) && !says_read_only && manifest != SideEffect::Destructive {
        out.push(HintDisagreement {
            hint: "destructiveHint",
            claim: "the server says a change the tool makes may be destructive (destructiveHint: true)",
            manifest,
        });
    }
    if a.open_world_hint == Some(true)
        && says_mutates
        && matches!(manifest, SideEffect::ReadOnly | SideEffect::LocalMutation)
    {
        out.push(HintDisagreement {
            hint: "openWorldHint",
            claim: "the server says the tool changes things beyond the agent's environment (openWorldHint: true, readOnlyHint: false)",
            manifest,
        });
    }
    out
}

#[cfg(test)]
mod tests;
