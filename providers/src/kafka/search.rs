//! Reconcile: is a record carrying this intent's effect key in its
//! partition?
//!
//! The search starts at the offset the broker gives for the attempt's start
//! (minus a margin for clocks) and reads forward to the partition's end as
//! it was when the search began, then stops: a partition that other
//! producers keep busy does not keep it reading. The end is the high
//! watermark the broker lists at the start, or the one its first fetch
//! answers with, whichever is later (Tansu lists one too low, the base
//! offset of its last batch plus one; its fetches answer the true one). A
//! partition read to where the broker says it ends (end of partition) is
//! done too. A start offset the broker answers too early (Tansu answers 0
//! for a time past the last record) costs only reading more.
//!
//! A record written after the search took its end is not seen: a record of
//! an earlier attempt that was still on its way to the broker then (see
//! the Kafka guide).
//!
//! A record with a partition in its payload is in that one. A keyed record
//! is where the producer's partition count put it: the topic may have
//! gained partitions since, so every partition an earlier count would have
//! chosen is read ([`super::partition::candidates`]). A record with neither
//! key nor partition may be in any, so all are read.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::request::EFFECT_KEY_HEADER;

/// What to look for.
pub struct Wanted<'a> {
    pub topic: &'a str,
    pub key: Option<&'a [u8]>,
    pub partition: Option<i32>,
    pub effect_key: &'a str,
    /// Milliseconds since the epoch: records older than this are not read
    /// (as far as the broker's time index allows).
    pub since_ms: i64,
}

#[derive(Debug, PartialEq)]
pub enum Search {
    Found {
        partition: i32,
        offset: i64,
    },
    /// Every partition the record could be in was read to its end from
    /// the start time: the record is not there (now).
    NotFound,
    /// The search could not finish; says why.
    Incomplete(String),
}

/// Run the search (blocking: call it off the async runtime) until
/// `deadline`.
pub fn search(common: &ClientConfig, wanted: &Wanted<'_>, deadline: Instant) -> Search {
    match run(common, wanted, deadline) {
        Ok(found) => found,
        Err(e) => Search::Incomplete(e),
    }
}

fn left(deadline: Instant) -> Result<Duration, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err("the attempt's time ran out".into())
    } else {
        Ok(left)
    }
}

/// Closing a consumer waits for its broker threads, which a cut network
/// holds up to the socket timeout: it is closed on a thread of its own, so
/// that the search answers by its deadline.
struct Detached(Option<BaseConsumer>);

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some(consumer) = self.0.take() {
            std::thread::spawn(move || drop(consumer));
        }
    }
}

fn run(common: &ClientConfig, w: &Wanted<'_>, deadline: Instant) -> Result<Search, String> {
    let consumer: BaseConsumer = common
        .clone()
        // assigned partitions only: no group is joined, nothing committed
        .set("group.id", "outbox-relay-reconcile")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("fetch.wait.max.ms", "100")
        .set("isolation.level", "read_uncommitted")
        .create()
        .map_err(|e| format!("cannot create the reconcile consumer: {e}"))?;
    let consumer = Detached(Some(consumer));
    let Some(consumer) = consumer.0.as_ref() else {
        return Err("no consumer".into());
    };
    let metadata = consumer
        .fetch_metadata(Some(w.topic), left(deadline)?)
        .map_err(|e| format!("no metadata for topic {:?}: {e}", w.topic))?;
    let count = metadata
        .topics()
        .iter()
        .find(|t| t.name() == w.topic && t.error().is_none())
        .map(|t| t.partitions().len() as i32)
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("the cluster reports no partitions for topic {:?}", w.topic))?;
    let partitions: Vec<i32> = match (w.partition, w.key) {
        (Some(p), _) => vec![p],
        (None, Some(key)) => super::partition::candidates(key, count),
        (None, None) => (0..count).collect(),
    };
    let mut at_time = TopicPartitionList::new();
    for p in &partitions {
        at_time
            .add_partition_offset(w.topic, *p, Offset::Offset(w.since_ms))
            .map_err(|e| e.to_string())?;
    }
    // where each partition's records from `since_ms` start; a broker that
    // cannot say is read from its beginning
    let starts = consumer.offsets_for_times(at_time, left(deadline)?).ok();
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<i32, End> = HashMap::new();
    for p in &partitions {
        let start = starts
            .as_ref()
            .and_then(|s| s.find_partition(w.topic, *p))
            .map(|e| e.offset());
        let start = match start {
            // no record at or after that time (Apache Kafka's answer)
            Some(Offset::End) => continue,
            Some(Offset::Offset(o)) if o >= 0 => Offset::Offset(o),
            _ => Offset::Beginning,
        };
        let listed = consumer
            .fetch_watermarks(w.topic, *p, left(deadline)?)
            .map_or(0, |(_, high)| high);
        assignment
            .add_partition_offset(w.topic, *p, start)
            .map_err(|e| e.to_string())?;
        ends.insert(
            *p,
            End {
                listed,
                fetched: None,
                done: false,
            },
        );
    }
    if ends.is_empty() {
        return Ok(Search::NotFound);
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("cannot read topic {:?}: {e}", w.topic))?;
    loop {
        let remaining = left(deadline)?;
        if ends.values().all(|end| end.done) {
            return Ok(Search::NotFound);
        }
        match consumer.poll(remaining.min(Duration::from_millis(200))) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                if let Some(end) = ends.get_mut(&p) {
                    end.done = true;
                }
            }
            Some(Err(e)) => return Err(format!("reading topic {:?}: {e}", w.topic)),
            Some(Ok(record)) => {
                let ours = record.headers().is_some_and(|headers| {
                    headers.iter().any(|h| {
                        h.key == EFFECT_KEY_HEADER && h.value == Some(w.effect_key.as_bytes())
                    })
                });
                if ours {
                    return Ok(Search::Found {
                        partition: record.partition(),
                        offset: record.offset(),
                    });
                }
                if let Some(end) = ends.get_mut(&record.partition()) {
                    // the high watermark of the fetch that brought the
                    // partition's first record, taken once
                    let fetched = *end
                        .fetched
                        .get_or_insert_with(|| fetched_high(consumer, w.topic, record.partition()));
                    if record.offset() + 1 >= end.listed.max(fetched) {
                        end.done = true;
                    }
                }
            }
        }
    }
}

/// The high watermark of the last fetch response for a partition, as
/// librdkafka keeps it (no request); 0 when it has none.
fn fetched_high(consumer: &BaseConsumer, topic: &str, partition: i32) -> i64 {
    let Ok(topic) = std::ffi::CString::new(topic) else {
        return 0;
    };
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` is borrowed, the
    // topic is a NUL-terminated string that outlives the call, and the call
    // only writes librdkafka's cached watermarks into the two locals.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    if err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        high.max(0)
    } else {
        0
    }
}

/// Where one partition's read stops.
struct End {
    /// The high watermark the broker listed when the search began.
    listed: i64,
    /// The one its first fetch answered with.
    fetched: Option<i64>,
    /// Read to the end.
    done: bool,
}
