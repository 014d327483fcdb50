//! Webhooks: a JSON POST with Standard Webhooks headers.
//!
//! Every attempt of an intent carries the same `webhook-id` (and
//! `idempotency-key`, equal to it), derived from the intent key, so a
//! receiver that dedupes on it sees one message however often we retry.

mod classify;
mod client;
mod hosts;
pub mod request;
mod resolve;
pub mod sign;
pub mod subscription;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, USER_AGENT};
use ipnet::IpNet;

use crate::span::SpanKind;
use crate::{keys, AmbiguityPolicy, Delivery, Outcome, Provider, Secret, SpanShape};
use sign::SigningKey;

// The names the relay sets on every request, checked at compile time: a
// name given as a `&str` is parsed again on every insert.
const WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
const WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
const WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Webhook settings, already validated by the relay's config loader.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Standard Webhooks secrets (`whsec_...`); several during a rotation.
    pub signing_secrets: Vec<Secret>,
    /// Total time for one attempt, from connect to the last body byte read
    /// (cut to the attempt's deadline). Past it, a request that was sent is
    /// ambiguous; one whose connection was never made is transient.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Exceptions to the destination guard.
    pub allowed_networks: Vec<IpNet>,
    /// At most this much of a response body is read (and kept).
    pub max_response_bytes: usize,
    /// Named endpoints an intent can target with `destination`.
    pub endpoints: HashMap<String, String>,
    /// Longest Retry-After we honour; longer answers are capped to this.
    pub max_retry_after: Duration,
    /// After a lost outcome: redeliver under the same `webhook-id` (receivers
    /// following Standard Webhooks dedupe on it), or park for an operator
    /// when the receiver is known not to dedupe.
    pub on_ambiguous: AmbiguityPolicy,
    /// Requests in flight to one origin (scheme, host, port) at most; more
    /// are deferred without spending an attempt.
    pub max_in_flight_per_host: usize,
    /// Where a subscription's delivery finds its URL, headers and secrets;
    /// None where this relay has no `[subscriptions] secret_key` (such a
    /// delivery is then refused, never sent unsigned).
    pub subscriptions: Option<Arc<dyn subscription::Directory>>,
}

impl std::fmt::Debug for dyn subscription::Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Directory")
    }
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            signing_secrets: Vec::new(),
            timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            allowed_networks: Vec::new(),
            max_response_bytes: 4096,
            endpoints: HashMap::new(),
            max_retry_after: Duration::from_secs(3600),
            on_ambiguous: AmbiguityPolicy::Redeliver,
            max_in_flight_per_host: 32,
            subscriptions: None,
        }
    }
}

pub struct WebhookProvider {
    client: client::Client,
    keys: Vec<SigningKey>,
    hosts: hosts::HostLimits,
    config: WebhookConfig,
}

impl WebhookConfig {
    /// Check what the provider would refuse, without building it: every
    /// signing secret parses.
    pub fn check(&self) -> Result<(), crate::Error> {
        self.keys().map(|_| ())
    }

    fn keys(&self) -> Result<Vec<SigningKey>, crate::Error> {
        self.signing_secrets
            .iter()
            .map(SigningKey::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| crate::Error::Config(format!("webhook.signing_secrets: {e}")))
    }
}

impl WebhookProvider {
    pub fn new(config: WebhookConfig) -> Result<Self, crate::Error> {
        let keys = config.keys()?;
        let client = client::Client::new(client::Settings {
            connect_timeout: config.connect_timeout,
            // only the addresses the guard approves are ever connected to
            allowed_networks: config.allowed_networks.clone(),
            idle_timeout: Duration::from_secs(60),
            max_idle_per_origin: 256,
        })?;
        Ok(WebhookProvider {
            client,
            keys,
            hosts: hosts::HostLimits::new(config.max_in_flight_per_host),
            config,
        })
    }

    async fn send(&self, d: &Delivery<'_>) -> Outcome {
        // the stored text, not a re-serialization of its parse: big integers
        // and long decimals arrive with every digit
        let req = match request::parse(
            d.payload,
            d.raw_body(),
            d.destination,
            &self.config.endpoints,
        ) {
            Ok(r) => r,
            Err(reason) => return Outcome::invalid(reason),
        };
        let (url, mut headers, keys) = match req.to {
            request::To::Url(url) => (url, req.headers, None),
            request::To::Subscription(id) => match self.subscription(&id).await {
                Ok(target) => target,
                Err(outcome) => return outcome,
            },
        };
        let keys = keys.as_deref().unwrap_or(&self.keys);
        // IP literals (including numeric forms like http://2130706433/, which
        // the URL parser normalizes) never reach the resolver: check them here.
        if let Some(ip) = resolve::literal_ip(&url) {
            if let Err(reason) = crate::guard::check(ip, &self.config.allowed_networks) {
                return Outcome::invalid(reason);
            }
        }
        // counted as `in_flight_limit` counts: by subscription, else by origin
        let origin = match request::subscription_of(d.payload) {
            Some(id) => id.to_string(),
            None => hosts::origin(&url),
        };
        let Some(_slot) = self.hosts.try_acquire(&origin) else {
            return Outcome::Deferred {
                reason: format!(
                    "{} requests to {origin} already in flight (webhook.max_in_flight_per_host)",
                    self.hosts.limit()
                ),
                retry_after: Duration::from_millis(500),
            };
        };
        let id = keys::webhook_id(d.key, d.key_generation);
        if let Some(trace) = d.trace {
            set_trace_headers(&mut headers, trace);
        }
        let request = match signed_post(&url, headers, &id, keys, req.body) {
            Ok(request) => request,
            Err(reason) => return Outcome::invalid(reason),
        };
        // one timer for the attempt: the request's own, cut to the attempt's
        // deadline, so the relay's backstop never races it
        let timeout = d.time_left(self.config.timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        match self
            .client
            .send(request, deadline, self.config.max_response_bytes)
            .await
        {
            Ok(answer) => classify::response(answer, id, &self.config),
            Err(err) => classify::error(&err, &crate::redact::redacted_url(&url), timeout),
        }
    }

    /// A subscription's URL, headers and signing keys, or the outcome that
    /// ends the attempt: never a delivery without its signature.
    async fn subscription(
        &self,
        id: &str,
    ) -> Result<(url::Url, http::header::HeaderMap, Option<Vec<SigningKey>>), Outcome> {
        use subscription::Refusal;
        let Some(directory) = &self.config.subscriptions else {
            return Err(Outcome::Misconfigured {
                reason: format!(
                    "subscription {id}: this relay has no [subscriptions] secret_key, and a subscription's delivery is never sent unsigned"
                ),
                status: None,
            });
        };
        let target = match directory.target(id).await {
            Ok(target) => target,
            Err(Refusal::Gone(reason)) => return Err(Outcome::invalid(reason)),
            Err(Refusal::Unavailable(reason)) => {
                return Err(Outcome::Transient {
                    reason,
                    status: None,
                    retry_after: None,
                })
            }
            Err(Refusal::Unsigned(reason)) => {
                return Err(Outcome::Misconfigured {
                    reason,
                    status: None,
                })
            }
        };
        let url = request::parse_url(&target.url)
            .map_err(|e| Outcome::invalid(format!("subscription {id}: {e}")))?;
        let headers = request::header_map(&target.headers)
            .map_err(|e| Outcome::invalid(format!("subscription {id}: {e}")))?;
        let keys = target
            .secrets
            .iter()
            .map(SigningKey::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Outcome::Misconfigured {
                reason: format!("subscription {id}: {e}"),
                status: None,
            })?;
        if keys.is_empty() {
            return Err(Outcome::Misconfigured {
                reason: format!("subscription {id} has no signing secret"),
                status: None,
            });
        }
        Ok((url, headers, Some(keys)))
    }
}

#[async_trait::async_trait]
impl Provider for WebhookProvider {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    async fn deliver(&self, delivery: &Delivery<'_>) -> Outcome {
        self.send(delivery).await
    }

    /// Standard Webhooks receivers dedupe on `webhook-id`, which is the same
    /// on every attempt: redelivering is safe by default.
    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// `webhook.max_in_flight_per_host` for the request's origin, counted
    /// exactly as [`WebhookProvider::send`] counts it.
    /// A subscription's deliveries count by subscription, so that one
    /// subscriber's slow endpoint holds none of the others' room.
    fn in_flight_limit(&self, d: &Delivery<'_>) -> Option<crate::InFlightLimit> {
        if let Some(id) = request::subscription_of(d.payload) {
            return Some(crate::InFlightLimit {
                destination: id.to_string(),
                limit: self.hosts.limit(),
                setting: "webhook.max_in_flight_per_host",
            });
        }
        let url = request::target_url(d.payload, d.destination, &self.config.endpoints)?;
        Some(crate::InFlightLimit {
            destination: hosts::origin(&url),
            limit: self.hosts.limit(),
            setting: "webhook.max_in_flight_per_host",
        })
    }

    /// An HTTP client span: `POST`, the URL with its secrets redacted.
    fn span_shape(&self, d: &Delivery<'_>) -> SpanShape {
        let Some(url) = request::target_url(d.payload, d.destination, &self.config.endpoints)
        else {
            return SpanShape::plain("webhook");
        };
        let shape = SpanShape {
            name: "POST".into(),
            kind: SpanKind::Client,
            attributes: vec![
                ("http.request.method", "POST".into()),
                ("url.full", crate::redact::redacted_url(&url).into()),
            ],
        };
        crate::span::server_of(shape, &url)
    }
}

/// The POST of `body` to `url`: the caller's headers, the relay's own, and
/// the Standard Webhooks id, timestamp and signature (when there are keys).
fn signed_post(
    url: &url::Url,
    mut headers: http::HeaderMap,
    id: &str,
    keys: &[SigningKey],
    body: Vec<u8>,
) -> Result<http::Request<http_body_util::Full<bytes::Bytes>>, String> {
    let uri = http::Uri::try_from(url.as_str())
        .map_err(|e| format!("webhook url cannot be sent as an HTTP request target: {e}"))?;
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|t| t.as_secs() as i64)
        .unwrap_or(0);
    let id_value = HeaderValue::from_str(id)
        .map_err(|_| format!("webhook id {id:?} is not a header value"))?;
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("outbox-relay/", env!("CARGO_PKG_VERSION"))),
    );
    headers
        .entry(ACCEPT)
        .or_insert(HeaderValue::from_static("*/*"));
    headers.insert(WEBHOOK_ID, id_value.clone());
    headers.insert(WEBHOOK_TIMESTAMP, HeaderValue::from(timestamp));
    headers.insert(IDEMPOTENCY_KEY, id_value);
    if !keys.is_empty() {
        let signature = sign::signature_header(keys, id, timestamp, &body);
        let value = HeaderValue::from_str(&signature)
            .map_err(|_| "webhook signature is not a header value".to_string())?;
        headers.insert(WEBHOOK_SIGNATURE, value);
    }
    let mut request = http::Request::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The attempt's `traceparent` and `tracestate`, in place of any the
/// payload's headers give.
fn set_trace_headers(headers: &mut http::header::HeaderMap, trace: crate::TraceHeaders<'_>) {
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    if let Ok(v) = HeaderValue::from_str(trace.traceparent) {
        headers.insert(TRACEPARENT, v);
    }
    if let Some(v) = trace.tracestate.and_then(|t| HeaderValue::from_str(t).ok()) {
        headers.insert(TRACESTATE, v);
    }
}
