//! A subscription's replay: the events of a time window that match it, and
//! what it has of each; then a first delivery of those it never had, and
//! the others again under their key.

use chrono::{DateTime, Utc};
use sqlx::FromRow;

use super::operator::{Change, RetryOptions};
use super::{Store, StoreError};
use crate::state::IntentState;

/// The events a replay looks at.
#[derive(Debug, Clone)]
pub struct Window {
    pub subscription: String,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    /// Only events of this type or `prefix.*` pattern.
    pub event_type: Option<String>,
}

/// One event of the window and the subscription's delivery of it, if any.
#[derive(Debug, Clone, FromRow)]
pub struct Replayed {
    pub event_id: i64,
    pub delivery_id: Option<i64>,
    pub delivery_state: Option<String>,
}

/// The states a replay sends again: every state an attempt has ended in.
pub const SENT_AGAIN: [IntentState; 5] = [
    IntentState::Delivered,
    IntentState::Rejected,
    IntentState::Dead,
    IntentState::Ambiguous,
    IntentState::Cancelled,
];

impl Store {
    /// The window's events that match the subscription (its tenant and
    /// patterns, and `event_type`), oldest first.
    pub async fn replay_selection(&self, w: &Window) -> Result<Vec<Replayed>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT l.id AS event_id, d.intent_id AS delivery_id, i.state AS delivery_state
               FROM outbox.subscriptions s
               JOIN outbox.intent_log l
                 ON l.kind = 'event' AND l.created_at >= $2 AND l.created_at < $3
                AND (l.payload->>'tenant') IS NOT DISTINCT FROM s.tenant
                AND outbox.event_type_matches(s.event_types, l.payload->>'type')
                AND ($4::text IS NULL
                     OR outbox.event_type_matches(ARRAY[$4::text], l.payload->>'type'))
               LEFT JOIN outbox.event_deliveries d
                 ON d.event_id = l.id AND d.subscription_id = s.id
               LEFT JOIN outbox.intents i ON i.id = d.intent_id
              WHERE s.id = $1
              ORDER BY l.created_at, l.id",
        )
        .bind(&w.subscription)
        .bind(w.since)
        .bind(w.until)
        .bind(&w.event_type)
        .fetch_all(self.pool())
        .await?)
    }

    /// The subscription's first delivery of each of `events` (those it has
    /// none of, while it is enabled); how many were made.
    pub async fn replay_first_deliveries(
        &self,
        subscription: &str,
        events: &[i64],
    ) -> Result<u64, StoreError> {
        let mut made = 0u64;
        for chunk in events.chunks(1000) {
            let n: i64 = sqlx::query_scalar(
                "SELECT coalesce(sum(x.created), 0)::bigint
                   FROM unnest($1::bigint[]) AS e(id),
                        LATERAL outbox.expand_event(e.id, $2) AS x",
            )
            .bind(chunk)
            .bind(subscription)
            .fetch_one(self.pool())
            .await?;
            made += n.max(0) as u64;
        }
        Ok(made)
    }

    /// Send `deliveries` again under their key (an operator retry, forced
    /// for the delivered ones: counted as replays), those still in one of
    /// [`SENT_AGAIN`]; how many.
    pub async fn replay_again(&self, deliveries: &[i64]) -> Result<u64, StoreError> {
        let how = RetryOptions {
            new_effect: false,
            force: true,
        };
        let mut done = 0u64;
        for chunk in deliveries.chunks(1000) {
            done += self
                .change_ids_in(chunk, &Change::Retry(how), &SENT_AGAIN)
                .await?;
        }
        Ok(done)
    }
}
