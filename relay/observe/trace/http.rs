//! OTLP over HTTP through reqwest (rustls, as the providers use it), so the
//! export adds no second HTTP stack.

use bytes::Bytes;
use opentelemetry_http::{HttpClient, HttpError};

/// The largest collector answer read (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct Client(reqwest::Client);

impl Client {
    pub fn new(timeout: std::time::Duration) -> Result<Client, reqwest::Error> {
        reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .build()
            .map(Client)
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut answer = self
            .0
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body)
            .send()
            .await?;
        let mut response = http::Response::builder().status(answer.status());
        if let Some(headers) = response.headers_mut() {
            *headers = std::mem::take(answer.headers_mut());
        }
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await? {
            if body.len() + chunk.len() > MAX_ANSWER {
                break;
            }
            body.extend_from_slice(&chunk);
        }
        Ok(response.body(Bytes::from(body))?)
    }
}
