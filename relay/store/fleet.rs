//! The fleet registry (`outbox.relays`) and the ordering upkeep the
//! sweeper runs.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::claims::RELAY_TTL_SECS;
use super::Store;

/// One relay as the registry knows it.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct RelayRow {
    pub owner: String,
    pub version: String,
    pub kinds: Vec<String>,
    pub known_kinds: Vec<String>,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    /// Heartbeat within the TTL and not stopped.
    pub live: bool,
}

/// Pending intents whose kind no live relay delivers, and why.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct UnservedKind {
    pub kind: String,
    pub pending: i64,
    /// Live relays that know the kind but are not configured for it.
    pub known_by: Vec<String>,
}

impl Store {
    /// Register (or re-register) this relay, heartbeat now.
    pub async fn register_relay(
        &self,
        owner: &str,
        version: &str,
        kinds: &[&str],
        known_kinds: &[&str],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO outbox.relays (owner, version, kinds, known_kinds)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (owner) DO UPDATE
                SET version = excluded.version, kinds = excluded.kinds,
                    known_kinds = excluded.known_kinds, heartbeat_at = now(), stopped_at = NULL",
        )
        .bind(owner)
        .bind(version)
        .bind(kinds)
        .bind(known_kinds)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forget relays whose last heartbeat is a day old.
    pub async fn forget_silent_relays(&self) -> Result<u64, sqlx::Error> {
        Ok(
            sqlx::query("DELETE FROM outbox.relays WHERE heartbeat_at < now() - interval '1 day'")
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }

    /// Mark this relay stopped (a clean shutdown).
    pub async fn deregister_relay(&self, owner: &str) -> Result<(), sqlx::Error> {
        sqlx::query("UPDATE outbox.relays SET stopped_at = now() WHERE owner = $1")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The fleet, live relays first, newest heartbeat first.
    pub async fn relays(&self) -> Result<Vec<RelayRow>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT owner, version, kinds, known_kinds, started_at, heartbeat_at, stopped_at,
                    (stopped_at IS NULL
                     AND heartbeat_at > now() - interval '{RELAY_TTL_SECS} seconds') AS live
               FROM outbox.relays ORDER BY live DESC, heartbeat_at DESC"
        ))
        .fetch_all(&self.pool)
        .await
    }

    /// The live relays' kinds: `(known, delivered)`, each sorted and
    /// deduplicated across the fleet; both empty when no relay is live.
    pub async fn live_kinds(&self) -> Result<(Vec<String>, Vec<String>), sqlx::Error> {
        sqlx::query_as(&format!(
            "WITH live AS (
                 SELECT kinds, known_kinds FROM outbox.relays
                  WHERE stopped_at IS NULL
                    AND heartbeat_at > now() - interval '{RELAY_TTL_SECS} seconds')
             SELECT coalesce((SELECT array_agg(DISTINCT k ORDER BY k)
                                FROM live, unnest(known_kinds) k), '{{}}'),
                    coalesce((SELECT array_agg(DISTINCT k ORDER BY k)
                                FROM live, unnest(kinds) k), '{{}}')"
        ))
        .fetch_one(&self.pool)
        .await
    }

    /// Kinds with pending intents that no live relay delivers.
    pub async fn unserved_kinds(&self) -> Result<Vec<UnservedKind>, sqlx::Error> {
        sqlx::query_as(&format!(
            "WITH live AS (
                 SELECT owner, kinds, known_kinds FROM outbox.relays
                  WHERE stopped_at IS NULL
                    AND heartbeat_at > now() - interval '{RELAY_TTL_SECS} seconds'),
             pending AS (
                 SELECT kind, count(*) AS pending FROM outbox.intents
                  WHERE state = 'pending' GROUP BY kind)
             SELECT p.kind, p.pending,
                    coalesce((SELECT array_agg(l.owner ORDER BY l.owner) FROM live l
                               WHERE p.kind = ANY(l.known_kinds)), '{{}}') AS known_by
               FROM pending p
              -- with no live relay registered (older relays, `run --once`)
              -- there is nothing to say
              WHERE EXISTS (SELECT 1 FROM live)
                AND NOT EXISTS (SELECT 1 FROM live l WHERE p.kind = ANY(l.kinds))
              ORDER BY p.kind"
        ))
        .fetch_all(&self.pool)
        .await
    }

    /// Promote the intents that wait with nothing live ahead of them in
    /// their ordering key. An intent enqueued behind a live one waits
    /// outside the claim index until a trigger promotes it when the one
    /// ahead finishes; an enqueue that commits while the one ahead is
    /// finishing is missed by that trigger. Every event that can leave a
    /// key so notes the key in `outbox.ordering_rechecks` (schema 0012);
    /// this takes the notes present now, `batch` at a time (one short
    /// transaction each), and looks only at those keys: the cost follows
    /// what was enqueued since the last pass, not how many keys wait.
    pub async fn promote_stranded_heads(&self, batch: i32) -> Result<Recheck, sqlx::Error> {
        let upto: Option<i64> = sqlx::query_scalar("SELECT max(id) FROM outbox.ordering_rechecks")
            .fetch_one(&self.pool)
            .await?;
        let mut done = Recheck::default();
        let Some(upto) = upto else {
            return Ok(done);
        };
        loop {
            let (taken, checked, promoted): (i32, i32, i32) = sqlx::query_as(
                "SELECT taken, checked, promoted FROM outbox.recheck_ordering_keys($1, $2)",
            )
            .bind(batch)
            .bind(upto)
            .fetch_one(&self.pool)
            .await?;
            done.keys += checked as u64;
            done.promoted += promoted as u64;
            if taken < batch {
                return Ok(done);
            }
        }
    }

    /// Intents that wait with no live intent ahead of them in their
    /// ordering key other than waiting ones: nothing would promote them but
    /// the sweeper, which does on its next pass (so this reads 0 after it).
    pub async fn stranded_ordering_intents(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(STRANDED).fetch_one(&self.pool).await
    }

    /// The same count over the keys noted for the next sweep only: what
    /// that sweep will promote. Its cost follows the notes taken since the
    /// last sweep, not how many intents wait, so the gauges read it every
    /// few seconds; `stats` reads every key ([`Store::stranded_ordering_intents`]).
    pub async fn noted_stranded_ordering_intents(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(STRANDED_NOTED)
            .fetch_one(&self.pool)
            .await
    }
}

/// What one sweep of the noted ordering keys did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recheck {
    /// Keys looked at.
    pub keys: u64,
    /// Intents promoted into the claim index.
    pub promoted: u64,
}

/// Every waiting intent with no live intent ahead of it that is not
/// waiting itself: the first waiting intent of a key nothing will promote,
/// and those behind it. One pass over `intents_waiting` with a probe of
/// `intents_ordering` each (about 110 ms beside 100,000 waiting intents,
/// docs/performance.md). Every intent with an ordering key has its row in
/// `outbox.intent_rows` from its enqueue on (`outbox.log_track`), so these
/// read that table, never the log behind the `outbox.intents` view.
pub(crate) const STRANDED: &str = "SELECT count(*) FROM outbox.intent_rows w
      WHERE w.waiting AND w.state = 'pending'
        AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows e
                         WHERE e.ordering_key = w.ordering_key AND e.id < w.id AND NOT e.waiting
                           AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'))";

/// [`STRANDED`] over the keys in `outbox.ordering_rechecks`: a probe of
/// `intents_waiting` per noted key (lateral, so that it is never planned as
/// a join over every waiting intent).
pub(crate) const STRANDED_NOTED: &str = "SELECT count(*)
       FROM (SELECT DISTINCT r.ordering_key FROM outbox.ordering_rechecks r) k
      CROSS JOIN LATERAL (
            SELECT 1 FROM outbox.intent_rows w
             WHERE w.ordering_key = k.ordering_key AND w.waiting AND w.state = 'pending'
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows e
                                WHERE e.ordering_key = w.ordering_key AND e.id < w.id
                                  AND NOT e.waiting
                                  AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'))) s";
