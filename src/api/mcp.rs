//! The MCP parts of the `AgentRun` (docs/design.md section 6, the `mcp` tool and
//! `spec.toolSets`; docs/behaviours.md 60-65): a tool's `mcp` executor, the toolsets that bring
//! in many tools of one server, and the pins of `status.toolPins[]`.
//!
//! Owns: their shapes, schema and CEL rules. Must not: hold logic (expanding a toolset, pinning
//! and comparing definitions are the engine's, in `engine::pins`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::agentrun::HttpHeader;
use super::schema::json_object;
use super::vocab::SideEffect;

/// The `mcp` executor of a tool (`spec.tools[].mcp`): call one tool of an MCP server over the
/// Streamable HTTP transport.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct McpTool {
    /// The server's MCP endpoint (http or https), e.g. `http://github-mcp.tools.svc:8080/mcp`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// The server's name of the tool; absent means the run's tool name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub tool: Option<String>,
    /// Extra headers sent with every request to the server (an `Authorization` token from a
    /// Secret, typically), each a literal value or a Secret key, exactly as an `http` tool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HttpHeader>,
    /// What a cancel of the run does to a call of this tool that runs as an MCP task
    /// (docs/design.md section 6, "MCP tasks"): `Leave` (default: the task runs on and its
    /// outcome is recorded late, as any tool's) or `Cancel` (`tasks/cancel` is sent, and the
    /// call ends as the task then does). A call that is not a task is never interrupted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_cancel: Option<McpOnCancel>,
    /// OAuth 2.0 client credentials for a server that is an OAuth resource server
    /// (docs/design.md section 6, "MCP OAuth"); exclusive with an `Authorization` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<McpOAuth>,
}

/// How agentrt gets an access token for an MCP server that is an OAuth 2.0 resource server
/// (`spec.tools[].mcp.oauth`, `spec.toolSets[].mcp.oauth`; docs/design.md section 6, "MCP
/// OAuth"): the client credentials grant (RFC 6749 section 4.4) at the authorization server
/// the server's Protected Resource Metadata names (RFC 9728), the token asked for the server
/// as its `resource` (RFC 8707), sent as `Authorization: Bearer`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct McpOAuth {
    /// The Secret in the run's namespace holding the client's id and secret (its owner's
    /// consent label applies, as for any Secret a run names).
    pub client_secret_ref: OAuthClientSecretRef,
    /// The scopes asked for (`scope`, space-separated); none: the authorization server's
    /// default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub scopes: Vec<String>,
}

/// The Secret holding an OAuth client's credentials (`oauth.clientSecretRef`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct OAuthClientSecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the client id (default `client_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id_key: Option<String>,
    /// The key holding the client secret (default `client_secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_key: Option<String>,
}

/// What a cancel does to an `mcp` tool's running task (`spec.tools[].mcp.onCancel`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum McpOnCancel {
    /// The task runs on; its outcome is appended to the record late (the contract for any tool).
    #[default]
    Leave,
    /// `tasks/cancel` is sent; the call's outcome is the task's as it then ends.
    Cancel,
}

/// The server a toolset lists its tools from (`spec.toolSets[].mcp`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct McpServer {
    /// The server's MCP endpoint (http or https).
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// Extra headers, each a literal value or a Secret key, as an `http` tool's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub headers: Vec<HttpHeader>,
    /// OAuth 2.0 client credentials, as a tool's `mcp.oauth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<McpOAuth>,
}

/// Many tools of one MCP server, each the run's tool `<name>__<server tool>`
/// (`spec.toolSets[]`; docs/design.md section 6).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.name.matches('^[a-zA-Z0-9_-]+$')", "message": "spec.toolSets[].name must be a valid function name: letters, digits, '_' and '-' only"},
    {"rule": "size(self.name) <= 61", "message": "spec.toolSets[].name must be at most 61 characters, so that '<name>__<tool>' fits in a function name of 64"}
]))]
pub struct ToolSet {
    /// Unique among the run's toolsets and distinct from its tools' names; the prefix of every
    /// tool the set brings in.
    #[schemars(length(min = 1, max = 61))]
    pub name: String,
    /// The server listed at start.
    pub mcp: McpServer,
    /// Globs (`*`, `?`) of the server's tool names to bring in; empty means every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub include: Vec<String>,
    /// The side-effect class of every tool of the set unless overridden (default
    /// `RemoteMutation`). It is the manifest's word: the server's annotations never change it.
    #[serde(default = "default_toolset_side_effect")]
    pub side_effect: SideEffect,
    /// Per-tool changes, by the server's tool name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["tool"]))]
    pub overrides: Vec<ToolSetOverride>,
}

fn default_toolset_side_effect() -> SideEffect {
    SideEffect::RemoteMutation
}

/// How one tool of a toolset differs from the set's defaults.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ToolSetOverride {
    /// The server's name of the tool.
    #[schemars(length(min = 1, max = 256))]
    pub tool: String,
    /// Its side-effect class instead of the set's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_effect: Option<SideEffect>,
    /// How long one call may take, in seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub timeout_seconds: Option<i64>,
    /// A successful call completes the run with its content as the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<bool>,
}

/// One MCP tool's definition as the record pinned it before `run.started`
/// (`status.toolPins[]`; docs/design.md section 6, docs/behaviours.md 60).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolPin {
    /// The run's name of the tool (`spec.tools[].name`, or `<set>__<server tool>`).
    pub tool: String,
    /// The server's URL.
    pub server: String,
    /// The server's name of the tool.
    pub server_tool: String,
    /// `sha256:<hex>` of the canonical JSON (RFC 8785) of `definition`.
    pub sha256: String,
    /// What the server listed, as recorded.
    pub definition: ToolDefinition,
    /// The MCP protocol revision the server spoke when it listed the tool (`2026-07-28`,
    /// `2025-11-25`, `2025-06-18` or `2025-03-26`; docs/design.md section 6, "MCP revisions").
    /// Recorded, not part of `sha256`: a server that moves to another revision with the same
    /// definition still matches its pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// Who the server said it is when it listed the tool: `{name, version}` of `initialize`'s
    /// `serverInfo` or `server/discover`'s `io.modelcontextprotocol/serverInfo` (other members
    /// dropped). Before each call it must say the same, else the call is refused
    /// `definition_changed` (docs/design.md section 6, "MCP revisions"). Not part of `sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub server_info: Option<Value>,
}

/// A tool definition as an MCP server lists it (`tools/list`), reduced to what is pinned.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    /// The server's name of the tool.
    pub name: String,
    /// A human title, when the server gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does, shown to the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema the args must pass, as the server listed it.
    #[schemars(schema_with = "json_object")]
    pub input_schema: Value,
    /// The server's hints: recorded and shown, never trusted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
    /// The JSON Schema a result's `structuredContent` must pass, when the server gives one
    /// (2025-06-18 on); a result that does not pass is a `tool_error` `invalid_content`
    /// (docs/design.md section 6, "MCP revisions").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub output_schema: Option<Value>,
    /// How the tool may be run, as the server says (`{"taskSupport": "forbidden" | "optional" |
    /// "required"}`, 2025-11-25 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "json_object")]
    pub execution: Option<Value>,
}

/// The hints an MCP server attaches to a tool (MCP `ToolAnnotations`). The manifest's
/// side-effect class decides the policy whatever they say (docs/behaviours.md 64).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct ToolAnnotations {
    /// A human title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not change its environment (MCP default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// A change it makes may be destructive (MCP default true, meaningful when not read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Calling it again with the same args has no further effect (MCP default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// It reaches an open world of external entities (MCP default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
    /// Any other hint the server sent, verbatim (it is part of the pinned definition).
    #[serde(default, flatten, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(skip)]
    pub extra: BTreeMap<String, Value>,
}
