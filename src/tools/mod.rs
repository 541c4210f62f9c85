//! Tool executors (docs/design.md section 6): http, the MCP client (`mcp`: Streamable HTTP,
//! sessions, bounded answers; docs/design.md section 6); and what `agentrt dev` serves for the
//! samples (tools, a scripted model, a reconcile hook); which Secrets a run may use
//! (`consent`).
//!
//! An executor turns one [`crate::engine::ToolCall`] into one [`crate::engine::ToolOutcome`]
//! and nothing else: it never writes the record and never retries a call of its own accord.
//! Whether a call may start at all (a live lease, a recorded `step.tool_started`) is the
//! controller's check, made before it calls in here.

pub mod consent;
pub mod http;
pub mod mcp;
pub mod samples;
