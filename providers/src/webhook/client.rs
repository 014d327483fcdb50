//! The HTTP client webhooks go out on: hyper's pooled HTTP/1.1 client over
//! rustls (Mozilla's roots), connecting only to the addresses the guarded
//! resolver approves.
//!
//! It knows how far a failed request got. A failure of the connector (the
//! name, the TCP connect, the TLS handshake, or the connect timeout over all
//! three) happened before a byte of the request was written. Anything later
//! may have reached the receiver.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;

use super::resolve::GuardedResolver;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Connector = ConnectWithin<HttpsConnector<HttpConnector<GuardedResolver>>>;

/// Pool and timeout settings; the rest is fixed.
pub struct Settings {
    pub connect_timeout: Duration,
    pub allowed_networks: Vec<ipnet::IpNet>,
    pub idle_timeout: Duration,
    pub max_idle_per_origin: usize,
}

#[derive(Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<Connector, Full<Bytes>>,
}

/// What came back within the attempt's time: the status, the headers, and
/// at most `max_body` bytes of the body (fewer when the body failed or the
/// time ran out while it was read: the receiver has answered all the same).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub excerpt: Vec<u8>,
}

/// Why no answer came back.
#[derive(Debug)]
pub enum SendError {
    /// The attempt's time ran out before the answer's head arrived.
    TimedOut,
    /// The client failed; [`SendError::is_connect`] tells on which side of
    /// the first byte written.
    Client(hyper_util::client::legacy::Error),
}

impl SendError {
    /// The connector failed: nothing of the request was written.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Client(e) if e.is_connect())
    }

    /// The client's error, whose `source` chain holds what happened.
    pub fn client_error(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SendError::TimedOut => None,
            SendError::Client(e) => Some(e),
        }
    }
}

impl Client {
    pub fn new(settings: Settings) -> Result<Client, crate::Error> {
        let mut http =
            HttpConnector::new_with_resolver(GuardedResolver::new(settings.allowed_networks));
        // https:// goes through the TLS layer, which asks for it
        http.enforce_http(false);
        http.set_nodelay(true);
        let tls = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(|e| crate::Error::Setup(format!("webhook TLS: {e}")))?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let connector = ConnectWithin {
            inner: tls,
            limit: settings.connect_timeout,
        };
        let inner = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(settings.idle_timeout)
            .pool_max_idle_per_host(settings.max_idle_per_origin)
            .build(connector);
        Ok(Client { inner })
    }

    /// Send `request` and read its answer, all before `deadline`.
    pub async fn send(
        &self,
        request: Request<Full<Bytes>>,
        deadline: Instant,
        max_body: usize,
    ) -> Result<Answer, SendError> {
        let response = match tokio::time::timeout_at(deadline, self.inner.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(SendError::Client(e)),
            Err(_) => return Err(SendError::TimedOut),
        };
        let (head, body) = response.into_parts();
        let excerpt = excerpt(body, deadline, max_body).await;
        Ok(Answer {
            status: head.status.as_u16(),
            headers: head.headers,
            excerpt,
        })
    }
}

/// Up to `max` bytes of the body, read until it ends, fails or `deadline`.
async fn excerpt(mut body: Incoming, deadline: Instant, max: usize) -> Vec<u8> {
    let mut excerpt = Vec::new();
    while excerpt.len() < max {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            _ => break,
        };
        if let Ok(data) = frame.into_data() {
            let room = max - excerpt.len();
            excerpt.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    excerpt
}

/// A connector whose whole connect (resolve, TCP and TLS) fails after
/// `limit`, as a connect error: nothing was written by then.
#[derive(Clone)]
pub struct ConnectWithin<C> {
    inner: C,
    limit: Duration,
}

impl<C> tower_service::Service<Uri> for ConnectWithin<C>
where
    C: tower_service::Service<Uri>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let limit = self.limit;
        Box::pin(async move {
            match tokio::time::timeout(limit, connecting).await {
                Ok(connected) => connected.map_err(Into::into),
                Err(_) => Err(Box::new(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connect timed out after {limit:?}"),
                )) as BoxError),
            }
        })
    }
}
