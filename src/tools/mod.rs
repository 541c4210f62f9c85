//! Tool executors (docs/design.md section 6): http, the MCP client (`mcp`: Streamable HTTP,
//! sessions, bounded answers; docs/design.md section 6); and what `agentrt dev` serves for the
//! samples (tools, a scripted model, a reconcile hook); which Secrets a run may use
//! (`consent`).
//!
//! An executor turns one [`crate::engine::ToolCall`] into one [`crate::engine::ToolOutcome`]
//! (or one [`crate::engine::StatusQuery`] into one [`crate::engine::StatusAnswer`]) and nothing
//! else: it never writes the record and never retries a call of its own accord.
//! Whether a call may start at all (a live lease, a recorded `step.tool_started`) is the
//! controller's check, made before it calls in here.
//!
//! Files:
//! - `http`: the `http` executor, its answer bounded and hashed as it streams; `http/status`:
//!   asking a tool's status URL what became of an interrupted call.
//! - `mcp`: the MCP client (`mcp/client`: sessions and calls; `mcp/answer`: bounded answers;
//!   `mcp/sse`: event streams).
//! - `consent`: a Secret is used only with its owner's consent label, and which spec fields name
//!   one.
//! - `samples`: what `agentrt dev` serves for `config/samples/` (`samples/model`, `samples/hook`,
//!   `samples/mcp`).

pub mod consent;
pub mod http;
pub mod mcp;
pub mod samples;
