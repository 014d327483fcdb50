-- The live queue, counted as it changes: the gauges read outbox.tallies,
-- whose size follows the destinations and kinds, not the backlog.
--
-- outbox.tallies holds, per kind, destination group and state, how many
-- intents are live: the states of outbox.intent_rows (pending, claimed,
-- ambiguous, dead) and 'log', the log intents no claim has taken and that
-- have no row. A destination group is what outbox.destination_of reads:
-- the kind, the destination column and, for a webhook without one, its
-- subscription or else its URL.
--
-- What changes them:
-- - statement triggers on outbox.intent_rows and outbox.log_batches write
--   each statement's changes as one outbox.tally_deltas row (an intent_rows
--   row entering or leaving a live state; a log intent leaving 'log' for a
--   batch or for a row);
-- - outbox.fold_tallies() adds the deltas, and counts the log intents that
--   arrived since its last pass: those its snapshot sees that the last
--   fold's snapshot (outbox.tally_mark) did not, read by the index on
--   (xid, id) from that snapshot's xmax, and by xid for the transactions it
--   saw running. The enqueue writes nothing more: its transaction's
--   intents are counted in the first fold that sees it committed.
-- - a log intent that leaves the log (deleted) takes back what it counted.
--
-- So a log intent without a row counts 'log' from the fold that saw it
-- arrive until a claim's batch or a row takes it; one that a batch or a
-- row took before any fold saw it leaves 'log' first and is counted at its
-- arrival after, which nets to nothing.
-- A TRUNCATE of the rows or the batches (the log's takes its rows with
-- it), or a delete in a transaction that reads an older snapshot, marks the
-- tallies to be counted again from the tables by the next fold; so does
-- this migration.
--
-- It changes three tables that relays and applications use while it
-- runs: it takes their locks together or not at all, each wait shorter
-- than Postgres's deadlock check, and tries again (a claim holds one of
-- them and asks for another), for at most a minute. It holds them for
-- the few milliseconds it takes: nothing in it reads the tables.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            LOCK TABLE outbox.log_batches, outbox.intent_rows, outbox.intent_log
                IN ACCESS EXCLUSIVE MODE;
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.log_batches, intent_rows and intent_log within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;

CREATE TABLE outbox.tallies (
    kind         text   NOT NULL,
    destination  text,
    subscription text,
    url          text,
    state        text   NOT NULL
                        CHECK (state IN ('log', 'pending', 'claimed', 'ambiguous', 'dead')),
    n            bigint NOT NULL,
    CONSTRAINT tallies_group UNIQUE NULLS NOT DISTINCT (kind, destination, subscription, url, state)
);

-- one row per statement that changed what is live, folded and deleted by
-- outbox.fold_tallies()
CREATE TABLE outbox.tally_deltas (
    kinds         text[]   NOT NULL,
    destinations  text[]   NOT NULL,
    subscriptions text[]   NOT NULL,
    urls          text[]   NOT NULL,
    states        text[]   NOT NULL,
    ns            bigint[] NOT NULL
)
-- every fold empties it: vacuumed after a thousand deleted rows rather
-- than a fifth of the table, so a fold's scan stays short
WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- the snapshot of the last fold: it has counted the log intents that
-- snapshot sees; `valid` false: count everything again
CREATE TABLE outbox.tally_mark (
    one      boolean     PRIMARY KEY DEFAULT true CHECK (one),
    snapshot pg_snapshot NOT NULL,
    valid    boolean     NOT NULL
);
INSERT INTO outbox.tally_mark (snapshot, valid) VALUES (pg_current_snapshot(), false);

-- A log intent that starts on the hot path (outbox.log_track gives the
-- others their row at once) is counted at its arrival.
CREATE FUNCTION outbox.log_untracked(p_ordering_key text, p_waiting boolean,
                                     p_run_after timestamptz, p_created_at timestamptz)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$ SELECT p_ordering_key IS NULL AND NOT p_waiting AND p_run_after <= p_created_at $$;

-- A webhook's subscription, or its URL, where they name its destination.
CREATE FUNCTION outbox.tally_subscription(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN p_kind = 'webhook' AND p_destination IS NULL
                  THEN p_payload->>'subscription' END $$;
CREATE FUNCTION outbox.tally_url(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
AS $$ SELECT CASE WHEN p_kind = 'webhook' AND p_destination IS NULL
                       AND p_payload->>'subscription' IS NULL
                  THEN p_payload->>'url' END $$;

-- The triggers below read the log and the rows by primary key only (seq
-- scans off, and then JIT off for the cost that puts on a scan). A
-- session keeps a statement's first plan, and one made while the log was
-- empty looks for an id by scanning the whole (xid, id) index: so these
-- reads are planned on each call (EXECUTE), and none is on the hot path.

-- Deltas of intent_rows statements: the live states each row leaves and
-- enters; an inserted row of a log intent no batch took leaves 'log'; a
-- deleted one gives it back while its log intent stays (after the cursor,
-- where a claim takes it again). Each log intent is probed on its own
-- (OFFSET 0): as a join, a plan may hash the whole log.
CREATE FUNCTION outbox.tally_rows() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- statements that changed no row (a claim of rows that found none)
    -- fire this too
    IF TG_OP = 'DELETE' THEN
        IF NOT EXISTS (SELECT 1 FROM old_rows) THEN
            RETURN NULL;
        END IF;
    ELSIF NOT EXISTS (SELECT 1 FROM new_rows) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT r.kind, r.destination,
                       outbox.tally_subscription(r.kind, r.destination, r.payload) AS subscription,
                       outbox.tally_url(r.kind, r.destination, r.payload) AS url,
                       r.state, count(*) AS n
                  FROM new_rows r
                 WHERE r.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                 GROUP BY 1, 2, 3, 4, 5) g
        HAVING count(*) > 0;
        -- A row has its log intent's kind, destination, payload, ordering
        -- key, waiting and created_at as they were, and its run_after too
        -- but where a claim set it aside for later (and wrote the row's
        -- updated_at then). So a row with a key or waiting, or with a later
        -- run_after written with its enqueue, is one its log intent had
        -- from its enqueue (never counted in 'log'); one with an earlier
        -- run_after is its log intent leaving 'log', unless a batch took it
        -- before (it has an outcome).
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT r.kind, r.destination,
                       outbox.tally_subscription(r.kind, r.destination, r.payload) AS subscription,
                       outbox.tally_url(r.kind, r.destination, r.payload) AS url, -count(*) AS n
                  FROM new_rows r
                 WHERE r.ordering_key IS NULL AND NOT r.waiting AND r.run_after <= r.created_at
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                    WHERE o.intent_id = r.id OFFSET 0)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                    WHERE b.ids @> ARRAY[r.id] OFFSET 0)
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0;
        -- a later run_after written after the enqueue: a claim's set-aside
        -- (or a row written so by hand), checked against the log
        IF EXISTS (SELECT 1 FROM new_rows r
                    WHERE r.ordering_key IS NULL AND NOT r.waiting
                      AND r.run_after > r.created_at AND r.updated_at <> r.created_at) THEN
            EXECUTE $q$
            INSERT INTO outbox.tally_deltas
            SELECT array_agg(kind), array_agg(destination), array_agg(subscription),
                   array_agg(url), array_agg('log'::text), array_agg(n)
              FROM (SELECT l.kind, l.destination,
                           outbox.tally_subscription(l.kind, l.destination, l.payload)
                               AS subscription,
                           outbox.tally_url(l.kind, l.destination, l.payload) AS url,
                           -count(*) AS n
                      FROM new_rows r
                      JOIN outbox.intent_log l ON l.id = r.id
                     WHERE r.ordering_key IS NULL AND NOT r.waiting
                       AND r.run_after > r.created_at AND r.updated_at <> r.created_at
                       AND outbox.log_untracked(l.ordering_key, l.waiting, l.run_after,
                                                l.created_at)
                       AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                        WHERE o.intent_id = l.id)
                       AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                        WHERE b.ids @> ARRAY[l.id])
                     GROUP BY 1, 2, 3, 4) g
            HAVING count(*) > 0
            $q$;
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT kind, destination, subscription, url, state, sum(n) AS n
                  FROM (SELECT o.kind, o.destination,
                               outbox.tally_subscription(o.kind, o.destination, o.payload)
                                   AS subscription,
                               outbox.tally_url(o.kind, o.destination, o.payload) AS url,
                               o.state, -1 AS n
                          FROM old_rows o
                         WHERE o.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                        UNION ALL
                        SELECT r.kind, r.destination,
                               outbox.tally_subscription(r.kind, r.destination, r.payload),
                               outbox.tally_url(r.kind, r.destination, r.payload), r.state, 1
                          FROM new_rows r
                         WHERE r.state IN ('pending', 'claimed', 'ambiguous', 'dead')) d
                 GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0) g
        HAVING count(*) > 0;
    ELSE
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT o.kind, o.destination,
                       outbox.tally_subscription(o.kind, o.destination, o.payload) AS subscription,
                       outbox.tally_url(o.kind, o.destination, o.payload) AS url,
                       o.state, -count(*) AS n
                  FROM old_rows o
                 WHERE o.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                 GROUP BY 1, 2, 3, 4, 5) g
        HAVING count(*) > 0;
        EXECUTE $q$
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT l.kind, l.destination,
                       outbox.tally_subscription(l.kind, l.destination, l.payload) AS subscription,
                       outbox.tally_url(l.kind, l.destination, l.payload) AS url, count(*) AS n
                  FROM old_rows o
                  JOIN outbox.intent_log l ON l.id = o.id
                 WHERE outbox.log_untracked(l.ordering_key, l.waiting, l.run_after, l.created_at)
                   AND (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                         ORDER BY c.seq DESC LIMIT 1)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes x WHERE x.intent_id = l.id)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b WHERE b.ids @> ARRAY[l.id])
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0
        $q$;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER intents_tally_insert AFTER INSERT ON outbox.intent_rows
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();
CREATE TRIGGER intents_tally_update AFTER UPDATE ON outbox.intent_rows
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();
CREATE TRIGGER intents_tally_delete AFTER DELETE ON outbox.intent_rows
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();

-- A claim's batch takes its intents out of 'log'. A claim writes its
-- batch's groups with it (`tally`: [[kind, destination, subscription, url,
-- n], ...]), so that this reads no log row; a batch without them (a relay
-- of an earlier version) has its intents' groups read from the log.
ALTER TABLE outbox.log_batches ADD COLUMN tally jsonb;

CREATE FUNCTION outbox.tally_batches() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- a claim that found nothing inserts no batch, and its statement
    -- still fires this: nothing to plan the read of the log on (a plan
    -- made on an empty log is the session's for good)
    IF NOT EXISTS (SELECT 1 FROM new_batches) THEN
        RETURN NULL;
    END IF;
    INSERT INTO outbox.tally_deltas
    SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
           array_agg('log'::text), array_agg(n)
      FROM (SELECT kind, destination, subscription, url, -sum(n)::bigint AS n
              FROM (SELECT g->>0 AS kind, g->>1 AS destination, g->>2 AS subscription,
                           g->>3 AS url, (g->>4)::bigint AS n
                      FROM new_batches b CROSS JOIN LATERAL jsonb_array_elements(b.tally) AS g
                     WHERE b.tally IS NOT NULL) c
             GROUP BY 1, 2, 3, 4) g
    HAVING count(*) > 0;
    IF EXISTS (SELECT 1 FROM new_batches WHERE tally IS NULL) THEN
        EXECUTE $q$
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT l.kind, l.destination,
                       outbox.tally_subscription(l.kind, l.destination, l.payload) AS subscription,
                       outbox.tally_url(l.kind, l.destination, l.payload) AS url,
                       -count(*) AS n
                  FROM new_batches b CROSS JOIN LATERAL unnest(b.ids) AS x(id)
                  JOIN outbox.intent_log l ON l.id = x.id
                 WHERE b.tally IS NULL
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0
        $q$;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER log_batches_tally AFTER INSERT ON outbox.log_batches
    REFERENCING NEW TABLE AS new_batches FOR EACH STATEMENT
    EXECUTE FUNCTION outbox.tally_batches();

-- A log intent that goes takes its row with it, here, in one statement,
-- rather than by the rows' foreign key cascade, which runs before this
-- trigger (so that it could not tell which intent had a row) and row by
-- row. The key is checked at commit instead, and still holds a log row
-- against a delete while a row for it is written. (Every row met the key
-- already: it is not validated again.) It takes back its arrival, once
-- counted, and gives back its leaving 'log', once it left (a batch, an
-- outcome, a row). Then its outcomes go with it, as before.
ALTER TABLE outbox.intent_rows DROP CONSTRAINT intent_rows_logged;
ALTER TABLE outbox.intent_rows
    ADD CONSTRAINT intent_rows_logged FOREIGN KEY (id) REFERENCES outbox.intent_log (id)
    DEFERRABLE INITIALLY DEFERRED NOT VALID;

CREATE OR REPLACE FUNCTION outbox.log_outcomes_follow() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    -- the fold counts arrivals under this lock, exclusively
    PERFORM pg_advisory_xact_lock_shared(20291, 2);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- this snapshot may predate a fold that counted these intents
        UPDATE outbox.tally_mark SET valid = false WHERE valid;
        EXECUTE 'DELETE FROM outbox.intent_rows t USING gone WHERE t.id = gone.id';
    ELSE
        EXECUTE $q$
        WITH rows_gone AS (
                 DELETE FROM outbox.intent_rows t USING gone WHERE t.id = gone.id RETURNING t.id)
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT kind, destination, subscription, url, sum(left_log - counted) AS n
                  FROM (SELECT g.kind, g.destination,
                               outbox.tally_subscription(g.kind, g.destination, g.payload)
                                   AS subscription,
                               outbox.tally_url(g.kind, g.destination, g.payload) AS url,
                               (EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                         WHERE o.intent_id = g.id)
                                OR EXISTS (SELECT 1 FROM outbox.log_batches b
                                            WHERE b.ids @> ARRAY[g.id])
                                OR g.id IN (SELECT r.id FROM rows_gone r))::int AS left_log,
                               pg_visible_in_snapshot(g.xid, m.snapshot)::int AS counted
                          FROM gone g, outbox.tally_mark m
                         WHERE outbox.log_untracked(g.ordering_key, g.waiting, g.run_after,
                                                    g.created_at)) x
                 GROUP BY 1, 2, 3, 4 HAVING sum(left_log - counted) <> 0) s
        HAVING count(*) > 0
        $q$;
    END IF;
    DELETE FROM outbox.log_outcomes o USING gone WHERE o.intent_id = gone.id;
    RETURN NULL;
END
$$;

-- Emptied tables: count again. (The log is truncated only with its rows,
-- which its foreign key holds.)
CREATE FUNCTION outbox.tally_recount() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    UPDATE outbox.tally_mark SET valid = false WHERE valid;
    RETURN NULL;
END
$$;
CREATE TRIGGER intents_tally_truncate AFTER TRUNCATE ON outbox.intent_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_recount();
CREATE TRIGGER log_batches_tally_truncate AFTER TRUNCATE ON outbox.log_batches
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_recount();

-- Fold the deltas and the log's arrivals into outbox.tallies, or count
-- everything again when the tallies are marked so. One relay at a time:
-- false when another is folding (its result serves this one's read too).
-- Its cost follows what changed since the last fold.
CREATE FUNCTION outbox.fold_tallies() RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
-- the log's arrivals are read by its index: without statistics (a log
-- filled since the last ANALYZE) the planner takes a third of it to be
-- new, and reads it all; and the cost that puts on the small tables' scans
-- would have every fold compiled (half a second beside a large log)
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    v_last pg_snapshot;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 2) THEN
        RETURN false;
    END IF;
    IF NOT (SELECT valid FROM outbox.tally_mark) THEN
        -- counting everything is a pass over the tables
        PERFORM set_config('enable_seqscan', 'on', true);
        DELETE FROM outbox.tallies;
        -- one statement, one snapshot: what it counts, the deltas it drops
        -- and the snapshot it keeps agree
        WITH dropped AS (DELETE FROM outbox.tally_deltas),
             counted AS (
                 SELECT kind, destination, outbox.tally_subscription(kind, destination, payload)
                            AS subscription,
                        outbox.tally_url(kind, destination, payload) AS url, state, count(*) AS n
                   FROM outbox.intent_rows
                  WHERE state IN ('pending', 'claimed', 'ambiguous', 'dead')
                  GROUP BY 1, 2, 3, 4, 5
                 UNION ALL
                 SELECT l.kind, l.destination,
                        outbox.tally_subscription(l.kind, l.destination, l.payload),
                        outbox.tally_url(l.kind, l.destination, l.payload), 'log', count(*)
                   FROM outbox.intent_log l
                  WHERE outbox.log_untracked(l.ordering_key, l.waiting, l.run_after, l.created_at)
                    AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
                    AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = l.id)
                    AND NOT EXISTS (SELECT 1 FROM outbox.log_batches x WHERE x.ids @> ARRAY[l.id])
                  GROUP BY 1, 2, 3, 4),
             ins AS (INSERT INTO outbox.tallies (kind, destination, subscription, url, state, n)
                     SELECT * FROM counted)
        UPDATE outbox.tally_mark SET snapshot = pg_current_snapshot(), valid = true;
        RETURN true;
    END IF;
    SELECT m.snapshot INTO v_last FROM outbox.tally_mark m;
    -- planned with the last snapshot's values, not as a generic plan
    EXECUTE $q$
    WITH d AS (DELETE FROM outbox.tally_deltas RETURNING *),
         -- what this snapshot sees and the last did not: the transactions
         -- from its xmax on, and those it saw running
         arrived AS (
             SELECT l.kind, l.destination, l.payload, l.ordering_key, l.waiting, l.run_after,
                    l.created_at
               FROM outbox.intent_log l
              WHERE l.xid >= pg_snapshot_xmax($1)
             UNION ALL
             SELECT l.kind, l.destination, l.payload, l.ordering_key, l.waiting, l.run_after,
                    l.created_at
               FROM pg_snapshot_xip($1) AS r(xid)
              CROSS JOIN LATERAL (SELECT * FROM outbox.intent_log y
                                   WHERE y.xid = r.xid OFFSET 0) l),
         changes AS (
             SELECT u.kind, u.destination, u.subscription, u.url, u.state, u.n
               FROM d CROSS JOIN LATERAL unnest(d.kinds, d.destinations, d.subscriptions, d.urls,
                                                d.states, d.ns)
                                      AS u(kind, destination, subscription, url, state, n)
             UNION ALL
             SELECT a.kind, a.destination,
                    outbox.tally_subscription(a.kind, a.destination, a.payload),
                    outbox.tally_url(a.kind, a.destination, a.payload), 'log', 1
               FROM arrived a
              WHERE outbox.log_untracked(a.ordering_key, a.waiting, a.run_after, a.created_at)),
         sums AS (SELECT kind, destination, subscription, url, state, sum(n)::bigint AS n
                    FROM changes GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0),
         ins AS (INSERT INTO outbox.tallies AS t (kind, destination, subscription, url, state, n)
                 SELECT * FROM sums
                 ON CONFLICT ON CONSTRAINT tallies_group DO UPDATE SET n = t.n + excluded.n)
    UPDATE outbox.tally_mark SET snapshot = pg_current_snapshot()
    $q$ USING v_last;
    DELETE FROM outbox.tallies WHERE n = 0;
    RETURN true;
END
$$;

REVOKE EXECUTE ON FUNCTION outbox.fold_tallies(), outbox.tally_rows(), outbox.tally_batches(),
                           outbox.tally_recount(),
                           outbox.log_untracked(text, boolean, timestamptz, timestamptz),
                           outbox.tally_subscription(text, text, jsonb),
                           outbox.tally_url(text, text, jsonb)
    FROM PUBLIC;

-- Whoever claims (inserts batches) folds and reads the tallies' groups
-- (the backlog gauge names their destinations), and whoever reads the
-- batches reads the tallies.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox.log_batches'::regclass AND a.grantee <> c.relowner
           AND a.grantee <> 0 AND a.privilege_type IN ('INSERT', 'SELECT')
    LOOP
        IF g.privilege_type = 'INSERT' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.fold_tallies(), '
                           'outbox.tally_subscription(text, text, jsonb), '
                           'outbox.tally_url(text, text, jsonb) TO %I',
                           pg_get_userbyid(g.grantee));
        ELSE
            EXECUTE format('GRANT SELECT ON outbox.tallies TO %I', pg_get_userbyid(g.grantee));
        END IF;
    END LOOP;
END
$$;
