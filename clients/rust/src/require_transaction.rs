//! Strict mode: [`enqueue`], [`enqueue_many`], [`publish`] and
//! [`publish_many`] as the crate's own, except that an intent or an event
//! written in a transaction that has written nothing yet is refused
//! (SQLSTATE OB428, nothing written): on a pool, or a connection outside
//! `BEGIN`, it would commit on its own, apart from the business rows it was
//! meant to go with. The server's `outbox.require_transaction` decides, in
//! the enqueue's own statement.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_client::{require_transaction, NewIntent, Webhook};
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
//! let hook = Webhook::new("https://hooks.example.com/orders", serde_json::json!({"order": 42}));
//! require_transaction::enqueue(&mut *tx, &NewIntent::of("order:42:confirmation", hook)).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use crate::enqueue::{enqueue_checked, enqueue_many_checked};
use crate::publish::{publish_checked, publish_many_checked};
use crate::{EnqueueError, Enqueued, NewEvent, NewIntent};

/// [`crate::enqueue`], refusing an intent that would commit on its own.
pub async fn enqueue<'e, E>(executor: E, intent: &NewIntent) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    enqueue_checked(executor, intent, true).await
}

/// [`crate::enqueue_many`], refusing intents that would commit on their own.
pub async fn enqueue_many(
    conn: &mut sqlx::PgConnection,
    intents: &[NewIntent],
) -> Result<Vec<Enqueued>, EnqueueError> {
    enqueue_many_checked(conn, intents, true).await
}

/// [`crate::publish`], refusing an event that would commit on its own.
pub async fn publish<'e, E>(executor: E, event: &NewEvent) -> Result<Enqueued, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    publish_checked(executor, event, true).await
}

/// [`crate::publish_many`], refusing events that would commit on their own.
pub async fn publish_many<'e, E>(
    executor: E,
    events: &[NewEvent],
) -> Result<Vec<Enqueued>, EnqueueError>
where
    E: sqlx::PgExecutor<'e>,
{
    publish_many_checked(executor, events, true).await
}
