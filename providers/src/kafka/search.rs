//! Reconcile: is a record carrying this intent's effect key in its
//! partition?
//!
//! The search starts at the offset the broker gives for the attempt's start
//! (minus a margin for clocks) and reads forward until the partition is
//! exhausted: past the high watermark the broker gave at the start, and no
//! record for [`IDLE`] since. It never trusts the high watermark to say
//! where the partition ends (Tansu reports one too low: the read goes on
//! past it), and a start offset the broker answers too early (Tansu answers
//! 0 for a time past the last record) costs only reading more.
//!
//! A record with a partition in its payload is in that one. A keyed record
//! is where the producer's partition count put it: the topic may have
//! gained partitions since, so every partition an earlier count would have
//! chosen is read ([`super::partition::candidates`]). A record with neither
//! key nor partition may be in any, so all are read.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use super::request::EFFECT_KEY_HEADER;

/// A partition that gives no record for this long is exhausted: the
/// broker answers an empty fetch within `fetch.wait.max.ms` (100 ms), so
/// this is four empty answers in a row.
pub const IDLE: Duration = Duration::from_millis(400);

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
    // per partition: the high watermark at the start, and whether the read
    // has reached it (a broker that reports one too low, as Tansu does,
    // only makes the read go on past it until the partition is quiet)
    let mut ends: std::collections::HashMap<i32, (i64, bool)> = Default::default();
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
        let high = consumer
            .fetch_watermarks(w.topic, *p, left(deadline)?)
            .map_or(0, |(_, high)| high);
        let reached = matches!(start, Offset::Offset(o) if o >= high);
        assignment
            .add_partition_offset(w.topic, *p, start)
            .map_err(|e| e.to_string())?;
        ends.insert(*p, (high, reached));
    }
    if ends.is_empty() {
        return Ok(Search::NotFound);
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("cannot read topic {:?}: {e}", w.topic))?;
    let mut last_record = Instant::now();
    loop {
        let remaining = left(deadline)?;
        if last_record.elapsed() >= IDLE && ends.values().all(|(_, reached)| *reached) {
            return Ok(Search::NotFound);
        }
        match consumer.poll(remaining.min(Duration::from_millis(200))) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                if let Some(end) = ends.get_mut(&p) {
                    end.1 = true;
                }
            }
            Some(Err(e)) => return Err(format!("reading topic {:?}: {e}", w.topic)),
            Some(Ok(record)) => {
                last_record = Instant::now();
                if let Some(end) = ends.get_mut(&record.partition()) {
                    end.1 |= record.offset() + 1 >= end.0;
                }
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
            }
        }
    }
}
