//! Tracing spans for one run's story (ARCHITECTURE.md: spans carry `run` and `step`): a `run` span per
//! executor and per reconcile, a `step` span per step the executor works on, and, with the
//! `otel` feature, the run's OpenTelemetry trace: its trace id is the run's uid (a UUID's 16
//! bytes; any other uid is hashed), so every replica that works on the run, a takeover
//! included, continues the same trace.

use tracing::Span;

use super::cluster::RunKey;
use crate::engine::{Next, Transition};

/// The span of an executor working on `key` (uid `uid`) as `holder`: a root, not a child of
/// the reconcile that started it (the executor outlives it), joined to the run's trace.
pub fn run_span(key: &RunKey, uid: &str, holder: &str) -> Span {
    let span = tracing::info_span!(parent: None, "run", run = %key, uid = %uid, holder = %holder);
    join_run_trace(&span, uid);
    span
}

/// The span of one reconcile of `key` (uid `uid`, when known); `step` is recorded once the run
/// is read.
pub fn reconcile_span(key: &RunKey, uid: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "reconcile",
        run = %key,
        step = tracing::field::Empty
    );
    if let Some(uid) = uid {
        join_run_trace(&span, uid);
    }
    span
}

/// The step a transition works on: the step of its external call, else the last step of the
/// status it writes, else the last step of the record as read.
pub fn step_of(transition: &Transition, stored: &serde_json::Value) -> Option<i64> {
    let last_step = |status: &serde_json::Value| {
        status["stepCount"]
            .as_i64()
            .filter(|count| *count > 0)
            .map(|count| count - 1)
    };
    if let Next::Call(call) = &transition.next {
        if let Some(step) = call.step() {
            return Some(step.get());
        }
    }
    transition
        .write
        .as_ref()
        .and_then(last_step)
        .or_else(|| last_step(stored))
}

/// The executor's `step` spans: one per step, kept open while the executor works on that step
/// (its decision, policy, tool call and the write recording the outcome), children of the
/// `run` span.
#[derive(Default)]
pub struct StepSpans {
    current: Option<(i64, Span)>,
}

impl StepSpans {
    /// The span for work on `step` (the run span itself when no step is known yet).
    pub fn for_step(&mut self, key: &RunKey, step: Option<i64>) -> Span {
        let Some(step) = step else {
            return Span::current();
        };
        match &self.current {
            Some((current, span)) if *current == step => span.clone(),
            _ => {
                let span = tracing::info_span!("step", run = %key, step);
                self.current = Some((step, span.clone()));
                span
            }
        }
    }
}

#[cfg(feature = "otel")]
fn join_run_trace(span: &Span, uid: &str) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let (trace_id, span_id) = run_trace_ids(uid);
    let parent = SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(trace_id),
        SpanId::from_bytes(span_id),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent));
}

#[cfg(not(feature = "otel"))]
fn join_run_trace(_span: &Span, _uid: &str) {}

/// The run's trace id (its uid's 16 bytes when the uid is a UUID, else the first 16 bytes of its
/// SHA-256) and the id of the run's synthetic root span (the next 8 bytes of the SHA-256), the
/// parent of every replica's spans for the run.
pub fn run_trace_ids(uid: &str) -> ([u8; 16], [u8; 8]) {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(uid.as_bytes());
    let mut trace_id = [0u8; 16];
    match uuid::Uuid::parse_str(uid) {
        Ok(uuid) if !uuid.is_nil() => trace_id.copy_from_slice(uuid.as_bytes()),
        _ => trace_id.copy_from_slice(&digest[..16]),
    }
    let mut span_id = [0u8; 8];
    span_id.copy_from_slice(&digest[16..24]);
    if span_id == [0u8; 8] {
        span_id[7] = 1;
    }
    (trace_id, span_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_run_trace_id_is_its_uid() {
        let uid = "6f1c2a4e-8d3b-4f5a-9c7e-0123456789ab";
        let (trace, span) = run_trace_ids(uid);
        assert_eq!(hex::encode(trace), "6f1c2a4e8d3b4f5a9c7e0123456789ab");
        // The same on every replica, so a takeover continues the trace.
        assert_eq!(run_trace_ids(uid), (trace, span));
        let (other, _) = run_trace_ids("not-a-uuid");
        assert_ne!(other, [0u8; 16]);
    }

    #[cfg(feature = "otel")]
    #[test]
    fn a_run_span_continues_the_trace_named_by_the_run_uid() {
        use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let uid = "6f1c2a4e-8d3b-4f5a-9c7e-0123456789ab";
        let key = RunKey {
            namespace: "ns".into(),
            name: "r".into(),
        };
        tracing::subscriber::with_default(subscriber, || {
            // Two replicas (a holder and the one that takes over) open the run's span apart.
            for holder in ["a-1", "b-2"] {
                let span = run_span(&key, uid, holder);
                let trace_id = span.context().span().span_context().trace_id();
                assert_eq!(trace_id.to_string(), "6f1c2a4e8d3b4f5a9c7e0123456789ab");
            }
        });
    }

    #[test]
    fn the_step_is_the_external_calls_else_the_last_written() {
        let stored = json!({"stepCount": 3});
        assert_eq!(step_of(&Transition::stop(), &stored), Some(2));
        assert_eq!(step_of(&Transition::stop(), &json!(null)), None);
        let write = Transition {
            seal: None,
            write: Some(json!({"stepCount": 5})),
            ..Transition::stop()
        };
        assert_eq!(step_of(&write, &stored), Some(4));
        let agent = Transition {
            next: Next::Call(crate::engine::ExternalCall::Agent {
                step: crate::api::StepIndex(7),
                request: json!({}),
                attempt: 1,
                delay_millis: 0,
                timeout_millis: 1000,
            }),
            ..Transition::stop()
        };
        assert_eq!(step_of(&agent, &stored), Some(7));
    }
}
