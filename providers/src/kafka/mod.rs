//! Kafka: produce a record with librdkafka's idempotent producer
//! (`enable.idempotence`, `acks=all`), carrying the header
//! `outbox-effect-key` derived from the intent key, so that consumers can
//! dedupe a redelivery and reconcile can find the record.
//!
//! - A delivery report with an offset is delivered, reference
//!   `<topic>:<partition>:<offset>`.
//! - A refusal that would repeat (a record too large, an invalid record,
//!   no permission on the topic, an unknown topic where the cluster does not
//!   create topics, a partition the topic lacks): rejected, naming it.
//! - Credentials refused: misconfigured.
//! - A record that never left the relay (no broker reachable, leader
//!   elections, not enough replicas until the report's time ran out):
//!   transient.
//! - A record that may have reached the broker with no report confirming
//!   it: ambiguous. Reconcile searches the record's partition from the
//!   attempt's start for our effect key ([`search`]): found, it is
//!   delivered with that record's offset; not found, `kafka.on_ambiguous`
//!   decides (`redeliver` under the same header, or `park`).
//!
//! A later attempt of an intent (a retry after any failure) searches first
//! and republishes only when the record is not there, so that a report lost
//! in a network cut does not become a second record. It does not search
//! when this relay made the attempt before it, and that attempt sent
//! nothing and needed no search itself ([`Unsent`]).

pub mod partition;
pub mod produce;
pub mod request;
pub mod search;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _};

use crate::{AmbiguityPolicy, Delivery, Outcome, Provider, Reconciled, Secret, SpanShape};
use produce::Report;
use search::{Search, Wanted};

/// Kafka settings, validated by the relay's config loader. The password
/// comes from the environment or a file and is never logged.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` separated by commas.
    pub brokers: String,
    pub client_id: String,
    /// `plaintext`, `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub security_protocol: String,
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`, with the SASL protocols.
    pub sasl_mechanism: Option<String>,
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// A PEM file of root certificates for `ssl` and `sasl_ssl`.
    pub tls_ca_file: Option<PathBuf>,
    /// Allow a `PLAIN` password over `sasl_plaintext` to brokers that are
    /// not loopback.
    pub allow_plaintext: bool,
    /// The budget of one attempt: the delivery report is awaited for half
    /// of it, the rest is kept for a reconcile.
    pub timeout: Duration,
    pub linger: Duration,
    /// `none`, `gzip`, `snappy`, `lz4` or `zstd`.
    pub compression: String,
    pub on_ambiguous: AmbiguityPolicy,
    /// How far back reconcile searches: never before the attempt's start,
    /// and never more than this before now.
    pub reconcile_window: Duration,
    /// The largest record the producer sends (librdkafka's
    /// `message.max.bytes`): body, key and headers.
    pub max_message_bytes: usize,
}

/// librdkafka's own bounds on `message.max.bytes`.
pub const MAX_MESSAGE_BYTES: std::ops::RangeInclusive<usize> = 1_000..=1_000_000_000;

pub const SECURITY_PROTOCOLS: &[&str] = &["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
pub const COMPRESSIONS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];

/// Records' timestamps come from the producer's clock, the search's start
/// from the relay's: this much earlier covers a skew between them.
const CLOCK_MARGIN: Duration = Duration::from_secs(60);

impl KafkaConfig {
    /// Check what the provider would refuse, without connecting.
    pub fn check(&self) -> Result<(), crate::Error> {
        let bad = |why: String| Err(crate::Error::Config(why));
        let brokers: Vec<&str> = self.brokers.split(',').map(str::trim).collect();
        if brokers.iter().all(|b| b.is_empty()) {
            return bad("kafka.brokers is empty".into());
        }
        for broker in &brokers {
            if broker.contains("://") {
                return bad(format!(
                    "kafka.brokers {broker:?}: give host:port, without a scheme (kafka.security_protocol chooses TLS)"
                ));
            }
            let port = broker
                .rsplit_once(':')
                .map(|(host, port)| (host, port.parse::<u16>()));
            if !matches!(port, Some((host, Ok(p))) if !host.is_empty() && p > 0) {
                return bad(format!("kafka.brokers {broker:?} must be host:port"));
            }
        }
        if !SECURITY_PROTOCOLS.contains(&self.security_protocol.as_str()) {
            return bad(format!(
                "kafka.security_protocol {:?} must be one of {}",
                self.security_protocol,
                SECURITY_PROTOCOLS.join(", ")
            ));
        }
        let sasl = self.security_protocol.starts_with("sasl_");
        match (&self.sasl_mechanism, sasl) {
            (Some(m), true) if !SASL_MECHANISMS.contains(&m.as_str()) => {
                return bad(format!(
                    "kafka.sasl_mechanism {m:?} must be one of {}",
                    SASL_MECHANISMS.join(", ")
                ))
            }
            (None, true) => {
                return bad(format!(
                    "kafka.security_protocol {:?} needs kafka.sasl_mechanism",
                    self.security_protocol
                ))
            }
            (Some(_), false) => {
                return bad(format!(
                    "kafka.sasl_mechanism is set but kafka.security_protocol is {:?} (use sasl_ssl or sasl_plaintext)",
                    self.security_protocol
                ))
            }
            _ => {}
        }
        if sasl && !(self.user.is_some() && self.password.is_some()) {
            return bad("kafka: SASL needs kafka.user and a password (OUTBOX_RELAY__KAFKA__PASSWORD, or ..._FILE naming a file)".into());
        }
        if !sasl && (self.user.is_some() || self.password.is_some()) {
            return bad("kafka.user and kafka.password are used only with security_protocol sasl_ssl or sasl_plaintext".into());
        }
        if self.tls_ca_file.is_some() && !self.security_protocol.ends_with("ssl") {
            return bad(
                "kafka.tls_ca_file is used only with security_protocol ssl or sasl_ssl".into(),
            );
        }
        let clear = self.security_protocol == "sasl_plaintext"
            && self.sasl_mechanism.as_deref() == Some("PLAIN");
        if clear && !self.allow_plaintext && !brokers.iter().all(|b| loopback(b)) {
            return bad("kafka: refusing to send a PLAIN password without TLS to brokers that are not local; use sasl_ssl (or set kafka.allow_plaintext = true)".into());
        }
        if !COMPRESSIONS.contains(&self.compression.as_str()) {
            return bad(format!(
                "kafka.compression {:?} must be one of {}",
                self.compression,
                COMPRESSIONS.join(", ")
            ));
        }
        if self.client_id.trim().is_empty() {
            return bad("kafka.client_id is empty".into());
        }
        if self.linger > Duration::from_secs(5) {
            return bad("kafka.linger must be at most 5s".into());
        }
        if self.linger >= produce::report_wait(self.timeout) {
            return bad(format!(
                "kafka.linger ({:?}) must be shorter than half of kafka.timeout ({:?})",
                self.linger, self.timeout
            ));
        }
        if self.reconcile_window < Duration::from_secs(1) {
            return bad("kafka.reconcile_window must be at least 1s".into());
        }
        if !MAX_MESSAGE_BYTES.contains(&self.max_message_bytes) {
            return bad(format!(
                "kafka.max_message_bytes ({}) must be from {} to {}",
                self.max_message_bytes,
                MAX_MESSAGE_BYTES.start(),
                MAX_MESSAGE_BYTES.end()
            ));
        }
        Ok(())
    }

    /// The settings both the producer and reconcile's consumer use.
    fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", self.brokers.replace(' ', ""))
            .set("client.id", &self.client_id)
            .set("security.protocol", &self.security_protocol)
            .set(
                "socket.connection.setup.timeout.ms",
                produce::millis(self.timeout.max(Duration::from_secs(1))),
            );
        if let Some(m) = &self.sasl_mechanism {
            c.set("sasl.mechanism", m);
        }
        if let (Some(user), Some(password)) = (&self.user, &self.password) {
            c.set("sasl.username", user)
                .set("sasl.password", password.expose());
        }
        if let Some(ca) = &self.tls_ca_file {
            c.set("ssl.ca.location", ca.to_string_lossy());
        }
        c
    }
}

fn loopback(broker: &str) -> bool {
    let host = broker.rsplit_once(':').map_or(broker, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub struct KafkaProvider {
    config: KafkaConfig,
    client: ClientConfig,
    /// Made on first use; rebuilt after a fatal error (an idempotent
    /// producer that lost its sequence cannot go on).
    producer: Mutex<Option<Arc<produce::Producer>>>,
    unsent: Unsent,
}

/// The effects whose last attempt this relay made and knows left no record
/// in the log: it sent nothing (refused before it was queued, or reported
/// `NOT_PERSISTED`), and nothing was there before it (the first attempt, a
/// search that found nothing, or an attempt of this kind itself). The
/// next attempt of such an effect has nothing to search for. By effect
/// key, the attempt's number; bounded, and forgotten on a restart (the
/// attempt after one searches).
#[derive(Default)]
struct Unsent(Mutex<HashMap<String, i32>>);

impl Unsent {
    /// Effects remembered at most; past it the memory starts again.
    const CAP: usize = 10_000;

    fn follows(&self, effect_key: &str, attempt: i32) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(effect_key).is_some_and(|a| *a + 1 == attempt)
    }

    fn record(&self, effect_key: String, attempt: i32, left_nothing: bool) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !left_nothing {
            map.remove(&effect_key);
            return;
        }
        if map.len() >= Self::CAP {
            map.clear();
        }
        map.insert(effect_key, attempt);
    }
}

/// Whether an attempt's record may have reached the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Nothing,
    Maybe,
}

impl KafkaProvider {
    pub fn new(config: KafkaConfig) -> Result<Self, crate::Error> {
        config.check()?;
        let client = config.client();
        // librdkafka checks the settings (a CA file it cannot read) as it
        // creates the producer
        let producer = produce::producer_config(client.clone(), &config)
            .create_with_context(produce::Context)
            .map(produce::Producer::new)
            .map_err(|e| crate::Error::Config(format!("kafka: {e}")))?;
        Ok(KafkaProvider {
            config,
            client,
            producer: Mutex::new(Some(Arc::new(producer))),
            unsent: Unsent::default(),
        })
    }

    fn producer(&self) -> Result<Arc<produce::Producer>, String> {
        let mut slot = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
        let p = produce::producer_config(self.client.clone(), &self.config)
            .create_with_context(produce::Context)
            .map(|p| Arc::new(produce::Producer::new(p)))
            .map_err(|e| format!("cannot create the Kafka producer: {e}"))?;
        *slot = Some(p.clone());
        Ok(p)
    }

    /// Forget a producer that cannot go on (unless another attempt has
    /// already replaced it); the next attempt makes a new one.
    fn drop_producer(&self, ours: &Arc<produce::Producer>) {
        let mut slot = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|p| Arc::ptr_eq(p, ours)) {
            *slot = None;
        }
    }

    /// Search for the record (off the async runtime), from `since`, until
    /// `deadline`.
    async fn look_for(&self, d: &Delivery<'_>, since: SystemTime, deadline: Instant) -> Search {
        let record = match request::parse(d.payload, None, d.ordering_key) {
            Ok(r) => r,
            Err(e) => return Search::Incomplete(e),
        };
        let oldest = SystemTime::now()
            .checked_sub(self.config.reconcile_window)
            .unwrap_or(UNIX_EPOCH);
        let since = since
            .checked_sub(CLOCK_MARGIN)
            .unwrap_or(UNIX_EPOCH)
            .max(oldest);
        let since_ms = since
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let client = self.client.clone();
        let effect_key = request::effect_key(d.key, d.key_generation);
        let searched = tokio::task::spawn_blocking(move || {
            let wanted = Wanted {
                topic: &record.topic,
                key: record.key.as_deref().map(str::as_bytes),
                partition: record.partition,
                effect_key: &effect_key,
                since_ms,
            };
            search::search(&client, &wanted, deadline)
        });
        // the search keeps its deadline itself; this bounds a blocking pool
        // too busy to start it
        let margin = Duration::from_millis(250);
        match tokio::time::timeout_at((deadline + margin).into(), searched).await {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => Search::Incomplete(format!("the search stopped: {e}")),
            Err(_) => Search::Incomplete("the search did not finish in the attempt's time".into()),
        }
    }

    /// Produce the record and classify its delivery report.
    async fn produce(
        &self,
        d: &Delivery<'_>,
        record: request::Record,
        started: Instant,
    ) -> (Outcome, Sent) {
        let held = match self.producer() {
            Ok(p) => p,
            Err(reason) => {
                let outcome = Outcome::Misconfigured {
                    reason,
                    status: None,
                };
                return (outcome, Sent::Nothing);
            }
        };
        let Some(producer) = held.get() else {
            let outcome = Outcome::Transient {
                reason: "the Kafka producer was being replaced; nothing was sent".into(),
                status: None,
                retry_after: None,
            };
            return (outcome, Sent::Nothing);
        };
        let effect_key = request::effect_key(d.key, d.key_generation);
        let size = record.size(&effect_key);
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 1);
        for (name, value) in &record.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        headers = headers.insert(Header {
            key: request::EFFECT_KEY_HEADER,
            value: Some(effect_key.as_bytes()),
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut base = BaseRecord::with_opaque_to(&record.topic, Box::new(tx))
            .payload(&record.body)
            .headers(headers);
        if let Some(key) = &record.key {
            base = base.key(key.as_bytes());
        }
        if let Some(p) = record.partition {
            base = base.partition(p);
        }
        let topic = record.topic.clone();
        if let Err((error, _)) = producer.send(base) {
            // refused before it was queued: nothing left the relay
            if produce::topic_unknown(&error) {
                self.drop_producer(&held);
            }
            let local_size = produce::code(&error) == Some(RDKafkaErrorCode::MessageSizeTooLarge);
            let outcome = match produce::code(&error).and_then(produce::refusal) {
                // librdkafka's own limit, not the broker's
                Some(_) if local_size => Outcome::invalid(format!(
                    "{} ({error})",
                    too_large(&topic, size, &self.config)
                )),
                Some(why) => rejected(&topic, why, &error),
                None => Outcome::Transient {
                    reason: format!("the record for topic {topic:?} was not queued: {error}"),
                    status: None,
                    retry_after: None,
                },
            };
            return (outcome, Sent::Nothing);
        }
        let wait =
            d.time_left(produce::report_wait(self.config.timeout) + Duration::from_millis(500));
        let report = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(report)) => report,
            Ok(Err(_)) | Err(_) => {
                let outcome = Outcome::Ambiguous {
                    reason: format!(
                        "no delivery report for the record to topic {topic:?} within {:?}; whether the broker wrote it is unknown",
                        started.elapsed()
                    ),
                    status: None,
                };
                return (outcome, Sent::Maybe);
            }
        };
        match report {
            Report::Written { partition, offset } => {
                let outcome = Outcome::Delivered {
                    reference: Some(reference(&topic, partition, offset)),
                    replayed: false,
                    status: None,
                };
                (outcome, Sent::Maybe)
            }
            Report::Failed {
                error,
                possibly_written,
            } => {
                // an idempotent producer that lost its sequence or epoch
                // (fenced, out of order) fails every record from then on
                if let Some((code, why)) = producer.client().fatal_error() {
                    tracing::warn!(%code, %why, "the Kafka producer is in a fatal state; a new one is made for the next attempt");
                    self.drop_producer(&held);
                } else if produce::is_fatal(&error) {
                    tracing::warn!(%error, "the Kafka producer's id or sequence was refused; a new producer is made for the next attempt");
                    self.drop_producer(&held);
                } else if produce::topic_unknown(&error) {
                    self.drop_producer(&held);
                }
                let sent = if possibly_written {
                    Sent::Maybe
                } else {
                    Sent::Nothing
                };
                (classify(&topic, &error, possibly_written), sent)
            }
        }
    }
}

/// The reason a record over `kafka.max_message_bytes` is refused.
fn too_large(topic: &str, size: usize, config: &KafkaConfig) -> String {
    format!(
        "the record for topic {topic:?} is about {size} bytes (body, key and headers), over kafka.max_message_bytes ({}), the largest record the relay's producer sends",
        config.max_message_bytes
    )
}

/// The provider reference of a record: `<topic>:<partition>:<offset>`.
fn reference(topic: &str, partition: i32, offset: i64) -> String {
    format!("{topic}:{partition}:{offset}")
}

fn rejected(topic: &str, why: &str, error: &KafkaError) -> Outcome {
    Outcome::Rejected {
        reason: format!("kafka refused the record for topic {topic:?}: {why} ({error})"),
        status: None,
        response: None,
    }
}

/// A failed delivery report's outcome.
fn classify(topic: &str, error: &KafkaError, possibly_written: bool) -> Outcome {
    let code = produce::code(error);
    if let Some(why) = code.and_then(produce::refusal) {
        return rejected(topic, why, error);
    }
    if let Some(why) = code.and_then(produce::misconfiguration) {
        return Outcome::Misconfigured {
            reason: format!("kafka: {why} ({error})"),
            status: None,
        };
    }
    if possibly_written {
        Outcome::Ambiguous {
            reason: format!(
                "the record to topic {topic:?} was sent but not confirmed ({error}); whether the broker wrote it is unknown"
            ),
            status: None,
        }
    } else {
        let hint = if code == Some(RDKafkaErrorCode::MessageTimedOut) {
            "; no broker took it in time"
        } else {
            ""
        };
        Outcome::Transient {
            reason: format!("the record to topic {topic:?} was not written ({error}{hint})"),
            status: None,
            retry_after: None,
        }
    }
}

#[async_trait::async_trait]
impl Provider for KafkaProvider {
    fn kind(&self) -> &'static str {
        "kafka"
    }

    async fn deliver(&self, d: &Delivery<'_>) -> Outcome {
        let started = Instant::now();
        if let Err(reason) = crate::refuse_destination("kafka", d.destination) {
            return Outcome::invalid(reason);
        }
        let mut record = match request::parse(d.payload, d.raw_body(), d.ordering_key) {
            Ok(r) => r,
            Err(reason) => return Outcome::invalid(reason),
        };
        if let Some(trace) = d.trace {
            crate::span::set_trace_headers(&mut record.headers, trace, |v| v.to_string());
        }
        let effect_key = request::effect_key(d.key, d.key_generation);
        let size = record.size(&effect_key);
        if size > self.config.max_message_bytes {
            // no attempt can send it: refused before any network call
            return Outcome::invalid(too_large(&record.topic, size, &self.config));
        }
        // a retry (not a recovery, which the relay reconciles itself):
        // the last attempt's record may be in the log already, unless this
        // relay knows that attempt left none
        let retry = d.attempt > 1 && d.previous_attempt_at.is_none();
        let clean = d.attempt == 1 || (retry && self.unsent.follows(&effect_key, d.attempt));
        if retry && !clean {
            // half of the attempt for the search, the rest for the produce;
            // as far back as the window goes
            let deadline = Instant::now() + d.time_left(self.config.timeout) / 2;
            match self.look_for(d, UNIX_EPOCH, deadline).await {
                Search::Found { partition, offset } => {
                    return Outcome::Delivered {
                        reference: Some(reference(&record.topic, partition, offset)),
                        replayed: true,
                        status: None,
                    }
                }
                Search::NotFound => {}
                Search::Incomplete(why) => {
                    self.unsent.record(effect_key, d.attempt, false);
                    return Outcome::Transient {
                        reason: format!(
                            "could not check whether an earlier attempt's record is in topic {:?} ({why}); nothing was sent",
                            record.topic
                        ),
                        status: None,
                        retry_after: None,
                    };
                }
            }
        }
        // known to leave nothing behind when it sends nothing: the first
        // attempt, or one after an attempt known to have left nothing (not
        // one that searched: an earlier record may have been in flight,
        // unseen, so the next attempt searches again)
        let (outcome, sent) = self.produce(d, record, started).await;
        self.unsent
            .record(effect_key, d.attempt, clean && sent == Sent::Nothing);
        outcome
    }

    async fn reconcile(&self, d: &Delivery<'_>) -> Reconciled {
        let since = d.previous_attempt_at.unwrap_or(UNIX_EPOCH);
        let deadline = Instant::now() + d.time_left(self.config.timeout);
        match self.look_for(d, since, deadline).await {
            Search::Found { partition, offset } => {
                let topic = d
                    .payload
                    .get("topic")
                    .and_then(|t| t.as_str())
                    .unwrap_or_default();
                Reconciled::Found {
                    reference: reference(topic, partition, offset),
                }
            }
            // not in the log now; a record still in flight could land
            // later, so the kind's policy decides
            Search::NotFound | Search::Incomplete(_) => Reconciled::Unknown,
        }
    }

    fn on_ambiguous(&self) -> AmbiguityPolicy {
        self.config.on_ambiguous
    }

    /// A messaging `publish` span on the record's topic.
    fn span_shape(&self, d: &Delivery<'_>) -> SpanShape {
        match d.payload.get("topic").and_then(|s| s.as_str()) {
            Some(topic) => {
                crate::span::publish("kafka", topic, request::effect_key(d.key, d.key_generation))
            }
            None => SpanShape::plain("kafka"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> KafkaConfig {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            client_id: "outbox-relay".into(),
            security_protocol: "plaintext".into(),
            sasl_mechanism: None,
            user: None,
            password: None,
            tls_ca_file: None,
            allow_plaintext: false,
            timeout: Duration::from_secs(10),
            linger: Duration::from_millis(5),
            compression: "none".into(),
            on_ambiguous: AmbiguityPolicy::Redeliver,
            reconcile_window: Duration::from_secs(900),
            max_message_bytes: 1_000_000,
        }
    }

    #[test]
    fn max_message_bytes_is_within_librdkafkas_bounds() {
        assert!(config().check().is_ok());
        for bad in [0, 999, 1_000_000_001] {
            let err = KafkaConfig {
                max_message_bytes: bad,
                ..config()
            }
            .check()
            .unwrap_err();
            assert!(err.to_string().contains("kafka.max_message_bytes"), "{err}");
        }
    }
}
