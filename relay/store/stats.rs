//! What `stats`, the console's overview and the gauges count: intents by
//! kind and state, what is due, expired leases, folded duplicates, ordering
//! keys blocked or stranded, the ledger's size, kinds no relay serves, and
//! what holds back the database's xmin horizon.

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

/// The oldest of one kind of holder of the xmin horizon that vacuum of the
/// outbox's tables obeys ([`Store::xmin_horizon`]).
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct XminHolder {
    /// `transaction` (a session of this database holding a snapshot or a
    /// transaction id), `prepared`, `replication_slot` or `standby` (a
    /// walsender with hot_standby_feedback and no slot).
    pub holder: String,
    /// Transaction ids assigned since its xmin: `age(xmin)`.
    pub age_transactions: i64,
    /// Seconds since it began, where known: the start of the transaction
    /// of the earliest session holding that xmin (other roles' sessions
    /// only with pg_read_all_stats), a prepared transaction's prepare time;
    /// None for slots and standbys.
    pub age_seconds: Option<f64>,
}

impl XminHolder {
    /// A phrase for `stats`: "a transaction open for 95s, 1234
    /// transaction(s) back".
    pub fn describe(&self) -> String {
        let what = match self.holder.as_str() {
            "transaction" => "a transaction",
            "prepared" => "a prepared transaction",
            "replication_slot" => "a replication slot",
            "standby" => "a standby (hot_standby_feedback)",
            other => other,
        };
        let since = match self.age_seconds {
            Some(s) => format!(" open for {s:.0}s"),
            None if self.holder == "transaction" => {
                " (when it began is hidden from this role: pg_read_all_stats)".to_string()
            }
            None => String::new(),
        };
        format!(
            "{what}{since}, {} transaction(s) back",
            self.age_transactions
        )
    }
}

/// The oldest xmin of each kind of holder, as the data horizon of this
/// database counts them (PostgreSQL 14 and later): sessions of this
/// database and walsenders with hot_standby_feedback (no database), by the
/// older of their snapshot's xmin and their transaction id; prepared
/// transactions of this database; every replication slot's `xmin` (a
/// logical slot's `catalog_xmin` holds back only the system catalogs).
/// Not counted: this query's own session, and processes with no role
/// (autovacuum: a vacuum's snapshot holds back no other vacuum).
///
/// The xmins are visible to every role, a session's `xact_start` of
/// another role only to members of pg_read_all_stats. Sessions often share
/// the oldest xmin (every snapshot taken while the oldest transaction runs
/// starts there): the seconds are those of the earliest visible among them,
/// so without that role they may be less than the holder's, or unknown.
const XMIN_HORIZON: &str = "WITH held AS (
         SELECT CASE WHEN datid IS NULL THEN 'standby' ELSE 'transaction' END AS holder,
                greatest(age(backend_xmin), age(backend_xid)) AS xids,
                extract(epoch FROM now() - xact_start)::float8 AS secs
           FROM pg_stat_activity
          WHERE pid <> pg_backend_pid() AND usesysid IS NOT NULL
            AND (datid IS NULL OR datname = current_database())
            AND coalesce(backend_xmin, backend_xid) IS NOT NULL
         UNION ALL
         SELECT 'prepared', age(transaction), extract(epoch FROM now() - prepared)::float8
           FROM pg_prepared_xacts WHERE database = current_database()
         UNION ALL
         SELECT 'replication_slot', age(xmin), NULL FROM pg_replication_slots
          WHERE xmin IS NOT NULL),
     oldest AS (
         SELECT DISTINCT ON (holder) holder, xids::bigint AS age_transactions,
                secs AS age_seconds
           FROM held ORDER BY holder, xids DESC, secs DESC NULLS LAST)
     SELECT * FROM oldest ORDER BY age_transactions DESC, holder";

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
    /// What holds back the xmin horizon, oldest first ([`XminHolder`]).
    pub xmin_horizon: Vec<XminHolder>,
}

/// Ordering keys whose oldest live intent is dead or ambiguous. Reads the
/// dead and ambiguous intents that have a key (`intents_blocked`) and one
/// index probe each, never the backlog queued behind them. Dead and
/// ambiguous intents, and every intent with an ordering key, have their
/// rows in `outbox.intent_rows`: the log is never read.
const BLOCKED_KEYS: &str = "SELECT count(DISTINCT h.ordering_key) FROM outbox.intent_rows h
     WHERE h.ordering_key IS NOT NULL AND h.state IN ('dead', 'ambiguous')
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows e
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
        let xmin_horizon = self.xmin_horizon().await?;
        Ok(Stats {
            standby_waits,
            xmin_horizon,
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

    /// The live queue for the gauges: counts of the non-terminal states
    /// (pending, claimed, ambiguous, dead) by kind from the tallies, folded
    /// first ([`super::tallies`]), the age of the oldest due intent per kind
    /// from the first due intents, the blocked ordering keys and the
    /// intents waiting with nothing live ahead among the keys noted for the
    /// next sweep. None of them reads the backlog.
    pub async fn stats_for_gauges(&self) -> Result<GaugeStats, sqlx::Error> {
        self.fold_tallies().await?;
        let counts = self.tallied_counts().await?;
        let due = self.oldest_due().await?;
        let mut kinds: Vec<(&str, i64)> = counts
            .iter()
            .filter(|(_, state, _)| state == "pending")
            .map(|(kind, _, n)| (kind.as_str(), *n))
            .collect();
        for (kind, _) in &due.seen {
            if !kinds.iter().any(|(k, _)| k == kind) {
                kinds.push((kind.as_str(), 0));
            }
        }
        let oldest = kinds
            .into_iter()
            .map(|(kind, pending)| (kind.to_string(), due.of(kind, pending)))
            .collect();
        let blocked: i64 = sqlx::query_scalar(BLOCKED_KEYS)
            .fetch_one(&self.pool)
            .await?;
        let stranded = self.noted_stranded_ordering_intents().await?;
        Ok(GaugeStats {
            counts,
            oldest,
            blocked,
            stranded,
        })
    }

    /// What holds back the xmin horizon of this database's tables: the
    /// oldest of each kind of holder, oldest first (see [`XminHolder`]).
    pub async fn xmin_horizon(&self) -> Result<Vec<XminHolder>, sqlx::Error> {
        sqlx::query_as(XMIN_HORIZON).fetch_all(&self.pool).await
    }

    /// Ordering keys whose oldest live intent is dead or ambiguous.
    pub async fn blocked_ordering_keys(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(BLOCKED_KEYS).fetch_one(&self.pool).await
    }
}
