-- Ordering keys that can strand, found directly; enqueue_many's waiting
-- flags and lock order. Signatures, answers, errors and SQLSTATEs of
-- outbox.enqueue and outbox.enqueue_many stay those of 0010.
--
-- 1. outbox.ordering_rechecks: the ordering keys the sweeper looks at on
--    its next pass, and only those. An intent waits (`waiting`, outside the
--    claim index) until the trigger of 0005 promotes it when a live intent
--    of its key finishes. That trigger cannot see a waiting intent whose
--    transaction has not committed yet, so an enqueue racing the head's
--    completion (or cancel) can leave an intent waiting with nothing live
--    ahead of it. Every event that can leave a key so is noted here, in the
--    same transaction (so the note becomes visible exactly when the event
--    does): a waiting intent inserted; an intent becoming pending and
--    waiting by an update (a retry of a cancelled one); a live intent
--    deleted (a purge of a dead head). The sweeper takes the notes in
--    batches, promotes each key's first waiting intent when nothing live is
--    ahead of it, and drops the note; it keeps the note for its next pass
--    only while every live intent ahead is being changed by a transaction
--    in progress (whose trigger may have run before the waiting intent
--    committed). A live intent ahead that is not being changed will finish
--    later, and its trigger then sees the waiting intent. So each pass reads
--    what could have stranded since the last one, whatever the number of
--    keys; see relay/store/fleet.rs. (The probes order by (ordering_key,
--    id), as intents_waiting does: ordered by id alone, a plan made
--    without statistics walks the primary key instead.)
CREATE TABLE outbox.ordering_rechecks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ordering_key text NOT NULL
);

CREATE FUNCTION outbox.note_ordering_recheck()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO outbox.ordering_rechecks (ordering_key) VALUES (OLD.ordering_key);
    ELSE
        INSERT INTO outbox.ordering_rechecks (ordering_key) VALUES (NEW.ordering_key);
    END IF;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.note_ordering_recheck() FROM PUBLIC;

SET LOCAL lock_timeout = '10s';
CREATE TRIGGER intents_note_waiting_insert
    AFTER INSERT ON outbox.intents
    FOR EACH ROW
    WHEN (NEW.waiting AND NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION outbox.note_ordering_recheck();
CREATE TRIGGER intents_note_waiting_update
    AFTER UPDATE OF state, waiting ON outbox.intents
    FOR EACH ROW
    WHEN (NEW.waiting AND NEW.state = 'pending' AND NEW.ordering_key IS NOT NULL
          AND NOT (OLD.waiting AND OLD.state = 'pending'))
    EXECUTE FUNCTION outbox.note_ordering_recheck();
CREATE TRIGGER intents_note_live_delete
    AFTER DELETE ON outbox.intents
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL
          AND OLD.state IN ('pending', 'claimed', 'ambiguous', 'dead'))
    EXECUTE FUNCTION outbox.note_ordering_recheck();

-- Every key that has waiting intents now is looked at once.
INSERT INTO outbox.ordering_rechecks (ordering_key)
SELECT DISTINCT ordering_key FROM outbox.intents WHERE waiting AND state = 'pending';

-- 2. The promotion trigger (0005) promotes the key's first waiting intent
--    that is still pending: when the one it picked is cancelled meanwhile
--    (it waits for that transaction, then finds the row no longer pending)
--    it looks again, instead of promoting nothing and leaving the next one
--    waiting. A waiting intent that is cancelled only leaves the waiting
--    set itself: the intents behind it still have the same live ones ahead.
CREATE OR REPLACE FUNCTION outbox.promote_next_in_order()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF OLD.waiting THEN
        UPDATE outbox.intents SET waiting = false WHERE id = NEW.id AND waiting;
        RETURN NULL;
    END IF;
    LOOP
        SELECT w.id INTO v_id FROM outbox.intents w
         WHERE w.ordering_key = OLD.ordering_key AND w.waiting AND w.state = 'pending'
         ORDER BY w.ordering_key, w.id LIMIT 1;
        EXIT WHEN NOT FOUND;
        UPDATE outbox.intents SET waiting = false
         WHERE id = v_id AND waiting AND state = 'pending';
        EXIT WHEN FOUND;
        -- promoted by another finishing intent of the key: done
        PERFORM 1 FROM outbox.intents WHERE id = v_id AND state = 'pending';
        EXIT WHEN FOUND;
    END LOOP;
    RETURN NULL;
END
$$;

-- 3. One batch of a sweep over the noted keys: up to p_limit notes with
--    ids up to p_upto, oldest first (SKIP LOCKED: two relays take
--    different notes). Returns how many notes were taken, how many keys
--    looked at and how many intents promoted.
CREATE FUNCTION outbox.recheck_ordering_keys(p_limit integer, p_upto bigint)
RETURNS TABLE (taken integer, checked integer, promoted integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_keys  text[];
    v_key   text;
    v_first bigint;
    v_keep  text[] := '{}';
BEGIN
    checked := 0;
    promoted := 0;
    WITH gone AS (
             DELETE FROM outbox.ordering_rechecks r
              WHERE r.id IN (SELECT c.id FROM outbox.ordering_rechecks c WHERE c.id <= p_upto
                              ORDER BY c.id LIMIT p_limit FOR UPDATE SKIP LOCKED)
             RETURNING r.ordering_key)
    SELECT count(*), coalesce(array_agg(DISTINCT g.ordering_key), '{}') INTO taken, v_keys
      FROM gone g;
    FOREACH v_key IN ARRAY v_keys
    LOOP
        checked := checked + 1;
        SELECT w.id INTO v_first FROM outbox.intents w
         WHERE w.ordering_key = v_key AND w.waiting AND w.state = 'pending'
         ORDER BY w.ordering_key, w.id LIMIT 1;
        CONTINUE WHEN NOT FOUND;
        IF NOT EXISTS (SELECT 1 FROM outbox.intents e
                        WHERE e.ordering_key = v_key AND e.id < v_first
                          AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')) THEN
            UPDATE outbox.intents SET waiting = false
             WHERE id = v_first AND waiting AND state = 'pending';
            IF FOUND THEN
                promoted := promoted + 1;
            ELSE
                -- changed meanwhile (cancelled): look at the key again
                v_keep := v_keep || v_key;
            END IF;
        ELSE
            -- A live intent ahead that no transaction is changing now will
            -- finish later and promote. When every one ahead is being
            -- changed, their triggers may have run before the waiting
            -- intent committed: look again next pass.
            PERFORM 1 FROM outbox.intents e
              WHERE e.ordering_key = v_key AND e.id < v_first
                AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
              LIMIT 1 FOR SHARE SKIP LOCKED;
            IF NOT FOUND THEN
                v_keep := v_keep || v_key;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(v_keep) > 0 THEN
        INSERT INTO outbox.ordering_rechecks (ordering_key) SELECT unnest(v_keep);
    END IF;
    RETURN NEXT;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.recheck_ordering_keys(integer, bigint) FROM PUBLIC;

-- 4. outbox.enqueue_many answers, inserts and flags every row exactly as
--    outbox.enqueue called for each row in input order would, and takes
--    its row locks in one order whatever the input order.
--    - A row waits behind an earlier row of the batch with its ordering
--      key only when that earlier row is new: not a duplicate of an
--      intent (live or not), not a key the ledger remembers, not a
--      repeated key of the batch.
--    - The new rows are inserted in key order, with ids drawn in input
--      order first: two batches sharing keys wait for each other on their
--      first shared key instead of deadlocking (each insert of a key some
--      other transaction inserted waits for that transaction).
--    - The set-based path also serves REPEATABLE READ and SERIALIZABLE,
--      with outbox.enqueue's ledger probe done for all new rows at once
--      (in key order too), so those batches cannot deadlock either.
CREATE OR REPLACE FUNCTION outbox.enqueue_many(
    p_keys          text[],
    p_kinds         text[],
    p_payloads      jsonb[],
    p_destinations  text[]        DEFAULT NULL,
    p_run_afters    timestamptz[] DEFAULT NULL,
    p_ordering_keys text[]        DEFAULT NULL,
    p_source        text          DEFAULT NULL)
RETURNS TABLE (ord int, id bigint, duplicate boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    n            integer := coalesce(cardinality(p_keys), 0);
    v_seq        regclass := pg_get_serial_sequence('outbox.intents', 'id')::regclass;
    v_bad        record;
    v_ins_ords   integer[] := '{}';
    v_ins_ids    bigint[]  := '{}';
    v_purged_ids bigint[]  := '{}';
    v_rest_ords  integer[] := '{}';
    v_rest_ids   bigint[]  := '{}';
    v_rest_dups  boolean[] := '{}';
    v_new_ids    bigint[];
    v_new_keys   text[];
    v_new_runs   timestamptz[];
    v_new_kinds  text[];
    v_planned    integer := 0;
    v_lost       text[];
    v_row        record;
    v_id         bigint;
    v_dup        boolean;
BEGIN
    IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR (p_destinations IS NOT NULL AND cardinality(p_destinations) <> n)
       OR (p_run_afters IS NOT NULL AND cardinality(p_run_afters) <> n)
       OR (p_ordering_keys IS NOT NULL AND cardinality(p_ordering_keys) <> n) THEN
        RAISE EXCEPTION 'outbox.enqueue_many: the arrays must have the same length (% keys)', n
            USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- The first row outbox.enqueue would refuse (its tests, set-based, with
    -- its shortcuts): outbox.enqueue itself raises its error for it, word
    -- for word. (unnest pads a missing optional array with NULLs.)
    SELECT i.* INTO v_bad
      FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters, p_ordering_keys)
           WITH ORDINALITY AS i(key, kind, payload, destination, run_after, ordering_key, ord),
           -- OFFSET 0 keeps the text computed once a row: pulled up, each
           -- use of x.t would print the payload again
           LATERAL (SELECT i.payload::text AS t OFFSET 0) x
     WHERE i.key IS NULL OR length(i.key) = 0 OR length(i.key) > 512
        OR i.kind IS NULL OR length(i.kind) > 64 OR i.kind !~ '^[a-z][a-z0-9_.-]*$'
        OR i.payload IS NULL OR octet_length(x.t) > 1048576
        OR jsonb_path_exists(i.payload, 'strict $.**{64}')
        OR (octet_length(x.t) >= 309
            AND jsonb_path_exists(i.payload,
                   'strict $.** ? (@.type() == "number" && (@ > 1e308 || @ < -1e308))'))
        OR length(p_source) > 128
     ORDER BY i.ord LIMIT 1;
    IF FOUND THEN
        PERFORM * FROM outbox.enqueue(v_bad.key, v_bad.kind, v_bad.payload, v_bad.destination,
                                      coalesce(v_bad.run_after, now()), v_bad.ordering_key, p_source);
        RAISE EXCEPTION 'outbox.enqueue_many: row % was refused', v_bad.ord USING ERRCODE = '22023';
    END IF;

    -- One INSERT of the rows whose key is new, in key order (ties in input
    -- order, so a repeated key's first row wins), ids drawn in input order.
    -- ON CONFLICT skips a key already used; those rows are answered below.
    IF p_ordering_keys IS NULL THEN
        WITH ins AS (
                 INSERT INTO outbox.intents AS t (id, key, kind, destination, payload, run_after,
                                                  source)
                 OVERRIDING SYSTEM VALUE
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), p_source
                   FROM (SELECT u.*, nextval(v_seq) AS id
                           FROM (SELECT * FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                                      p_run_afters)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, ord)
                                  ORDER BY ord OFFSET 0) u) f
                  ORDER BY f.key, f.ord
                 ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
                 RETURNING t.id, t.key, t.run_after, t.kind)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after),
               array_agg(ins.kind)
          INTO v_new_ids, v_new_keys, v_new_runs, v_new_kinds FROM ins;
    ELSE
        -- Only the rows that will be new are inserted (a key's first row,
        -- the key unused and not in the ledger, as this statement sees
        -- them), so that a row waits behind an earlier row of its ordering
        -- key only when that row is a new intent, as one enqueue after the
        -- other would have it.
        WITH cand AS (
                 -- ids drawn in input order (OFFSET 0: the rows reach
                 -- nextval in the order of the subquery)
                 SELECT c.*, nextval(v_seq) AS id,
                        c.ordering_key IS NOT NULL AND (c.okey_rank > 1 OR EXISTS (
                            SELECT 1 FROM outbox.intents e
                             WHERE e.ordering_key = c.ordering_key
                               AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')))
                            AS waiting
                   FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key
                                                        ORDER BY u.ord) AS okey_rank
                           FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key
                                                               ORDER BY u.ord) AS nth
                                   FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                               p_run_afters, p_ordering_keys)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, ordering_key, ord)) u
                          WHERE u.nth = 1
                            AND NOT EXISTS (SELECT 1 FROM outbox.intents e WHERE e.key = u.key)
                            AND NOT EXISTS (SELECT 1 FROM outbox.ledger l WHERE l.key = u.key)
                          ORDER BY u.ord OFFSET 0) c),
             ins AS (
                 INSERT INTO outbox.intents AS t (id, key, kind, destination, payload, run_after,
                                                  ordering_key, source, waiting)
                 OVERRIDING SYSTEM VALUE
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), f.ordering_key, p_source, f.waiting
                   FROM cand f
                  ORDER BY f.key
                 ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
                 RETURNING t.id, t.key, t.run_after, t.kind)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after),
               array_agg(ins.kind), (SELECT count(*) FROM cand)
          INTO v_new_ids, v_new_keys, v_new_runs, v_new_kinds, v_planned FROM ins;
    END IF;

    -- outbox.enqueue's ledger probe under snapshot isolation (see there),
    -- for every new row at once, in key order.
    IF current_setting('transaction_isolation') <> 'read committed'
       AND cardinality(v_new_ids) > 0 THEN
        INSERT INTO outbox.ledger AS l (key, intent_id, kind, fingerprint, state, created_at,
                                        completed_at)
        SELECT r.key, r.id, r.kind, '\x'::bytea, 'probe', now(), now()
          FROM unnest(v_new_ids, v_new_keys, v_new_kinds) AS r(id, key, kind)
         ORDER BY r.key
        ON CONFLICT (key) DO NOTHING;
        DELETE FROM outbox.ledger l
         USING unnest(v_new_ids, v_new_keys) AS r(id, key)
         WHERE l.key = r.key AND l.intent_id = r.id AND l.state = 'probe';
    END IF;

    -- Each new row's position is its key's first one in the input. A
    -- new row whose key the ledger remembers is not new: as in
    -- outbox.enqueue (looked up after the insert, so a racing purge is
    -- seen too), outbox.enqueue answers for it.
    SELECT coalesce(array_agg(k.ord ORDER BY k.ord) FILTER (WHERE NOT k.purged), '{}'),
           coalesce(array_agg(k.id ORDER BY k.ord) FILTER (WHERE NOT k.purged), '{}'),
           coalesce(array_agg(k.id) FILTER (WHERE k.purged), '{}'),
           coalesce(bool_or(NOT k.purged AND k.run_after <= now()), false)
      INTO v_ins_ords, v_ins_ids, v_purged_ids, v_dup
      FROM (SELECT r.id, r.run_after, min(f.ord)::int AS ord,
                   EXISTS (SELECT 1 FROM outbox.ledger l WHERE l.key = r.key) AS purged
              FROM unnest(v_new_ids, v_new_keys, v_new_runs)
                   AS r(id, key, run_after)
              JOIN unnest(p_keys) WITH ORDINALITY AS f(key, ord) ON f.key = r.key
             GROUP BY r.id, r.key, r.run_after) k;
    IF cardinality(v_purged_ids) > 0 THEN
        DELETE FROM outbox.intents t WHERE t.id = ANY(v_purged_ids);
    END IF;

    -- A row planned as new that is not (a transaction inserted its key,
    -- or the ledger took it, after this statement's snapshot): the rows of
    -- its ordering key that are new get the flag enqueue would give them
    -- now, behind a live intent of the key that is not one of this batch's
    -- new rows, or behind an earlier new row of the batch.
    IF p_ordering_keys IS NOT NULL AND cardinality(v_ins_ids) < v_planned THEN
        SELECT array_agg(DISTINCT u.ordering_key) INTO v_lost
          FROM unnest(p_keys, p_ordering_keys) WITH ORDINALITY AS u(key, ordering_key, ord)
         WHERE u.ordering_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM unnest(v_ins_ords) AS d(ord) WHERE d.ord = u.ord);
        UPDATE outbox.intents t SET waiting = x.waiting
          FROM (SELECT r.id, EXISTS (
                           SELECT 1 FROM outbox.intents e
                            WHERE e.ordering_key = r.ordering_key AND e.id <> r.id
                              AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                              AND (e.id < r.id OR e.id <> ALL(v_ins_ids))) AS waiting
                  FROM outbox.intents r
                 WHERE r.id = ANY(v_ins_ids) AND r.ordering_key = ANY(v_lost)) x
         WHERE t.id = x.id AND t.waiting <> x.waiting;
    END IF;

    IF v_dup THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    IF cardinality(v_ins_ords) = n THEN
        RETURN QUERY SELECT a.ord, a.id, false FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id);
        RETURN;
    END IF;

    -- Everything else, in input order, by outbox.enqueue itself (an
    -- anti-join, not `ord <> ALL(...)`: that would be quadratic).
    FOR v_row IN
        SELECT i.* FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters,
                               p_ordering_keys)
                        WITH ORDINALITY AS i(key, kind, payload, destination, run_after,
                                             ordering_key, ord)
          LEFT JOIN unnest(v_ins_ords) AS done(ord) ON done.ord = i.ord
         WHERE done.ord IS NULL
         ORDER BY i.ord
    LOOP
        SELECT e.id, e.duplicate INTO v_id, v_dup
          FROM outbox.enqueue(v_row.key, v_row.kind, v_row.payload, v_row.destination,
                              coalesce(v_row.run_after, now()), v_row.ordering_key, p_source) e;
        v_rest_ords := v_rest_ords || v_row.ord::int;
        v_rest_ids := v_rest_ids || v_id;
        v_rest_dups := v_rest_dups || v_dup;
    END LOOP;

    RETURN QUERY
        SELECT x.ord, x.id, x.dup FROM (
            SELECT a.ord, a.id, false AS dup FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id)
            UNION ALL
            SELECT b.ord, b.id, b.dup
              FROM unnest(v_rest_ords, v_rest_ids, v_rest_dups) AS b(ord, id, dup)
        ) x ORDER BY x.ord;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text) FROM PUBLIC;
