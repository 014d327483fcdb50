//! `outbox.enqueue` and `outbox.enqueue_many` from Rust, on the caller's
//! executor (inside the caller's transaction).

use serde_json::Value;
use sqlx::types::chrono::{DateTime, Utc};

use crate::kinds::Intent;
use crate::EnqueueError;

/// One intent to write. Only `key`, `kind` and `payload` are required.
#[derive(Debug, Clone)]
pub struct NewIntent {
    /// The business identity of the effect, e.g. `order:42:confirmation`.
    /// The same key with the same payload is a duplicate, not a new effect.
    pub key: String,
    pub kind: String,
    pub payload: Value,
    pub destination: Option<String>,
    /// Not before this time; `None` means now.
    pub run_after: Option<DateTime<Utc>>,
    /// Intents sharing an ordering key are delivered one at a time, in order.
    pub ordering_key: Option<String>,
    /// Which client or service enqueued it, to see duplicate rates per source.
    pub source: Option<String>,
    /// The W3C `traceparent` of the trace this intent belongs to, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`. `None`
    /// takes the transaction's `outbox.traceparent` setting, if any. A
    /// malformed value is not stored (the intent gets no context) and never
    /// fails the enqueue.
    pub traceparent: Option<String>,
    /// The W3C `tracestate` that goes with `traceparent`: stored only with a
    /// valid explicit `traceparent` (with the setting's, the setting
    /// `outbox.tracestate` is taken instead).
    pub tracestate: Option<String>,
}

impl NewIntent {
    pub fn new(key: impl Into<String>, kind: impl Into<String>, payload: Value) -> Self {
        NewIntent {
            key: key.into(),
            kind: kind.into(),
            payload,
            destination: None,
            run_after: None,
            ordering_key: None,
            source: None,
            traceparent: None,
            tracestate: None,
        }
    }

    /// The intent `intent` (a [`crate::Webhook`], [`crate::Email`], ...)
    /// under `key`, with the destination it names.
    pub fn of(key: impl Into<String>, intent: impl Intent) -> Self {
        let mut new = NewIntent::new(key, intent.kind(), intent.payload());
        new.destination = intent.destination().map(str::to_string);
        new
    }

    /// Name a destination (a webhook endpoint).
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Deliver no earlier than `at`.
    pub fn run_after(mut self, at: DateTime<Utc>) -> Self {
        self.run_after = Some(at);
        self
    }

    /// Deliver one at a time, in order, with the other intents of `key`.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Name the enqueuing client (a service name).
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// Attach a W3C trace context (`tracestate` may be `None`).
    pub fn traceparent(
        mut self,
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Self {
        self.traceparent = Some(traceparent.into());
        self.tracestate = tracestate;
        self
    }
}

/// The result of `outbox.enqueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Enqueued {
    pub id: i64,
    /// True when the key already existed with the same payload.
    pub duplicate: bool,
}

/// Call `outbox.enqueue` on any executor: a pool, a connection, or (the
/// point of an outbox) `&mut *tx` inside the business transaction.
///
/// The trace context's parameters are sent only with a `traceparent` (a
/// `tracestate` alone would not be stored), so an intent without one is
/// enqueued by the same call as before them, on a schema not yet migrated
/// to them too.
pub async fn enqueue<'e, E>(executor: E, intent: &NewIntent) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    enqueue_checked(executor, intent, false).await
}

/// The key parameter `$1` of a call of `function`: in strict mode behind
/// `outbox.require_transaction`, which the server runs before the call (an
/// argument is evaluated first) and which refuses, with SQLSTATE OB428, a
/// transaction that has written nothing yet.
pub(crate) fn key_param(function: &str, require_transaction: bool) -> String {
    if require_transaction {
        format!("CASE WHEN outbox.require_transaction('{function}') THEN $1 END")
    } else {
        "$1".to_string()
    }
}

/// [`enqueue`], in strict mode when `require_transaction`.
pub(crate) async fn enqueue_checked<'e, E>(
    executor: E,
    intent: &NewIntent,
    require_transaction: bool,
) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    let current = crate::trace::current(intent);
    let intent = current.as_ref().unwrap_or(intent);
    let traced = intent.traceparent.is_some();
    let sql = format!(
        "SELECT id, duplicate FROM outbox.enqueue({}, $2, $3, $4, coalesce($5, now()), $6, $7{})",
        key_param("outbox.enqueue", require_transaction),
        if traced { ", $8, $9" } else { "" }
    );
    let query = sqlx::query_as(&sql)
        .bind(&intent.key)
        .bind(&intent.kind)
        .bind(&intent.payload)
        .bind(&intent.destination)
        .bind(intent.run_after)
        .bind(&intent.ordering_key)
        .bind(&intent.source);
    let query = if traced {
        query.bind(&intent.traceparent).bind(&intent.tracestate)
    } else {
        query
    };
    let (id, duplicate): (i64, bool) = query
        .fetch_one(executor)
        .await
        .map_err(|e| EnqueueError::of(e, &[intent.key.as_str()]))?;
    Ok(Enqueued { id, duplicate })
}

/// Enqueue many intents in one statement with `outbox.enqueue_many`: per
/// intent exactly what [`enqueue`] would answer (duplicate, OB409, the
/// ledger, the limits), in the order given. `enqueue_many` takes one
/// `p_source` per call, so intents are sent in runs of equal `source`
/// (one statement for the usual slice whose intents share it). Any
/// executor, as for [`enqueue`]; inside a transaction an error leaves none
/// of the slice written. Trace contexts go as `p_traceparents` and
/// `p_tracestates` only when some intent of the run has a `traceparent`
/// (otherwise every intent takes the transaction's setting, if any, and
/// the call is the one made before those parameters existed).
pub async fn enqueue_many(
    conn: &mut sqlx::PgConnection,
    intents: &[NewIntent],
) -> Result<Vec<Enqueued>, EnqueueError> {
    enqueue_many_checked(conn, intents, false).await
}

/// [`enqueue_many`], in strict mode when `require_transaction`.
pub(crate) async fn enqueue_many_checked(
    conn: &mut sqlx::PgConnection,
    intents: &[NewIntent],
    require_transaction: bool,
) -> Result<Vec<Enqueued>, EnqueueError> {
    let current: Vec<NewIntent>;
    let intents = if crate::trace::has_current() {
        current = intents
            .iter()
            .map(|i| crate::trace::current(i).unwrap_or_else(|| i.clone()))
            .collect();
        &current[..]
    } else {
        intents
    };
    let mut out = Vec::with_capacity(intents.len());
    for run in intents.chunk_by(|a, b| a.source == b.source) {
        macro_rules! col {
            ($f:expr) => {
                run.iter().map($f).collect::<Vec<_>>()
            };
        }
        let traced = run.iter().any(|i| i.traceparent.is_some());
        let sql = format!(
            "SELECT ord, id, duplicate FROM outbox.enqueue_many({}, $2, $3, $4, $5, $6, $7{})",
            key_param("outbox.enqueue_many", require_transaction),
            if traced { ", $8, $9" } else { "" }
        );
        let query = sqlx::query_as(&sql)
            .bind(col!(|i| i.key.as_str()))
            .bind(col!(|i| i.kind.as_str()))
            .bind(col!(|i| &i.payload))
            .bind(col!(|i| i.destination.as_deref()))
            .bind(col!(|i| i.run_after))
            .bind(col!(|i| i.ordering_key.as_deref()))
            .bind(run[0].source.as_deref());
        let query = if traced {
            // no tracestate in the run: NULL rather than an array of NULLs
            let tracestates = run
                .iter()
                .any(|i| i.tracestate.is_some())
                .then(|| col!(|i| i.tracestate.as_deref()));
            query
                .bind(col!(|i| i.traceparent.as_deref()))
                .bind(tracestates)
        } else {
            query
        };
        let rows: Vec<(i32, i64, bool)> = query.fetch_all(&mut *conn).await.map_err(|e| {
            let keys: Vec<&str> = run.iter().map(|i| i.key.as_str()).collect();
            EnqueueError::of(e, &keys)
        })?;
        debug_assert!(rows.iter().enumerate().all(|(i, r)| r.0 as usize == i + 1));
        out.extend(
            rows.into_iter()
                .map(|(_, id, duplicate)| Enqueued { id, duplicate }),
        );
    }
    Ok(out)
}
