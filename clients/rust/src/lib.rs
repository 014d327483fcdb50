//! Write [outbox-relay](https://github.com/) intents from Rust, inside the
//! application's own Postgres transaction.
//!
//! ```no_run
//! # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_client::{enqueue, NewIntent, Webhook};
//! let mut tx = pool.begin().await?;
//! sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
//! let hook = Webhook::new("https://hooks.example.com/orders", serde_json::json!({"order": 42}));
//! let r = enqueue(&mut *tx, &NewIntent::of("order:42:confirmation", hook)).await?;
//! tx.commit().await?; // the intent exists if and only if the order does
//! println!("intent {} (duplicate: {})", r.id, r.duplicate);
//! # Ok(()) }
//! ```
//!
//! The client runs on the executor it is given and never begins, commits
//! or rolls back a transaction of its own. The SQL API (`outbox.enqueue`,
//! `outbox.enqueue_many`, `outbox.publish`, `outbox.publish_many`) stays
//! the one source of truth; this crate makes it typed.
//!
//! - [`kinds`]: the builders [`Webhook`], [`Email`], [`Charge`], [`Nats`],
//!   [`Amqp`], [`Kafka`], each making exactly its kind's payload, as
//!   `schema/kinds/<kind>.json` describes it.
//! - [`NewIntent`]: one intent and its options; [`enqueue`] and
//!   [`enqueue_many`] write them; [`Enqueued`] is the answer.
//! - [`NewEvent`]: one event, its type, data and tenant; [`publish`] and
//!   [`publish_many`] write it as an intent of kind `event`, which the
//!   relay delivers to every matching subscription.
//! - [`EnqueueError`]: a conflict ([`EnqueueError::Conflict`], with the
//!   key) apart from every other refusal, each with its SQLSTATE.
//! - [`require_transaction`]: strict mode, the same calls refusing an
//!   intent or an event that would commit on its own (SQLSTATE OB428).
//!
//! With the feature `opentelemetry`, an intent enqueued (or an event
//! published) without a `traceparent` while an OpenTelemetry span is
//! current takes that span's context, so the relay's attempts join the
//! request's trace.

mod enqueue;
mod error;
pub mod kinds;
mod publish;
pub mod require_transaction;
mod trace;

pub use enqueue::{enqueue, enqueue_many, Enqueued, NewIntent};
pub use error::EnqueueError;
pub use kinds::{Amqp, Charge, Email, Intent, Kafka, Nats, Webhook};
pub use publish::{publish, publish_many, NewEvent};
