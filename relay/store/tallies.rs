//! The live queue as the gauges read it: `outbox.tallies` (schema 0033),
//! kept by triggers and folded by `outbox.fold_tallies()`, whose cost
//! follows what changed since the last fold; the intents claimed from the
//! log, counted from the batches in flight; and the oldest due intent per
//! kind, from the first intents in claim order. None of them reads the
//! backlog, so their cost does not grow with it.

use super::Store;

/// Live intents by kind and state: the tallies with the deltas not folded
/// yet (`log`, the log intents no claim has taken, are pending) and the
/// log intents in a claim's batch without an outcome or a row yet
/// (claimed), each probed on its own (OFFSET 0: as an anti join, a plan
/// may hash all of `intent_rows`). The deltas are read in the same
/// snapshot as the batches: a batch committed after the last fold takes
/// its intents out of `log` here as it counts them claimed, not twice.
pub const TALLY_COUNTS: &str = "SELECT kind, state, sum(n)::bigint
       FROM (SELECT kind, CASE state WHEN 'log' THEN 'pending' ELSE state END AS state, n
               FROM (SELECT kind, state, n FROM outbox.tallies
                     UNION ALL
                     SELECT x.kind, x.state, x.n
                       FROM outbox.tally_deltas d
                            CROSS JOIN LATERAL unnest(d.kinds, d.states, d.ns) AS x(kind, state, n)) t
             UNION ALL
             SELECT l.kind, 'claimed', 1
               FROM outbox.log_batches b CROSS JOIN LATERAL unnest(b.ids) AS x(id)
               JOIN outbox.intent_log_batchable l ON l.id = x.id
              WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o
                                 WHERE o.intent_id = x.id OFFSET 0)
                AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t
                                 WHERE t.id = x.id OFFSET 0)) c
      GROUP BY 1, 2 HAVING sum(n) > 0";

/// Pending and claimed intents per destination: the tallies' groups with
/// the deltas not folded yet (as in [`TALLY_COUNTS`]) and the log's
/// claimed intents, `outbox.destination_of` once per group.
pub const TALLY_BACKLOG: &str = "SELECT outbox.destination_of(kind, destination,
                                  jsonb_build_object('url', url, 'subscription', subscription)),
        sum(n)::bigint
   FROM (SELECT kind, destination, subscription, url, n
           FROM (SELECT kind, destination, subscription, url, state, n FROM outbox.tallies
                 UNION ALL
                 SELECT x.*
                   FROM outbox.tally_deltas d
                        CROSS JOIN LATERAL unnest(d.kinds, d.destinations, d.subscriptions, d.urls,
                                                  d.states, d.ns)
                            AS x(kind, destination, subscription, url, state, n)) t
          WHERE state IN ('log', 'pending', 'claimed')
         UNION ALL
         SELECT l.kind, l.destination,
                outbox.tally_subscription(l.kind, l.destination, l.payload),
                outbox.tally_url(l.kind, l.destination, l.payload), 1
           FROM outbox.log_batches b CROSS JOIN LATERAL unnest(b.ids) AS x(id)
           JOIN outbox.intent_log_batchable l ON l.id = x.id
          WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes_open o
                             WHERE o.intent_id = x.id OFFSET 0)
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = x.id OFFSET 0)) g
  GROUP BY 1 HAVING sum(n) > 0";

/// How many intents each side of [`OLDEST_DUE`] looks at.
pub const OLDEST_DUE_WINDOW: i64 = 1000;

/// The oldest due intent per kind among the first [`OLDEST_DUE_WINDOW`]
/// intents of the log after its cursor (in claim order; those no claim
/// took and without a row) and the first due ones of `outbox.intent_rows`
/// (by `run_after`), as (kind, seconds); and a row with no kind whose
/// seconds bound every kind not seen, when a window was full: a kind
/// behind a full window has waited at most as long as that window's
/// newest intent.
pub const OLDEST_DUE: &str = concat!(
    "WITH first AS (
             SELECT l.id, l.kind, l.run_after
               FROM outbox.intent_log_open l
              WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                      ORDER BY c.seq DESC LIMIT 1)
              ORDER BY l.xid, l.id LIMIT 1000),
         -- probed after the limit, each a probe of its own (OFFSET 0): in
         -- the scan, a plan that guesses few intents after the cursor reads
         -- and sorts them all; as anti joins, it hashes whole tables
         log AS (
             SELECT f.kind, f.run_after FROM first f
              WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = f.id OFFSET 0)
                AND ",
    log_untaken!("f"),
    "),
         rows AS (
             SELECT kind, run_after FROM outbox.intent_rows
              WHERE state = 'pending' AND NOT waiting AND run_after <= now()
              ORDER BY run_after, id LIMIT 1000),
         bounds AS (
             SELECT max(run_after) AS newest FROM first HAVING count(*) >= 1000
             UNION ALL
             SELECT max(run_after) FROM rows HAVING count(*) >= 1000)
     SELECT kind, extract(epoch FROM now() - min(run_after))::float8
       FROM (SELECT * FROM log UNION ALL SELECT * FROM rows) w
      GROUP BY kind
     UNION ALL
     SELECT NULL, extract(epoch FROM now() - max(newest))::float8 FROM bounds
     HAVING count(*) > 0"
);

/// The oldest due intent per kind ([`Store::oldest_due`]).
#[derive(Debug, Clone, Default)]
pub struct OldestDue {
    /// (kind, seconds) of the kinds seen.
    pub seen: Vec<(String, f64)>,
    /// At most how long any kind not seen has waited, when a window was
    /// full; None: a kind not seen has nothing due.
    pub bound: Option<f64>,
}

impl OldestDue {
    /// Seconds the oldest due intent of `kind` has waited, given that it
    /// has `pending` intents.
    pub fn of(&self, kind: &str, pending: i64) -> f64 {
        match self.seen.iter().find(|(k, _)| k == kind) {
            Some((_, s)) => *s,
            None if pending > 0 => self.bound.unwrap_or(0.0),
            None => 0.0,
        }
    }
}

impl Store {
    /// Fold what changed since the last fold into `outbox.tallies`; false
    /// when another session was folding. Its fold then serves the read that
    /// follows, once it has committed: until then the deltas of the claims
    /// it folds away are in the snapshot, and the arrivals it counts are
    /// not (a relay's gauges fold from two tasks, so a read right after a
    /// refused fold counted intents a claim took before any fold as gone).
    /// So this waits for that fold's transaction to end (sharing the lock
    /// with a purge, which takes it shared).
    pub async fn fold_tallies(&self) -> Result<bool, sqlx::Error> {
        let folded: bool = sqlx::query_scalar("SELECT outbox.fold_tallies()")
            .fetch_one(&self.pool)
            .await?;
        if !folded {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock_shared(20291, 2)")
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
        }
        Ok(folded)
    }

    /// Live intents by (kind, state), from the tallies as last folded.
    pub async fn tallied_counts(&self) -> Result<Vec<(String, String, i64)>, sqlx::Error> {
        sqlx::query_as(TALLY_COUNTS).fetch_all(&self.pool).await
    }

    /// Intents pending, due or scheduled, from the tallies folded first:
    /// what the summary line reports as the backlog, read at the cost of
    /// what changed since the last fold, not of the backlog.
    pub async fn pending_count(&self) -> Result<i64, sqlx::Error> {
        self.fold_tallies().await?;
        Ok(self
            .tallied_counts()
            .await?
            .iter()
            .filter(|(_, state, _)| state == "pending")
            .map(|(_, _, n)| n)
            .sum())
    }

    /// Pending and claimed intents per destination, from the tallies as
    /// last folded (None: the payload names none).
    pub async fn tallied_backlogs(&self) -> Result<Vec<(Option<String>, i64)>, sqlx::Error> {
        sqlx::query_as(TALLY_BACKLOG).fetch_all(&self.pool).await
    }

    /// The oldest due intent per kind, from the first due intents only.
    pub async fn oldest_due(&self) -> Result<OldestDue, sqlx::Error> {
        let rows: Vec<(Option<String>, f64)> =
            sqlx::query_as(OLDEST_DUE).fetch_all(&self.pool).await?;
        let mut due = OldestDue::default();
        for (kind, seconds) in rows {
            match kind {
                Some(kind) => due.seen.push((kind, seconds.max(0.0))),
                None => due.bound = Some(seconds.max(0.0)),
            }
        }
        Ok(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_due_window_is_written_into_the_statement() {
        let limit = format!("LIMIT {OLDEST_DUE_WINDOW})");
        assert_eq!(OLDEST_DUE.matches(&limit).count(), 2);
        let full = format!("count(*) >= {OLDEST_DUE_WINDOW}");
        assert_eq!(OLDEST_DUE.matches(&full).count(), 2);
    }

    #[test]
    fn a_kind_not_seen_waited_at_most_the_bound() {
        let due = OldestDue {
            seen: vec![("webhook".into(), 12.0)],
            bound: Some(3.0),
        };
        assert_eq!(due.of("webhook", 5), 12.0);
        assert_eq!(due.of("email", 2), 3.0);
        assert_eq!(due.of("email", 0), 0.0);
        let none = OldestDue::default();
        assert_eq!(none.of("email", 2), 0.0);
    }
}
