//! `outbox.publish` and `outbox.publish_many` from Rust, on the caller's
//! executor (inside the caller's transaction). An event is one intent of
//! kind `event`, written through `outbox.enqueue`: its duplicates,
//! conflicts and limits are enqueue's.

use serde_json::Value;

use crate::{EnqueueError, Enqueued};

/// One event to publish: after the commit, the relay delivers it to every
/// matching subscription. Only `key`, `event_type` and `data` are required.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// The business identity of the event, e.g. `order:42:paid`. The same
    /// key with the same event is a duplicate, not a new event.
    pub key: String,
    /// A dotted name (letters, digits, `_` and `-` between the dots, at
    /// most 200 characters), e.g. `order.paid`.
    pub event_type: String,
    /// Any JSON: the deliveries' `data`.
    pub data: Value,
    /// The tenant whose subscriptions receive it (1 to 200 characters);
    /// `None`: the subscriptions without a tenant.
    pub tenant: Option<String>,
    /// The W3C `traceparent` of the trace the event belongs to. `None`
    /// takes the current span's (feature `opentelemetry`), else the
    /// transaction's `outbox.traceparent` setting, if any.
    pub traceparent: Option<String>,
}

impl NewEvent {
    pub fn new(key: impl Into<String>, event_type: impl Into<String>, data: Value) -> Self {
        NewEvent {
            key: key.into(),
            event_type: event_type.into(),
            data,
            tenant: None,
            traceparent: None,
        }
    }

    /// Publish it to the subscriptions of `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Attach a W3C `traceparent`.
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// The explicit traceparent, else the current span's.
    fn trace(&self) -> Option<String> {
        self.traceparent
            .clone()
            .or_else(crate::trace::current_traceparent)
    }
}

/// Call `outbox.publish` on any executor: a pool, a connection, or (the
/// point of an outbox) `&mut *tx` inside the business transaction. The
/// answer is enqueue's: the event's intent id, and whether the key was
/// already there with the same event. Another event under the key is
/// [`EnqueueError::Conflict`]; an event type that is not a dotted name, or
/// a tenant of 0 or over 200 characters, is [`EnqueueError::Invalid`]
/// (22023).
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_client::{publish, NewEvent};
/// use serde_json::json;
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, total) VALUES ($1, $2)")
///     .bind(48_i64).bind(1999_i64).execute(&mut *tx).await?;
/// let event = NewEvent::new("order:48:paid", "order.paid", json!({"order": 48, "total": 1999}))
///     .tenant("acme");
/// let r = publish(&mut *tx, &event).await?;
/// tx.commit().await?; // the event exists if and only if the order does
/// println!("event {} (duplicate: {})", r.id, r.duplicate);
/// # Ok(()) }
/// ```
pub async fn publish<'e, E>(executor: E, event: &NewEvent) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    publish_checked(executor, event, false).await
}

/// [`publish`], in strict mode when `require_transaction`.
pub(crate) async fn publish_checked<'e, E>(
    executor: E,
    event: &NewEvent,
    require_transaction: bool,
) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    let sql = format!(
        "SELECT id, duplicate FROM outbox.publish({}, $2, $3, $4, $5)",
        crate::enqueue::key_param("outbox.publish", require_transaction),
    );
    let (id, duplicate): (i64, bool) = sqlx::query_as(&sql)
        .bind(&event.key)
        .bind(&event.event_type)
        .bind(&event.data)
        .bind(&event.tenant)
        .bind(event.trace())
        .fetch_one(executor)
        .await
        .map_err(|e| EnqueueError::of(e, &[event.key.as_str()]))?;
    Ok(Enqueued { id, duplicate })
}

/// Publish many events in one statement with `outbox.publish_many`: per
/// event exactly what [`publish`] would answer, in the order given. Any
/// executor, as for [`publish`]; one refused event refuses them all, and
/// inside a transaction leaves none of the slice written.
pub async fn publish_many<'e, E>(
    executor: E,
    events: &[NewEvent],
) -> Result<Vec<Enqueued>, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    publish_many_checked(executor, events, false).await
}

/// [`publish_many`], in strict mode when `require_transaction`.
pub(crate) async fn publish_many_checked<'e, E>(
    executor: E,
    events: &[NewEvent],
    require_transaction: bool,
) -> Result<Vec<Enqueued>, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let keys: Vec<&str> = events.iter().map(|e| e.key.as_str()).collect();
    let traces: Vec<Option<String>> = events.iter().map(NewEvent::trace).collect();
    // no tenant (or trace) in the slice: NULL rather than an array of NULLs
    let tenants = events.iter().any(|e| e.tenant.is_some()).then(|| {
        events
            .iter()
            .map(|e| e.tenant.as_deref())
            .collect::<Vec<_>>()
    });
    let traces = traces.iter().any(Option::is_some).then_some(traces);
    let sql = format!(
        "SELECT ord, id, duplicate FROM outbox.publish_many({}, $2, $3, $4, $5) ORDER BY ord",
        crate::enqueue::key_param("outbox.publish_many", require_transaction),
    );
    let rows: Vec<(i32, i64, bool)> = sqlx::query_as(&sql)
        .bind(&keys)
        .bind(
            events
                .iter()
                .map(|e| e.event_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(events.iter().map(|e| &e.data).collect::<Vec<_>>())
        .bind(tenants)
        .bind(traces)
        .fetch_all(executor)
        .await
        .map_err(|e| EnqueueError::of(e, &keys))?;
    debug_assert!(rows.iter().enumerate().all(|(i, r)| r.0 as usize == i + 1));
    Ok(rows
        .into_iter()
        .map(|(_, id, duplicate)| Enqueued { id, duplicate })
        .collect())
}
