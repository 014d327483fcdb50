-- Hardening: the ledger under snapshot isolation, one claim per
-- ordering key, waiting intents outside the claim index, a bounded
-- p_source, the fleet registry, and running totals for `stats`.
--
-- Safe while older relays run: older relays' claim statement does not know
-- `waiting` and reads intents through another index (correct, slower)
-- until they are upgraded; the trigger below keeps `waiting` right
-- whichever relay completes an intent.

-- 1. Waiting intents. An intent enqueued behind a live intent of the same
--    ordering key waits with `waiting = true`, outside the claim index, so
--    a key blocked by a dead head costs the claim nothing however many
--    intents queue behind it. When the head finishes, the next waiting
--    intent of its key is promoted (trigger). The sweeper promotes any
--    head left waiting by a race (an enqueue that committed while the head
--    finished).
ALTER TABLE outbox.intents ADD COLUMN waiting boolean NOT NULL DEFAULT false;

UPDATE outbox.intents c SET waiting = true
 WHERE c.state = 'pending' AND c.ordering_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM outbox.intents e
                WHERE e.ordering_key = c.ordering_key AND e.id < c.id
                  AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'));

DROP INDEX outbox.intents_due;
CREATE INDEX intents_due ON outbox.intents (run_after, id) WHERE state = 'pending' AND NOT waiting;
CREATE INDEX intents_waiting ON outbox.intents (ordering_key, id) WHERE waiting;
-- the blocked-keys gauge reads only dead and ambiguous intents with a key
CREATE INDEX intents_blocked ON outbox.intents (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('dead', 'ambiguous');

CREATE FUNCTION outbox.promote_next_in_order()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    UPDATE outbox.intents SET waiting = false
     WHERE id = (SELECT w.id FROM outbox.intents w
                  WHERE w.ordering_key = OLD.ordering_key AND w.waiting
                  ORDER BY w.id LIMIT 1)
       AND waiting;
    RETURN NULL;
END
$$;

CREATE TRIGGER intents_promote_next_in_order
    AFTER UPDATE OF state ON outbox.intents
    FOR EACH ROW
    WHEN (OLD.ordering_key IS NOT NULL
          AND OLD.state IN ('pending', 'claimed', 'ambiguous', 'dead')
          AND NEW.state IN ('delivered', 'rejected', 'cancelled'))
    EXECUTE FUNCTION outbox.promote_next_in_order();

-- 2. One claim per ordering key. The claim takes an intent with a key only
--    when this function says it is that key's turn: no older live intent
--    and no other intent of the key claimed (an operator may have made an
--    older one pending again, or an older one may have committed after a
--    younger was claimed). A transaction-scoped advisory lock on the key
--    makes two relays claiming at the same moment take turns: the second
--    one cannot take the lock until the first has committed, and then
--    sees its claim, because each statement of a VOLATILE function reads a
--    fresh snapshot under READ COMMITTED. (A hash collision between two
--    keys only makes one of them wait for the next claim.)
CREATE FUNCTION outbox.ordering_turn(p_ordering_key text, p_id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
-- no SET search_path (it costs every call, and the function runs with its
-- caller's rights): every name is qualified
AS $$
BEGIN
    -- 20290 = 0x4f42 ("OB"): our class of advisory locks
    IF NOT pg_catalog.pg_try_advisory_xact_lock(20290, pg_catalog.hashtext(p_ordering_key)) THEN
        RETURN false;
    END IF;
    -- the state list repeats intents_ordering's predicate, so that index
    -- serves the probe
    RETURN NOT EXISTS (
        SELECT 1 FROM outbox.intents e
         WHERE e.ordering_key = p_ordering_key
           AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
           AND e.id <> p_id
           AND (e.state = 'claimed' OR e.id < p_id));
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.ordering_turn(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.promote_next_in_order() FROM PUBLIC;

-- 3. The fleet: each relay registers itself and beats a heartbeat, so that
--    an intent of a kind this relay does not know is rejected only when no
--    live relay serves it (a rolling upgrade that adds a kind loses nothing).
CREATE TABLE outbox.relays (
    owner        text PRIMARY KEY,
    version      text        NOT NULL,
    -- kinds this relay delivers (configured)
    kinds        text[]      NOT NULL,
    -- kinds this relay's binary knows (configured or not)
    known_kinds  text[]      NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- set on a clean shutdown; the row is kept a day for `relays`
    stopped_at   timestamptz
);

-- 4. Running totals that `stats` reads instead of summing the history.
CREATE TABLE outbox.totals (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO outbox.totals (name, value)
SELECT 'duplicate_enqueues', coalesce(sum(duplicates), 0) FROM outbox.intents
ON CONFLICT (name) DO NOTHING;

-- 5. outbox.enqueue: as 0004, plus the waiting flag, the ledger probe under
--    snapshot isolation, and a length limit on p_source (a metric label).
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
    IF p_kind IS NULL OR p_kind !~ '^[a-z][a-z0-9_.-]{0,63}$' THEN
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
    IF jsonb_path_exists(p_payload, format('strict $.**{%s}', c_depth_limit)::jsonpath) THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is nested more than % levels deep; the limit is %',
            p_key, c_depth_limit - 1, c_depth_limit - 1
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(p_payload,
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

REVOKE EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text) FROM PUBLIC;
