//! Enqueue from Rust, inside the application's own transaction: the
//! `outbox-client` crate, which an application depends on instead of this
//! one (it needs only sqlx and serde). The relay's `enqueue` verb, its
//! schedules and its tests write intents through it too.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> anyhow::Result<()> {
//! use outbox_client::{enqueue, NewIntent, Webhook};
//! let mut tx = pool.begin().await?;
//! // ... the business write, e.g. INSERT INTO orders ...
//! let hook = Webhook::new("https://example.com/hooks", serde_json::json!({"order": 42}));
//! let r = enqueue(&mut *tx, &NewIntent::of("order:42:confirmation", hook)).await?;
//! tx.commit().await?; // the intent exists if and only if the order does
//! println!("intent {} (duplicate: {})", r.id, r.duplicate);
//! # Ok(()) }
//! ```

pub use outbox_client::{enqueue, enqueue_many, EnqueueError, Enqueued, NewIntent};

impl super::Store {
    /// Enqueue one intent in a transaction of its own (the `enqueue` verb).
    pub async fn enqueue(&self, intent: &NewIntent) -> Result<Enqueued, EnqueueError> {
        enqueue(&self.pool, intent).await
    }
}
