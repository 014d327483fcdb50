-- Cheaper enqueues. Function bodies and one CHECK change; the
-- signatures, answers, errors and SQLSTATEs stay those of 0005 and 0006,
-- and the CHECK accepts exactly what it accepted, so relays and
-- applications of any earlier version run unchanged beside this.
--
-- 1. outbox.enqueue skips the walk for numbers beyond +/-1e308 when the
--    payload's text is too short to hold one (309 characters), and its
--    depth path is a constant instead of a string formatted and parsed on
--    every call. (A prefilter for the depth, counting '{' and '[' with
--    translate(), cost more than the walk it would skip: 3.5 µs against
--    0.2 µs for a 310-byte payload.)
-- 2. outbox.enqueue_many's common case (new keys, READ COMMITTED) is one
--    INSERT straight from the arrays: a key repeated within the batch is
--    left to ON CONFLICT (the first occurrence wins, as before, and the
--    later ones are answered by outbox.enqueue), the per-key rank is only
--    computed when the batch has ordering keys, and the checks use the
--    same shortcut as outbox.enqueue and print each payload once. The CTE
--    that carried every input row through two sorts and a join is gone:
--    the 0006 function ran at about a sixth of this one's rate
--    (docs/performance.md, "Bulk enqueue").
-- 3. The kind's shape is tested as `length(kind) <= 64 AND kind ~
--    '^[a-z][a-z0-9_.-]*$'`, which accepts exactly what '^[a-z][a-z0-9_.-]
--    {0,63}$' accepts: Postgres's regex engine runs the bounded repeat as
--    63 copies of its state, about 1.2 µs a row against 0.15 µs, paid by
--    the CHECK on every insert and by both functions' own tests. The CHECK
--    is swapped NOT VALID (every existing row passed its equal); 0011
--    validates it without blocking writes.

-- Waits at most 10 s for the brief ACCESS EXCLUSIVE lock of the swap
-- instead of queueing every relay and application behind a long reader:
-- migrate then fails with "lock timeout" and can simply be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE outbox.intents
    DROP CONSTRAINT intents_kind_shape,
    ADD CONSTRAINT intents_kind_shape
        CHECK (length(kind) <= 64 AND kind ~ '^[a-z][a-z0-9_.-]*$') NOT VALID;

CREATE OR REPLACE FUNCTION outbox.enqueue(
    p_key          text,
    p_kind         text,
    p_payload      jsonb,
    p_destination  text        DEFAULT NULL,
    p_run_after    timestamptz DEFAULT now(),
    p_ordering_key text        DEFAULT NULL,
    p_source       text        DEFAULT NULL)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    -- bytes of p_payload::text (canonical jsonb text, UTF-8); 1 MiB
    c_payload_limit constant integer := 1048576;
    -- no value at this nesting level (the payload itself is level 0)
    c_depth_limit   constant integer := 64;
    -- characters of p_source (it becomes a metric label value)
    c_source_limit  constant integer := 128;
    v_waiting  boolean := false;
    v_size     integer;
    v_id       bigint;
    v_kind     text;
    v_dest     text;
    v_payload  jsonb;
    v_ledger   outbox.ledger%ROWTYPE;
BEGIN
    IF p_key IS NULL OR length(p_key) = 0 THEN
        RAISE EXCEPTION 'outbox.enqueue: key must not be empty' USING ERRCODE = '22023';
    END IF;
    IF length(p_key) > 512 THEN
        RAISE EXCEPTION 'outbox.enqueue: key is % characters long; the limit is 512', length(p_key)
            USING ERRCODE = '22023';
    END IF;
    IF p_kind IS NULL OR length(p_kind) > 64 OR p_kind !~ '^[a-z][a-z0-9_.-]*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: kind % is not a valid kind name', quote_nullable(p_kind)
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be NULL (key %)', p_key
            USING ERRCODE = '22023';
    END IF;
    v_size := octet_length(p_payload::text);
    IF v_size > c_payload_limit THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is % bytes; the limit is % bytes (1 MiB)',
            p_key, v_size, c_payload_limit
            USING ERRCODE = 'OB413',
                  DETAIL = 'the size is that of the payload''s JSON text (payload::text)',
                  HINT = 'store large content elsewhere and put a reference in the payload';
    END IF;
    IF length(p_source) > c_source_limit THEN
        RAISE EXCEPTION 'outbox.enqueue: source is % characters long; the limit is %',
            length(p_source), c_source_limit
            USING ERRCODE = '22023',
                  HINT = 'p_source names the enqueuing client (a service name), not a request';
    END IF;
    IF jsonb_path_exists(p_payload, 'strict $.**{64}') THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is nested more than % levels deep; the limit is %',
            p_key, c_depth_limit - 1, c_depth_limit - 1
            USING ERRCODE = '22023';
    END IF;
    -- jsonb prints a number with all its digits, never an exponent: one
    -- beyond +/-1e308 takes at least 309 characters of the text.
    IF v_size >= 309 AND jsonb_path_exists(p_payload,
           'strict $.** ? (@.type() == "number" && (@ > 1e308 || @ < -1e308))') THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % has a number beyond +/-1e308, which JSON parsers cannot read as a number',
            p_key USING ERRCODE = '22023';
    END IF;

    -- Behind a live intent of the same ordering key, the new one waits
    -- outside the claim index until the one ahead finishes (a trigger
    -- promotes it); see outbox.promote_next_in_order.
    IF p_ordering_key IS NOT NULL THEN
        v_waiting := EXISTS (SELECT 1 FROM outbox.intents e
                              WHERE e.ordering_key = p_ordering_key
                                AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'));
    END IF;

    LOOP
        INSERT INTO outbox.intents AS i (key, kind, destination, payload, run_after, ordering_key,
                                         source, waiting)
        VALUES (p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()), p_ordering_key,
                p_source, v_waiting)
        ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
        RETURNING i.id INTO v_id;

        IF v_id IS NOT NULL THEN
            -- Under REPEATABLE READ or SERIALIZABLE the ledger lookup below
            -- reads the transaction's snapshot, which may predate the purge
            -- of this very key: the purged row is gone (so the insert above
            -- succeeded) and its ledger entry is invisible. An insert sees
            -- what a snapshot cannot: Postgres answers a conflict with a row
            -- the snapshot cannot see with a serialization failure (40001),
            -- which the application retries, and the retry sees the ledger.
            -- A key never in the ledger leaves nothing behind.
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                INSERT INTO outbox.ledger AS l (key, intent_id, kind, fingerprint, state,
                                                created_at, completed_at)
                VALUES (p_key, v_id, p_kind, '\x'::bytea, 'probe', now(), now())
                ON CONFLICT (key) DO NOTHING;
                DELETE FROM outbox.ledger l
                 WHERE l.key = p_key AND l.intent_id = v_id AND l.state = 'probe';
            END IF;
            -- A new row, unless the key was purged into the ledger (checked
            -- after the insert, so a purge racing this call is seen too).
            SELECT * INTO v_ledger FROM outbox.ledger l WHERE l.key = p_key;
            IF NOT FOUND THEN
                IF coalesce(p_run_after, now()) <= now() THEN
                    PERFORM pg_notify('outbox_intents', '');
                END IF;
                id := v_id; duplicate := false;
                RETURN NEXT;
                RETURN;
            END IF;
            DELETE FROM outbox.intents i WHERE i.id = v_id;
            IF v_ledger.kind <> p_kind OR v_ledger.destination IS DISTINCT FROM p_destination
               OR v_ledger.fingerprint <> outbox.fingerprint(p_payload) THEN
                RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                    USING ERRCODE = 'OB409',
                          DETAIL = format('intent %s (purged, kept in the ledger) has kind %s and was %s',
                                          v_ledger.intent_id, v_ledger.kind, v_ledger.state),
                          HINT = 'use a new key for a new operation, or resend the original payload';
            END IF;
            INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind)
            VALUES (v_ledger.intent_id, p_source, v_ledger.kind);
            id := v_ledger.intent_id; duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;

        SELECT i.id, i.kind, i.destination, i.payload
          INTO v_id, v_kind, v_dest, v_payload
          FROM outbox.intents i WHERE i.key = p_key;
        -- the row we collided with may have been purged meanwhile: try again
        CONTINUE WHEN NOT FOUND;

        IF v_kind <> p_kind OR v_dest IS DISTINCT FROM p_destination OR v_payload <> p_payload THEN
            RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                USING ERRCODE = 'OB409',
                      DETAIL = format('existing intent %s has kind %s; the new request differs in %s',
                                      v_id, v_kind,
                                      CASE WHEN v_kind <> p_kind THEN 'kind'
                                           WHEN v_dest IS DISTINCT FROM p_destination THEN 'destination'
                                           ELSE 'payload' END),
                      HINT = 'use a new key for a new operation, or resend the original payload';
        END IF;

        INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind) VALUES (v_id, p_source, v_kind);
        id := v_id; duplicate := true;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;

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

    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The fast path: one INSERT, in input order, of every row whose key
        -- is new. ON CONFLICT skips a key already used, by an earlier
        -- statement or by an earlier row of this batch; those rows are
        -- answered below. Behind a live intent of its ordering key, or
        -- behind an earlier row of the batch with that key, a row waits
        -- (see 0005).
        IF p_ordering_keys IS NULL THEN
            WITH ins AS (
                     INSERT INTO outbox.intents AS t (key, kind, destination, payload, run_after,
                                                      source)
                     SELECT f.key, f.kind, f.destination, f.payload, coalesce(f.run_after, now()),
                            p_source
                       FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters)
                            WITH ORDINALITY AS f(key, kind, payload, destination, run_after, ord)
                      ORDER BY f.ord
                     ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
                     RETURNING t.id, t.key, t.run_after)
            SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after)
              INTO v_new_ids, v_new_keys, v_new_runs FROM ins;
        ELSE
            WITH ins AS (
                     INSERT INTO outbox.intents AS t (key, kind, destination, payload, run_after,
                                                      ordering_key, source, waiting)
                     SELECT f.key, f.kind, f.destination, f.payload, coalesce(f.run_after, now()),
                            f.ordering_key, p_source,
                            f.ordering_key IS NOT NULL AND (f.okey_rank > 1 OR EXISTS (
                                SELECT 1 FROM outbox.intents e
                                 WHERE e.ordering_key = f.ordering_key
                                   AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')))
                       FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key
                                                            ORDER BY u.ord) AS okey_rank
                               FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                           p_run_afters, p_ordering_keys)
                                    WITH ORDINALITY AS u(key, kind, payload, destination,
                                                         run_after, ordering_key, ord)) f
                      ORDER BY f.ord
                     ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
                     RETURNING t.id, t.key, t.run_after)
            SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after)
              INTO v_new_ids, v_new_keys, v_new_runs FROM ins;
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
        IF v_dup THEN
            PERFORM pg_notify('outbox_intents', '');
        END IF;
        IF cardinality(v_ins_ords) = n THEN
            RETURN QUERY SELECT a.ord, a.id, false FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id);
            RETURN;
        END IF;
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
