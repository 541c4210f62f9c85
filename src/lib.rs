//! agentrt: a Kubernetes operator that runs tool-using AI agents durably.
//!
//! The rooms, as docs/design.md section 7 lays them out (see ARCHITECTURE.md for the map):
//! - [`api`]: the `AgentRun` and `Approval` custom resources, the contract and nothing else.
//! - [`engine`]: the sans-IO run state machine holding every rule of docs/design.md sections 3-6.
//! - [`controller`]: kube-runtime wiring, per-run executors, leases, compare-and-set writes.
//! - [`agents`]: the deciders (scripted, openai, webhook).
//! - [`tools`]: tool executors (http) and schema checks.
//! - [`cli`]: the operator commands (runs, show, approve, reject, cancel), also `kubectl-agentrt`.
//! - [`console`]: `agentrt console`, the web page for deciding Approvals as the caller.
//! - [`devcluster`]: the embedded Kubernetes-API-compatible server behind `agentrt dev`.
//! - [`telemetry`]: logs (text or JSON) and, with the `otel` feature, OpenTelemetry traces.
//! - [`bench`]: `agentrt bench`, the performance figures of docs/design.md section 10.

pub mod agents;
pub mod api;
pub mod bench;
pub mod cli;
pub mod console;
pub mod controller;
pub mod devcluster;
pub mod engine;
pub mod telemetry;
pub mod tools;
