//! Charges against a Stripe-compatible PaymentIntents API (create with
//! `confirm=true`), under an Idempotency-Key derived from the intent.
//!
//! | answer | outcome |
//! |---|---|
//! | 200 | delivered; reference = the `pi_…` id; replay flag from `Idempotent-Replayed` |
//! | 402 card_error | rejected with the decline code |
//! | 400 idempotency_error | rejected, logged loudly (the key was reused with other parameters) |
//! | other 400, 404 | rejected |
//! | 401, 403 | misconfigured → dead (fix the API key, then `retry --state dead`) |
//! | 409, 429, 502, 503, 504 | transient, same key |
//! | nothing sent (DNS, connection refused, connect timeout) | transient, same key |
//! | 500 | ambiguous: Stripe stores and replays it for the key, so reconcile searches by metadata |
//! | no answer in time, connection lost after the request went out | ambiguous: reconcile searches by metadata, then `on_ambiguous` |
//! | `Stripe-Should-Retry: true/false` | overrides: transient / not retried |

pub mod request;

use std::time::Duration;

use serde_json::{json, Value};

use crate::{AmbiguityPolicy, Delivery, Outcome, Provider, Reconciled, Secret, SpanShape};

#[derive(Debug, Clone)]
pub struct ChargeConfig {
    /// e.g. `https://api.stripe.com`
    pub api_base: reqwest::Url,
    /// From STRIPE_API_KEY; never logged or stored.
    pub api_key: Secret,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// The limit on one reconcile search.
    pub reconcile_timeout: Duration,
    /// When reconcile cannot tell: park (default) for an operator.
    pub on_ambiguous: AmbiguityPolicy,
}

/// `https://api.stripe.com` or another http(s) base URL.
pub fn parse_api_base(text: &str) -> Result<reqwest::Url, String> {
    reqwest::Url::parse(text)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or_else(|| format!("{text:?} is not an http(s) URL"))
}

pub struct ChargeProvider {
    client: reqwest::Client,
    config: ChargeConfig,
}

impl ChargeProvider {
    pub fn new(config: ChargeConfig) -> Result<Self, crate::Error> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .build()
            .map_err(|e| crate::Error::Setup(format!("charge HTTP client: {e}")))?;
        Ok(ChargeProvider { client, config })
    }

    fn url(&self, path: &str) -> reqwest::Url {
        let mut url = self.config.api_base.clone();
        let base = url.path().trim_end_matches('/').to_string();
        url.set_path(&format!("{base}{path}"));
        url
    }
}

#[async_trait::async_trait]
impl Provider for ChargeProvider {
    fn kind(&self) -> &'static str {
        "charge"
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        if let Err(reason) = crate::refuse_destination("charge", d.destination) {
            return Outcome::invalid(reason);
        }
        let form = match request::form(d.payload, d.key, d.key_generation) {
            Ok(f) => f,
            Err(reason) => return Outcome::invalid(reason),
        };
        let body = serde_urlencoded::to_string(&form).expect("strings encode");
        let sent = self
            .client
            .post(self.url("/v1/payment_intents"))
            .timeout(d.time_left(self.config.timeout))
            .bearer_auth(self.config.api_key.expose())
            .header(
                "Idempotency-Key",
                request::idempotency_key(d.key, d.key_generation),
            )
            .header("Content-Type", "application/x-www-form-urlencoded")
            .headers(trace_headers(d.trace))
            .body(body)
            .send()
            .await;
        match sent {
            Ok(resp) => classify(resp, d.key).await,
            Err(e) => unanswered(&e),
        }
    }

    /// Search for a PaymentIntent carrying this intent's idempotency key in
    /// its metadata (a stored 500 is replayed for the key, so asking again
    /// under the key cannot tell).
    async fn reconcile(&self, d: &Delivery<'_>) -> Reconciled {
        let idem = request::idempotency_key(d.key, d.key_generation);
        let query = format!("metadata['{}']:'{}'", request::META_IDEMPOTENCY_KEY, idem);
        let mut url = self.url("/v1/payment_intents/search");
        url.query_pairs_mut().append_pair("query", &query);
        let resp = match self
            .client
            .get(url)
            .timeout(d.time_left(self.config.reconcile_timeout))
            .bearer_auth(self.config.api_key.expose())
            .headers(trace_headers(d.trace))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                tracing::warn!(
                    status = r.status().as_u16(),
                    "charge reconcile: search failed"
                );
                return Reconciled::Unknown;
            }
            Err(e) => {
                tracing::warn!(error = %e.without_url(), "charge reconcile: search failed");
                return Reconciled::Unknown;
            }
        };
        let Ok(found) = resp.json::<Value>().await else {
            return Reconciled::Unknown;
        };
        let Some(data) = found["data"].as_array() else {
            return Reconciled::Unknown;
        };
        let mine = |pi: &&Value| pi["metadata"][request::META_IDEMPOTENCY_KEY] == idem.as_str();
        if let Some(pi) = data.iter().filter(mine).find(|pi| {
            matches!(
                pi["status"].as_str(),
                Some("succeeded" | "processing" | "requires_capture")
            )
        }) {
            if let Some(id) = pi["id"].as_str() {
                return Reconciled::Found {
                    reference: id.to_string(),
                };
            }
        }
        if data.iter().any(|pi| mine(&pi)) {
            // it exists but did not succeed: an operator should look
            Reconciled::Unknown
        } else {
            Reconciled::Absent
        }
    }

    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// A client span of the charge (its search and its POST), naming the
    /// payment API's server.
    fn span_shape(&self, _d: &Delivery<'_>) -> SpanShape {
        let shape = SpanShape {
            name: "charge".into(),
            kind: crate::span::SpanKind::Client,
            attributes: vec![("http.request.method", "POST".into())],
        };
        crate::span::server_of(shape, &self.config.api_base)
    }
}

/// The attempt's `traceparent` and `tracestate` as HTTP headers of the
/// payment API's requests (each only when it is a valid header value). Not
/// in the PaymentIntent's metadata: a retry under the same Idempotency-Key
/// must send the same parameters, and each attempt has its own span.
fn trace_headers(trace: Option<crate::TraceHeaders<'_>>) -> reqwest::header::HeaderMap {
    use reqwest::header::HeaderValue;
    let mut headers = reqwest::header::HeaderMap::new();
    let Some(trace) = trace else {
        return headers;
    };
    let valid = |v: &str| {
        crate::span::printable(v)
            .then(|| HeaderValue::from_str(v).ok())
            .flatten()
    };
    if let Some(v) = valid(trace.traceparent) {
        headers.insert("traceparent", v);
    }
    if let Some(v) = trace.tracestate.and_then(valid) {
        headers.insert("tracestate", v);
    }
    headers
}

/// A POST that got no answer. Nothing sent (the connection was never
/// made) is transient, retried under the same Idempotency-Key; a timeout or
/// a connection lost after the request may have reached the API is
/// ambiguous: reconcile searches for the payment, and the kind's policy
/// decides when the search cannot tell.
fn unanswered(e: &reqwest::Error) -> Outcome {
    let cause = std::error::Error::source(e)
        .map(|s| s.to_string())
        .unwrap_or_else(|| "network error".into());
    failed_request(!(e.is_connect() || e.is_builder()), e.is_timeout(), &cause)
}

/// [`unanswered`]'s decision, pure.
pub fn failed_request(maybe_sent: bool, timed_out: bool, cause: &str) -> Outcome {
    if !maybe_sent {
        return Outcome::Transient {
            reason: format!(
                "charge request not sent ({cause}); retrying under the same Idempotency-Key"
            ),
            status: None,
            retry_after: None,
        };
    }
    let what = if timed_out {
        "no answer from the charge API in time".to_string()
    } else {
        format!("the connection to the charge API failed before its answer ({cause})")
    };
    Outcome::Ambiguous {
        reason: format!("{what}; the payment may or may not exist"),
        status: None,
    }
}

/// The longest `Retry-After` the charge API is obeyed for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

async fn classify(resp: reqwest::Response, key: &str) -> Outcome {
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let should_retry = header("stripe-should-retry");
    // capped as the webhook's is: an absurd value must not park the intent
    // for ever (or overflow a clock)
    let retry_after = header("retry-after")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|secs| Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    let err = &body["error"];
    let describe = || {
        let parts: Vec<&str> = [
            &err["type"],
            &err["code"],
            &err["decline_code"],
            &err["message"],
        ]
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
        if parts.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {}", parts.join(": "))
        }
    };
    let excerpt = json!({"status": status, "error": {
        "type": err["type"], "code": err["code"], "decline_code": err["decline_code"], "message": err["message"]}});
    if (200..300).contains(&status) {
        return match body["id"].as_str() {
            Some(id) => Outcome::Delivered {
                reference: Some(id.to_string()),
                replayed,
                status: Some(status),
            },
            None => Outcome::Ambiguous {
                reason: format!("charge API answered HTTP {status} without a PaymentIntent id"),
                status: Some(status),
            },
        };
    }
    let transient = |reason: String| Outcome::Transient {
        reason,
        status: Some(status),
        retry_after,
    };
    match should_retry.as_deref() {
        Some("true") => return transient(format!("{}; the API asks for a retry", describe())),
        Some("false") if status >= 500 => {
            return Outcome::Ambiguous {
                reason: format!("{}; the API says not to retry", describe()),
                status: Some(status),
            }
        }
        Some("false") => {
            return Outcome::Rejected {
                reason: describe(),
                status: Some(status),
                response: Some(excerpt),
            }
        }
        _ => {}
    }
    match status {
        402 => Outcome::Rejected {
            reason: format!("card declined: {}", describe()),
            status: Some(status),
            response: Some(excerpt),
        },
        400 if err["type"] == "idempotency_error" => {
            tracing::error!(
                intent_key = key,
                "charge API refused the Idempotency-Key: it was used before with other parameters"
            );
            Outcome::Rejected {
                reason: format!(
                    "idempotency key reused with different parameters: {}",
                    describe()
                ),
                status: Some(status),
                response: Some(excerpt),
            }
        }
        401 | 403 => Outcome::Misconfigured {
            reason: format!(
                "charge API refused the credentials ({}); check STRIPE_API_KEY",
                describe()
            ),
            status: Some(status),
        },
        409 | 429 | 502 | 503 | 504 => transient(describe()),
        500 => Outcome::Ambiguous {
            reason: format!("{}; the charge may or may not exist", describe()),
            status: Some(status),
        },
        400..=499 => Outcome::Rejected {
            reason: describe(),
            status: Some(status),
            response: Some(excerpt),
        },
        _ => transient(describe()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_headers_are_sent_only_when_printable() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let h = trace_headers(Some(crate::TraceHeaders {
            traceparent: tp,
            tracestate: Some("a=1"),
        }));
        assert_eq!(h["traceparent"], tp);
        assert_eq!(h["tracestate"], "a=1");
        let smuggled = trace_headers(Some(crate::TraceHeaders {
            traceparent: "00-x\r\nIdempotency-Key: forged",
            tracestate: Some("a=\u{7f}"),
        }));
        assert!(smuggled.is_empty(), "{smuggled:?}");
        assert!(trace_headers(None).is_empty());
    }

    #[test]
    fn failed_request_table() {
        for (maybe_sent, timed_out, class) in [
            (false, false, "transient"),
            (false, true, "transient"),
            (true, true, "ambiguous"),
            (true, false, "ambiguous"),
        ] {
            let out = failed_request(maybe_sent, timed_out, "cause");
            assert_eq!(
                out.class(),
                class,
                "sent {maybe_sent}, timed out {timed_out}"
            );
        }
    }
}
