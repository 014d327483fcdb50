//! Schedule watermarks: which tick of each schedule was enqueued last.

use chrono::{DateTime, Utc};

use super::{enqueue, NewIntent, Store, StoreError};

impl Store {
    /// Fire a schedule once, if no other relay is doing it right now. In one
    /// short transaction (no network call): lock the schedule's row (skip if
    /// another relay holds it), let `due` turn the last tick enqueued (None
    /// for a schedule never seen) into the intents to enqueue and the new
    /// watermark, enqueue them, move the watermark. Returns how many intents
    /// were enqueued, or `None` when another relay held the schedule.
    pub async fn fire_schedule(
        &self,
        name: &str,
        due: impl FnOnce(Option<DateTime<Utc>>) -> (Vec<NewIntent>, DateTime<Utc>),
    ) -> Result<Option<usize>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(DateTime<Utc>,)> = sqlx::query_as(
            "SELECT last_tick FROM outbox.schedules WHERE name = $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?;
        let watermark = match row {
            Some((t,)) => Some(t),
            None => {
                let exists: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM outbox.schedules WHERE name = $1)",
                )
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
                if exists {
                    return Ok(None); // locked by another relay
                }
                None
            }
        };
        let (intents, new_watermark) = due(watermark);
        for intent in &intents {
            enqueue(&mut *tx, intent).await?;
        }
        sqlx::query(
            "INSERT INTO outbox.schedules (name, last_tick) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE
                SET last_tick = greatest(schedules.last_tick, excluded.last_tick), updated_at = now()",
        )
        .bind(name)
        .bind(new_watermark)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(intents.len()))
    }

    /// The last tick enqueued per schedule.
    pub async fn schedule_watermarks(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT name, last_tick FROM outbox.schedules ORDER BY name")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}
