//! Tracing: one OpenTelemetry span per delivery attempt, a child of the
//! trace context the application enqueued the intent with, exported over
//! OTLP (gRPC or HTTP/protobuf) through a bounded queue
//! ([`export::BoundedExport`]) that no delivery ever waits on.
//!
//! Without an endpoint nothing is set up: no exporter, no span, and an
//! intent's own `traceparent` is forwarded unchanged, so receivers still
//! join the application's trace.

mod attempt;
pub mod context;
mod export;
mod http;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub use attempt::{Attempt, Identity};
pub use context::IntentContext;

/// The standard variables the OpenTelemetry SDK and its OTLP exporter
/// read by themselves (the relay reads the endpoint, protocol, service
/// name and sampler variables too, in [`Settings::resolve`]). The relay
/// logs which are set when it starts exporting, never their values: the
/// headers may carry a collector's API key.
pub const READ_BY_THE_SDK: &[&str] = &["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_TRACES_SAMPLER_ARG"];

/// How long one export over HTTP may take: `OTEL_EXPORTER_OTLP_TIMEOUT`
/// (milliseconds), else 10 s, as the specification says.
fn export_timeout(var: impl Fn(&str) -> Option<String>) -> Duration {
    var("OTEL_EXPORTER_OTLP_TIMEOUT")
        .and_then(|ms| ms.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
}

/// The OTLP transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// `grpc` or `http/protobuf`, the values of `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn parse(text: &str) -> anyhow::Result<Protocol> {
        match text.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            "http/json" => bail!("OTLP over http/json is not supported; use grpc or http/protobuf"),
            other => bail!("unknown OTLP protocol {other:?} (grpc or http/protobuf)"),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Grpc => "grpc",
            Protocol::HttpProtobuf => "http/protobuf",
        })
    }
}

/// What `[telemetry]` says; the standard `OTEL_*` variables take
/// precedence over it ([`Settings::resolve`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// Where spans go (as `OTEL_EXPORTER_OTLP_ENDPOINT`); none: no export.
    pub endpoint: Option<String>,
    pub protocol: Option<Protocol>,
    /// The share of new traces sampled; a child of the application's span
    /// follows the application's decision.
    pub sample_ratio: Option<f64>,
    /// Finished spans that may wait for the exporter.
    pub queue: usize,
}

/// The export the relay sets up: resolved from [`Settings`] and the
/// environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// The endpoint given to the exporter; `None` lets it read
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// itself, by the specification's rules.
    pub endpoint: Option<String>,
    pub protocol: Protocol,
    /// `None` leaves the sampler to `OTEL_TRACES_SAMPLER` (or the default,
    /// parent-based always-on).
    pub sample_ratio: Option<f64>,
    /// Name the service `outbox-relay` (neither `OTEL_SERVICE_NAME` nor a
    /// `service.name` in `OTEL_RESOURCE_ATTRIBUTES` names it).
    pub default_service_name: bool,
    pub queue: usize,
}

impl Settings {
    /// The export to set up, if any, given the environment `var`. The
    /// standard variables win over the file: `OTEL_SDK_DISABLED=true`
    /// turns export off, an `OTEL_EXPORTER_OTLP_*ENDPOINT` replaces
    /// `otlp_endpoint`, `OTEL_EXPORTER_OTLP_*PROTOCOL` replaces `protocol`,
    /// `OTEL_TRACES_SAMPLER` replaces `sample_ratio`.
    pub fn resolve(&self, var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Export>> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let from_env = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .any(|name| var(name).is_some());
        if !from_env && self.endpoint.is_none() {
            return Ok(None);
        }
        let protocol = match [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ]
        .iter()
        .find_map(|name| var(name).map(|v| (name, v)))
        {
            Some((name, v)) => Protocol::parse(&v).with_context(|| format!("in {name}"))?,
            None => self.protocol.unwrap_or(Protocol::HttpProtobuf),
        };
        let endpoint = match (&self.endpoint, from_env) {
            (Some(base), false) => Some(endpoint_url(base, protocol)?),
            _ => None,
        };
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attrs| {
                attrs
                    .split(',')
                    .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
            });
        Ok(Some(Export {
            endpoint,
            protocol,
            sample_ratio: self
                .sample_ratio
                .filter(|_| var("OTEL_TRACES_SAMPLER").is_none()),
            default_service_name: !named,
            queue: self.queue,
        }))
    }
}

/// `otlp_endpoint` means what `OTEL_EXPORTER_OTLP_ENDPOINT` means: over
/// HTTP, a base URL that `/v1/traces` is appended to; over gRPC, the
/// address as it stands.
fn endpoint_url(base: &str, protocol: Protocol) -> anyhow::Result<String> {
    let url = url::Url::parse(base)
        .with_context(|| format!("telemetry.otlp_endpoint {base:?} is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        bail!("telemetry.otlp_endpoint {base:?} must be an http:// or https:// URL");
    }
    Ok(match protocol {
        Protocol::HttpProtobuf => format!("{}/v1/traces", url.as_str().trim_end_matches('/')),
        Protocol::Grpc => base.to_string(),
    })
}

/// The relay's tracer: off (no endpoint) or exporting.
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    flusher: export::Flusher,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("exporting", &self.inner.is_some())
            .finish()
    }
}

/// How long the relay waits for the collector when it stops.
const FLUSH_AT_EXIT: Duration = Duration::from_secs(5);

impl Tracer {
    /// No export: attempts forward the intent's own context.
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// Set up the export (on the current tokio runtime). A bad setting is
    /// an error; a collector that cannot be reached is not (its spans are
    /// dropped and counted while deliveries go on).
    pub fn start(export: &Export) -> anyhow::Result<Tracer> {
        let exporter = match export.protocol {
            Protocol::Grpc => {
                let mut b = opentelemetry_otlp::SpanExporter::builder().with_tonic();
                if let Some(endpoint) = &export.endpoint {
                    b = b.with_endpoint(endpoint);
                }
                b.build()
            }
            Protocol::HttpProtobuf => {
                let timeout = export_timeout(|name| std::env::var(name).ok());
                let client =
                    http::Client::new(timeout).context("cannot build the OTLP HTTP client")?;
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_http_client(client)
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
                if let Some(endpoint) = &export.endpoint {
                    b = b.with_endpoint(endpoint);
                }
                b.build()
            }
        }
        .context("cannot set up the OTLP trace exporter")?;
        let (processor, flusher) = export::BoundedExport::start(exporter, export.queue);
        let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ));
        if export.default_service_name {
            resource = resource.with_service_name("outbox-relay");
        }
        let mut builder = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_id_generator(context::Ids::default())
            .with_resource(resource.build());
        if let Some(ratio) = export.sample_ratio {
            builder = builder.with_sampler(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(ratio),
            )));
        }
        let provider = builder.build();
        let tracer = provider.tracer("outbox-relay");
        Ok(Tracer {
            inner: Some(Arc::new(Exporting {
                provider,
                tracer,
                flusher,
            })),
        })
    }

    /// Spans are exported.
    pub fn is_on(&self) -> bool {
        self.inner.is_some()
    }

    /// Send what is queued (at most a few seconds) and stop exporting.
    pub async fn shutdown(&self) {
        if let Some(inner) = &self.inner {
            inner.flusher.flush(FLUSH_AT_EXIT).await;
            let _ = inner.provider.shutdown();
        }
    }

    fn sdk(&self) -> Option<&SdkTracer> {
        self.inner.as_ref().map(|i| &i.tracer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn no_endpoint_no_export() {
        assert_eq!(Settings::default().resolve(env(&[])).unwrap(), None);
        let file = Settings {
            endpoint: Some("http://127.0.0.1:4318".into()),
            ..Settings::default()
        };
        assert_eq!(
            file.resolve(env(&[("OTEL_SDK_DISABLED", "true")])).unwrap(),
            None
        );
    }

    #[test]
    fn the_file_says_what_the_variables_say_and_the_variables_win() {
        let file = Settings {
            endpoint: Some("http://127.0.0.1:4318".into()),
            protocol: None,
            sample_ratio: Some(0.25),
            queue: 100,
        };
        let e = file.resolve(env(&[])).unwrap().unwrap();
        assert_eq!(
            e.endpoint.as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            (e.protocol, e.sample_ratio, e.default_service_name),
            (Protocol::HttpProtobuf, Some(0.25), true)
        );
        let e = file
            .resolve(env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=x, service.name=relay-eu",
                ),
            ]))
            .unwrap()
            .unwrap();
        assert_eq!(e.endpoint, None, "the exporter reads the variable itself");
        assert_eq!(
            (e.protocol, e.sample_ratio, e.default_service_name),
            (Protocol::Grpc, None, false)
        );
        let grpc = Settings {
            endpoint: Some("http://127.0.0.1:4317".into()),
            protocol: Some(Protocol::Grpc),
            ..Settings::default()
        };
        let e = grpc.resolve(env(&[])).unwrap().unwrap();
        assert_eq!(e.endpoint.as_deref(), Some("http://127.0.0.1:4317"));
        let path = Settings {
            endpoint: Some("https://gateway.example/otlp/".into()),
            ..Settings::default()
        };
        let e = path.resolve(env(&[])).unwrap().unwrap();
        assert_eq!(
            e.endpoint.as_deref(),
            Some("https://gateway.example/otlp/v1/traces")
        );
    }

    #[test]
    fn an_export_takes_the_standard_timeout() {
        assert_eq!(export_timeout(env(&[])), Duration::from_secs(10));
        assert_eq!(
            export_timeout(env(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")])),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let file = Settings {
            endpoint: Some("127.0.0.1:4318".into()),
            ..Settings::default()
        };
        let err = format!("{:#}", file.resolve(env(&[])).unwrap_err());
        assert!(err.contains("telemetry.otlp_endpoint"), "{err}");
        let err = format!(
            "{:#}",
            Settings::default()
                .resolve(env(&[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ]))
                .unwrap_err()
        );
        assert!(
            err.contains("http/json is not supported")
                && err.contains("OTEL_EXPORTER_OTLP_PROTOCOL"),
            "{err}"
        );
    }
}
