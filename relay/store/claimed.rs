//! A committed claim on one intent, and how a claim's result rows are
//! read into claims: the columns found by name once per result, the
//! payload as `claimed_payload` reads it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;

/// A committed claim on one intent: the relay may now perform its effect.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: i64,
    pub key: String,
    pub kind: String,
    pub destination: Option<String>,
    /// The payload read from its text, except a top-level `body`, which
    /// stands as `null` here (unless it nests 100 deep or more) and is
    /// [`Claimed::body_text`]: every kind with a body sends it as stored
    /// and reads nothing inside it.
    pub payload: Value,
    /// The payload as stored: Postgres' canonical jsonb text (a webhook body
    /// is sent as its slice of this text, digits intact).
    pub payload_text: String,
    /// Where the payload's `body` is in `payload_text`, when it has one.
    pub body: Option<std::ops::Range<usize>>,
    /// Set when the stored payload cannot be read (nested deeper than the
    /// JSON parser allows, a number beyond a double outside its `body`:
    /// shapes outbox.enqueue refuses since 0004, but a row written
    /// otherwise may have them; a body is sent as stored). The
    /// claim still succeeds, with a `Null` payload, so one such row cannot
    /// fail the claim of its whole batch; the intent is rejected with this.
    pub payload_error: Option<String>,
    /// Attempt number of this claim (1 for the first).
    pub attempt: i32,
    /// Attempts made before the last operator retry; the retry budget
    /// counts from here.
    pub attempts_base: i32,
    /// The fencing token; the completion must present it.
    pub fence: i64,
    pub key_generation: i32,
    pub created_at: DateTime<Utc>,
    /// The intent was delivered before (an operator retried it): a new
    /// delivery is not a first effect.
    pub delivered_before: bool,
    /// When this process received the claim; the lease started a little earlier.
    pub claimed_at: std::time::Instant,
    /// Where the server's WAL stood when it claimed the intent: past the
    /// intent's commit (the claim saw it). The standbys must have flushed
    /// it before the effect (`relay.wait_for_standbys`).
    pub wal_target: Option<WalMark>,
    /// The batch of the claim of the log that took the intent (a claim at
    /// its first attempt from `outbox.intent_log`): its completion names
    /// the batch, which goes once every intent of it is done.
    pub log_batch: Option<i64>,
    /// Set when the sweeper reclaimed an expired lease (or the intent is
    /// claimed again after its recovery was deferred): the previous attempt's
    /// outcome is unknown and must be reconciled, not guessed.
    pub recovered_from: Option<String>,
    /// With `recovered_from`: when the lost attempt's claim was taken.
    pub previous_attempt_at: Option<DateTime<Utc>>,
    /// The W3C trace context the intent was enqueued with: its attempts'
    /// spans are children of it, and it goes out with the effect.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The intent's ordering key: a Kafka record's key when its payload
    /// names none, so that one key's intents share a partition.
    pub ordering_key: Option<String>,
}

impl Claimed {
    /// The payload's `body` as stored, when it has one.
    pub fn body_text(&self) -> Option<&str> {
        self.body.clone().and_then(|r| self.payload_text.get(r))
    }
}

/// Where a claim's columns are in its result: looked up by name once per
/// result, not once per row and column (the lookup hashes the name).
pub(super) struct ClaimColumns {
    payload: usize,
    id: usize,
    key: usize,
    kind: usize,
    destination: usize,
    attempts: usize,
    attempts_base: usize,
    fence: usize,
    key_generation: usize,
    created_at: usize,
    delivered_before: usize,
    log_batch: usize,
    wal_timeline: usize,
    wal_position: usize,
    traceparent: usize,
    tracestate: usize,
    ordering_key: usize,
    recovered_from: usize,
    previous_attempt_at: usize,
}

impl ClaimColumns {
    /// The columns of `row`'s result. A fresh claim of an intent whose
    /// recovery was deferred (see Store::keep_recovery) is a recovered
    /// claim still: its owner and time are the recovery's.
    pub(super) fn of(row: &sqlx::postgres::PgRow, recovered: bool) -> Result<Self, sqlx::Error> {
        use sqlx::Column;
        let at = |name: &str| row.try_column(name).map(|c| c.ordinal());
        Ok(ClaimColumns {
            payload: at("payload")?,
            id: at("id")?,
            key: at("key")?,
            kind: at("kind")?,
            destination: at("destination")?,
            attempts: at("attempts")?,
            attempts_base: at("attempts_base")?,
            fence: at("fence")?,
            key_generation: at("key_generation")?,
            created_at: at("created_at")?,
            delivered_before: at("delivered_before")?,
            log_batch: at("log_batch")?,
            wal_timeline: at("wal_timeline")?,
            wal_position: at("wal_position")?,
            traceparent: at("traceparent")?,
            tracestate: at("tracestate")?,
            ordering_key: at("ordering_key")?,
            recovered_from: at(if recovered {
                "previous_owner"
            } else {
                "recover_owner"
            })?,
            previous_attempt_at: at(if recovered {
                "previous_at"
            } else {
                "recover_at"
            })?,
        })
    }
}

/// The claims of a claim's result.
pub(super) fn claimed_from_rows(
    rows: &[sqlx::postgres::PgRow],
    recovered: bool,
) -> Result<Vec<Claimed>, sqlx::Error> {
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let columns = ClaimColumns::of(first, recovered)?;
    rows.iter().map(|r| claimed_from_row(r, &columns)).collect()
}

pub(super) fn claimed_from_row(
    row: &sqlx::postgres::PgRow,
    c: &ClaimColumns,
) -> Result<Claimed, sqlx::Error> {
    let payload_text: String = row.try_get(c.payload)?;
    let (payload, body, payload_error) = match super::claimed_payload::read(&payload_text) {
        Ok(read) => (read.value, read.body, None),
        Err(source) => (
            Value::Null,
            None,
            Some(format!(
                "the stored payload cannot be read as JSON: {source}"
            )),
        ),
    };
    Ok(Claimed {
        id: row.try_get(c.id)?,
        key: row.try_get(c.key)?,
        kind: row.try_get(c.kind)?,
        destination: row.try_get(c.destination)?,
        payload,
        payload_text,
        body,
        payload_error,
        attempt: row.try_get(c.attempts)?,
        attempts_base: row.try_get(c.attempts_base)?,
        fence: row.try_get(c.fence)?,
        key_generation: row.try_get(c.key_generation)?,
        created_at: row.try_get(c.created_at)?,
        delivered_before: row.try_get(c.delivered_before)?,
        claimed_at: std::time::Instant::now(),
        log_batch: row.try_get(c.log_batch)?,
        wal_target: match (row.try_get(c.wal_timeline)?, row.try_get(c.wal_position)?) {
            (Some(timeline), Some(position)) => Some(WalMark { timeline, position }),
            _ => None,
        },
        traceparent: row.try_get(c.traceparent)?,
        tracestate: row.try_get(c.tracestate)?,
        ordering_key: row.try_get(c.ordering_key)?,
        recovered_from: row.try_get(c.recovered_from)?,
        previous_attempt_at: row.try_get(c.previous_attempt_at)?,
    })
}

/// A position in a server's WAL, on its timeline (a promoted standby
/// starts a new one: a position of the old primary's timeline says
/// nothing about what the new primary holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalMark {
    pub timeline: i32,
    /// Bytes from 0/0.
    pub position: i64,
}
