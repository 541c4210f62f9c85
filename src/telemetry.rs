//! Logs and traces of the process: `tracing` to stderr as text or JSON (`--log-format`), the
//! filter from `AGENTRT_LOG` (else `RUST_LOG`, else the command's default level), coloured only
//! when stderr is a terminal; and, built
//! with the `otel` feature and given `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), the spans exported over OTLP/HTTP. The controller's
//! spans (`run`, `step`, `reconcile`, `tool`) carry `run` and `step` fields either way; the
//! trace of a run is its uid (see `controller::trace`).

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the exporter alive; dropping it flushes the spans not yet exported.
#[must_use = "dropping the guard stops the export"]
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// Installs the global subscriber: `format` is `text` or `json`.
pub fn init(format: &str, default_level: &str) -> Telemetry {
    let filter = EnvFilter::try_from_env("AGENTRT_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    // Colours only for a person at a terminal: a log file or a collector gets plain text.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let logs = if format == "json" {
        logs.json().boxed()
    } else {
        logs.boxed()
    };
    let registry = tracing_subscriber::registry().with(logs.with_filter(filter));
    #[cfg(feature = "otel")]
    {
        let (layer, provider) = match otel::layer() {
            Some((layer, provider)) => (Some(layer), Some(provider)),
            None => (None, None),
        };
        let _ = registry.with(layer).try_init();
        Telemetry { provider }
    }
    #[cfg(not(feature = "otel"))]
    {
        let _ = registry.try_init();
        Telemetry {}
    }
}

#[cfg(feature = "otel")]
mod otel {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;

    /// The OTLP layer when an endpoint is configured (its spans are not filtered by the log
    /// level: `run`, `step` and `reconcile` are info spans). `None` without an endpoint, or when
    /// the exporter cannot be built (said on stderr).
    pub fn layer<S>() -> Option<(Box<dyn Layer<S> + Send + Sync>, SdkTracerProvider)>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let endpoint = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|_| {
                std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
                    .map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
            })
            .ok()?;
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.clone())
            .build()
        {
            Ok(exporter) => exporter,
            Err(err) => {
                eprintln!("warning: no OpenTelemetry export to {endpoint}: {err}");
                return None;
            }
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("agentrt")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("agentrt");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
            .boxed();
        Some((layer, provider))
    }
}
