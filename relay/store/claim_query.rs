//! The claim statement of one relay: a ladder of texts with the relay's
//! cap and the kinds it leaves alone written in, so that Postgres plans
//! each once per connection.

use crate::kinds::Kind;

/// What a claim returns of each row, the claim's and the sweeper's alike.
pub(super) const CLAIMED_COLUMNS: &str =
    "i.id, i.key, i.kind, i.destination, i.payload::text AS payload, i.attempts, \
     i.attempts_base, i.fence, i.key_generation, i.created_at, \
     i.delivered_at IS NOT NULL AS delivered_before, i.recover_owner, i.recover_at, \
     i.traceparent, i.tracestate, i.ordering_key, NULL::bigint AS log_batch";

/// Where the server's WAL stands and its timeline, with each claimed row
/// (`relay.wait_for_standbys`); evaluated after the row was found visible,
/// so past the intent's commit record.
pub(super) const WAL_MARK: &str =
    "(pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint AS wal_position, \
     ('x' || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8))::bit(32)::int AS wal_timeline";

/// The same columns, empty: a relay that does not wait for standbys spends
/// nothing on them.
pub(super) const NO_WAL_MARK: &str = "NULL::bigint AS wal_position, NULL::int AS wal_timeline";

/// One relay's claim statements. The relay's batch size (the cap) and the
/// kinds it leaves alone are written into the text rather than bound, so
/// that Postgres can plan each statement once per connection and reuse the
/// plan.
///
/// Bound, they cost a fresh plan on every call (for a small claim, a large
/// share of the statement's time): a generic plan
/// that knows neither guesses that `kind <> ALL($n)` keeps almost no row and
/// that `LIMIT $n` keeps a tenth of the pending rows, and prices a bitmap
/// scan and sort of every pending row below the index scan in claim order,
/// so Postgres rightly planned each call. With the cap and the kinds in the
/// text, the generic plan is the index scan in claim order, limited to the
/// cap; the bound `LIMIT $1` (the free claim slots, at most the cap) above
/// it stops the scan, and its row locks, at what was asked for.
///
/// Postgres switches to the generic plan after five calls only when it does
/// not look dearer than the plans made per call, and it prices a bound
/// `LIMIT $1` at a tenth of the rows below it: with a single text limited to
/// the cap, a claim asking for less than a tenth of the cap was planned on
/// every call, a fifth to a third of such a claim's time. (A relay asks for
/// its free claim slots: an idle one asks for the cap, a busy one, whose
/// slots are held by claims in flight, for the few that came back.)
///
/// So there is a ladder of texts, limited to 1, 2, 4, … and the cap, and a
/// claim of `n` runs the smallest one limited to `n` or more: `n` is always
/// more than half of that limit, so every rung's generic plan looks cheaper
/// than a plan made for `n`, and Postgres plans each rung once per
/// connection (a test checks).
#[derive(Debug, Clone)]
pub struct ClaimQuery {
    /// (inner limit, statement), by limit ascending; the last is the cap.
    rungs: Vec<(i64, String)>,
    /// The claim of intents from the log (see [`log_claim_sql`]), and the
    /// same for a claim that sets nothing aside.
    log: String,
    log_plain: String,
    /// What the statements are built from (see [`ClaimQuery::with_wal_mark`]).
    limits: Vec<i64>,
    unserved_kinds: Vec<String>,
}

impl ClaimQuery {
    /// The claim of at most `cap` intents per call, skipping `unserved_kinds`.
    pub fn new(cap: i64, unserved_kinds: &[String]) -> ClaimQuery {
        let cap = cap.max(1);
        let mut limits: Vec<i64> = std::iter::successors(Some(1i64), |l| l.checked_mul(2))
            .take_while(|l| *l < cap)
            .collect();
        limits.push(cap);
        ClaimQuery::with_rungs(&limits, unserved_kinds)
    }

    /// The same claim as one statement limited to `cap`, whatever a claim
    /// asks for: what a relay ran before the ladder, kept for the bench's
    /// comparison (`--small-claims`).
    pub fn single(cap: i64, unserved_kinds: &[String]) -> ClaimQuery {
        ClaimQuery::with_rungs(&[cap.max(1)], unserved_kinds)
    }

    /// The same claim returning each row's WAL mark (for
    /// `relay.wait_for_standbys`), or not.
    pub fn with_wal_mark(self, on: bool) -> ClaimQuery {
        ClaimQuery::build(&self.limits, &self.unserved_kinds, on)
    }

    /// One statement per limit in `limits` (ascending; the last is the cap).
    fn with_rungs(limits: &[i64], unserved_kinds: &[String]) -> ClaimQuery {
        ClaimQuery::build(limits, unserved_kinds, false)
    }

    fn build(limits: &[i64], unserved_kinds: &[String], wal_mark: bool) -> ClaimQuery {
        let kinds = if unserved_kinds.is_empty() {
            String::new()
        } else {
            format!("AND kind <> ALL({})", text_array_literal(unserved_kinds))
        };
        let known = text_array_literal(
            &Kind::names()
                .iter()
                .map(|k| k.to_string())
                .collect::<Vec<_>>(),
        );
        let mark = if wal_mark { WAL_MARK } else { NO_WAL_MARK };
        let rungs = limits
            .iter()
            .map(|&limit| (limit, claim_sql(limit, &kinds, &known, mark)))
            .collect();
        let served = if unserved_kinds.is_empty() {
            String::new()
        } else {
            format!("AND l.kind <> ALL({})", text_array_literal(unserved_kinds))
        };
        ClaimQuery {
            log: log_claim_sql(&served, &known, mark, SetsAside::Yes),
            log_plain: log_claim_sql(&served, &known, mark, SetsAside::No),
            rungs,
            limits: limits.to_vec(),
            unserved_kinds: unserved_kinds.to_vec(),
        }
    }

    /// The most intents one call claims.
    pub fn cap(&self) -> i64 {
        self.rungs.last().map_or(1, |r| r.0)
    }

    /// The statement for a claim of `n` (clamped to 1 ..= the cap): $1 how
    /// many to claim (`n`), $2 owner, $3 lease in ms.
    pub fn sql_for(&self, n: i64) -> &str {
        let n = n.clamp(1, self.cap());
        self.rungs
            .iter()
            .find(|r| r.0 >= n)
            .or(self.rungs.last())
            .map_or("", |r| r.1.as_str())
    }

    /// The claim of at most $1 intents from the log: $2 owner, $3 lease in
    /// ms. Run in a transaction begun with [`LOG_CLAIM_BEGIN`].
    pub fn log_sql(&self) -> &str {
        &self.log
    }

    /// The same claim when no destination's intents are set aside: $1 how
    /// many, $2 owner, $3 lease in ms, and nothing more bound.
    pub fn log_plain_sql(&self) -> &str {
        &self.log_plain
    }

    /// The statement limited to the cap (what [`ClaimQuery::sql_for`] gives
    /// for a full batch).
    pub fn sql(&self) -> &str {
        self.sql_for(self.cap())
    }
}

/// The claim of at most `limit` intents (see [`ClaimQuery`]).
fn claim_sql(limit: i64, kinds: &str, known: &str, mark: &str) -> String {
    format!(
        "WITH due AS (
             SELECT id FROM (
                 SELECT id FROM outbox.intent_rows c
                  WHERE state = 'pending' AND NOT waiting AND run_after <= now() {kinds}
                    -- a kind this relay does not know is claimed (to be
                    -- rejected) only when no live relay knows it
                    AND (kind = ANY({known}) OR NOT EXISTS (
                         SELECT 1 FROM outbox.relays r
                          WHERE c.kind = ANY(r.known_kinds) AND r.stopped_at IS NULL
                            AND r.heartbeat_at > now() - interval '{RELAY_TTL_SECS} seconds'))
                    -- per-key ordering: the key's oldest live intent, and
                    -- only while no other intent of the key is claimed
                    AND (c.ordering_key IS NULL OR outbox.ordering_turn(c.ordering_key, c.id))
                  ORDER BY run_after, id
                  LIMIT {limit}
                  FOR UPDATE SKIP LOCKED) capped
              LIMIT $1)
         UPDATE outbox.intent_rows i
            SET state = 'claimed', owner = $2,
                lease_expires_at = now() + $3 * interval '1 millisecond',
                fence = i.fence + 1, attempts = i.attempts + 1, updated_at = now()
          -- by primary key, whatever the cap: joined to the CTE instead,
          -- a claim of more than about a hundred rows beside a small table
          -- was planned as a hash join over a scan of the whole table
          WHERE i.id = ANY(ARRAY(SELECT id FROM due))
         RETURNING {CLAIMED_COLUMNS}, {mark}"
    )
}

/// The lock every claim from the log takes for its transaction, and
/// `outbox.track` too (the same key): claims of the log take turns, and an
/// intent no batch holds stays so while it is copied into `intent_rows`.
macro_rules! log_claim_lock {
    () => {
        "SELECT pg_advisory_xact_lock(20291, 0)"
    };
}

/// How a claim of the log that sets intents aside begins its transaction,
/// in one round trip: its lock, with JIT compilation off. Beside a large
/// log the planner prices the claim far above `jit_above_cost` and
/// `jit_optimize_above_cost` (it cannot tell how few intents after the
/// cursor pass its probes), and with the server's defaults compiling the
/// claim took 1.2 s of the server's CPU on every call, for a claim that
/// then ran in a millisecond.
pub const LOG_CLAIM_BEGIN: &str = concat!(
    "BEGIN; ",
    log_claim_lock!(),
    ", set_config('jit', 'off', true)"
);

/// The settings of [`GENERIC_PLAN_SETTINGS`], as a literal for `concat!`.
macro_rules! generic_plan_settings {
    () => {
        "SET LOCAL jit = off; SET LOCAL plan_cache_mode = force_generic_plan; \
         SET LOCAL enable_seqscan = off"
    };
}

/// What the claim that sets nothing aside and the deliveries at the first
/// attempt set for their transaction: they run on their connection's
/// cached generic plan, and that plan probes by index whatever the tables
/// held when it was made.
///
/// Left to choose, Postgres plans both afresh on every call: the generic
/// plan of the claim guesses a tenth of the log for its bound limit, so it
/// never looks cheaper than a plan made for the limit, and the completion
/// fares no better. Planning was a third of what the two statements cost
/// the server in a drain (about a millisecond per claim of 100 and half a
/// millisecond per completion; docs/performance.md, "Planning per call"). A
/// generic plan is made once per connection and kept until a table it
/// reads is analyzed, so it must not depend on what the tables hold when
/// it is made: beside the empty outcomes of a new segment the planner
/// would read them whole on every probe. Sequential scans are off for
/// these statements, so every probe is by index, and so is JIT
/// compilation (see [`LOG_CLAIM_BEGIN`]).
pub const GENERIC_PLAN_SETTINGS: &str = generic_plan_settings!();

/// How the claim that sets nothing aside begins its transaction, in one
/// round trip: the lock of every claim of the log, then
/// [`GENERIC_PLAN_SETTINGS`].
pub const LOG_PLAIN_CLAIM_BEGIN: &str =
    concat!("BEGIN; ", log_claim_lock!(), "; ", generic_plan_settings!());

/// How the deliveries at the first attempt begin their transaction.
pub const GENERIC_PLAN_BEGIN: &str = concat!("BEGIN; ", generic_plan_settings!());

/// Whether a claim of the log sets a congested destination's intents aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SetsAside {
    /// $4 to $7 bound: the destinations, their turns and the look-ahead.
    Yes,
    /// Nothing bound past $3: every served intent the claim meets is taken.
    No,
}

/// The parts of [`log_claim_sql`] that differ with what it sets aside: the
/// scan's `aside` column, how many more than $1 it reads, the CTE `cand`
/// (the intents taken), a row's run_after, updated_at and last_error for
/// an intent not taken into the batch, and the order of the rows returned.
type Shape = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

fn shape(aside: SetsAside) -> Shape {
    match aside {
        SetsAside::Yes => (
            "CASE WHEN cardinality($4::text[]) > 0
                  THEN array_position($4::text[],
                                      outbox.destination_of(l.kind, l.destination, l.payload))
             END",
            " + $7",
            "ranked AS (
             -- an intent of the tail (an id above the segments) gets its
             -- row, for the claims of rows: no batch holds one
             SELECT s.*, s.served AND s.aside IS NULL AND NOT s.in_tail AS eligible,
                    -- those claimable before this one (a running count
                    -- to this row, less itself: a frame ending before the
                    -- row is counted again for every row)
                    count(*) FILTER (WHERE s.served AND s.aside IS NULL AND NOT s.in_tail)
                        OVER (ORDER BY s.xid, s.id ROWS UNBOUNDED PRECEDING)
                    - (s.served AND s.aside IS NULL AND NOT s.in_tail)::int AS before,
                    row_number() OVER (PARTITION BY s.aside ORDER BY s.xid, s.id) AS turn
               FROM scan s),
         cand AS (SELECT * FROM ranked r WHERE r.before < $1)",
            "CASE WHEN c.aside IS NULL THEN c.run_after
                         ELSE greatest(c.run_after,
                                       now() + (($5::float8[])[c.aside]
                                                + (c.turn - 1) * ($6::float8[])[c.aside])
                                               * interval '1 millisecond')
                    END",
            // written now: a row whose run_after moved past its enqueue
            // says so (outbox.tally_rows reads it)
            "CASE WHEN c.aside IS NULL THEN c.created_at ELSE now() END",
            "CASE WHEN c.aside IS NOT NULL
                         THEN 'deferred: its destination is congested (deliveries waited for '
                              || 'room there); it takes its turn' END",
            "ORDER BY c.xid, c.id",
        ),
        SetsAside::No => (
            "NULL::int",
            "",
            // an intent of the tail (an id above the segments) gets its
            // row, for the claims of rows: no batch holds one
            "cand AS (SELECT s.*, s.served AND NOT s.in_tail AS eligible FROM scan s)",
            "c.run_after",
            "c.created_at",
            "NULL::text",
            "",
        ),
    }
}

/// The claim of at most $1 intents from `outbox.intent_log` (see
/// schema/0027_intent_log.sql): those after the cursor, in (xid, id) order,
/// that no batch holds and that have no row and no outcome. The ones of a
/// kind this relay serves go into one new batch and are returned, claimed
/// at their first attempt under fence 1; the others get their row, pending,
/// for a relay that serves them (or for the rejection of a kind no relay
/// knows). The cursor moves past the intents taken whose transaction is
/// older than every transaction still running: one that commits later has a
/// larger xid, so its intents come after the cursor.
///
/// Set aside ([`SetsAside::Yes`]): the intents of a congested destination ($4,
/// its names as `outbox.destination_of` gives them) get their row too,
/// pending, each at its turn (the destination's first turn $5 ms from now,
/// then one per $6 ms), and are returned with `aside` (its index in $4) and
/// no payload. The claim looks at up to $7 more intents than it claims for
/// them: the intents it takes are those up to its $1-th claimed one, so the
/// cursor still passes only intents taken.
///
/// With nothing set aside ([`SetsAside::No`]) the claim takes every intent it
/// reads, so it needs neither the running count nor the turns, nor a sort
/// of its rows: they come back in the order the scan read them (the rows
/// of a materialized CTE are read back in the order they were written).
/// Those windows and the sort were an eighth of the Postgres work of a
/// claim and its completion (docs/performance.md, "Instructions per
/// intent").
fn log_claim_sql(served: &str, known: &str, mark: &str, aside: SetsAside) -> String {
    let untaken = log_untaken!("l");
    let (aside_of, look_ahead, cand, run_after, updated_at, last_error, order) = shape(aside);
    format!(
        "WITH scan AS (
             SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after,
                    l.ordering_key, l.waiting, l.source, l.created_at, l.traceparent,
                    l.tracestate, l.in_tail, (l.kind = ANY({known}) {served}) AS served,
                    {aside_of} AS aside
               FROM outbox.intent_log_open l
              WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                      ORDER BY c.seq DESC LIMIT 1)
                -- probes of each row taken in order (OFFSET 0 keeps each a
                -- subplan): as anti joins, a generic plan that guessed a third
                -- of the log after the cursor hashed every outcome ever
                -- written and sorted the log, per claim
                AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id OFFSET 0)
                -- no outcome and no batch (see log_untaken!)
                AND {untaken}
              ORDER BY l.xid, l.id
              LIMIT $1{look_ahead}),
         {cand},
         tracked AS (
             INSERT INTO outbox.intent_rows (id, key, kind, destination, payload, run_after,
                                             ordering_key, waiting, source, created_at,
                                             updated_at, traceparent, tracestate, last_error)
             SELECT c.id, c.key, c.kind, c.destination, c.payload, {run_after},
                    c.ordering_key, c.waiting, c.source, c.created_at, {updated_at},
                    c.traceparent, c.tracestate, {last_error}
               FROM cand c
              WHERE NOT c.eligible
             ON CONFLICT (id) DO NOTHING),
         -- the batch's groups for outbox.tallies (schema 0033), so that its
         -- trigger reads no log row
         groups AS (
             SELECT jsonb_agg(jsonb_build_array(g.kind, g.destination, g.subscription, g.url,
                                                g.n)) AS tally
               FROM (SELECT c.kind, c.destination,
                            outbox.tally_subscription(c.kind, c.destination, c.payload)
                                AS subscription,
                            outbox.tally_url(c.kind, c.destination, c.payload) AS url,
                            count(*) AS n
                       FROM cand c WHERE c.eligible GROUP BY 1, 2, 3, 4) g),
         batch AS (
             INSERT INTO outbox.log_batches (owner, lease_expires_at, ids, max_id, tally)
             SELECT $2, now() + $3 * interval '1 millisecond', array_agg(c.id ORDER BY c.xid, c.id),
                    max(c.id), (SELECT tally FROM groups)
               FROM cand c WHERE c.eligible
             HAVING count(*) > 0
             RETURNING batch),
         moved AS (
             INSERT INTO outbox.log_cursor (xid, id)
             SELECT c.xid, c.id FROM cand c
              WHERE c.xid < pg_snapshot_xmin(pg_current_snapshot())
              ORDER BY c.xid DESC, c.id DESC LIMIT 1)
         -- every column from the scan itself: joined to the log again, the
         -- generic plan (the limit bound) hashed the whole log per claim
         SELECT c.id, c.key, c.kind, c.destination,
                CASE WHEN c.eligible THEN c.payload::text END AS payload, 1 AS attempts,
                0 AS attempts_base, 1::bigint AS fence, 0 AS key_generation, c.created_at,
                false AS delivered_before, NULL::text AS recover_owner,
                NULL::timestamptz AS recover_at, c.traceparent, c.tracestate, c.ordering_key,
                c.aside, c.served AND c.in_tail AS to_rows,
                CASE WHEN c.eligible THEN (SELECT b.batch FROM batch b) END AS log_batch, {mark}
           FROM cand c
          WHERE c.eligible OR c.aside IS NOT NULL OR (c.served AND c.in_tail)
          {order}"
    )
}

/// A relay whose heartbeat is older than this is not counted as live when
/// deciding whether anyone knows a kind.
pub const RELAY_TTL_SECS: u64 = 60;

/// `ARRAY['a', 'b']::text[]`, each element quoted as an SQL string literal
/// (quotes doubled, and `E''` with backslashes doubled when there are any, so
/// the text means the same whatever `standard_conforming_strings` says).
fn text_array_literal(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| {
            let body = s.replace('\'', "''");
            if body.contains('\\') {
                format!("E'{}'", body.replace('\\', "\\\\"))
            } else {
                format!("'{body}'")
            }
        })
        .collect();
    format!("ARRAY[{}]::text[]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_written_as_sql_string_literals() {
        let kinds =
            |k: &[&str]| text_array_literal(&k.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            kinds(&["email", "payment"]),
            "ARRAY['email', 'payment']::text[]"
        );
        assert_eq!(kinds(&["o'brien"]), "ARRAY['o''brien']::text[]");
        assert_eq!(kinds(&["a\\'b"]), "ARRAY[E'a\\\\''b']::text[]");
    }

    #[test]
    fn the_claim_writes_its_cap_and_kinds_into_the_text() {
        let all = ClaimQuery::new(100, &[]);
        assert!(all.sql().contains("LIMIT 100\n"));
        assert!(!all.sql().contains("kind <> ALL"));
        let some = ClaimQuery::new(0, &["email".to_string()]);
        assert_eq!(some.cap(), 1, "a cap below one would claim nothing");
        assert!(some.sql().contains("kind <> ALL(ARRAY['email']::text[])"));
        assert!(some.sql_for(5).contains("LIMIT 1\n"));
    }

    #[test]
    fn the_plain_claim_of_the_log_binds_three_and_ranks_nothing() {
        let q = ClaimQuery::new(100, &["email".to_string()]);
        let plain = q.log_plain_sql();
        for gone in ["$4", "$5", "$6", "$7", "OVER (", "ORDER BY c.xid, c.id\n"] {
            assert!(!plain.contains(gone), "{gone} in the plain claim:\n{plain}");
        }
        assert!(plain.contains("l.kind <> ALL(ARRAY['email']::text[])"));
        assert!(plain.contains("LIMIT $1)"));
        let full = q.log_sql();
        for kept in ["$7", "OVER (", "LIMIT $1 + $7)"] {
            assert!(full.contains(kept), "{kept} missing:\n{full}");
        }
    }

    #[test]
    fn a_claim_runs_the_smallest_rung_that_holds_it() {
        let q = ClaimQuery::new(100, &["email".to_string()]);
        let limit = |n: i64| {
            let sql = q.sql_for(n);
            assert!(sql.contains("kind <> ALL(ARRAY['email']::text[])"));
            let at = sql.find("ORDER BY run_after, id").unwrap();
            sql[at..].split_whitespace().nth(5).unwrap().to_string()
        };
        for (n, want) in [
            (0, "1"),
            (1, "1"),
            (2, "2"),
            (3, "4"),
            (16, "16"),
            (17, "32"),
            (64, "64"),
            (65, "100"),
            (100, "100"),
            (500, "100"),
        ] {
            assert_eq!(limit(n), want, "a claim of {n}");
        }
        // more than half of every rung's limit is asked for, but for the cap
        for n in 1..=100i64 {
            let l: i64 = limit(n).parse().unwrap();
            assert!(n <= l && 2 * n > l, "{n} runs the rung of {l}");
        }
        assert_eq!(ClaimQuery::new(64, &[]).cap(), 64);
        assert_eq!(ClaimQuery::new(64, &[]).rungs.len(), 7);
        let single = ClaimQuery::single(100, &["email".to_string()]);
        assert_eq!(single.sql_for(1), q.sql());
    }
}
