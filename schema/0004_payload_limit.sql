-- The payload size limit, measured on what the application sent.
--
-- 0001/0002 checked pg_column_size(p_payload): the size of the datum as
-- stored, which is the *compressed* size when the value arrives compressed
-- (e.g. `SELECT outbox.enqueue(k, 'webhook', p) FROM staging`): a 5 MB
-- payload of repetitive text measured 57 kB and was accepted. The limit is
-- now on the payload's canonical text form, octet_length(p_payload::text),
-- which no storage detail changes, and has its own SQLSTATE:
--
--   OB413  payload too large; the message names the key, the size in
--          bytes and the limit. (Was 54000, shared with Postgres' own
--          program_limit_exceeded errors.)
--
-- The limit stays 1 MiB (1048576 bytes of payload::text), the value already
-- documented; it is checked before anything is written.
--
-- Two shapes Postgres stores but the relay (and most JSON parsers) cannot
-- read back are refused too, with SQLSTATE 22023: nesting 64 levels deep
-- or more (serde_json stops at 128), and numbers beyond +/-1e308 (outside
-- a double: Postgres keeps 1e400 as a 401-digit numeric). Before this, such
-- a payload was accepted and then failed the relay's claim of every intent
-- in the same batch, again after every lease expiry.
--
-- CREATE OR REPLACE keeps the function's owner and its grants (0003's
-- REVOKE FROM PUBLIC, deploy/sql/roles.sql's GRANTs), but not SECURITY
-- DEFINER or SET search_path, which are part of the definition: both are
-- restated below exactly as 0003 set them. The body is 0002's otherwise.

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

    LOOP
        INSERT INTO outbox.intents AS i (key, kind, destination, payload, run_after, ordering_key, source)
        VALUES (p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()), p_ordering_key, p_source)
        ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
        RETURNING i.id INTO v_id;

        IF v_id IS NOT NULL THEN
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

-- As 0003: applications get EXECUTE only through an explicit GRANT
-- (deploy/sql/roles.sql). Replacing the function kept its ACL; restating the
-- REVOKE makes that independent of how the function was (re)created.
REVOKE EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text) FROM PUBLIC;
