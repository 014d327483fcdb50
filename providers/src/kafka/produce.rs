//! The idempotent producer and its delivery reports.
//!
//! A [`ThreadedProducer`] with a context of our own: librdkafka's delivery
//! report says not only whether a record failed but whether it may have
//! reached the broker (`rd_kafka_message_status`), which is exactly the
//! line between a transient failure and an ambiguous one.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::oneshot;

/// What a delivery report says.
#[derive(Debug)]
pub enum Report {
    Written {
        partition: i32,
        offset: i64,
    },
    Failed {
        error: KafkaError,
        /// The record may be in the log (it was sent and no answer came, or
        /// the answer was an error that does not exclude it).
        possibly_written: bool,
    },
}

/// Routes each delivery report to the attempt waiting for it.
pub struct Context;

impl ClientContext for Context {}

impl ProducerContext for Context {
    type DeliveryOpaque = Box<oneshot::Sender<Report>>;

    fn delivery(&self, result: &DeliveryResult<'_>, waiting: Self::DeliveryOpaque) {
        let report = match result {
            Ok(message) => Report::Written {
                partition: message.partition(),
                offset: message.offset(),
            },
            Err((error, message)) => {
                // SAFETY: the message is borrowed from librdkafka for the
                // duration of this callback, so its pointer is valid here;
                // rd_kafka_message_status only reads it.
                let status = unsafe { rdkafka::bindings::rd_kafka_message_status(message.ptr()) };
                Report::Failed {
                    error: error.clone(),
                    possibly_written: status
                        != rdkafka::bindings::rd_kafka_msg_status_t::RD_KAFKA_MSG_STATUS_NOT_PERSISTED,
                }
            }
        };
        // the attempt may have given up waiting: nobody to tell
        let _ = waiting.send(report);
    }
}

/// The producer. Destroying one waits for its broker threads (a cut
/// network holds them up to the socket timeout), so the last reference
/// lets go of it on a thread of its own, never on the async runtime.
pub struct Producer(Option<ThreadedProducer<Context>>);

impl Producer {
    pub fn new(inner: ThreadedProducer<Context>) -> Self {
        Producer(Some(inner))
    }

    /// The producer; `None` only once it is being dropped.
    pub fn get(&self) -> Option<&ThreadedProducer<Context>> {
        self.0.as_ref()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            std::thread::spawn(move || drop(p));
        }
    }
}

/// How long librdkafka tries to deliver a record (`message.timeout.ms`):
/// half of the attempt, the other half is kept for a reconcile when no
/// report comes.
pub fn report_wait(timeout: Duration) -> Duration {
    (timeout / 2).max(Duration::from_millis(50))
}

/// The producer's settings: idempotent, `acks=all`, the Java client's
/// partitioner for keyed records.
pub fn producer_config(common: ClientConfig, config: &super::KafkaConfig) -> ClientConfig {
    let mut c = common;
    let wait = report_wait(config.timeout);
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("message.timeout.ms", millis(wait))
        // an idempotent producer fails a record in flight only when its
        // request times out: within the same wait, so that the report, not
        // the attempt's own timer, says what became of it
        .set("request.timeout.ms", millis(wait))
        // an unknown topic is reported within the attempt, not after 30 s
        .set("topic.metadata.propagation.max.ms", millis(wait / 2))
        .set("linger.ms", millis(config.linger))
        .set("message.max.bytes", config.max_message_bytes.to_string())
        .set("compression.type", config.compression.as_str());
    c
}

pub fn millis(d: Duration) -> String {
    d.as_millis().to_string()
}

/// Refusals that would repeat, whatever the attempt: the record or the
/// topic is wrong for this cluster.
pub fn refusal(code: RDKafkaErrorCode) -> Option<&'static str> {
    use RDKafkaErrorCode as C;
    Some(match code {
        C::MessageSizeTooLarge => "the record is larger than the broker takes (message.max.bytes)",
        C::InvalidRecord | C::InvalidMessage => "the broker refused the record as invalid",
        C::TopicAuthorizationFailed => "the relay's user may not write to this topic",
        C::UnknownTopicOrPartition | C::UnknownTopic => {
            "the topic does not exist (and the cluster does not create topics on first use)"
        }
        C::UnknownPartition => "the topic has no such partition",
        C::InvalidTopic => "the broker refused the topic name",
        C::InvalidRequiredAcks => "the broker refused acks=all",
        _ => return None,
    })
}

/// Errors that only an operator can fix: the relay's credentials.
pub fn misconfiguration(code: RDKafkaErrorCode) -> Option<&'static str> {
    use RDKafkaErrorCode as C;
    Some(match code {
        C::SaslAuthenticationFailed | C::Authentication => {
            "the cluster refused the relay's credentials"
        }
        C::ClusterAuthorizationFailed | C::TransactionalIdAuthorizationFailed => {
            "the relay's user may not produce idempotently on this cluster (IdempotentWrite)"
        }
        _ => return None,
    })
}

/// The error code of a librdkafka error, when it has one.
pub fn code(error: &KafkaError) -> Option<RDKafkaErrorCode> {
    error.rdkafka_error_code()
}

/// The producer's own state is broken (an idempotent producer fenced, or
/// out of sequence with the broker): it fails every record from then on
/// and must be rebuilt, with a new producer id.
pub fn is_fatal(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code(error),
        Some(
            C::Fatal
                | C::ProducerFenced
                | C::InvalidProducerEpoch
                | C::OutOfOrderSequenceNumber
                | C::UnknownProducerId
                | C::InvalidProducerIdMapping
        )
    )
}

/// The topic is missing. librdkafka keeps that answer for the topic until
/// its next metadata refresh (`topic.metadata.refresh.interval.ms`, five
/// minutes) and refuses every record to it meanwhile, so the producer is
/// replaced: a topic an operator creates is seen by the next attempt.
pub fn topic_unknown(error: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code(error),
        Some(C::UnknownTopic | C::UnknownTopicOrPartition)
    )
}
