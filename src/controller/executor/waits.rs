//! The executor's waits on a tool call that runs on its own once started (docs/design.md
//! section 6): a `job` tool's Job ("Job tools") and an MCP task on the record ("MCP tasks").
//! Stopping, shutting down or losing the lease stops only the waiting; the next holder reads
//! the Job by its name, or follows the task by the id the record holds.

use tracing::Instrument;

use super::super::calls::{follow_task, job, FollowStep};
use super::gate::lost;
use super::{outcome_word, Driver, Flow};
use crate::engine::{Input, JobStage, ToolCall};

impl Driver<'_> {
    /// Creates or reads step's Job ([`JobStage`]) and waits for it: [`Input::JobCreated`] once
    /// created, [`Input::ToolFinished`] once it ended.
    pub(super) async fn wait_for_job(&mut self, call: ToolCall) -> Flow {
        let (ctx, lease, stop) = (self.ctx, self.lease, self.stop);
        let (step, attempt) = (call.step, call.attempt);
        let stage = call.job.unwrap_or(JobStage::Create);
        let tool = call.tool.name.clone();
        let started = std::time::Instant::now();
        let done = tokio::select! {
            done = job::call_job(ctx, &self.state, &call, stage)
                .instrument(tracing::info_span!("job", step = step.get(), tool = %tool)) => done,
            _ = stop.cancelled() => return Flow::Stop,
            _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
            _ = lost(lease) => return Flow::Next(Input::LeaseLost),
        };
        let next = match done {
            job::JobStep::Created { name, job } => Input::JobCreated {
                step,
                attempt,
                name,
                job,
            },
            job::JobStep::Finished(outcome) => {
                ctx.metrics.tool_call(
                    &tool,
                    outcome_word(&outcome),
                    started.elapsed().as_secs_f64(),
                );
                let uid = &self.state.run.snapshot.uid;
                self.job_outcome = Some(crate::engine::job_name(uid, step, attempt));
                Input::ToolFinished {
                    step,
                    attempt,
                    outcome,
                }
            }
        };
        Flow::Next(if lease.is_lost() {
            Input::LeaseLost
        } else {
            next
        })
    }

    /// Follows the MCP task the record holds for the step's attempt ([`ToolCall::task`]) to
    /// its outcome ([`Input::ToolFinished`]) or its request for input
    /// ([`Input::TaskInputRequired`]). Following only reads (and sends a decided answer).
    pub(super) async fn follow(&mut self, call: ToolCall) -> Flow {
        let (ctx, lease, stop) = (self.ctx, self.lease, self.stop);
        let (step, attempt) = (call.step, call.attempt);
        let tool = call.tool.name.clone();
        let started = std::time::Instant::now();
        let followed = tokio::select! {
            followed = follow_task(ctx, &self.state, &call)
                .instrument(tracing::info_span!("task", step = step.get(), tool = %tool)) => followed,
            _ = stop.cancelled() => return Flow::Stop,
            _ = ctx.executors.shutdown.cancelled() => return Flow::Stop,
            _ = lost(lease) => return Flow::Next(Input::LeaseLost),
        };
        let next = match followed {
            FollowStep::Finished(outcome) => {
                ctx.metrics.tool_call(
                    &tool,
                    outcome_word(&outcome),
                    started.elapsed().as_secs_f64(),
                );
                Input::ToolFinished {
                    step,
                    attempt,
                    outcome,
                }
            }
            FollowStep::InputRequired(input) => Input::TaskInputRequired {
                step,
                attempt,
                input,
            },
        };
        Flow::Next(if lease.is_lost() {
            Input::LeaseLost
        } else {
            next
        })
    }
}
