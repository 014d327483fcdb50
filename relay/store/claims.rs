//! The hot path: claim, complete, release, and the sweeper's reclaim.
//!
//! Every statement here is a single autocommit statement: a claim commits
//! before the relay makes any network call, and no row lock outlives the
//! statement that took it.

use std::collections::HashSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;

pub use super::claim_query::RELAY_TTL_SECS;
use super::claim_query::{ClaimQuery, CLAIMED_COLUMNS, WAL_MARK};
use super::claimed::{claimed_from_rows, Claimed};
use super::{storable, Store};
use crate::state::{AttemptOutcome, IntentState};

/// A delivery at the first attempt with no error: what the log records
/// without a row (the same test as `first` in the completion statement).
pub(super) fn first_delivery(c: &Completion) -> bool {
    c.state == IntentState::Delivered
        && c.outcome == AttemptOutcome::Delivered
        && c.attempt == 1
        && !c.uncounted
        && c.error.is_none()
}

/// The destinations a claim of the log sets aside (congested ones): each
/// name as `outbox.destination_of` gives it, when its first turn is due
/// (ms from now) and the time between its turns (ms).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Aside {
    pub names: Vec<String>,
    pub first_ms: Vec<f64>,
    pub turn_ms: Vec<f64>,
}

impl Aside {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// What a claim took: its claims, and how many intents of each name in
/// its [`Aside`] it set aside.
#[derive(Debug, Default)]
pub struct Claims {
    pub claimed: Vec<Claimed>,
    pub set_aside: Vec<u64>,
    /// Intents of the log's tail (ids above its segments) this relay
    /// serves that the claim of the log gave rows instead of a batch: the
    /// claim of rows takes them.
    pub to_rows: u64,
}

/// The recorded result of one attempt and the intent's next state.
#[derive(Debug, Clone)]
pub struct Completion {
    pub id: i64,
    /// Not stored; for metrics and logs.
    pub kind: String,
    pub delivered_before: bool,
    /// The first attempt after an operator retry (or resolve --redeliver).
    pub operator_replay: bool,
    pub fence: i64,
    pub attempt: i32,
    pub key_generation: i32,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub outcome: AttemptOutcome,
    pub status: Option<i32>,
    pub provider_ref: Option<String>,
    pub error: Option<String>,
    pub replayed: bool,
    /// Not an attempt (deferred before any call): the attempt counter goes
    /// back down and no attempt row is written.
    pub uncounted: bool,
    /// The intent's next state (pending for a retry).
    pub state: IntentState,
    /// For a retry: when.
    pub run_after: Option<DateTime<Utc>>,
    /// For a rejection: the provider's answer.
    pub response: Option<Value>,
    /// The claim of the log's batch that held the intent ([`Claimed::log_batch`]).
    pub log_batch: Option<i64>,
}

/// A completion the database accepted (its fence still held).
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    pub id: i64,
    pub created_at: DateTime<Utc>,
}

/// What one completion statement did with its batch.
#[derive(Debug, Clone, Default)]
pub struct Written {
    /// Accepted: the fence still held, the intent moved on.
    pub accepted: Vec<Accepted>,
    /// Completions for intents that no longer exist (cancelled and purged
    /// while the attempt was in flight): nothing to record them on.
    pub gone: Vec<i64>,
}

/// The sweeper's reclaim of expired leases: $1 limit, $2 owner, $3 lease in
/// ms, $4 kinds to leave alone. (Called every `sweep_interval`, not per
/// batch: planning it per call costs nothing that matters.)
static CLAIM_EXPIRED_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH expired AS (
             SELECT id, owner AS previous_owner, updated_at AS previous_at FROM outbox.intent_rows
              WHERE state = 'claimed' AND lease_expires_at < now()
                AND kind <> ALL($4::text[])
              ORDER BY lease_expires_at
              LIMIT $1
              FOR UPDATE SKIP LOCKED),
         lost AS (
             INSERT INTO outbox.attempts (intent_id, attempt, fence, owner, started_at,
                                          finished_at, outcome, error, key_generation, accepted)
             SELECT i.id, i.attempts, i.fence, i.owner, i.updated_at, now(), 'lost',
                    format('lease held by %s expired at %s with no recorded outcome',
                           i.owner, i.lease_expires_at),
                    -- nothing was accepted: no completion arrived under this fence
                    i.key_generation, false
               FROM outbox.intent_rows i JOIN expired e ON e.id = i.id
             ON CONFLICT (intent_id, fence) DO NOTHING)
         UPDATE outbox.intent_rows i
            SET owner = $2, lease_expires_at = now() + $3 * interval '1 millisecond',
                fence = i.fence + 1, attempts = i.attempts + 1, updated_at = now()
           FROM expired e WHERE i.id = e.id
         RETURNING {CLAIMED_COLUMNS}, {WAL_MARK}, e.previous_owner, e.previous_at"
    )
});

/// When the first pending intent of a kind this relay serves ($1: the
/// kinds it does not) comes due, as seconds from now: the first of
/// `outbox.intent_rows` by `run_after`, and the first untaken one among the
/// first 1,000 intents of the log after its cursor (due at
/// its enqueue: an intent enqueued for later has its row). Two reads of an
/// index's start, whatever the backlog. The relay asks when a claim found
/// nothing, so an untaken log intent beyond the window (behind intents
/// claims took, held there by an open transaction) is not missed for long:
/// the next claim finds it, at the enqueue's notification or the poll.
pub const NEXT_DUE: &str = concat!(
    "SELECT extract(epoch FROM (min(d.run_after) - now()))::float8
       FROM ((SELECT r.run_after FROM outbox.intent_rows r
               WHERE r.state = 'pending' AND NOT r.waiting AND r.kind <> ALL($1::text[])
               ORDER BY r.run_after, r.id LIMIT 1)
             UNION ALL
             (SELECT f.run_after
                FROM (SELECT l.id, l.kind, l.run_after FROM outbox.intent_log_open l
                       WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                               ORDER BY c.seq DESC LIMIT 1)
                       ORDER BY l.xid, l.id LIMIT 1000) f
               -- probed after the limit, each on its own (see OLDEST_DUE)
               WHERE f.kind <> ALL($1::text[])
                 AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = f.id OFFSET 0)
                 AND ",
    log_untaken!("f"),
    "
               LIMIT 1)) d"
);

/// The completion statement (see [`Store::complete`]): $1..$14 and $16 the
/// completions as parallel arrays, $15 the owner.
///
/// Each intent is found by its primary key, never through an index on
/// `state`: `(i.state = 'claimed') IS TRUE` (the same test, `state` being
/// NOT NULL) is not something an index can answer. Written plainly, Postgres
/// may read every claimed intent through `intents_leases` or
/// `intents_unsettled` and match them against the batch, since the
/// statistics, taken while few rows happened to be claimed, say there is
/// about one: that costs in proportion to all the claims every relay holds
/// (docs/performance.md has the measurement). A test checks the plan.
pub const COMPLETE_SQL: &str = "WITH u AS (
                 SELECT v.*,
                        -- delivered at the intent's first attempt: kept on
                        -- the intent row, not in a row of outbox.attempts
                        (v.state = 'delivered' AND v.outcome = 'delivered' AND v.attempt = 1
                         AND NOT v.uncounted AND v.error IS NULL) AS first
                   FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::int[],
                               $5::timestamptz[], $6::timestamptz[], $7::text[], $8::int[],
                               $9::text[], $10::text[], $11::bool[], $12::text[],
                               $13::timestamptz[], $14::jsonb[], $16::bool[])
                     AS v(id, fence, attempt, key_generation, started_at, finished_at, outcome,
                          status, provider_ref, error, replayed, state, run_after, response,
                          uncounted)),
             done AS (
                 UPDATE outbox.intent_rows i
                    SET state = u.state,
                        attempts = i.attempts - CASE WHEN u.uncounted THEN 1 ELSE 0 END,
                        run_after = coalesce(u.run_after, i.run_after),
                        provider_ref = coalesce(u.provider_ref, i.provider_ref),
                        -- a delivery clears the reason of an earlier failure
                        -- (the attempts keep the history)
                        -- a deferral says why it waits (an open breaker, a
                        -- paused destination), or keeps the last reason
                        last_error = CASE WHEN u.uncounted THEN coalesce(u.error, i.last_error)
                                          WHEN u.state = 'delivered' THEN NULL
                                          ELSE coalesce(u.error, i.last_error) END,
                        response = coalesce(u.response, i.response),
                        owner = NULL, lease_expires_at = NULL, updated_at = now(),
                        delivered_at = CASE WHEN u.state = 'delivered' THEN now()
                                            ELSE i.delivered_at END,
                        first_attempt_started_at = CASE WHEN u.first THEN u.started_at
                                                        ELSE i.first_attempt_started_at END,
                        first_attempt_finished_at = CASE WHEN u.first THEN u.finished_at
                                                         ELSE i.first_attempt_finished_at END,
                        first_attempt_owner = CASE WHEN u.first THEN $15
                                                   ELSE i.first_attempt_owner END,
                        first_attempt_status = CASE WHEN u.first THEN u.status
                                                    ELSE i.first_attempt_status END,
                        first_attempt_replayed = CASE WHEN u.first THEN u.replayed
                                                      ELSE i.first_attempt_replayed END
                   FROM u
                  WHERE i.id = u.id AND i.fence = u.fence AND (i.state = 'claimed') IS TRUE
                 RETURNING i.id, i.created_at),
             recorded AS (
                 INSERT INTO outbox.attempts AS a (intent_id, attempt, fence, owner, started_at,
                        finished_at, outcome, status, provider_ref, error, replayed, accepted,
                        key_generation)
                 SELECT u.id, u.attempt, u.fence, $15, u.started_at, u.finished_at, u.outcome,
                        u.status, u.provider_ref, u.error, u.replayed, d.id IS NOT NULL,
                        u.key_generation
                   FROM u LEFT JOIN done d ON d.id = u.id
                  WHERE NOT u.uncounted
                    -- kept on the intent row
                    AND NOT (u.first AND d.id IS NOT NULL)
                    -- an intent cancelled and purged while its attempt was in
                    -- flight has no row left to hang the attempt on; the
                    -- same batch written again after a lost acknowledgement
                    -- finds a first attempt already on its row
                    AND (d.id IS NOT NULL
                         OR EXISTS (SELECT 1 FROM outbox.intent_rows g
                                     WHERE g.id = u.id
                                       AND NOT (g.fence = u.fence
                                                AND g.first_attempt_started_at IS NOT NULL)))
                 ON CONFLICT (intent_id, fence) DO UPDATE
                    SET finished_at = excluded.finished_at, outcome = excluded.outcome,
                        status = excluded.status, provider_ref = excluded.provider_ref,
                        error = concat_ws('; ', excluded.error,
                                          'reported after the lease had expired'),
                        replayed = excluded.replayed, accepted = false
                  WHERE a.outcome = 'lost')
             SELECT id, created_at, false AS gone FROM done
             UNION ALL
             SELECT u.id, NULL::timestamptz, true FROM u
              WHERE NOT EXISTS (SELECT 1 FROM done d WHERE d.id = u.id)
                AND NOT EXISTS (SELECT 1 FROM outbox.intent_log g WHERE g.id = u.id)
                -- a row outlives its retired segment of the log
                AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows g WHERE g.id = u.id)";

impl Store {
    /// Claim up to `limit` due pending intents for `owner` for `lease_ms`,
    /// skipping rows other relays hold and kinds this relay does not serve.
    /// (A relay builds its [`ClaimQuery`] once and calls [`Store::claim_with`].)
    pub async fn claim(
        &self,
        owner: &str,
        limit: i64,
        lease_ms: i64,
        unserved_kinds: &[String],
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let query = ClaimQuery::new(limit, unserved_kinds);
        self.claim_with(&query, owner, limit, lease_ms).await
    }

    /// Claim up to `limit` (at most the query's cap) due pending intents.
    pub async fn claim_with(
        &self,
        query: &ClaimQuery,
        owner: &str,
        limit: i64,
        lease_ms: i64,
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let claims = self
            .claim_setting_aside(query, owner, limit, lease_ms, &Aside::default())
            .await?;
        Ok(claims.claimed)
    }

    /// Claim up to `n` intents that have rows.
    async fn claim_rows(
        &self,
        query: &ClaimQuery,
        owner: &str,
        n: i64,
        lease_ms: i64,
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        let rows = sqlx::query(query.sql_for(n))
            .bind(n)
            .bind(owner)
            .bind(lease_ms)
            .fetch_all(&self.pool)
            .await?;
        claimed_from_rows(&rows, false)
    }

    /// [`Store::claim_with`], setting the intents of congested
    /// destinations (`aside`) met in the log aside.
    pub async fn claim_setting_aside(
        &self,
        query: &ClaimQuery,
        owner: &str,
        limit: i64,
        lease_ms: i64,
        aside: &Aside,
    ) -> Result<Claims, sqlx::Error> {
        let limit = limit.clamp(0, query.cap());
        let mut claimed = self.claim_rows(query, owner, limit, lease_ms).await?;
        let rest = limit - claimed.len() as i64;
        let mut from_log = self
            .claim_from_log(query, owner, rest, lease_ms, aside)
            .await?;
        claimed.append(&mut from_log.claimed);
        // the tail's intents, given their rows just now
        let room = limit - claimed.len() as i64;
        if from_log.to_rows > 0 && room > 0 {
            claimed.append(&mut self.claim_rows(query, owner, room, lease_ms).await?);
        }
        Ok(Claims {
            claimed,
            set_aside: from_log.set_aside,
            to_rows: from_log.to_rows,
        })
    }

    /// EXPLAIN (ANALYZE, BUFFERS) of the claim statement for `limit` rows,
    /// inside a transaction that is rolled back: nothing is claimed.
    pub async fn explain_claim(&self, limit: i64) -> Result<Vec<String>, sqlx::Error> {
        let query = ClaimQuery::new(limit, &[]);
        let mut tx = self.pool.begin().await?;
        let plan: Vec<String> =
            sqlx::query_scalar(&format!("EXPLAIN (ANALYZE, BUFFERS) {}", query.sql()))
                .bind(limit)
                .bind("explain")
                .bind(60_000i64)
                .fetch_all(&mut *tx)
                .await?;
        tx.rollback().await?;
        Ok(plan)
    }

    /// Reclaim up to `limit` intents whose lease expired. The lost attempt is
    /// recorded (outcome `lost`) and a new fence is issued, so the previous
    /// owner's late completion, if it ever comes, changes nothing.
    pub async fn claim_expired(
        &self,
        owner: &str,
        limit: i64,
        lease_ms: i64,
        unserved_kinds: &[String],
    ) -> Result<Vec<Claimed>, sqlx::Error> {
        self.settle_log_batches().await?;
        let rows = sqlx::query(&CLAIM_EXPIRED_SQL)
            .bind(limit)
            .bind(owner)
            .bind(lease_ms)
            .bind(unserved_kinds)
            .fetch_all(&self.pool)
            .await?;
        claimed_from_rows(&rows, true)
    }

    /// Record a batch of attempts and move each intent to its next state, in
    /// one statement. Each row is guarded by its fencing token: a completion
    /// whose claim has moved on (the sweeper reclaimed it, an operator
    /// cancelled it) changes nothing, and its attempt is kept with
    /// `accepted = false`. Returns the accepted completions.
    ///
    /// Idempotent: running the same batch twice (after a lost commit
    /// acknowledgement) changes nothing the second time.
    ///
    /// Provider text is made storable first ([`storable`](super::storable)):
    /// one hostile answer must not fail the statement for the whole batch.
    pub async fn complete(
        &self,
        owner: &str,
        batch: &[Completion],
    ) -> Result<Written, sqlx::Error> {
        if batch.is_empty() {
            return Ok(Written::default());
        }
        let first: Vec<&Completion> = batch.iter().filter(|c| first_delivery(c)).collect();
        let from_log = self.complete_from_log(owner, &first).await?;
        let logged: HashSet<i64> = from_log.iter().map(|a| a.id).collect();
        let rest: Vec<&Completion> = batch.iter().filter(|c| !logged.contains(&c.id)).collect();
        let mut written = self.complete_rows(owner, &rest).await?;
        written.accepted.extend(from_log);
        self.drop_finished_batches(&rest).await?;
        if !written.gone.is_empty() {
            self.note_effects_of_purged(batch, &written.gone).await?;
        }
        Ok(written)
    }

    /// The completions of intents that have their rows (or get them now:
    /// a log intent's attempt that did not deliver at once).
    async fn complete_rows(
        &self,
        owner: &str,
        batch: &[&Completion],
    ) -> Result<Written, sqlx::Error> {
        if batch.is_empty() {
            return Ok(Written::default());
        }
        self.track_claims(batch.iter().map(|c| (c.id, c.fence)))
            .await?;
        macro_rules! col {
            ($f:expr) => {
                batch.iter().map($f).collect::<Vec<_>>()
            };
        }
        let rows = sqlx::query(COMPLETE_SQL)
            .bind(col!(|c| c.id))
            .bind(col!(|c| c.fence))
            .bind(col!(|c| c.attempt))
            .bind(col!(|c| c.key_generation))
            .bind(col!(|c| c.started_at))
            .bind(col!(|c| c.finished_at))
            .bind(col!(|c| c.outcome.as_sql()))
            .bind(col!(|c| c.status))
            .bind(col!(|c| c
                .provider_ref
                .as_deref()
                .map(|r| storable::text(r, storable::MAX_REF_CHARS))))
            .bind(col!(|c| c
                .error
                .as_deref()
                .map(|e| storable::text(e, storable::MAX_ERROR_CHARS))))
            .bind(col!(|c| c.replayed))
            .bind(col!(|c| c.state.as_sql()))
            .bind(col!(|c| c.run_after))
            .bind(col!(|c| c.response.as_ref().map(storable::json)))
            .bind(owner)
            .bind(col!(|c| c.uncounted))
            .fetch_all(&self.pool)
            .await?;
        let mut written = Written::default();
        for r in &rows {
            let id: i64 = r.try_get("id")?;
            if r.try_get("gone")? {
                written.gone.push(id);
            } else {
                written.accepted.push(Accepted {
                    id,
                    created_at: r.try_get("created_at")?,
                });
            }
        }
        Ok(written)
    }

    /// A success reported for an intent purged while its attempt was in
    /// flight (cancelled, then purged) has no row to be recorded on: the
    /// ledger notes that its effect happened, and when, and the provider's
    /// reference when it kept none. Idempotent, like the completion.
    async fn note_effects_of_purged(
        &self,
        batch: &[Completion],
        gone: &[i64],
    ) -> Result<(), sqlx::Error> {
        let happened: Vec<&Completion> = batch
            .iter()
            .filter(|c| gone.contains(&c.id) && c.outcome == AttemptOutcome::Delivered)
            .collect();
        if happened.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE outbox.ledger l
                SET effect_at = greatest(l.effect_at, v.finished_at),
                    provider_ref = coalesce(l.provider_ref, v.provider_ref)
               FROM unnest($1::bigint[], $2::timestamptz[], $3::text[])
                    AS v(id, finished_at, provider_ref)
              WHERE l.intent_id = v.id",
        )
        .bind(happened.iter().map(|c| c.id).collect::<Vec<_>>())
        .bind(happened.iter().map(|c| c.finished_at).collect::<Vec<_>>())
        .bind(
            happened
                .iter()
                .map(|c| {
                    c.provider_ref
                        .as_deref()
                        .map(|r| storable::text(r, storable::MAX_REF_CHARS))
                })
                .collect::<Vec<_>>(),
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Of these completions, the ones an earlier run of the same statement
    /// already recorded as accepted (its commit was acknowledged too late
    /// to be seen): the attempt of their fence is in outbox.attempt_history,
    /// accepted. A
    /// completer that retries a batch after an unknown commit result counts
    /// these as written, not as fencing rejections.
    pub async fn already_completed(
        &self,
        batch: &[Completion],
    ) -> Result<Vec<Accepted>, sqlx::Error> {
        let ids: Vec<i64> = batch.iter().map(|c| c.id).collect();
        let fences: Vec<i64> = batch.iter().map(|c| c.fence).collect();
        let rows = sqlx::query(
            "SELECT i.id, i.created_at
               FROM unnest($1::bigint[], $2::bigint[]) AS u(id, fence)
               JOIN outbox.intents i ON i.id = u.id
              WHERE EXISTS (SELECT 1 FROM outbox.attempt_history a
                             WHERE a.intent_id = u.id AND a.fence = u.fence AND a.accepted)",
        )
        .bind(ids)
        .bind(fences)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(Accepted {
                    id: r.try_get("id")?,
                    created_at: r.try_get("created_at")?,
                })
            })
            .collect()
    }

    /// Hand claims back untouched (shutdown before the effect started): the
    /// intents become pending again and the attempt is not counted.
    pub async fn release(&self, claims: &[(i64, i64)]) -> Result<u64, sqlx::Error> {
        if claims.is_empty() {
            return Ok(0);
        }
        self.track_claims(claims.iter().copied()).await?;
        let ids: Vec<i64> = claims.iter().map(|c| c.0).collect();
        let fences: Vec<i64> = claims.iter().map(|c| c.1).collect();
        let done = sqlx::query(
            "UPDATE outbox.intent_rows i
                SET state = 'pending', owner = NULL, lease_expires_at = NULL,
                    attempts = i.attempts - 1, updated_at = now()
               FROM unnest($1::bigint[], $2::bigint[]) AS u(id, fence)
              -- by primary key, as in COMPLETE_SQL
              WHERE i.id = u.id AND i.fence = u.fence AND (i.state = 'claimed') IS TRUE",
        )
        .bind(ids)
        .bind(fences)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }

    /// Fold duplicate enqueues into `intents.duplicates`, exactly once across
    /// any number of relays. Returns how many were folded, per kind and source.
    pub async fn fold_duplicates(
        &self,
        limit: i64,
    ) -> Result<Vec<(String, Option<String>, i64)>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let taken: Vec<(i64, Option<String>, Option<String>)> = sqlx::query_as(
            "DELETE FROM outbox.enqueue_duplicates
              WHERE id IN (SELECT id FROM outbox.enqueue_duplicates ORDER BY id
                           LIMIT $1 FOR UPDATE SKIP LOCKED)
             RETURNING intent_id, source, kind",
        )
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if taken.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<i64> = taken.iter().map(|d| d.0).collect();
        let sources: Vec<Option<String>> = taken.iter().map(|d| d.1.clone()).collect();
        let kinds: Vec<Option<String>> = taken.iter().map(|d| d.2.clone()).collect();
        // the count lives on the row: a log intent gets one
        sqlx::query("SELECT count(*) FROM outbox.track($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        let folded = sqlx::query_as(
            "WITH d AS (SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])
                                 AS d(intent_id, source, kind)),
             per_intent AS (
                 UPDATE outbox.intent_rows i SET duplicates = i.duplicates + c.n
                   FROM (SELECT intent_id, count(*)::int AS n FROM d GROUP BY intent_id) c
                  WHERE i.id = c.intent_id),
             total AS (
                 -- the all-time count `stats` reports, kept past purges
                 UPDATE outbox.totals SET value = value + (SELECT count(*) FROM d)
                  WHERE name = 'duplicate_enqueues')
             SELECT coalesce(d.kind, i.kind, 'unknown'), d.source, count(*)
               FROM d LEFT JOIN outbox.intent_log i ON i.id = d.intent_id
              GROUP BY 1, 2",
        )
        .bind(&ids)
        .bind(&sources)
        .bind(&kinds)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(folded)
    }

    /// Seconds until the earliest pending intent of a kind this relay
    /// serves becomes due (negative when one is overdue), or `None` when
    /// nothing is pending ([`NEXT_DUE`]).
    pub async fn next_due_in(&self, unserved_kinds: &[String]) -> Result<Option<f64>, sqlx::Error> {
        sqlx::query_scalar(NEXT_DUE)
            .bind(unserved_kinds)
            .fetch_one(&self.pool)
            .await
    }
}
