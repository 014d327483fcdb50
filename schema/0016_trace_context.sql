-- W3C Trace Context stored with each intent, so that a delivery can be a
-- span of the trace that enqueued it (design.md, "Trace context").
--
-- 1. outbox.intents gains traceparent and tracestate (nullable, no default:
--    a catalog change, no rewrite). Older relays read and write the table
--    as before; they never see the columns.
-- 2. Where the values come from, per row: an explicit traceparent when one
--    is given (p_traceparent of outbox.enqueue, p_traceparents of
--    outbox.enqueue_many, the traceparent column of an INSERT into
--    outbox.outbox), else the transaction's setting outbox.traceparent
--    (`SET LOCAL outbox.traceparent = '00-...'` once per transaction). An
--    explicit traceparent counts for its row even when malformed: the row
--    then gets none. The tracestate goes with whichever traceparent was
--    taken: the explicit one with the explicit one, the setting
--    outbox.tracestate with the setting. current_setting(..., true) is NULL
--    when the setting was never made and '' after the transaction of a SET
--    LOCAL ended: both mean none.
-- 3. A malformed value is not stored and never fails the enqueue (W3C: a
--    malformed traceparent starts a new trace). outbox.valid_traceparent
--    and outbox.valid_tracestate return their argument when it is valid,
--    else NULL (Trace Context level 1; a tracestate over 512 characters is
--    dropped, which the specification allows). They are IMMUTABLE SQL
--    functions the planner inlines, test the length before any regex, and
--    use only unbounded regex repeats (a bounded one like {32} runs as 32
--    copies of its state): about 2 µs for a traceparent and 1.5 µs for a
--    tracestate, spent only when a value is given. Without one, enqueue
--    adds a current_setting() lookup and enqueue_many one per call (no
--    measurable change: 100,000 enqueues, or 100 batches of 1,000, take
--    the time they took under 0015).
-- 4. The trace context is not part of an intent's identity: the same key
--    and payload again is a duplicate whatever its context, and the row
--    keeps the context of the first enqueue.
-- 5. Adding parameters changes the functions' signatures, so the old
--    outbox.enqueue and outbox.enqueue_many are dropped and the new ones
--    created (CREATE OR REPLACE would add an overload, and the calls would
--    become ambiguous). The new parameters come after p_source with
--    defaults, so every existing positional or named call resolves to the
--    new functions unchanged. Bodies, answers, errors, SQLSTATEs, SECURITY
--    DEFINER and search_path are those of 0010 (enqueue) and 0012
--    (enqueue_many). DROP would lose the EXECUTE grants a deployment made
--    on the old signatures (deploy/sql/roles.sql's, and any of its own):
--    each is granted again on the new function, read from the old one's
--    ACL before it is dropped, and the new function keeps the old one's
--    owner (it runs as its owner).
-- 6. outbox.outbox gains the columns traceparent and tracestate, at the end;
--    its INSTEAD OF trigger passes them on.

-- Waits at most 10 s for the brief ACCESS EXCLUSIVE lock of ADD COLUMN
-- instead of queueing every relay and application behind a long reader:
-- migrate then fails with "lock timeout" and can simply be run again.
SET LOCAL lock_timeout = '10s';
ALTER TABLE outbox.intents
    ADD COLUMN traceparent text,
    ADD COLUMN tracestate  text;

-- version "-" trace-id "-" parent-id "-" flags, lowercase hex: version ff
-- is invalid; version 00 is exactly 55 characters; a later version may be
-- longer when character 56 is '-', and only its first 55 characters (the
-- fields this version knows) are kept: the rest is unchecked text that
-- would otherwise go out in a message header; neither id all zeros.
-- The positions of the dashes and the regex (55 characters, four runs of
-- hex) fix the fields' lengths.
CREATE FUNCTION outbox.valid_traceparent(p_value text)
RETURNS text
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN (length(p_value) = 55
          OR (length(p_value) > 55 AND substr(p_value, 56, 1) = '-'
              AND left(p_value, 2) <> '00'))
     AND substr(p_value, 3, 1) = '-' AND substr(p_value, 36, 1) = '-'
     AND substr(p_value, 53, 1) = '-'
     AND left(p_value, 55) ~ '^[0-9a-f]+-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'
     AND left(p_value, 2) <> 'ff'
     AND substr(p_value, 4, 32) <> '00000000000000000000000000000000'
     AND substr(p_value, 37, 16) <> '0000000000000000'
    THEN left(p_value, 55) END;

-- At most 512 characters of printable ASCII; comma-separated members, each
-- empty (spaces only) or `key=value` with optional spaces around it: a key
-- of lowercase letters, digits and _-*/@ beginning with a letter or digit,
-- a value without ',' or '=' that does not end in a space. At most 32
-- members (one '=' each), and at least one (an empty list is no state).
CREATE FUNCTION outbox.valid_tracestate(p_value text)
RETURNS text
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN length(p_value) <= 512
     AND strpos(p_value, '=') > 0
     AND length(p_value) - length(replace(p_value, '=', '')) <= 32
     AND p_value !~ '[^ -~]'
     AND p_value ~ '^ *([a-z0-9][a-z0-9_*/@-]*=[^,=]*[^ ,=])? *(, *([a-z0-9][a-z0-9_*/@-]*=[^,=]*[^ ,=])? *)*$'
    THEN p_value END;

-- The new signatures are created beside the old ones (an overload until
-- the old ones are dropped below, in this same transaction).
CREATE FUNCTION outbox.enqueue(
    p_key          text,
    p_kind         text,
    p_payload      jsonb,
    p_destination  text        DEFAULT NULL,
    p_run_after    timestamptz DEFAULT now(),
    p_ordering_key text        DEFAULT NULL,
    p_source       text        DEFAULT NULL,
    p_traceparent  text        DEFAULT NULL,
    p_tracestate   text        DEFAULT NULL)
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
    v_traceparent text;
    v_tracestate  text;
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
        INSERT INTO outbox.intents AS i (key, kind, destination, payload, run_after, ordering_key,
                                         source, waiting, traceparent, tracestate)
        VALUES (p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()), p_ordering_key,
                p_source, v_waiting, v_traceparent, v_tracestate)
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

CREATE FUNCTION outbox.enqueue_many(
    p_keys          text[],
    p_kinds         text[],
    p_payloads      jsonb[],
    p_destinations  text[]        DEFAULT NULL,
    p_run_afters    timestamptz[] DEFAULT NULL,
    p_ordering_keys text[]        DEFAULT NULL,
    p_source        text          DEFAULT NULL,
    p_traceparents  text[]        DEFAULT NULL,
    p_tracestates   text[]        DEFAULT NULL)
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
    -- the setting's trace context, read once for the whole batch
    v_set_tp     text := outbox.valid_traceparent(current_setting('outbox.traceparent', true));
    v_set_ts     text;
    -- each row's trace context, when p_traceparents is given
    v_tps        text[];
    v_tss        text[];
BEGIN
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

    -- One INSERT of the rows whose key is new, in key order (ties in input
    -- order, so a repeated key's first row wins), ids drawn in input order.
    -- ON CONFLICT skips a key already used; those rows are answered below.
    IF p_ordering_keys IS NULL THEN
        WITH ins AS (
                 INSERT INTO outbox.intents AS t (id, key, kind, destination, payload, run_after,
                                                  source, traceparent, tracestate)
                 OVERRIDING SYSTEM VALUE
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), p_source,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
                   FROM (SELECT u.*, nextval(v_seq) AS id
                           FROM (SELECT * FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                                      p_run_afters, v_tps, v_tss)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, traceparent, tracestate,
                                                             ord)
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
                                               p_run_afters, p_ordering_keys, v_tps, v_tss)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, ordering_key, traceparent,
                                                             tracestate, ord)) u
                          WHERE u.nth = 1
                            AND NOT EXISTS (SELECT 1 FROM outbox.intents e WHERE e.key = u.key)
                            AND NOT EXISTS (SELECT 1 FROM outbox.ledger l WHERE l.key = u.key)
                          ORDER BY u.ord OFFSET 0) c),
             ins AS (
                 INSERT INTO outbox.intents AS t (id, key, kind, destination, payload, run_after,
                                                  ordering_key, source, waiting, traceparent,
                                                  tracestate)
                 OVERRIDING SYSTEM VALUE
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), f.ordering_key, p_source, f.waiting,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
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
$$;

-- As 0003: applications get EXECUTE only through an explicit GRANT.
REVOKE EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text, text[], text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.valid_traceparent(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.valid_tracestate(text) FROM PUBLIC;

-- Each new function gets the old one's owner (a SECURITY DEFINER function
-- runs as its owner; CREATE OR REPLACE kept it, CREATE makes the migrating
-- role the owner) and every EXECUTE grant of the old one, to the same
-- grantee (PUBLIC too, had a deployment granted it on purpose: the REVOKE
-- above only undoes the default), with its grant option; the owner's own
-- entry is implied. Then the old signatures go.
DO $$
DECLARE
    v_pair  record;
    v_grant record;
BEGIN
    FOR v_pair IN
        SELECT o.oid AS old_oid, o.proowner, n.proowner AS new_owner, s.new_sig
          FROM (VALUES ('outbox.enqueue(text, text, jsonb, text, timestamptz, text, text)',
                        'outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)'),
                       ('outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text)',
                        'outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text, text[], text[])'))
               AS s(old_sig, new_sig)
          JOIN pg_proc o ON o.oid = s.old_sig::regprocedure
          JOIN pg_proc n ON n.oid = s.new_sig::regprocedure
    LOOP
        IF v_pair.new_owner <> v_pair.proowner THEN
            EXECUTE format('ALTER FUNCTION %s OWNER TO %I', v_pair.new_sig,
                           pg_get_userbyid(v_pair.proowner));
            -- the validators they call, which PUBLIC may not execute
            EXECUTE format('ALTER FUNCTION outbox.valid_traceparent(text) OWNER TO %I',
                           pg_get_userbyid(v_pair.proowner));
            EXECUTE format('ALTER FUNCTION outbox.valid_tracestate(text) OWNER TO %I',
                           pg_get_userbyid(v_pair.proowner));
        END IF;
        FOR v_grant IN
            SELECT DISTINCT a.grantee, a.is_grantable
              FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = v_pair.old_oid AND a.privilege_type = 'EXECUTE'
               AND a.grantee <> p.proowner
        LOOP
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s%s', v_pair.new_sig,
                           CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
                           CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
        END LOOP;
    END LOOP;
END
$$;

DROP FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text);
DROP FUNCTION outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text);

-- The insertable outbox, with the two columns at the end (CREATE OR
-- REPLACE VIEW keeps its grants); an INSERT that leaves them out takes the
-- setting's context, as outbox.enqueue does.
CREATE OR REPLACE VIEW outbox.outbox AS
    SELECT key, kind, payload, destination, run_after, ordering_key, source, traceparent,
           tracestate
      FROM outbox.intents WHERE false;

CREATE OR REPLACE FUNCTION outbox.outbox_insert()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    PERFORM * FROM outbox.enqueue(NEW.key, NEW.kind, NEW.payload, NEW.destination,
                                  coalesce(NEW.run_after, now()), NEW.ordering_key, NEW.source,
                                  NEW.traceparent, NEW.tracestate);
    RETURN NEW;
END
$$;
