//! The intent log (schema/0027_intent_log.sql): claims from it, the
//! deliveries at the first attempt it records without a row, and the moves
//! of its intents into `outbox.intent_rows` when they leave that path.
//!
//! An intent enqueued is one row of `outbox.intent_log`, never rewritten. A
//! claim of log intents writes one `outbox.log_batches` row for the batch;
//! a delivery at the first attempt writes one narrow `outbox.log_outcomes`
//! row. Everything else (a retry, a deferral, a rejection, an expired lease,
//! a release, an operator's change) first copies the intent into
//! `intent_rows` (`outbox.track`), and the row takes it from there.
//!
//! The claim and the deliveries at the first attempt read the log through
//! `outbox.intent_log_open` (schema/0036_open_log.sql), the part of it that
//! holds the intents no claim has taken and those in a claim's batch.

use chrono::{DateTime, Utc};
use sqlx::{Column, Row};

use super::claim_query::{ClaimQuery, GENERIC_PLAN_BEGIN, LOG_CLAIM_BEGIN, LOG_PLAIN_CLAIM_BEGIN};
use super::claimed::{claimed_from_row, ClaimColumns};
use super::claims::{Accepted, Aside, Claims, Completion};
use super::{storable, Store};

/// Expired batches the sweeper settles in one transaction.
const BATCHES_PER_SWEEP: i64 = 200;

/// Cursor rows kept: the newest is the cursor; a few more keep the table's
/// tail readable for someone looking at where claims went.
const CURSOR_ROWS_KEPT: i64 = 1000;

/// The statement of [`LOG_COMPLETE_SQL`], with the outcome insert's guard
/// and conflict clause.
macro_rules! log_complete_sql {
    ($guard:literal, $conflict:literal) => {
        concat!(
            "WITH v AS (
         SELECT v.*, l.created_at
           FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::int[], $5::text[],
                       $6::bool[]) AS v(id, started_at, finished_at, status, provider_ref, replayed)
           -- a probe per intent (OFFSET 0 keeps each a subplan, see log_claim_sql);
           -- the log's gives the enqueue time the relay's latency reads
           CROSS JOIN LATERAL (SELECT l.created_at FROM outbox.intent_log_batchable l
                                WHERE l.id = v.id OFFSET 0) l
          WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = v.id OFFSET 0)),
     done AS (
         INSERT INTO outbox.log_outcomes AS o (intent_id, outcome, owner, started_at,
                                               finished_at, status, provider_ref, replayed)
         SELECT v.id, 'delivered', $7, v.started_at, v.finished_at, v.status, v.provider_ref,
                v.replayed
           FROM v
          ",
            $guard,
            "
         ",
            $conflict,
            "
         RETURNING o.intent_id),
     finished AS (
         DELETE FROM outbox.log_batches b
          WHERE b.batch = ANY($8::bigint[])
            AND NOT EXISTS (
                SELECT 1 FROM unnest(b.ids) AS x(id)
                 -- a hashed subplan: as `<> ALL` of an array, the generic plan
                 -- compared every id of the batches with every outcome written
                 WHERE x.id NOT IN (SELECT d.intent_id FROM done d)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o
                                    WHERE o.intent_id = x.id OFFSET 0)
                   AND EXISTS (SELECT 1 FROM outbox.intent_log_batchable l WHERE l.id = x.id OFFSET 0)))
     SELECT d.intent_id, v.created_at FROM done d JOIN v ON v.id = d.intent_id"
        )
    };
}

/// Records deliveries of log intents claimed from the log: $1 ids, $2
/// started, $3 finished, $4 status, $5 provider reference, $6 replayed, $7
/// owner, $8 their claims' batches. An intent that has an outcome already
/// (moved into `intent_rows` when its lease expired, an operator changed
/// it, or this very batch written before a lost acknowledgement), a row, or
/// no longer its log row (purged, which takes its outcome with it) is not
/// recorded here: its completion goes through the row, under its fence.
///
/// The outcome is a plain insert guarded by a probe of the outcomes: an
/// `INSERT ... ON CONFLICT` into the partitioned outcomes cost a tenth of
/// the completion (docs/performance.md, "Instructions per intent"). An
/// outcome that another transaction writes between the probe and the
/// insert (`outbox.track`, the sweeper) makes the insert fail with 23505,
/// and [`LOG_COMPLETE_CONTENDED_SQL`] runs instead.
///
/// The same statement deletes the batches these outcomes finish (see
/// [`Store::drop_finished_batches`]): those of $8 whose every intent has
/// its outcome, written before or by this statement (which its own
/// snapshot does not show, so they are named), or has left the log. The
/// batches are named by the claims that returned them, found by primary
/// key: searched for by their ids in the GIN index instead, the search was
/// a tenth of the completion's work.
pub(super) const LOG_COMPLETE_SQL: &str = log_complete_sql!(
    "WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open x
                             WHERE x.intent_id = v.id OFFSET 0)",
    ""
);

/// [`LOG_COMPLETE_SQL`] for when another transaction wrote an outcome of
/// one of the intents meanwhile: the insert passes over an outcome there
/// is, committed or not, instead of failing on it.
pub(super) const LOG_COMPLETE_CONTENDED_SQL: &str =
    log_complete_sql!("", "ON CONFLICT (intent_id) DO NOTHING");

/// The claims' batches that hold these completions' intents, each once: a
/// claim of the log has fence 1, and any later claim is of a row.
fn log_batches<'a>(completions: impl Iterator<Item = &'a Completion>) -> Vec<i64> {
    let mut batches: Vec<i64> = completions
        .filter(|c| c.fence == 1)
        .filter_map(|c| c.log_batch)
        .collect();
    batches.sort_unstable();
    batches.dedup();
    batches
}

/// Intents a claim looked at beyond what it claims, per claimable one, to
/// set a congested destination's intents aside.
const ASIDE_PER_CLAIM: i64 = 50;

impl Store {
    /// Claim up to `limit` intents from the log (after those with rows),
    /// setting the intents of the destinations in `aside` aside.
    pub(super) async fn claim_from_log(
        &self,
        query: &ClaimQuery,
        owner: &str,
        limit: i64,
        lease_ms: i64,
        aside: &Aside,
    ) -> Result<Claims, sqlx::Error> {
        let mut claims = Claims {
            set_aside: vec![0; aside.names.len()],
            ..Claims::default()
        };
        if limit <= 0 {
            return Ok(claims);
        }
        let mut tx = self
            .pool
            .begin_with(if aside.is_empty() {
                LOG_PLAIN_CLAIM_BEGIN
            } else {
                LOG_CLAIM_BEGIN
            })
            .await?;
        let rows = if aside.is_empty() {
            sqlx::query(query.log_plain_sql())
                .bind(limit)
                .bind(owner)
                .bind(lease_ms)
                .fetch_all(&mut *tx)
                .await?
        } else {
            sqlx::query(query.log_sql())
                .bind(limit)
                .bind(owner)
                .bind(lease_ms)
                .bind(&aside.names)
                .bind(&aside.first_ms)
                .bind(&aside.turn_ms)
                .bind(query.cap() * ASIDE_PER_CLAIM)
                .fetch_all(&mut *tx)
                .await?
        };
        tx.commit().await?;
        let Some(first) = rows.first() else {
            return Ok(claims);
        };
        // the columns by position, found once: by name, each read hashes it
        let c = ClaimColumns::of(first, false)?;
        let aside = first.try_column("aside")?.ordinal();
        let to_rows = first.try_column("to_rows")?.ordinal();
        for row in &rows {
            match row.try_get::<Option<i32>, _>(aside)? {
                Some(i) => {
                    if let Some(n) = claims.set_aside.get_mut((i - 1).max(0) as usize) {
                        *n += 1;
                    }
                }
                // an intent of the log's tail, given its row for the
                // claims of rows
                None if row.try_get::<bool, _>(to_rows)? => claims.to_rows += 1,
                None => claims.claimed.push(claimed_from_row(row, &c)?),
            }
        }
        Ok(claims)
    }

    /// EXPLAIN (ANALYZE) of the claim of the log as a claim runs it (its
    /// transaction, after its lock), for up to `limit` intents with
    /// nothing set aside, in a transaction that is rolled back: nothing is
    /// claimed.
    pub async fn explain_log_claim(&self, limit: i64) -> Result<Vec<String>, sqlx::Error> {
        let query = ClaimQuery::new(limit, &[]);
        let mut tx = self.pool.begin_with(LOG_PLAIN_CLAIM_BEGIN).await?;
        let plan: Vec<String> = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, BUFFERS) {}",
            query.log_plain_sql()
        ))
        .bind(limit)
        .bind("explain")
        .bind(60_000i64)
        .fetch_all(&mut *tx)
        .await?;
        tx.rollback().await?;
        Ok(plan)
    }

    /// Record the deliveries at the first attempt of intents claimed from
    /// the log. Returns those recorded; the rest of `batch` goes through
    /// the rows.
    pub(super) async fn complete_from_log(
        &self,
        owner: &str,
        batch: &[&Completion],
    ) -> Result<Vec<Accepted>, sqlx::Error> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        macro_rules! col {
            ($f:expr) => {
                batch.iter().map($f).collect::<Vec<_>>()
            };
        }
        let statement = |sql| {
            sqlx::query(sql)
                .bind(col!(|c| c.id))
                .bind(col!(|c| c.started_at))
                .bind(col!(|c| c.finished_at))
                .bind(col!(|c| c.status))
                .bind(col!(|c| c
                    .provider_ref
                    .as_deref()
                    .map(|r| storable::text(r, storable::MAX_REF_CHARS))))
                .bind(col!(|c| c.replayed))
                .bind(owner)
                .bind(log_batches(batch.iter().copied()))
        };
        // on the connection's generic plan (GENERIC_PLAN_SETTINGS)
        let mut tx = self.pool.begin_with(GENERIC_PLAN_BEGIN).await?;
        let rows = match statement(LOG_COMPLETE_SQL).fetch_all(&mut *tx).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("23505") => {
                tx.rollback().await?;
                statement(LOG_COMPLETE_CONTENDED_SQL)
                    .fetch_all(&self.pool)
                    .await?
            }
            rows => {
                let rows = rows?;
                tx.commit().await?;
                rows
            }
        };
        rows.iter()
            .map(|r| {
                let created_at: Option<DateTime<Utc>> = r.try_get("created_at")?;
                Ok(Accepted {
                    id: r.try_get("intent_id")?,
                    created_at: created_at.unwrap_or_else(Utc::now),
                })
            })
            .collect()
    }

    /// Delete the batches of log claims among these completions' whose
    /// every intent has its outcome: the claims of the log and the view
    /// check the batches left, so they are kept to those in flight. A batch
    /// whose last outcomes were written by two completers at once is left
    /// to its lease and [`Store::settle_log_batches`]. The deliveries at the
    /// first attempt do this in their own statement ([`LOG_COMPLETE_SQL`]);
    /// this is for the completions that went through the rows.
    pub(super) async fn drop_finished_batches(
        &self,
        batch: &[&Completion],
    ) -> Result<(), sqlx::Error> {
        let batches = log_batches(batch.iter().copied());
        if batches.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "DELETE FROM outbox.log_batches b
              WHERE b.batch = ANY($1::bigint[])
                AND NOT EXISTS (
                    SELECT 1 FROM unnest(b.ids) AS x(id)
                     WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o
                                        WHERE o.intent_id = x.id OFFSET 0)
                       AND EXISTS (SELECT 1 FROM outbox.intent_log_batchable l WHERE l.id = x.id OFFSET 0))",
        )
        .bind(&batches)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// [`Store::track`] for the claims among these that may lack a row:
    /// a claim of the log has fence 1, and any later claim is of a row.
    pub(super) async fn track_claims(
        &self,
        claims: impl Iterator<Item = (i64, i64)>,
    ) -> Result<(), sqlx::Error> {
        let ids: Vec<i64> = claims
            .filter(|&(_, fence)| fence == 1)
            .map(|(id, _)| id)
            .collect();
        self.track(&ids).await
    }

    /// Give these intents their rows (`outbox.track`): those only in the
    /// log are copied into `intent_rows` in the state the log gives them.
    /// Cheap when every one has its row already.
    pub(super) async fn track(&self, ids: &[i64]) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        sqlx::query("SELECT count(*) FROM outbox.track($1)")
            .bind(ids)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Trim the cursor's old rows, and settle batches of log claims whose
    /// lease has expired: each intent of them with no outcome is moved into
    /// `intent_rows`, claimed under the expired lease, for the sweeper's
    /// reclaim to recover; then the batch goes.
    pub(super) async fn settle_log_batches(&self) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let expired: Vec<(i64, Vec<i64>)> = sqlx::query_as(
            "SELECT batch, ids FROM outbox.log_batches
              WHERE lease_expires_at < now()
              ORDER BY lease_expires_at LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(BATCHES_PER_SWEEP)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM outbox.log_cursor
              WHERE seq < (SELECT max(seq) FROM outbox.log_cursor) - $1",
        )
        .bind(CURSOR_ROWS_KEPT)
        .execute(&mut *tx)
        .await?;
        if expired.is_empty() {
            return tx.commit().await;
        }
        let batches: Vec<i64> = expired.iter().map(|b| b.0).collect();
        let ids: Vec<i64> = expired.into_iter().flat_map(|b| b.1).collect();
        sqlx::query(
            "SELECT count(*) FROM outbox.track(ARRAY(
                 SELECT x FROM unnest($1::bigint[]) x
                  WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o WHERE o.intent_id = x)))",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM outbox.log_batches WHERE batch = ANY($1)")
            .bind(&batches)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}
