//! Exports the spans of `core::trace` over OTLP/HTTP with the OpenTelemetry SDK (the one module
//! that imports it): `telemetry.otlp_endpoint` and `telemetry.sample_ratio`.
//!
//! The SDK's batch processor queues finished spans (2,048 at most; more are dropped, never
//! waited for) and exports them from a thread of its own every second. Its HTTP requests go
//! through `http::fetch` on the gateway's runtime.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, SpanKind as OtelKind, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};

use crate::config::TelemetryConfig;
use crate::core::log_throttle::Throttled;
use crate::core::trace::{AttributeValue, Span, SpanKind, Tracer};

/// How long one export may take (connect to last byte).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Spans exported over OTLP.
pub struct OtlpTracer {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// `sample_ratio` as a threshold on a random u64: a new trace is sampled below it.
    threshold: u64,
}

impl OtlpTracer {
    /// `None` when no endpoint is configured. Must run on the gateway's tokio runtime.
    pub fn start(config: &TelemetryConfig, instance: &str) -> anyhow::Result<Option<Arc<OtlpTracer>>> {
        if config.otlp_endpoint.is_empty() {
            return Ok(None);
        }
        let url = traces_url(&config.otlp_endpoint);
        let client = FetchClient { runtime: tokio::runtime::Handle::current() };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| anyhow::anyhow!("telemetry.otlp_endpoint {url:?}: {e}"))?;
        let batches = BatchConfigBuilder::default().with_scheduled_delay(Duration::from_secs(1)).with_max_queue_size(2048).build();
        let processor = BatchSpanProcessor::builder(exporter).with_batch_config(batches).build();
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("ackgate")
            .with_attributes([KeyValue::new("service.instance.id", instance.to_string()), KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))])
            .build();
        // Sampling is decided before a span exists (`core::trace`): whatever reaches the SDK is kept.
        let provider = SdkTracerProvider::builder().with_span_processor(processor).with_sampler(Sampler::AlwaysOn).with_resource(resource).build();
        let tracer = provider.tracer("ackgate");
        let threshold = (config.sample_ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        tracing::info!(endpoint = %url, sample_ratio = config.sample_ratio, "exporting traces over OTLP/HTTP");
        Ok(Some(Arc::new(OtlpTracer { provider, tracer, threshold })))
    }

    /// Exports what is queued and stops the export thread (at shutdown), within `grace`.
    pub fn shutdown(&self, grace: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(grace) {
            tracing::debug!(error = %e, "the span exporter did not stop cleanly");
        }
    }
}

impl Tracer for OtlpTracer {
    fn sample_new_trace(&self) -> bool {
        match self.threshold {
            0 => false,
            u64::MAX => true,
            threshold => crate::core::trace::random_id() < threshold,
        }
    }

    fn export(&self, span: Span) {
        let parent = match span.parent_span_id {
            0 => Context::new(),
            id => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from(span.trace_id),
                SpanId::from(id),
                TraceFlags::SAMPLED,
                span.remote_parent,
                TraceState::default(),
            )),
        };
        let attributes = span.attributes.into_iter().map(|(key, value)| match value {
            AttributeValue::Text(text) => KeyValue::new(key, text),
            AttributeValue::Number(number) => KeyValue::new(key, number),
        });
        let kind = match span.kind {
            SpanKind::Server => OtelKind::Server,
            SpanKind::Client => OtelKind::Client,
            SpanKind::Producer => OtelKind::Producer,
            SpanKind::Consumer => OtelKind::Consumer,
        };
        let mut built = self
            .tracer
            .span_builder(span.name)
            .with_trace_id(TraceId::from(span.trace_id))
            .with_span_id(SpanId::from(span.span_id))
            .with_kind(kind)
            .with_start_time(span.start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut built, span.end);
    }
}

/// The traces URL of `endpoint`: as given, or with /v1/traces when it names no path.
fn traces_url(endpoint: &str) -> String {
    let after_scheme = endpoint.split_once("://").map_or(endpoint, |(_, rest)| rest);
    match after_scheme.find('/') {
        None => format!("{endpoint}/v1/traces"),
        Some(at) if after_scheme[at..] == *"/" => format!("{}v1/traces", endpoint),
        Some(_) => endpoint.to_string(),
    }
}

/// The SDK's HTTP client: each export is one `http::fetch` POST, run on the gateway's runtime
/// (the SDK's export thread has none).
#[derive(Debug)]
struct FetchClient {
    runtime: tokio::runtime::Handle,
}

/// Failed exports are logged at most once a second, with how many were left out.
static FAILED_EXPORT_LINES: Throttled = Throttled::new();

#[async_trait::async_trait]
impl HttpClient for FetchClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let url = request.uri().to_string();
        let content_type = match request.headers().get("content-type").and_then(|v| v.to_str().ok()) {
            Some("application/json") => "application/json",
            _ => "application/x-protobuf",
        };
        let body = request.into_body();
        let sent = self.runtime.spawn(async move { crate::http::fetch::post(&url, "", EXPORT_TIMEOUT, content_type, &body).await }).await;
        let (status, body) = match sent {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(failed(e)),
            Err(e) => return Err(failed(format!("the export task ended: {e}"))),
        };
        if !(200..300).contains(&status) {
            return Err(failed(format!("the OTLP endpoint answered HTTP {status}")));
        }
        Ok(Response::builder().status(status).body(Bytes::from(body))?)
    }
}

fn failed(why: String) -> HttpError {
    // The SDK logs nothing (its internal logs are off): this is the operator's only sign.
    if let Some(suppressed) = FAILED_EXPORT_LINES.allow() {
        tracing::warn!(error = %why, suppressed, "exporting spans failed; they are dropped");
    }
    why.into()
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn an_endpoint_without_a_path_gets_the_traces_path() {
        assert_eq!(traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("https://otel.example/custom/path"), "https://otel.example/custom/path");
    }
}
