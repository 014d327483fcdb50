//! The bench's OTLP receiver (`--tracing`): `POST /v1/traces` over
//! HTTP/protobuf, on a thread and runtime of its own as the webhook
//! receiver is. It decodes every `ExportTraceServiceRequest` with the
//! official definitions (`opentelemetry-proto`), counts its spans, and
//! answers an empty `ExportTraceServiceResponse`; a body it cannot decode
//! is refused (400) and counted, so a traced drain that lost spans that way
//! fails.

use std::sync::{Arc, Mutex};

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;

/// What the receiver has taken so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// Export requests answered 200.
    pub requests: u64,
    /// Spans in them.
    pub spans: u64,
    /// Requests refused: not protobuf, or not an `ExportTraceServiceRequest`.
    pub refused: u64,
}

/// The receiver: where it listens, and its counts (shared with its
/// thread).
#[derive(Clone)]
pub(crate) struct Traces {
    port: u16,
    received: Arc<Mutex<Received>>,
}

impl Traces {
    /// The base URL for `telemetry.otlp_endpoint` (the exporter appends
    /// `/v1/traces`).
    pub(crate) fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn received(&self) -> Received {
        *self.received.lock().expect("otlp counts")
    }

    pub(crate) fn reset(&self) {
        *self.received.lock().expect("otlp counts") = Received::default();
    }

    fn take(&self, body: &[u8], protobuf: bool) -> Response {
        let decoded = spans_in(body).filter(|_| protobuf);
        let mut r = self.received.lock().expect("otlp counts");
        match decoded {
            Some(spans) => {
                r.requests += 1;
                r.spans += spans;
                (
                    [(header::CONTENT_TYPE, "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
                    .into_response()
            }
            None => {
                r.refused += 1;
                (
                    StatusCode::BAD_REQUEST,
                    "not an application/x-protobuf ExportTraceServiceRequest",
                )
                    .into_response()
            }
        }
    }
}

/// The spans of an encoded `ExportTraceServiceRequest`, over all its
/// resources and scopes; `None` if it is not one.
pub(crate) fn spans_in(body: &[u8]) -> Option<u64> {
    let request = ExportTraceServiceRequest::decode(body).ok()?;
    Some(
        request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len() as u64)
            .sum(),
    )
}

/// Start the receiver on a free loopback port: its thread, and its
/// address and counts.
pub(crate) fn collector() -> anyhow::Result<(std::thread::JoinHandle<()>, Traces)> {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    std_listener.set_nonblocking(true)?;
    let traces = Traces {
        port: std_listener.local_addr()?.port(),
        received: Arc::default(),
    };
    let counts = traces.clone();
    let handle = std::thread::Builder::new()
        .name("bench-otlp".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).expect("listener");
                let app = axum::Router::new().route(
                    "/v1/traces",
                    axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                        let protobuf = headers
                            .get(header::CONTENT_TYPE)
                            .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
                        let answer = counts.take(&body, protobuf);
                        async move { answer }
                    }),
                );
                let _ = axum::serve(listener, app).await;
            });
        })?;
    Ok((handle, traces))
}

/// `outbox_spans_dropped_total` from a relay's Prometheus text (summed
/// over any labels); `None` when the relay does not export it (tracing
/// off).
pub(crate) fn dropped_in(metrics: &str) -> Option<u64> {
    let mut found = None;
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] != "outbox_spans_dropped_total" {
            continue;
        }
        let value: f64 = line.split_whitespace().last()?.parse().ok()?;
        *found.get_or_insert(0) += value as u64;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};

    fn scope(spans: usize) -> ScopeSpans {
        ScopeSpans {
            spans: (0..spans)
                .map(|i| Span {
                    name: format!("webhook {i}"),
                    span_id: vec![i as u8 + 1; 8],
                    trace_id: vec![7; 16],
                    ..Span::default()
                })
                .collect(),
            ..ScopeSpans::default()
        }
    }

    #[test]
    fn counts_the_spans_of_every_resource_and_scope() {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    scope_spans: vec![scope(3), scope(0)],
                    ..ResourceSpans::default()
                },
                ResourceSpans {
                    scope_spans: vec![scope(2)],
                    ..ResourceSpans::default()
                },
            ],
        };
        assert_eq!(spans_in(&request.encode_to_vec()), Some(5));
        assert_eq!(spans_in(&[]), Some(0));
        assert_eq!(spans_in(b"\xff\xff\xff not protobuf"), None);
    }

    #[tokio::test]
    async fn answers_an_export_and_refuses_what_is_not_one() {
        let (_thread, traces) = collector().unwrap();
        let url = format!("{}/v1/traces", traces.endpoint());
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                scope_spans: vec![scope(4)],
                ..ResourceSpans::default()
            }],
        };
        let client = reqwest::Client::new();
        let answer = client
            .post(&url)
            .header("content-type", "application/x-protobuf")
            .body(request.encode_to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(
            answer.headers()["content-type"].as_bytes(),
            b"application/x-protobuf"
        );
        let body = answer.bytes().await.unwrap();
        assert_eq!(
            ExportTraceServiceResponse::decode(body).unwrap(),
            ExportTraceServiceResponse::default()
        );
        let json = client
            .post(&url)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(json.status(), 400);
        assert_eq!(
            traces.received(),
            Received {
                requests: 1,
                spans: 4,
                refused: 1
            }
        );
    }

    #[test]
    fn reads_the_dropped_spans_counter() {
        let text = "# TYPE outbox_spans_dropped_total counter\n\
                    outbox_spans_dropped_total 12\n\
                    outbox_spans_dropped_total_other 5\n\
                    outbox_delivered_total{kind=\"webhook\"} 20000\n";
        assert_eq!(dropped_in(text), Some(12));
        assert_eq!(dropped_in("outbox_delivered_total 3\n"), None);
    }
}
