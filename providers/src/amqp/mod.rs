//! AMQP 0-9-1 (RabbitMQ): publish an event with publisher confirms, the
//! `mandatory` flag and persistent delivery, under a `message_id` derived
//! from the intent key, so that a consumer can dedupe a redelivery.
//!
//! Each publish has a channel to itself for the time of its publish and
//! confirm (channels are reused, kept open on one connection), so that an
//! error the broker raises on a channel is that publish's alone:
//!
//! - a confirm ack is delivered, reference `exchange "<x>" routing key
//!   "<k>" message_id <id>`;
//! - a `basic.return` (unroutable: no queue bound for the routing key) is
//!   rejected with the broker's reply text, except within
//!   [`RECOVERING`] of reconnecting to a broker that went away: a broker
//!   restarted after a crash takes connections before it has restored the
//!   bindings of its durable queues, so the return is transient then;
//! - a nack, no such exchange (404 on the channel), a connection that
//!   cannot be opened: transient;
//! - access refused (403): misconfigured (the relay's user lacks the
//!   permission);
//! - a connection or channel lost after the publish and before its
//!   confirm, or no confirm within `timeout`: ambiguous. RabbitMQ cannot be
//!   asked afterwards whether it took the message, so `amqp.on_ambiguous`
//!   decides: `redeliver` (the default: the same `message_id`, consumers
//!   dedupe on it) or `park`.
//!
//! A broken connection is reopened on the next publish, with backoff
//! between failed attempts (transient outcomes meanwhile, no network call).

pub mod request;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

use crate::{AmbiguityPolicy, Delivery, Outcome, Provider, Secret, SpanShape};

/// AMQP settings, validated by the relay's config loader. The password
/// comes from the environment or a file and is never logged; the URL
/// carries none.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// `amqp://user@host:port/vhost` or `amqps://...`, without a password.
    pub url: String,
    pub password: Option<Secret>,
    /// A PEM file of root certificates for `amqps://` (else the webpki
    /// roots).
    pub tls_ca_file: Option<PathBuf>,
    /// Allow a password over `amqp://` to a host that is not loopback.
    pub allow_plaintext: bool,
    /// The budget of one attempt: connect, channel, publish and confirm.
    pub timeout: Duration,
    /// What to do with a publish whose confirm was lost: redeliver by
    /// default (consumers dedupe on `message_id`).
    pub on_ambiguous: AmbiguityPolicy,
}

impl AmqpConfig {
    /// The broker's address as `amq-protocol` takes it, password included
    /// (never shown: errors name [`AmqpConfig::url`]).
    fn uri(&self) -> Result<lapin::uri::AMQPUri, crate::Error> {
        let bad = |why: String| crate::Error::Config(format!("amqp.url: {why}"));
        let parsed = url::Url::parse(self.url.trim()).map_err(|e| bad(e.to_string()))?;
        if !matches!(parsed.scheme(), "amqp" | "amqps") {
            return Err(bad(format!(
                "{:?} must start with amqp:// or amqps://",
                self.url
            )));
        }
        if parsed.password().is_some() {
            return Err(bad(
                "has a password in it; give it as amqp.password (OUTBOX_RELAY__AMQP__PASSWORD, or ..._FILE naming a file)".into(),
            ));
        }
        let Some(host) = parsed.host_str() else {
            return Err(bad("has no host".into()));
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let mut uri: lapin::uri::AMQPUri = parsed.as_str().parse().map_err(bad)?;
        // amq-protocol reads only a domain name as the host (an IP address
        // would become "localhost"): set it from the parsed URL
        uri.authority.host = host.clone();
        if parsed.username().is_empty() && self.password.is_some() {
            return Err(bad(
                "a password needs a user in the URL (amqp://user@host/)".into(),
            ));
        }
        if let Some(password) = &self.password {
            uri.authority.userinfo.password = password.expose().to_string();
            let loopback = host == "localhost"
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if parsed.scheme() == "amqp" && !loopback && !self.allow_plaintext {
                return Err(crate::Error::Config(
                    "amqp: refusing to send the password without TLS to a non-local broker; use amqps:// (or set amqp.allow_plaintext = true)".into(),
                ));
            }
        }
        Ok(uri)
    }

    /// Check what the provider would refuse, without connecting.
    pub fn check(&self) -> Result<(), crate::Error> {
        self.uri().map(drop)
    }
}

/// The connection and what its publishes need, reopened when broken.
struct Link {
    connection: Connection,
    /// Confirm-mode channels not in use.
    idle: Mutex<Vec<Channel>>,
    /// When it was opened, if that was after the broker went away.
    reconnected_at: Option<Instant>,
}

/// How long after reconnecting to a broker that went away an unroutable
/// return is taken for a broker still restoring its bindings.
pub const RECOVERING: Duration = Duration::from_secs(30);

/// The most idle channels kept per connection.
const MAX_IDLE_CHANNELS: usize = 64;
/// Backoff between failed connects: doubled from the first up to the last.
const RECONNECT_FIRST: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

#[derive(Default)]
struct LinkState {
    link: Option<Arc<Link>>,
    failures: u32,
    /// A connection was lost or could not be opened since the last one
    /// opened.
    lost: bool,
    /// No connect before this, after a failed one; with its error.
    retry_at: Option<(Instant, String)>,
}

pub struct AmqpProvider {
    config: AmqpConfig,
    uri: lapin::uri::AMQPUri,
    tls: lapin::tcp::OwnedTLSConfig,
    state: tokio::sync::Mutex<LinkState>,
}

impl AmqpProvider {
    pub fn new(config: AmqpConfig) -> Result<Self, crate::Error> {
        let uri = config.uri()?;
        let mut tls = lapin::tcp::OwnedTLSConfig::default();
        if let Some(path) = &config.tls_ca_file {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                crate::Error::Config(format!("amqp.tls_ca_file {}: {e}", path.display()))
            })?;
            tls.cert_chain = Some(pem);
        }
        Ok(AmqpProvider {
            config,
            uri,
            tls,
            state: tokio::sync::Mutex::new(LinkState::default()),
        })
    }

    /// The open connection, or a new one; an error (a transient reason)
    /// while the broker cannot be reached, without trying again before the
    /// backoff has passed.
    async fn link(&self, deadline: Instant) -> Result<Arc<Link>, String> {
        let mut state = self.state.lock().await;
        if let Some(link) = &state.link {
            if link.connection.status().connected() {
                return Ok(link.clone());
            }
            state.link = None;
            state.lost = true;
        }
        if let Some((at, error)) = &state.retry_at {
            if Instant::now() < *at {
                return Err(error.clone());
            }
        }
        match self.connect(deadline).await {
            Ok(connection) => {
                let link = Arc::new(Link {
                    connection,
                    idle: Mutex::new(Vec::new()),
                    reconnected_at: state.lost.then(Instant::now),
                });
                state.lost = false;
                state.link = Some(link.clone());
                state.failures = 0;
                state.retry_at = None;
                Ok(link)
            }
            Err(error) => {
                let wait = RECONNECT_FIRST
                    .saturating_mul(1 << state.failures.min(16))
                    .min(RECONNECT_MAX);
                state.failures += 1;
                state.lost = true;
                state.retry_at = Some((Instant::now() + wait, error.clone()));
                Err(error)
            }
        }
    }

    async fn connect(&self, deadline: Instant) -> Result<Connection, String> {
        // the error names the configured URL (no password in it)
        let failed = |e: String| format!("cannot connect to AMQP at {}: {e}", self.config.url);
        let runtime = lapin::runtime::default_runtime().map_err(|e| failed(e.to_string()))?;
        let properties =
            ConnectionProperties::default().with_connection_name(LongString::from("outbox-relay"));
        let connect = Connection::connect_uri_with_config(
            self.uri.clone(),
            properties,
            self.tls.clone(),
            runtime,
        );
        match tokio::time::timeout_at(deadline.into(), connect).await {
            Ok(Ok(connection)) => Ok(connection),
            Ok(Err(e)) => Err(failed(e.to_string())),
            Err(_) => Err(failed("no answer in time".into())),
        }
    }

    /// Stop using `link` (its next user reconnects) and close it in the
    /// background, bounded by the timeout.
    async fn forget(&self, link: &Arc<Link>) {
        let mut state = self.state.lock().await;
        if state.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link)) {
            state.link = None;
        }
        drop(state);
        let link = link.clone();
        let timeout = self.config.timeout;
        tokio::spawn(async move {
            let close = link
                .connection
                .close(320, ShortString::from("publisher confirm timed out"));
            let _ = tokio::time::timeout(timeout, close).await;
        });
    }

    /// A confirm-mode channel of `link` for one publish.
    async fn channel(&self, link: &Link, deadline: Instant) -> Result<Channel, String> {
        let reused = {
            let mut idle = link.idle.lock().unwrap_or_else(|p| p.into_inner());
            std::iter::from_fn(|| idle.pop()).find(|c| c.status().connected())
        };
        if let Some(channel) = reused {
            return Ok(channel);
        }
        let open = async {
            let channel = link.connection.create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Ok::<_, lapin::Error>(channel)
        };
        match tokio::time::timeout_at(deadline.into(), open).await {
            Ok(Ok(channel)) => Ok(channel),
            Ok(Err(e)) => Err(format!("cannot open an AMQP channel: {e}")),
            Err(_) => Err("cannot open an AMQP channel: no answer in time".into()),
        }
    }
}

fn header_table(headers: &std::collections::BTreeMap<String, request::Header>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        let value = match value {
            request::Header::Text(s) => AMQPValue::LongString(LongString::from(s.as_str())),
            request::Header::Integer(i) => AMQPValue::LongLongInt(*i),
            request::Header::Boolean(b) => AMQPValue::Boolean(*b),
        };
        table.insert(ShortString::from(name.as_str()), value);
    }
    table
}

fn transient(reason: String) -> Outcome {
    Outcome::Transient {
        reason,
        status: None,
        retry_after: None,
    }
}

#[async_trait::async_trait]
impl Provider for AmqpProvider {
    fn kind(&self) -> &'static str {
        "amqp"
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        if let Err(reason) = crate::refuse_destination("amqp", d.destination) {
            return Outcome::invalid(reason);
        }
        let mut publish = match request::parse(d.payload, d.raw_body()) {
            Ok(p) => p,
            Err(reason) => return Outcome::invalid(reason),
        };
        if let Some(trace) = d.trace {
            crate::span::set_trace_headers(&mut publish.headers, trace, |v| {
                request::Header::Text(v.to_string())
            });
        }
        // within the attempt's budget (`timeout`, cut to the attempt's
        // deadline), with room for the relay to record what happened
        let started = Instant::now();
        let deadline = started + d.time_left(self.config.timeout).mul_f64(0.9);
        let link = match self.link(deadline).await {
            Ok(link) => link,
            Err(reason) => return transient(reason),
        };
        let channel = match self.channel(&link, deadline).await {
            Ok(channel) => channel,
            Err(reason) => return transient(reason),
        };
        let id = request::message_id(d.key, d.key_generation);
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |t| t.as_secs());
        let mut properties = BasicProperties::default()
            .with_message_id(ShortString::from(id.as_str()))
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_timestamp(timestamp)
            .with_app_id(ShortString::from("outbox-relay"));
        if !publish.headers.is_empty() {
            properties = properties.with_headers(header_table(&publish.headers));
        }
        let target = format!(
            "exchange {:?} routing key {:?}",
            publish.exchange, publish.routing_key
        );
        let sent = channel
            .basic_publish(
                ShortString::from(publish.exchange.as_str()),
                ShortString::from(publish.routing_key.as_str()),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                &publish.body,
                properties,
            )
            .await;
        let confirm = match sent {
            Ok(confirm) => confirm,
            // refused before a frame went out
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidConnectionState(..)
                ) =>
            {
                return transient(format!("AMQP publish to {target} not sent: {e}"));
            }
            Err(e) => {
                return Outcome::Ambiguous {
                    reason: format!(
                        "AMQP publish to {target} failed while it was being sent ({e}); whether the broker took it is unknown"
                    ),
                    status: None,
                };
            }
        };
        let answer = match tokio::time::timeout_at(deadline.into(), confirm).await {
            Ok(answer) => answer,
            Err(_) => {
                // a broker that takes a publish and answers nothing within
                // the timeout: the connection is not trusted again
                self.forget(&link).await;
                return Outcome::Ambiguous {
                    reason: format!(
                        "no publisher confirm for the publish to {target} within {:?}; whether the broker took it is unknown",
                        started.elapsed()
                    ),
                    status: None,
                };
            }
        };
        let outcome = recovering(classify(answer, &target, &id), link.reconnected_at);
        if channel.status().connected() {
            let mut idle = link.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE_CHANNELS {
                idle.push(channel);
            }
        }
        outcome
    }

    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// A messaging `publish` span on the intent's exchange (`(default)`
    /// for the nameless one), with its routing key.
    fn span_shape(&self, d: &Delivery<'_>) -> SpanShape {
        let text = |name: &str| d.payload.get(name).and_then(|v| v.as_str());
        match (text("exchange"), text("routing_key")) {
            (Some(exchange), Some(routing_key)) => {
                let name = if exchange.is_empty() {
                    "(default)"
                } else {
                    exchange
                };
                crate::span::publish(
                    "rabbitmq",
                    name,
                    request::message_id(d.key, d.key_generation),
                )
                .with("messaging.rabbitmq.destination.routing_key", routing_key)
            }
            _ => SpanShape::plain("amqp"),
        }
    }
}

/// An unroutable return within [`RECOVERING`] of reconnecting to a broker
/// that went away is transient: the broker may not have restored the
/// bindings of its durable queues yet.
fn recovering(outcome: Outcome, reconnected_at: Option<Instant>) -> Outcome {
    match (outcome, reconnected_at) {
        (Outcome::Rejected { reason, .. }, Some(at))
            if at.elapsed() < RECOVERING && reason.contains("unroutable") =>
        {
            Outcome::Transient {
                reason: format!(
                    "{reason}, {:.0?} after reconnecting to a broker that went away (it may \
                     still be restoring its bindings)",
                    at.elapsed()
                ),
                status: None,
                retry_after: None,
            }
        }
        (outcome, _) => outcome,
    }
}

/// What the broker's answer to a sent publish means.
fn classify(answer: lapin::Result<Confirmation>, target: &str, id: &str) -> Outcome {
    match answer {
        Ok(Confirmation::Ack(None)) => Outcome::Delivered {
            reference: Some(format!("{target} message_id {id}")),
            replayed: false,
            status: None,
        },
        Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => {
            Outcome::Rejected {
                reason: format!(
                    "the broker returned the message to {target} as unroutable: {} {}",
                    returned.reply_code, returned.reply_text
                ),
                status: None,
                response: None,
            }
        }
        // a queue full to its limit (`reject-publish`): about this queue
        Ok(Confirmation::Nack(None)) => Outcome::TargetUnavailable {
            reason: format!("the broker nacked the publish to {target} (it could not store it)"),
            status: None,
        },
        // confirm_select was answered on every channel we publish on
        Ok(Confirmation::NotRequested) => Outcome::Ambiguous {
            reason: format!("the publish to {target} was not confirmed (confirms are off)"),
            status: None,
        },
        Err(e) => match e.kind() {
            // the broker closed the channel because of this publish
            ErrorKind::ProtocolError(amqp) => {
                let said = format!("{} {}", amqp.get_id(), amqp.get_message());
                match amqp.kind() {
                    // no such exchange: about this exchange, not the broker
                    AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Outcome::TargetUnavailable {
                        reason: format!("the broker refused the publish to {target}: {said}"),
                        status: None,
                    },
                    AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Outcome::Misconfigured {
                        reason: format!(
                            "the broker refused the publish to {target}: {said} (the relay's AMQP user lacks the permission)"
                        ),
                        status: None,
                    },
                    AMQPErrorKind::Soft(
                        AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::CONTENTTOOLARGE,
                    ) => Outcome::Rejected {
                        reason: format!("the broker refused the publish to {target}: {said}"),
                        status: None,
                        response: None,
                    },
                    _ => lost(target, &e),
                }
            }
            _ => lost(target, &e),
        },
    }
}

fn lost(target: &str, e: &lapin::Error) -> Outcome {
    Outcome::Ambiguous {
        reason: format!(
            "the connection or channel was lost after the publish to {target} and before its confirm ({e}); whether the broker took it is unknown"
        ),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(url: &str, password: Option<&str>) -> AmqpConfig {
        AmqpConfig {
            url: url.into(),
            password: password.map(|p| Secret::new(p.to_string())),
            tls_ca_file: None,
            allow_plaintext: false,
            timeout: Duration::from_secs(5),
            on_ambiguous: AmbiguityPolicy::Redeliver,
        }
    }

    #[test]
    fn the_url_is_checked_and_the_password_kept_out_of_it() {
        let uri = config("amqp://relay@127.0.0.1:5673/events", Some("s3cret"))
            .uri()
            .unwrap();
        assert_eq!(uri.authority.host, "127.0.0.1");
        assert_eq!(uri.authority.port, 5673);
        assert_eq!(uri.vhost, "events");
        assert_eq!(uri.authority.userinfo.username, "relay");
        assert_eq!(uri.authority.userinfo.password, "s3cret");
        let cases = [
            (config("http://h/", None), "amqp:// or amqps://"),
            (config("amqp://u:pw@localhost/", None), "password in it"),
            (config("amqp://10.1.2.3/", Some("pw")), "needs a user"),
            (config("amqp://u@10.1.2.3/", Some("pw")), "without TLS"),
            (config("not a url", None), "amqp.url"),
        ];
        for (c, says) in cases {
            let err = c.check().unwrap_err().to_string();
            assert!(err.contains(says), "{}: {err:?} should say {says:?}", c.url);
            assert!(!err.contains("pw"), "{err}");
        }
        assert!(config("amqps://u@10.1.2.3/", Some("pw")).check().is_ok());
        let mut plain = config("amqp://u@10.1.2.3/", Some("pw"));
        plain.allow_plaintext = true;
        assert!(plain.check().is_ok());
    }

    #[test]
    fn an_unroutable_return_just_after_the_broker_came_back_is_transient() {
        let unroutable = || {
            Outcome::Rejected {
            reason: "the broker returned the message to exchange \"e\" routing key \"k\" as unroutable: 312 NO_ROUTE".into(),
            status: None,
            response: None,
        }
        };
        // the first connection of a relay: the topology is the operator's
        assert!(matches!(
            recovering(unroutable(), None),
            Outcome::Rejected { .. }
        ));
        // just after the broker came back: it may still restore bindings
        match recovering(unroutable(), Some(Instant::now())) {
            Outcome::Transient { reason, .. } => {
                assert!(
                    reason.contains("NO_ROUTE") && reason.contains("reconnecting"),
                    "{reason}"
                )
            }
            other => panic!("{other:?}"),
        }
        // long after: rejected again
        let long_ago = Instant::now().checked_sub(RECOVERING + Duration::from_secs(1));
        if let Some(at) = long_ago {
            assert!(matches!(
                recovering(unroutable(), Some(at)),
                Outcome::Rejected { .. }
            ));
        }
        // another refusal is never turned into a retry
        let other = Outcome::Rejected {
            reason: "access refused".into(),
            status: None,
            response: None,
        };
        assert!(matches!(
            recovering(other, Some(Instant::now())),
            Outcome::Rejected { .. }
        ));
    }
}
