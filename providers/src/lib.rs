//! Side-effect providers for outbox-relay.
//!
//! This crate performs effects (an HTTP POST, an SMTP transaction, a charge)
//! and classifies what happened. It never touches Postgres: the relay hands it
//! a [`Delivery`] built from a committed claim and stores the [`Outcome`].
//!
//! - [`outcome`]: the closed set of outcomes every provider maps to.
//! - [`keys`]: idempotency keys derived from the intent key, identical on
//!   every attempt, relay, restart and operator retry.
//! - [`webhook`]: Standard Webhooks POSTs with a destination guard.
//! - [`guard`]: the destination guard's pure decision.
//! - [`email`]: SMTP with failures placed before or after the body.
//! - [`charge`]: Stripe-compatible PaymentIntents with reconcile by metadata.
//! - [`nats`]: NATS JetStream publishes deduped by `Nats-Msg-Id`.
//! - [`span`]: what an attempt's trace span says, and the trace context
//!   it carries outward.
//! - [`amqp`]: RabbitMQ publishes with confirms, `mandatory` and a stable
//!   `message_id`.
//! - [`kafka`]: idempotent Kafka produces carrying `outbox-effect-key`,
//!   reconciled by searching the record's partition.

pub mod amqp;
pub mod charge;
pub mod email;
pub mod guard;
pub mod kafka;
pub mod keys;
pub mod memo;
pub mod nats;
pub mod outcome;
pub mod redact;
pub mod secret;
pub mod span;
pub mod webhook;

use std::sync::Arc;

pub use outcome::{AmbiguityPolicy, Outcome, Reconciled};
pub use span::{SpanShape, TraceHeaders};

/// Why a provider could not be set up. The relay branches on it: a
/// configuration error is the operator's to fix (exit 2, invalid
/// configuration); a setup error is the machine's (exit 1).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The configuration is wrong (a secret that does not parse,
    /// credentials that would cross the network in the clear).
    #[error("{0}")]
    Config(String),
    /// The configuration is fine but the provider's client cannot be built
    /// here (a TLS backend that will not start).
    #[error("{0}")]
    Setup(String),
}
pub use secret::Secret;

/// Everything a provider may know about one delivery attempt.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// Database id, for log correlation only.
    pub intent_id: i64,
    /// The application's idempotency key; every provider key derives from it.
    pub key: &'a str,
    pub kind: &'a str,
    /// Names a configured endpoint (webhook) instead of an inline address.
    pub destination: Option<&'a str>,
    /// The intent's ordering key, if it has one (the `kafka` kind's record
    /// key when the payload names none).
    pub ordering_key: Option<&'a str>,
    pub payload: &'a serde_json::Value,
    /// The payload as stored (Postgres' canonical jsonb text), when the
    /// relay has it: a webhook body is sent as exactly this text, so no
    /// number loses digits on its way through a double.
    pub payload_text: Option<&'a str>,
    /// The payload's `body` as stored, found as the relay read the payload
    /// (`payload` may hold `null` for it; see [`Delivery::raw_body`]).
    pub body: Option<&'a str>,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// Bumped only when an operator explicitly asks for a new effect; part of
    /// every derived key so that a new generation is a new operation.
    pub key_generation: i32,
    /// When the attempt whose outcome is being reconciled started (the lost
    /// one of an expired lease, or the one that just answered ambiguously):
    /// a provider whose dedupe has a window (JetStream) needs to know.
    pub previous_attempt_at: Option<std::time::SystemTime>,
    /// When the attempt's budget ends (the relay's, reconcile included).
    /// A provider bounds every call of the attempt by it and classifies
    /// its own timeouts: a request that may have gone out is ambiguous,
    /// one that provably did not is transient. The relay's own timer is
    /// only a backstop after it, so the two never race.
    pub deadline: Option<std::time::Instant>,
    /// The trace context to send with the effect (webhook headers, broker
    /// message headers, an email's headers, the payment API request's
    /// headers), replacing any the payload's own headers name.
    pub trace: Option<TraceHeaders<'a>>,
}

impl Delivery<'_> {
    /// The payload's `body` as its stored text spells it, when the relay
    /// handed over that text: [`Delivery::body`], or else found in
    /// [`Delivery::payload_text`] ([`webhook::request::raw_body`]). What the
    /// webhook, NATS, AMQP and Kafka kinds send.
    pub fn raw_body(&self) -> Option<Vec<u8>> {
        match self.body {
            Some(body) => Some(body.as_bytes().to_vec()),
            None => self.payload_text.and_then(webhook::request::raw_body),
        }
    }

    /// What a provider call may take now: `limit` (the provider's own
    /// timeout), cut to what is left before [`Delivery::deadline`].
    pub fn time_left(&self, limit: std::time::Duration) -> std::time::Duration {
        match self.deadline {
            Some(at) => at
                .saturating_duration_since(std::time::Instant::now())
                .min(limit),
            None => limit,
        }
    }
}

/// A kind of side effect.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// The intent kind this provider serves (`webhook`, `email`, `charge`).
    fn kind(&self) -> &'static str;

    /// Perform the effect once and classify the result. Never panics on bad
    /// input: an unusable payload is a [`Outcome::Rejected`] with the reason.
    async fn deliver(&self, delivery: &Delivery<'_>) -> Outcome;

    /// Ask the provider what happened to an earlier attempt whose outcome was
    /// lost (its lease expired). The default is "cannot tell".
    async fn reconcile(&self, _delivery: &Delivery<'_>) -> Reconciled {
        Reconciled::Unknown
    }

    /// What to do when an outcome is ambiguous and reconcile cannot tell.
    fn on_ambiguous(&self) -> AmbiguityPolicy;

    /// The span of an attempt of this delivery, by the OpenTelemetry
    /// semantic conventions. Asked only when the relay records spans.
    fn span_shape(&self, delivery: &Delivery<'_>) -> SpanShape {
        SpanShape::plain(delivery.kind)
    }

    /// How many deliveries this provider lets be in flight to this
    /// delivery's destination at once, when it bounds them
    /// (`webhook.max_in_flight_per_host`). The relay waits for room under
    /// that bound before it gives a delivery a slot, so that a burst to
    /// one destination queues briefly instead of being deferred, while a
    /// slow destination holds none of the relay's slots with its queue.
    /// The provider keeps its own check as well. The default: no bound.
    fn in_flight_limit(&self, _delivery: &Delivery<'_>) -> Option<InFlightLimit> {
        None
    }
}

/// A bound on the deliveries in flight to one destination
/// ([`Provider::in_flight_limit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightLimit {
    /// What the bound counts by (a webhook's `scheme://host:port`).
    pub destination: String,
    pub limit: usize,
    /// The setting that sets it, for messages.
    pub setting: &'static str,
}

/// The providers one relay is configured with, by kind.
#[derive(Clone, Default)]
pub struct ProviderSet {
    providers: Vec<Arc<dyn Provider>>,
}

impl ProviderSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, provider: Arc<dyn Provider>) -> Self {
        self.providers.retain(|p| p.kind() != provider.kind());
        self.providers.push(provider);
        self
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Provider>> {
        self.providers.iter().find(|p| p.kind() == kind)
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        self.providers.iter().map(|p| p.kind()).collect()
    }
}

impl std::fmt::Debug for ProviderSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderSet")
            .field("kinds", &self.kinds())
            .finish()
    }
}

/// Only webhooks have named destinations (`webhook.endpoints`). An email or
/// charge intent that names one is refused rather than sent where the name
/// did not choose.
pub fn refuse_destination(kind: &str, destination: Option<&str>) -> Result<(), String> {
    match destination {
        None => Ok(()),
        Some(name) => Err(format!(
            "{kind} intents take no destination (got {name:?}): the payload says where it goes; only webhooks have named destinations"
        )),
    }
}

/// A broker payload's `"body"` as the bytes to publish: the stored JSON
/// text when the relay has it (`raw_body`), else the value serialized.
pub(crate) fn payload_body(
    kind: &str,
    obj: &serde_json::Map<String, serde_json::Value>,
    raw_body: Option<Vec<u8>>,
) -> Result<Vec<u8>, String> {
    let body = obj
        .get("body")
        .ok_or_else(|| format!("{kind} payload has no \"body\" (use null for an empty body)"))?;
    match raw_body {
        Some(raw) => Ok(raw),
        None => serde_json::to_vec(body).map_err(|e| format!("{kind} body: {e}")),
    }
}

/// The kinds this product knows about. An intent of another kind is rejected
/// by the relay with a readable reason.
pub const KNOWN_KINDS: &[&str] = &["webhook", "email", "charge", "nats", "amqp", "kafka"];
