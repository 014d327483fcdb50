//! Retention: terminal intents purged into the ledger, and the ledger's
//! own retention. Both run in bounded batches of short statements with
//! SKIP LOCKED, so a purge never holds a lock the claim path needs for long.

use super::{Store, StoreError};
use crate::state::{sql_names, IntentState, PURGEABLE};

/// The states a purge removes.
pub(super) fn purgeable(include_dead: bool) -> Vec<&'static str> {
    let states: Vec<IntentState> = PURGEABLE
        .into_iter()
        .filter(|s| include_dead || *s != IntentState::Dead)
        .collect();
    sql_names(&states)
}

/// One batch of intents with a row: the rows leave the live table and their
/// keys enter the ledger atomically, with when a provider last answered
/// success (the attempts, read in the statement's snapshot, go with the
/// rows; a delivery resolved by hand has none, and happened at
/// delivered_at). `$1` the states, `$2` the age in milliseconds, `$3` the
/// batch; answers how many went.
pub(super) const PURGE_ROWS: &str = "WITH gone AS (
         SELECT * FROM outbox.intent_rows
          WHERE state = ANY($1) AND updated_at < now() - $2 * interval '1 millisecond'
          LIMIT $3 FOR UPDATE SKIP LOCKED),
     -- the log row goes, and its row, attempts and actions with it
     deleted AS (
         DELETE FROM outbox.intent_log l USING gone WHERE l.id = gone.id),
     -- a row whose segment of the log was retired goes by itself, with its
     -- attempts, actions and event deliveries
     outlived AS (
         SELECT gone.id FROM gone
          WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_log l WHERE l.id = gone.id)),
     rows_deleted AS (
         DELETE FROM outbox.intent_rows t USING outlived o WHERE t.id = o.id),
     attempts_deleted AS (
         DELETE FROM outbox.attempts a USING outlived o WHERE a.intent_id = o.id),
     actions_deleted AS (
         DELETE FROM outbox.operator_actions a USING outlived o WHERE a.intent_id = o.id),
     deliveries_deleted AS (
         DELETE FROM outbox.event_deliveries d USING outlived o WHERE d.intent_id = o.id),
     fanouts_deleted AS (
         DELETE FROM outbox.event_deliveries d USING outlived o WHERE d.event_id = o.id),
     kept AS (
         INSERT INTO outbox.ledger (key, intent_id, kind, destination, fingerprint, state,
                                    provider_ref, last_error, created_at, completed_at,
                                    effect_at)
         SELECT key, id, kind, destination, outbox.fingerprint(payload), state,
                provider_ref, last_error, created_at, coalesce(delivered_at, updated_at),
                coalesce((SELECT max(coalesce(a.finished_at, a.started_at))
                            FROM outbox.attempt_history a
                           WHERE a.intent_id = gone.id AND a.outcome = 'delivered'),
                         CASE WHEN state = 'delivered' THEN delivered_at END)
           FROM gone
         ON CONFLICT (key) DO NOTHING)
     SELECT count(*) FROM gone";

/// One batch of intents delivered at the first attempt, which have no row:
/// the log row and its outcome. Binds as [`PURGE_ROWS`].
pub(super) const PURGE_LOG: &str = "WITH gone AS (
         SELECT l.id, l.key, l.kind, l.destination, l.payload, l.created_at,
                o.provider_ref, o.at, coalesce(o.finished_at, o.started_at, o.at) AS effect_at
           FROM outbox.log_outcomes o JOIN outbox.intent_log l ON l.id = o.intent_id
          WHERE 'delivered' = ANY($1) AND o.outcome = 'delivered'
            AND o.at < now() - $2 * interval '1 millisecond'
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = o.intent_id)
          LIMIT $3 FOR UPDATE OF o SKIP LOCKED),
     deleted AS (
         DELETE FROM outbox.intent_log l USING gone WHERE l.id = gone.id),
     kept AS (
         INSERT INTO outbox.ledger (key, intent_id, kind, destination, fingerprint, state,
                                    provider_ref, created_at, completed_at, effect_at)
         SELECT key, id, kind, destination, outbox.fingerprint(payload), 'delivered',
                provider_ref, created_at, at, effect_at
           FROM gone
         ON CONFLICT (key) DO NOTHING)
     SELECT count(*) FROM gone";

/// [`PURGE_LOG`] for the tail of the log (`outbox.intent_log_tail`: the ids
/// above its segments, where an application that moved the sequence on
/// enqueues), which is never retired whole: the daemon purges it so.
static PURGE_TAIL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    PURGE_LOG.replace(
        "FROM outbox.log_outcomes o JOIN outbox.intent_log l",
        "FROM outbox.log_outcomes_tail o JOIN outbox.intent_log_tail l",
    )
});

impl Store {
    /// Delete terminal intents last changed before `older_than` ago, in
    /// batches (short transactions, SKIP LOCKED). Returns how many.
    pub async fn purge(
        &self,
        older_than: std::time::Duration,
        include_dead: bool,
        dry_run: bool,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let states = purgeable(include_dead);
        let ms = older_than.as_millis() as i64;
        if dry_run {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox.intents
                  WHERE state = ANY($1) AND updated_at < now() - $2 * interval '1 millisecond'",
            )
            .bind(states)
            .bind(ms)
            .fetch_one(&self.pool)
            .await?;
            return Ok(n as u64);
        }
        self.purge_paced(older_than, include_dead, batch, std::time::Duration::ZERO)
            .await
    }

    /// Purge in batches of `batch`, sleeping `pause` between batches so a
    /// large purge leaves the database room for the claim path: the intents
    /// with rows, and those of the log delivered at the first attempt, one
    /// by one (an operator's purge, which takes what it counted).
    pub async fn purge_paced(
        &self,
        older_than: std::time::Duration,
        include_dead: bool,
        batch: i64,
        pause: std::time::Duration,
    ) -> Result<u64, StoreError> {
        self.purge_batches(older_than, include_dead, batch, pause, true)
            .await
    }

    /// As [`Store::purge_paced`], the intents with rows and those of the
    /// log's tail: the daemon's purge, which leaves the intents of the
    /// segments delivered at the first attempt to their segment's
    /// retirement (`Store::maintain_log_segments`).
    pub async fn purge_rows_paced(
        &self,
        older_than: std::time::Duration,
        include_dead: bool,
        batch: i64,
        pause: std::time::Duration,
    ) -> Result<u64, StoreError> {
        self.purge_batches(older_than, include_dead, batch, pause, false)
            .await
    }

    async fn purge_batches(
        &self,
        older_than: std::time::Duration,
        include_dead: bool,
        batch: i64,
        pause: std::time::Duration,
        from_log: bool,
    ) -> Result<u64, StoreError> {
        let states = purgeable(include_dead);
        let ms = older_than.as_millis() as i64;
        let mut total = 0u64;
        loop {
            let n: i64 = sqlx::query_scalar(PURGE_ROWS)
                .bind(&states)
                .bind(ms)
                .bind(batch)
                .fetch_one(&self.pool)
                .await?;
            let logged: i64 = sqlx::query_scalar(if from_log {
                PURGE_LOG
            } else {
                PURGE_TAIL.as_str()
            })
            .bind(&states)
            .bind(ms)
            .bind(batch)
            .fetch_one(&self.pool)
            .await?;
            total += (n + logged) as u64;
            if n < batch && logged < batch {
                return Ok(total);
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }

    /// Forget ledger entries purged longer ago than `older_than`, in batches,
    /// and their keys in `outbox.intent_keys` (unless an intent of the log
    /// holds the key). After this, a retry with such a key is a new
    /// operation: the ledger retention is the client's retry deadline.
    pub async fn purge_ledger(
        &self,
        older_than: std::time::Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let ms = older_than.as_millis() as i64;
        let mut total = 0u64;
        loop {
            let n: i64 = sqlx::query_scalar(
                "WITH gone AS (
                     DELETE FROM outbox.ledger WHERE key IN (
                         SELECT key FROM outbox.ledger
                          WHERE purged_at < now() - $1 * interval '1 millisecond'
                          LIMIT $2 FOR UPDATE SKIP LOCKED)
                     RETURNING key),
                 keys AS (
                     DELETE FROM outbox.intent_keys k USING gone g
                      WHERE k.key = g.key
                        AND NOT EXISTS (SELECT 1 FROM outbox.intent_log l
                                         WHERE l.id = k.intent_id)
                        AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t
                                         WHERE t.id = k.intent_id))
                 SELECT count(*) FROM gone",
            )
            .bind(ms)
            .bind(batch)
            .fetch_one(&self.pool)
            .await?;
            let n = n as u64;
            total += n;
            if n < batch as u64 {
                return Ok(total);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_tail_purge_reads_the_tail() {
        let tail = super::PURGE_TAIL.as_str();
        assert!(tail.contains("FROM outbox.log_outcomes_tail o JOIN outbox.intent_log_tail l"));
        assert_eq!(tail.matches("_tail").count(), 2, "{tail}");
    }
}
