-- The key of an intent is kept unique by outbox.intent_keys (schema
-- 0037): the enqueue writes the key there first, and a key already there,
-- live or purged, is a duplicate whatever the caller's snapshot. The
-- enqueue functions no longer probe the ledger (nor write the probe row
-- that stood in for it under snapshot isolation), and the view
-- outbox.intents finds a log intent by its key through outbox.intent_keys,
-- two index probes, so that the log can do without its index on the key
-- (schema 0039). The view's log intents take their key from their key row
-- through a LEFT JOIN on the key's primary key: a read that filters on the
-- key turns it into a join Postgres starts from the key's index, and a
-- read that does not name the key leaves the join out (a count of the
-- delivered intents reads no key row).
--
-- `outbox-relay migrate` applies this once outbox.fill_intent_keys() has
-- copied every earlier key. Replacing the view locks it; the lock is
-- waited for at most 100 ms at a time, so that readers never queue behind
-- a long wait, for at most a minute.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM outbox.intent_keys_fill WHERE done_at IS NOT NULL) THEN
        RAISE EXCEPTION 'the keys of the intents enqueued before schema 0037 are not all in outbox.intent_keys yet'
            USING HINT = 'run outbox-relay migrate, which copies them in short transactions before this migration';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox.enqueue(p_key text, p_kind text, p_payload jsonb, p_destination text DEFAULT NULL::text, p_run_after timestamp with time zone DEFAULT now(), p_ordering_key text DEFAULT NULL::text, p_source text DEFAULT NULL::text, p_traceparent text DEFAULT NULL::text, p_tracestate text DEFAULT NULL::text) RETURNS TABLE(id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
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
    v_traceparent text;
    v_tracestate  text;
BEGIN
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.enqueue', current_setting('outbox.require_transaction'));
    END IF;
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
        v_waiting := EXISTS (SELECT 1 FROM outbox.intent_rows e
                              WHERE e.ordering_key = p_ordering_key
                                AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'));
    END IF;

    -- The trace context: the explicit traceparent when one is given (a
    -- malformed one, '' too, gives none), else the setting's ('' after an
    -- earlier transaction's SET LOCAL: none); the tracestate of the same
    -- origin, only with a valid traceparent. Never an error.
    v_traceparent := coalesce(p_traceparent, current_setting('outbox.traceparent', true));
    IF v_traceparent IS NOT NULL THEN
        v_traceparent := outbox.valid_traceparent(v_traceparent);
        IF v_traceparent IS NOT NULL THEN
            v_tracestate := outbox.valid_tracestate(
                CASE WHEN p_traceparent IS NULL THEN current_setting('outbox.tracestate', true)
                     ELSE p_tracestate END);
        END IF;
    END IF;

    LOOP
        -- The key first. outbox.intent_keys holds every key, live or purged
        -- until the ledger forgets it. Its primary key sees every committed
        -- key whatever the snapshot: under REPEATABLE READ or SERIALIZABLE a
        -- conflict with a key the snapshot cannot see is a serialization
        -- failure (40001), which the application retries.
        INSERT INTO outbox.intent_keys AS k (key, intent_id)
        VALUES (p_key, nextval('outbox.intent_ids'))
        ON CONFLICT (key) DO NOTHING
        RETURNING k.intent_id INTO v_id;

        IF v_id IS NOT NULL THEN
            INSERT INTO outbox.intent_log (id, key, kind, destination, payload, run_after,
                                           ordering_key, source, waiting, traceparent, tracestate)
            VALUES (v_id, p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()),
                    p_ordering_key, p_source, v_waiting, v_traceparent, v_tracestate);
            IF coalesce(p_run_after, now()) <= now() THEN
                PERFORM pg_notify('outbox_intents', '');
            END IF;
            id := v_id; duplicate := false;
            RETURN NEXT;
            RETURN;
        END IF;

        -- The key is taken: by a live intent, by a purged one the ledger
        -- remembers, or by one deleted since, whose key is free again.
        SELECT k.intent_id INTO v_id FROM outbox.intent_keys k WHERE k.key = p_key;
        -- forgotten meanwhile (the ledger's retention): try again
        CONTINUE WHEN NOT FOUND;

        SELECT i.kind, i.destination, i.payload
          INTO v_kind, v_dest, v_payload
          FROM outbox.intent_log i WHERE i.id = v_id AND i.key = p_key;
        IF NOT FOUND THEN
            -- an intent with a row outlives its segment of the log (0042)
            SELECT t.kind, t.destination, t.payload
              INTO v_kind, v_dest, v_payload
              FROM outbox.intent_rows t WHERE t.id = v_id AND t.key = p_key;
        END IF;
        IF FOUND THEN
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
        END IF;

        -- Purged: the ledger answers (its purge removed the log row and
        -- wrote the entry in one transaction, so one of the two is seen).
        SELECT * INTO v_ledger FROM outbox.ledger l WHERE l.key = p_key;
        IF FOUND THEN
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

        -- Neither: its intent was deleted and is not remembered, so the
        -- key is free. Taken over on the next pass (by this call or a
        -- racing one).
        DELETE FROM outbox.intent_keys k WHERE k.key = p_key AND k.intent_id = v_id;
    END LOOP;
END
$_$;

CREATE OR REPLACE FUNCTION outbox.enqueue_many(p_keys text[], p_kinds text[], p_payloads jsonb[], p_destinations text[] DEFAULT NULL::text[], p_run_afters timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], p_ordering_keys text[] DEFAULT NULL::text[], p_source text DEFAULT NULL::text, p_traceparents text[] DEFAULT NULL::text[], p_tracestates text[] DEFAULT NULL::text[]) RETURNS TABLE(ord integer, id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    n            integer := coalesce(cardinality(p_keys), 0);
    v_seq        regclass := pg_get_serial_sequence('outbox.intents', 'id')::regclass;
    v_bad        record;
    v_ins_ords   integer[] := '{}';
    v_ins_ids    bigint[]  := '{}';
    v_rest_ords  integer[] := '{}';
    v_rest_ids   bigint[]  := '{}';
    v_rest_dups  boolean[] := '{}';
    v_new_ids    bigint[];
    v_new_keys   text[];
    v_new_runs   timestamptz[];
    v_planned    integer := 0;
    v_lost       text[];
    v_row        record;
    v_id         bigint;
    v_dup        boolean;
    -- the setting's trace context, read once for the whole batch
    v_set_tp     text := outbox.valid_traceparent(current_setting('outbox.traceparent', true));
    v_set_ts     text;
    -- each row's trace context, when p_traceparents is given
    v_tps        text[];
    v_tss        text[];
BEGIN
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.enqueue_many', current_setting('outbox.require_transaction'));
    END IF;
    IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR (p_destinations IS NOT NULL AND cardinality(p_destinations) <> n)
       OR (p_run_afters IS NOT NULL AND cardinality(p_run_afters) <> n)
       OR (p_ordering_keys IS NOT NULL AND cardinality(p_ordering_keys) <> n)
       OR (p_traceparents IS NOT NULL AND cardinality(p_traceparents) <> n)
       OR (p_tracestates IS NOT NULL AND cardinality(p_tracestates) <> n) THEN
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

    -- The trace context of each row, by outbox.enqueue's rule: a row's
    -- explicit traceparent (a malformed one gives none) with its explicit
    -- tracestate, else the setting's pair. Without p_traceparents every
    -- row has the setting's pair, and v_tps and v_tss stay NULL.
    IF v_set_tp IS NOT NULL THEN
        v_set_ts := outbox.valid_tracestate(current_setting('outbox.tracestate', true));
    END IF;
    IF p_traceparents IS NOT NULL THEN
        SELECT array_agg(CASE WHEN t.given THEN t.tp ELSE v_set_tp END ORDER BY t.ord),
               array_agg(CASE WHEN NOT t.given THEN v_set_ts
                              WHEN t.tp IS NOT NULL THEN outbox.valid_tracestate(t.ts) END
                         ORDER BY t.ord)
          INTO v_tps, v_tss
          -- OFFSET 0: each row's traceparent validated once
          FROM (SELECT u.ord, u.tp IS NOT NULL AS given, u.ts,
                       outbox.valid_traceparent(u.tp) AS tp
                  FROM unnest(p_traceparents, p_tracestates) WITH ORDINALITY AS u(tp, ts, ord)
                OFFSET 0) t;
    END IF;

    -- The keys of the rows first, in one INSERT in key order (ties in
    -- input order, so a repeated key's first row wins), ids drawn in input
    -- order; ON CONFLICT skips a key already used, live or purged (those
    -- rows are answered below). Then the rows whose key went in.
    IF p_ordering_keys IS NULL THEN
        WITH f AS MATERIALIZED (
                 SELECT u.*, nextval(v_seq) AS id
                   FROM (SELECT * FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                              p_run_afters, v_tps, v_tss)
                                WITH ORDINALITY AS u(key, kind, payload, destination,
                                                     run_after, traceparent, tracestate, ord)
                          ORDER BY ord OFFSET 0) u),
             keyed AS (
                 INSERT INTO outbox.intent_keys AS k (key, intent_id)
                 SELECT f.key, f.id FROM f ORDER BY f.key, f.ord
                 ON CONFLICT (key) DO NOTHING
                 RETURNING k.intent_id),
             ins AS (
                 INSERT INTO outbox.intent_log AS t (id, key, kind, destination, payload, run_after,
                                                  source, traceparent, tracestate)
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), p_source,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
                   FROM f
                  WHERE f.id IN (SELECT k.intent_id FROM keyed k)
                 RETURNING t.id, t.key, t.run_after)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after)
          INTO v_new_ids, v_new_keys, v_new_runs FROM ins;
    ELSE
        -- Only the rows that will be new are inserted (a key's first row,
        -- the key unused, live or purged, as this statement sees them), so
        -- that a row waits behind an earlier row of its ordering
        -- key only when that row is a new intent, as one enqueue after the
        -- other would have it.
        WITH cand AS (
                 -- ids drawn in input order (OFFSET 0: the rows reach
                 -- nextval in the order of the subquery)
                 SELECT c.*, nextval(v_seq) AS id,
                        c.ordering_key IS NOT NULL AND (c.okey_rank > 1 OR EXISTS (
                            SELECT 1 FROM outbox.intent_rows e
                             WHERE e.ordering_key = c.ordering_key
                               AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')))
                            AS waiting
                   FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key
                                                        ORDER BY u.ord) AS okey_rank
                           FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key
                                                               ORDER BY u.ord) AS nth
                                   FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                               p_run_afters, p_ordering_keys, v_tps, v_tss)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, ordering_key, traceparent,
                                                             tracestate, ord)) u
                          WHERE u.nth = 1
                            AND NOT EXISTS (SELECT 1 FROM outbox.intent_keys k WHERE k.key = u.key)
                          ORDER BY u.ord OFFSET 0) c),
             keyed AS (
                 INSERT INTO outbox.intent_keys AS k (key, intent_id)
                 SELECT c.key, c.id FROM cand c ORDER BY c.key
                 ON CONFLICT (key) DO NOTHING
                 RETURNING k.intent_id),
             ins AS (
                 INSERT INTO outbox.intent_log AS t (id, key, kind, destination, payload, run_after,
                                                  ordering_key, source, waiting, traceparent,
                                                  tracestate)
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), f.ordering_key, p_source, f.waiting,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
                   FROM cand f
                  WHERE f.id IN (SELECT k.intent_id FROM keyed k)
                 RETURNING t.id, t.key, t.run_after)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after),
               (SELECT count(*) FROM cand)
          INTO v_new_ids, v_new_keys, v_new_runs, v_planned FROM ins;
    END IF;

    -- Each new row's position is its key's first one in the input.
    SELECT coalesce(array_agg(k.ord ORDER BY k.ord), '{}'),
           coalesce(array_agg(k.id ORDER BY k.ord), '{}'),
           coalesce(bool_or(k.run_after <= now()), false)
      INTO v_ins_ords, v_ins_ids, v_dup
      FROM (SELECT r.id, r.run_after, min(f.ord)::int AS ord
              FROM unnest(v_new_ids, v_new_keys, v_new_runs)
                   AS r(id, key, run_after)
              JOIN unnest(p_keys) WITH ORDINALITY AS f(key, ord) ON f.key = r.key
             GROUP BY r.id, r.key, r.run_after) k;

    -- A row planned as new that is not (a transaction inserted its key
    -- after this statement's snapshot): the rows of
    -- its ordering key that are new get the flag enqueue would give them
    -- now, behind a live intent of the key that is not one of this batch's
    -- new rows, or behind an earlier new row of the batch.
    IF p_ordering_keys IS NOT NULL AND cardinality(v_ins_ids) < v_planned THEN
        SELECT array_agg(DISTINCT u.ordering_key) INTO v_lost
          FROM unnest(p_keys, p_ordering_keys) WITH ORDINALITY AS u(key, ordering_key, ord)
         WHERE u.ordering_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM unnest(v_ins_ords) AS d(ord) WHERE d.ord = u.ord);
        UPDATE outbox.intent_rows t SET waiting = x.waiting
          FROM (SELECT r.id, EXISTS (
                           SELECT 1 FROM outbox.intent_rows e
                            WHERE e.ordering_key = r.ordering_key AND e.id <> r.id
                              AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                              AND (e.id < r.id OR e.id <> ALL(v_ins_ids))) AS waiting
                  FROM outbox.intent_rows r
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
    -- anti-join, not `ord <> ALL(...)`: that would be quadratic), each row
    -- with its own explicit trace context (outbox.enqueue applies the same
    -- rule, the setting's pair when the row has no traceparent).
    FOR v_row IN
        SELECT i.* FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters,
                               p_ordering_keys, p_traceparents, p_tracestates)
                        WITH ORDINALITY AS i(key, kind, payload, destination, run_after,
                                             ordering_key, traceparent, tracestate, ord)
          LEFT JOIN unnest(v_ins_ords) AS done(ord) ON done.ord = i.ord
         WHERE done.ord IS NULL
         ORDER BY i.ord
    LOOP
        SELECT e.id, e.duplicate INTO v_id, v_dup
          FROM outbox.enqueue(v_row.key, v_row.kind, v_row.payload, v_row.destination,
                              coalesce(v_row.run_after, now()), v_row.ordering_key, p_source,
                              v_row.traceparent, v_row.tracestate) e;
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
$_$;

CREATE OR REPLACE FUNCTION outbox.expand_event(p_event bigint, p_subscription text DEFAULT NULL::text) RETURNS TABLE(matched integer, created integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_event   outbox.intent_log;
    v_matched integer;
    v_created integer;
BEGIN
    SELECT * INTO v_event FROM outbox.intent_log l WHERE l.id = p_event AND l.kind = 'event';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox.expand_event: no event has id %', p_event USING ERRCODE = 'P0002';
    END IF;
    WITH subs AS (
             SELECT s.id, outbox.derive_key(v_event.key, 'subscription ' || s.id) AS key
               FROM outbox.subscriptions s
              WHERE s.disabled_at IS NULL
                AND (p_subscription IS NULL OR s.id = p_subscription)
                AND s.tenant IS NOT DISTINCT FROM (v_event.payload->>'tenant')
                AND outbox.event_type_matches(s.event_types, v_event.payload->>'type')),
         fresh AS (
             SELECT s.id, s.key, nextval('outbox.intent_ids') AS intent_id FROM subs s
              WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                 WHERE d.event_id = p_event AND d.subscription_id = s.id)),
         -- a delivery's key not used yet, live or purged
         keyed AS (
             INSERT INTO outbox.intent_keys AS k (key, intent_id)
             SELECT f.key, f.intent_id FROM fresh f ORDER BY f.key
             ON CONFLICT (key) DO NOTHING
             RETURNING k.intent_id),
         -- each delivery names its subscription: the link is made from
         -- what the insert returns, without joining back to `fresh`
         logged AS (
             INSERT INTO outbox.intent_log (id, key, kind, payload, source, traceparent, tracestate)
             SELECT f.intent_id, f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.id,
                        'body', jsonb_build_object(
                            'type', v_event.payload->>'type',
                            'timestamp', to_char(v_event.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', v_event.payload->'data')),
                    'event ' || p_event, v_event.traceparent, v_event.tracestate
               FROM fresh f
              WHERE f.intent_id IN (SELECT k.intent_id FROM keyed k)
             RETURNING intent_log.id, intent_log.payload->>'subscription' AS subscription_id),
         linked AS (
             INSERT INTO outbox.event_deliveries (event_id, subscription_id, intent_id)
             SELECT p_event, g.subscription_id, g.id FROM logged g
             ON CONFLICT ON CONSTRAINT event_deliveries_pkey DO NOTHING
             RETURNING 1)
    SELECT (SELECT count(*) FROM subs)::integer, (SELECT count(*) FROM linked)::integer
      INTO v_matched, v_created;
    -- the relays wake for the deliveries, as for an enqueue
    IF v_created > 0 THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    matched := v_matched;
    created := v_created;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION outbox.expand_events(p_events bigint[]) RETURNS TABLE(event_id bigint, is_event boolean, matched integer, created integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_ids     bigint[];
    v_found   boolean[];
    v_matched integer[];
    v_created integer[];
BEGIN
    WITH ev AS (
             SELECT l.id, l.key, l.payload, l.created_at, l.traceparent, l.tracestate
               FROM outbox.intent_log l
              WHERE l.id = ANY (p_events) AND l.kind = 'event'),
         pairs AS (
             SELECT e.id AS event_id, s.id AS subscription_id,
                    outbox.derive_key(e.key, 'subscription ' || s.id) AS key
               FROM ev e
               JOIN outbox.subscriptions s
                 ON s.disabled_at IS NULL
                AND s.tenant IS NOT DISTINCT FROM (e.payload->>'tenant')
                AND outbox.event_type_matches(s.event_types, e.payload->>'type')),
         -- ids drawn in event and subscription order (OFFSET 0: the rows
         -- reach nextval in the order of the subquery)
         fresh AS (
             SELECT p.*, nextval('outbox.intent_ids') AS intent_id
               FROM (SELECT p.* FROM pairs p
                      WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                         WHERE d.event_id = p.event_id
                                           AND d.subscription_id = p.subscription_id)
                      ORDER BY p.event_id, p.subscription_id OFFSET 0) p),
         -- a delivery's key not used yet, live or purged
         keyed AS (
             INSERT INTO outbox.intent_keys AS k (key, intent_id)
             SELECT f.key, f.intent_id FROM fresh f ORDER BY f.key
             ON CONFLICT (key) DO NOTHING
             RETURNING k.intent_id),
         logged AS (
             INSERT INTO outbox.intent_log (id, key, kind, payload, source, traceparent, tracestate)
             SELECT f.intent_id, f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.subscription_id,
                        'body', jsonb_build_object(
                            'type', e.payload->>'type',
                            'timestamp', to_char(e.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', e.payload->'data')),
                    'event ' || e.id, e.traceparent, e.tracestate
               FROM fresh f JOIN ev e ON e.id = f.event_id
              WHERE f.intent_id IN (SELECT k.intent_id FROM keyed k)
              ORDER BY f.intent_id
             -- each delivery names its event (its source) and its
             -- subscription: the link is made from what the insert
             -- returns, without joining back to `fresh` (a CTE Postgres
             -- cannot size, joined as a nested loop)
             RETURNING intent_log.id, substr(intent_log.source, 7)::bigint AS event_id,
                       intent_log.payload->>'subscription' AS subscription_id),
         linked AS (
             INSERT INTO outbox.event_deliveries (event_id, subscription_id, intent_id)
             SELECT g.event_id, g.subscription_id, g.id
               FROM logged g
             ON CONFLICT ON CONSTRAINT event_deliveries_pkey DO NOTHING
             RETURNING event_deliveries.event_id),
         counts AS (
             SELECT u.id, e.id IS NOT NULL AS found,
                    coalesce(m.n, 0)::integer AS matched, coalesce(k.n, 0)::integer AS created
               FROM (SELECT DISTINCT unnest(p_events) AS id) u
               LEFT JOIN ev e ON e.id = u.id
               LEFT JOIN (SELECT p.event_id, count(*) AS n FROM pairs p GROUP BY 1) m
                      ON m.event_id = u.id
               LEFT JOIN (SELECT k.event_id, count(*) AS n FROM linked k GROUP BY 1) k
                      ON k.event_id = u.id)
    SELECT array_agg(c.id), array_agg(c.found), array_agg(c.matched), array_agg(c.created)
      INTO v_ids, v_found, v_matched, v_created
      FROM counts c;
    -- the relays wake for the deliveries, as for an enqueue
    IF EXISTS (SELECT 1 FROM unnest(v_created) n WHERE n > 0) THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_found, v_matched, v_created);
END
$$;

CREATE OR REPLACE FUNCTION outbox.intents_write() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- the key, unless it is taken (a unique violation, as for the log's
        -- own key before); a key whose intent is gone and not remembered
        -- is free
        DELETE FROM outbox.intent_keys k
         WHERE k.key = NEW.key
           AND NOT EXISTS (SELECT 1 FROM outbox.intent_log l WHERE l.id = k.intent_id)
           AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = k.intent_id)
           AND NOT EXISTS (SELECT 1 FROM outbox.ledger g WHERE g.key = k.key);
        INSERT INTO outbox.intent_keys (key, intent_id) VALUES (NEW.key, NEW.id);
        INSERT INTO outbox.intent_log (id, key, kind, destination, payload, run_after,
                                       ordering_key, waiting, source, traceparent, tracestate,
                                       created_at)
        VALUES (NEW.id, NEW.key, NEW.kind, NEW.destination, NEW.payload, NEW.run_after,
                NEW.ordering_key, NEW.waiting, NEW.source, NEW.traceparent, NEW.tracestate,
                NEW.created_at);
        -- the log's trigger gave some intents their row already
        DELETE FROM outbox.intent_rows t WHERE t.id = NEW.id;
        INSERT INTO outbox.intent_rows SELECT NEW.*;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM outbox.intent_log l WHERE l.id = OLD.id;
        IF NOT FOUND THEN
            -- an intent that outlived its segment of the log (0042): its
            -- row, and what the log's triggers would have taken with it
            DELETE FROM outbox.intent_rows t WHERE t.id = OLD.id;
            DELETE FROM outbox.attempts a WHERE a.intent_id = OLD.id;
            DELETE FROM outbox.operator_actions a WHERE a.intent_id = OLD.id;
            DELETE FROM outbox.event_deliveries d WHERE d.intent_id = OLD.id;
            DELETE FROM outbox.event_deliveries d WHERE d.event_id = OLD.id;
        END IF;
        DELETE FROM outbox.intent_keys k WHERE k.key = OLD.key AND k.intent_id = OLD.id;
        RETURN OLD;
    END IF;
    PERFORM outbox.track(ARRAY[OLD.id]);
    -- the row as OLD saw it, or nothing: a row that moved on meanwhile (a
    -- claim took the log intent, a completion settled the row) is left to
    -- what moved it, as an UPDATE of a table re-checks its row
    PERFORM 1 FROM outbox.intent_rows t
      WHERE t.id = OLD.id AND t.state = OLD.state AND t.fence = OLD.fence
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF (NEW.key, NEW.kind, NEW.destination, NEW.payload)
       IS DISTINCT FROM (OLD.key, OLD.kind, OLD.destination, OLD.payload) THEN
        UPDATE outbox.intent_log l
           SET key = NEW.key, kind = NEW.kind, destination = NEW.destination, payload = NEW.payload
         WHERE l.id = OLD.id;
        UPDATE outbox.intent_keys k SET key = NEW.key
         WHERE k.key = OLD.key AND k.intent_id = OLD.id AND NEW.key <> OLD.key;
    END IF;
    UPDATE outbox.intent_rows t
       SET (key, kind, destination, payload, state, attempts, attempts_base, run_after,
            ordering_key, provider_ref, last_error, response, owner, lease_expires_at, fence,
            key_generation, duplicates, source, created_at, updated_at, delivered_at, waiting,
            recover_owner, recover_at, traceparent, tracestate, first_attempt_started_at,
            first_attempt_finished_at, first_attempt_owner, first_attempt_status,
            first_attempt_replayed)
         = (NEW.key, NEW.kind, NEW.destination, NEW.payload, NEW.state, NEW.attempts,
            NEW.attempts_base, NEW.run_after, NEW.ordering_key, NEW.provider_ref, NEW.last_error,
            NEW.response, NEW.owner, NEW.lease_expires_at, NEW.fence, NEW.key_generation,
            NEW.duplicates, NEW.source, NEW.created_at, NEW.updated_at, NEW.delivered_at,
            NEW.waiting, NEW.recover_owner, NEW.recover_at, NEW.traceparent, NEW.tracestate,
            NEW.first_attempt_started_at, NEW.first_attempt_finished_at,
            NEW.first_attempt_owner, NEW.first_attempt_status, NEW.first_attempt_replayed)
     WHERE t.id = OLD.id;
    RETURN NEW;
END
$$;

DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            CREATE OR REPLACE VIEW outbox.intents AS
            SELECT t.id, t.key, t.kind, t.destination, t.payload, t.state, t.attempts,
                   t.attempts_base, t.run_after, t.ordering_key, t.provider_ref, t.last_error,
                   t.response, t.owner, t.lease_expires_at, t.fence, t.key_generation,
                   t.duplicates, t.source, t.created_at, t.updated_at, t.delivered_at, t.waiting,
                   t.recover_owner, t.recover_at, t.traceparent, t.tracestate,
                   t.first_attempt_started_at, t.first_attempt_finished_at,
                   t.first_attempt_owner, t.first_attempt_status, t.first_attempt_replayed
              FROM outbox.intent_rows t
            UNION ALL
            -- delivered at the first attempt, from the log
            SELECT l.id, k.key, l.kind, l.destination, l.payload, 'delivered'::text, 1, 0,
                   l.run_after, l.ordering_key, o.provider_ref, NULL::text, NULL::jsonb,
                   NULL::text, NULL::timestamptz, 1::bigint, 0, 0, l.source, l.created_at, o.at,
                   o.at, false, NULL::text, NULL::timestamptz, l.traceparent, l.tracestate,
                   o.started_at, o.finished_at, o.owner, o.status, o.replayed
              FROM outbox.log_outcomes o JOIN outbox.intent_log l ON l.id = o.intent_id
              LEFT JOIN outbox.intent_keys k ON k.key = l.key AND k.intent_id = l.id
             WHERE o.outcome = 'delivered'
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = o.intent_id)
            UNION ALL
            -- claimed from the log, no outcome yet
            SELECT l.id, k.key, l.kind, l.destination, l.payload, 'claimed'::text, 1, 0,
                   l.run_after, l.ordering_key, NULL::text, NULL::text, NULL::jsonb, b.owner,
                   b.lease_expires_at, 1::bigint, 0, 0, l.source, l.created_at, b.claimed_at,
                   NULL::timestamptz, false, NULL::text, NULL::timestamptz, l.traceparent,
                   l.tracestate, NULL::timestamptz, NULL::timestamptz, NULL::text,
                   NULL::integer, NULL::boolean
              FROM outbox.log_batches b CROSS JOIN LATERAL unnest(b.ids) AS c(id)
              JOIN outbox.intent_log l ON l.id = c.id
              LEFT JOIN outbox.intent_keys k ON k.key = l.key AND k.intent_id = l.id
             WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = c.id)
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = c.id)
            UNION ALL
            -- in the log after the cursor, taken by no claim yet
            SELECT l.id, k.key, l.kind, l.destination, l.payload, 'pending'::text, 0, 0,
                   l.run_after, l.ordering_key, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                   NULL::timestamptz, 0::bigint, 0, 0, l.source, l.created_at, l.created_at,
                   NULL::timestamptz, l.waiting, NULL::text, NULL::timestamptz, l.traceparent,
                   l.tracestate, NULL::timestamptz, NULL::timestamptz, NULL::text,
                   NULL::integer, NULL::boolean
              FROM outbox.intent_log l
              LEFT JOIN outbox.intent_keys k ON k.key = l.key AND k.intent_id = l.id
             WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                     ORDER BY c.seq DESC LIMIT 1)
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
               AND (l.id > (SELECT greatest(
                                coalesce((SELECT max(o.intent_id) FROM outbox.log_outcomes o), 0),
                                coalesce((SELECT max(b.max_id) FROM outbox.log_batches b), 0)))
                    OR (NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = l.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                         WHERE b.ids @> ARRAY[l.id])));
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the view outbox.intents within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;
