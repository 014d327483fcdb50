//! What the console shows of a subscription beyond `subscriptions.rs`: its
//! recent deliveries, each with the event it was made of.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::{Store, StoreError};

/// One delivery of an event to a subscription: the webhook intent linked
/// in `outbox.event_deliveries`.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Delivery {
    /// The webhook intent.
    pub intent_id: i64,
    pub event_id: i64,
    pub event_key: String,
    pub event_type: Option<String>,
    /// The intent's state and attempts (none once the intent is gone).
    pub state: Option<String>,
    pub attempts: Option<i32>,
    pub delivered_at: Option<DateTime<Utc>>,
    /// When the expansion (or a replay) made it.
    pub made_at: DateTime<Utc>,
}

impl Store {
    /// Subscription `id`'s deliveries, newest event first, at most `limit`.
    pub async fn subscription_deliveries(
        &self,
        id: &str,
        limit: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT d.intent_id, d.event_id, e.key AS event_key,
                    e.payload->>'type' AS event_type,
                    i.state, i.attempts, i.delivered_at, d.at AS made_at
               FROM outbox.event_deliveries d
               -- the log, or the row of an event that outlived its segment
               JOIN LATERAL (SELECT x.key, x.payload FROM outbox.intents x
                              WHERE x.id = d.event_id) e ON true
               LEFT JOIN LATERAL (
                    SELECT x.state, x.attempts, x.delivered_at
                      FROM outbox.intents x WHERE x.id = d.intent_id) i ON true
              WHERE d.subscription_id = $1
              ORDER BY d.event_id DESC
              LIMIT $2",
        )
        .bind(id)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}
