//! A recovered claim whose destination may not be called now (paused,
//! breaker open, rate limited) is deferred like any other, and keeps its
//! recovery: the intent carries the lost attempt's owner and time
//! (`recover_owner`, `recover_at`, schema 0015) until a claim of it gets
//! past the gate, so that the attempt whose outcome was lost is still
//! reconciled first, whenever that is. An operator's change (retry, cancel,
//! resolve) clears it: a retried intent is claimed afresh.

use chrono::{DateTime, Utc};

use super::Store;

impl Store {
    /// Keep the recovery of a claim that is about to be deferred (fenced:
    /// only while this claim holds the intent).
    pub async fn keep_recovery(
        &self,
        id: i64,
        fence: i64,
        previous_owner: &str,
        previous_at: Option<DateTime<Utc>>,
    ) -> Result<bool, sqlx::Error> {
        self.track(&[id]).await?;
        let done = sqlx::query(
            "UPDATE outbox.intent_rows SET recover_owner = $3, recover_at = $4
              WHERE id = $1 AND fence = $2 AND (state = 'claimed') IS TRUE",
        )
        .bind(id)
        .bind(fence)
        .bind(previous_owner)
        .bind(previous_at)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The recovery is under way (its claim got past the gate): a later
    /// claim is a fresh one again. A crash from here on is an expired lease
    /// that the sweeper recovers anew.
    pub async fn recovery_started(&self, id: i64, fence: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE outbox.intent_rows SET recover_owner = NULL, recover_at = NULL
              WHERE id = $1 AND fence = $2 AND recover_owner IS NOT NULL",
        )
        .bind(id)
        .bind(fence)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
