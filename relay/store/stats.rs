//! What `stats`, the console's overview and the gauges count: intents by
//! kind and state, what is due, expired leases, folded duplicates, ordering
//! keys blocked or stranded, the ledger's size, kinds no relay serves.

use serde::Serialize;
use sqlx::FromRow;

use super::{Store, StoreError};
use crate::state::IntentState;

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct StatsRow {
    pub kind: String,
    #[sqlx(try_from = "String")]
    pub state: IntentState,
    pub count: i64,
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct DueRow {
    pub kind: String,
    pub due: i64,
    pub oldest_due_seconds: f64,
}

/// What the gauges read ([`Store::stats_for_gauges`]).
#[derive(Debug, Clone, Default)]
pub struct GaugeStats {
    /// (kind, state, count) of the non-terminal states.
    pub counts: Vec<(String, String, i64)>,
    /// (kind, seconds) of the oldest due intent.
    pub oldest: Vec<(String, f64)>,
    /// Ordering keys whose oldest live intent is dead or ambiguous.
    pub blocked: i64,
    /// Intents waiting with no live intent ahead in their ordering key.
    pub stranded: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub by_state: Vec<StatsRow>,
    pub due: Vec<DueRow>,
    pub expired_leases: i64,
    pub duplicate_enqueues: i64,
    /// Ordering keys whose oldest live intent is dead or ambiguous: that key
    /// waits for an operator (cancel, retry or resolve the head).
    pub blocked_ordering_keys: i64,
    /// Intents that wait with no live intent ahead of them in their
    /// ordering key but waiting ones (a race left the first so): the
    /// sweeper promotes the first on its next pass, so this reads 0 one
    /// sweep later.
    pub stranded_ordering_intents: i64,
    /// Purged intents whose keys the ledger still remembers (estimated
    /// from the table statistics past 100,000 keys: `stats` never counts a
    /// long history row by row).
    pub ledger_keys: i64,
    pub ledger_keys_estimated: bool,
    /// Pending intents whose kind no live relay delivers, and which live
    /// relays know the kind without being configured for it.
    pub unserved_kinds: Vec<super::fleet::UnservedKind>,
    /// Live relays whose deliveries wait for standbys to flush their
    /// intents' commits (`relay.wait_for_standbys`).
    pub standby_waits: Vec<super::standbys::StandbyWait>,
}

/// Ordering keys whose oldest live intent is dead or ambiguous. Reads the
/// dead and ambiguous intents that have a key (`intents_blocked`) and one
/// index probe each, never the backlog queued behind them.
const BLOCKED_KEYS: &str = "SELECT count(DISTINCT h.ordering_key) FROM outbox.intents h
     WHERE h.ordering_key IS NOT NULL AND h.state IN ('dead', 'ambiguous')
       AND NOT EXISTS (SELECT 1 FROM outbox.intents e
                        WHERE e.ordering_key = h.ordering_key AND e.id < h.id
                          AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'))";

impl Store {
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        let by_state = sqlx::query_as(
            "SELECT kind, state, count(*) AS count FROM outbox.intents GROUP BY kind, state ORDER BY kind, state",
        )
        .fetch_all(&self.pool)
        .await?;
        let due = sqlx::query_as(
            "SELECT kind, count(*) AS due,
                    extract(epoch FROM now() - min(run_after))::float8 AS oldest_due_seconds
               FROM outbox.intents WHERE state = 'pending' AND run_after <= now()
              GROUP BY kind ORDER BY kind",
        )
        .fetch_all(&self.pool)
        .await?;
        // duplicates: the running total the sweeper folds into, plus those
        // not folded yet; the ledger: counted while small, else estimated
        let (expired_leases, duplicate_enqueues, ledger_keys, ledger_keys_estimated): (
            i64,
            i64,
            i64,
            bool,
        ) = sqlx::query_as(
            "WITH est AS (SELECT reltuples::bigint AS n FROM pg_class
                           WHERE oid = 'outbox.ledger'::regclass)
             SELECT (SELECT count(*) FROM outbox.intents
                      WHERE state = 'claimed' AND lease_expires_at < now()),
                    (SELECT coalesce(sum(value), 0)::bigint FROM outbox.totals
                      WHERE name = 'duplicate_enqueues')
                    + (SELECT count(*) FROM outbox.enqueue_duplicates),
                    CASE WHEN (SELECT n FROM est) < 100000
                         THEN (SELECT count(*) FROM outbox.ledger)
                         ELSE (SELECT n FROM est) END,
                    (SELECT n FROM est) >= 100000",
        )
        .fetch_one(&self.pool)
        .await?;
        let unserved_kinds = self.unserved_kinds().await?;
        let blocked_ordering_keys: i64 = sqlx::query_scalar(BLOCKED_KEYS)
            .fetch_one(&self.pool)
            .await?;
        let stranded_ordering_intents = self.stranded_ordering_intents().await?;
        let standby_waits = self.standby_waits().await?;
        Ok(Stats {
            standby_waits,
            by_state,
            due,
            expired_leases,
            duplicate_enqueues,
            blocked_ordering_keys,
            stranded_ordering_intents,
            ledger_keys,
            ledger_keys_estimated,
            unserved_kinds,
        })
    }

    /// The live queue for the gauges, cheaply: counts of the non-terminal
    /// states (pending, claimed, ambiguous, dead) by kind, from the
    /// (state, kind) index, and the age of the oldest due intent per kind,
    /// from the due index, the blocked ordering keys and the intents
    /// waiting with nothing live ahead. Delivered history is never scanned.
    pub async fn stats_for_gauges(&self) -> Result<GaugeStats, sqlx::Error> {
        let counts = sqlx::query_as(
            "SELECT kind, state, count(*) FROM outbox.intents
              WHERE state IN ('pending', 'claimed', 'ambiguous', 'dead') GROUP BY kind, state",
        )
        .fetch_all(&self.pool)
        .await?;
        let oldest = sqlx::query_as(
            "SELECT kind, extract(epoch FROM now() - min(run_after))::float8 FROM outbox.intents
              WHERE state = 'pending' AND run_after <= now() GROUP BY kind",
        )
        .fetch_all(&self.pool)
        .await?;
        let blocked: i64 = sqlx::query_scalar(BLOCKED_KEYS)
            .fetch_one(&self.pool)
            .await?;
        let stranded = self.stranded_ordering_intents().await?;
        Ok(GaugeStats {
            counts,
            oldest,
            blocked,
            stranded,
        })
    }

    /// Ordering keys whose oldest live intent is dead or ambiguous.
    pub async fn blocked_ordering_keys(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(BLOCKED_KEYS).fetch_one(&self.pool).await
    }
}
