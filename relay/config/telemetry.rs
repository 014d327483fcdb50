//! `[telemetry]`: where the spans of attempts go. The standard `OTEL_*`
//! variables say the same and take precedence
//! ([`crate::observe::trace::Settings::resolve`]).

use anyhow::bail;
use serde::Deserialize;

use crate::observe::trace::{Protocol, Settings};

/// `[telemetry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetrySection {
    /// The OTLP endpoint (as `OTEL_EXPORTER_OTLP_ENDPOINT`), e.g.
    /// `http://127.0.0.1:4318`; none: no spans are exported.
    pub otlp_endpoint: Option<String>,
    /// `http/protobuf` or `grpc`.
    pub protocol: String,
    /// The share of traces the relay starts that are sampled, 0 to 1;
    /// an attempt under the application's span follows its decision.
    pub sample_ratio: Option<f64>,
    /// Finished spans that may wait for the collector; beyond it spans
    /// are dropped and counted, never waited for.
    pub queue: u32,
}

impl Default for TelemetrySection {
    fn default() -> Self {
        TelemetrySection {
            otlp_endpoint: None,
            protocol: "http/protobuf".into(),
            sample_ratio: None,
            queue: 2048,
        }
    }
}

impl TelemetrySection {
    /// The section, checked.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let protocol = Protocol::parse(&self.protocol)
            .map_err(|e| anyhow::anyhow!("telemetry.protocol: {e:#}"))?;
        if let Some(r) = self.sample_ratio {
            if !(0.0..=1.0).contains(&r) {
                bail!("telemetry.sample_ratio must be between 0 and 1 (got {r})");
            }
        }
        if !(1..=1_000_000).contains(&self.queue) {
            bail!("telemetry.queue must be between 1 and 1000000 spans");
        }
        let endpoint = self.otlp_endpoint.clone().filter(|e| !e.trim().is_empty());
        let settings = Settings {
            endpoint,
            protocol: Some(protocol),
            sample_ratio: self.sample_ratio,
            queue: self.queue as usize,
        };
        // the endpoint's own checks, as if no variable overrode it
        settings.resolve(|_| None)?;
        Ok(settings)
    }
}
