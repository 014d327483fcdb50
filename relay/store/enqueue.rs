//! Enqueue from Rust, inside the application's own transaction.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> anyhow::Result<()> {
//! use outbox_relay::store::{enqueue, NewIntent};
//! let mut tx = pool.begin().await?;
//! // ... the business write, e.g. INSERT INTO orders ...
//! let r = enqueue(
//!     &mut *tx,
//!     &NewIntent::new(
//!         "order:42:confirmation",
//!         "webhook",
//!         serde_json::json!({"url": "https://example.com/hooks", "body": {"order": 42}}),
//!     ),
//! )
//! .await?;
//! tx.commit().await?; // the intent exists if and only if the order does
//! println!("intent {} (duplicate: {})", r.id, r.duplicate);
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use serde_json::Value;

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
}

/// The result of `outbox.enqueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Enqueued {
    pub id: i64,
    /// True when the key already existed with the same payload.
    pub duplicate: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    /// SQLSTATE OB409: the key exists with a different kind, destination or
    /// payload. A client bug: never a replay, never a new effect.
    #[error("{message}{}", detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Conflict {
        message: String,
        detail: Option<String>,
    },
    /// SQLSTATE OB413: the payload's JSON text (`payload::text`) is over
    /// the limit (1 MiB). The message names the key, the size and the limit.
    #[error("{message}{}", hint.as_deref().map(|h| format!(" ({h})")).unwrap_or_default())]
    PayloadTooLarge {
        message: String,
        hint: Option<String>,
    },
    /// The input was refused by `outbox.enqueue` (22023: empty key, key over
    /// 512 characters, bad kind name, NULL payload, nesting 64 levels deep,
    /// a number beyond ±1e308) or could not be read as jsonb (22P02 not
    /// JSON, 22P05 `\u0000` in a string, 54001 nested too deep to parse).
    #[error("{0}")]
    Invalid(String),
    #[error("database error: {0}")]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for EnqueueError {
    fn from(err: sqlx::Error) -> Self {
        let Some(db) = err.as_database_error() else {
            return EnqueueError::Database(err);
        };
        let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = db.message().to_string();
        match code.as_str() {
            "OB409" => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|e| e.detail().map(str::to_string));
                EnqueueError::Conflict { message, detail }
            }
            "OB413" => {
                let hint = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|e| e.hint().map(str::to_string));
                EnqueueError::PayloadTooLarge { message, hint }
            }
            // 54000: the size limit as schemas before 0004 raised it
            "22023" | "54000" | "22P02" | "22P05" | "54001" | "23514" => {
                EnqueueError::Invalid(message)
            }
            _ => EnqueueError::Database(err),
        }
    }
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
    let traced = intent.traceparent.is_some();
    let query = sqlx::query_as(if traced {
        "SELECT id, duplicate FROM outbox.enqueue($1, $2, $3, $4, coalesce($5, now()), $6, $7, $8, $9)"
    } else {
        "SELECT id, duplicate FROM outbox.enqueue($1, $2, $3, $4, coalesce($5, now()), $6, $7)"
    })
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
    let (id, duplicate): (i64, bool) = query.fetch_one(executor).await?;
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
pub async fn enqueue_all(
    conn: &mut sqlx::PgConnection,
    intents: &[NewIntent],
) -> Result<Vec<Enqueued>, EnqueueError> {
    let mut out = Vec::with_capacity(intents.len());
    for run in intents.chunk_by(|a, b| a.source == b.source) {
        macro_rules! col {
            ($f:expr) => {
                run.iter().map($f).collect::<Vec<_>>()
            };
        }
        let traced = run.iter().any(|i| i.traceparent.is_some());
        let query = sqlx::query_as(if traced {
            "SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3, $4, $5, $6, $7, $8, $9)"
        } else {
            "SELECT ord, id, duplicate FROM outbox.enqueue_many($1, $2, $3, $4, $5, $6, $7)"
        })
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
        let rows: Vec<(i32, i64, bool)> = query.fetch_all(&mut *conn).await?;
        debug_assert!(rows.iter().enumerate().all(|(i, r)| r.0 as usize == i + 1));
        out.extend(
            rows.into_iter()
                .map(|(_, id, duplicate)| Enqueued { id, duplicate }),
        );
    }
    Ok(out)
}
