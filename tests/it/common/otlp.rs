//! A real OTLP receiver for the tracing tests: the official protobuf
//! definitions (`opentelemetry-proto`), served over gRPC (tonic's
//! generated `TraceService`) and over HTTP/protobuf (`POST /v1/traces`),
//! keeping every span it is sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;

/// One span as the collector received it, ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct SpanSeen {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind`: 1 internal, 2 server, 3 client, 4 producer.
    pub kind: i32,
    pub attributes: BTreeMap<String, String>,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    pub status_message: String,
    /// Which transport brought it: `grpc` or `http`.
    pub via: &'static str,
}

impl SpanSeen {
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attributes.get(name).map(String::as_str)
    }
}

type Seen = Arc<Mutex<Vec<SpanSeen>>>;

/// The receiver: both transports on loopback ports of their own.
pub struct Collector {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    seen: Seen,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Collector {
    pub async fn start() -> Collector {
        let seen: Seen = Arc::default();
        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let service = TraceServiceServer::new(Grpc(seen.clone()));
        let grpc_task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener))
                .await;
        });
        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(http_export))
            .with_state(seen.clone());
        let http_task = tokio::spawn(async move {
            let _ = axum::serve(http_listener, app).await;
        });
        Collector {
            grpc,
            http,
            seen,
            tasks: vec![grpc_task, http_task],
        }
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for HTTP/protobuf.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `OTEL_EXPORTER_OTLP_ENDPOINT` for gRPC.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn spans(&self) -> Vec<SpanSeen> {
        self.seen.lock().unwrap().clone()
    }

    /// Wait until `enough` holds of the spans received (or `limit` passes);
    /// the spans then.
    pub async fn wait_for(
        &self,
        limit: Duration,
        enough: impl Fn(&[SpanSeen]) -> bool,
    ) -> Vec<SpanSeen> {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let spans = self.spans();
            if enough(&spans) || tokio::time::Instant::now() >= until {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

struct Grpc(Seen);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn http_export(
    axum::extract::State(seen): axum::extract::State<Seen>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let protobuf = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes() == b"application/x-protobuf");
    let Ok(request) = ExportTraceServiceRequest::decode(body).map_err(|_| ()) else {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            "not an ExportTraceServiceRequest",
        )
            .into_response();
    };
    if !protobuf {
        return (
            axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "want application/x-protobuf",
        )
            .into_response();
    }
    keep(&seen, request, "http");
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([("content-type", "application/x-protobuf")], answer).into_response()
}

fn keep(seen: &Seen, request: ExportTraceServiceRequest, via: &'static str) {
    let mut out = seen.lock().unwrap();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let status = s.status.unwrap_or_default();
                out.push(SpanSeen {
                    service: service.clone(),
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_span_id: hex::encode(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes: attributes(&s.attributes),
                    status_code: status.code,
                    status_message: status.message,
                    via,
                });
            }
        }
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}
