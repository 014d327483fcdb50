-- Retention as a contract, schedules, per-key ordering.

-- A purged intent's key is not forgotten: the ledger keeps what a late
-- retry needs to be answered truthfully (duplicate or OB409) and what
-- `show KEY` / GET /v1/intents/{key} report, for much longer than the
-- intents themselves.
CREATE TABLE outbox.ledger (
    key          text PRIMARY KEY,
    intent_id    bigint      NOT NULL,
    kind         text        NOT NULL,
    destination  text,
    -- sha256 of the payload's canonical jsonb text
    fingerprint  bytea       NOT NULL,
    state        text        NOT NULL,
    provider_ref text,
    last_error   text,
    created_at   timestamptz NOT NULL,
    completed_at timestamptz NOT NULL,
    purged_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_purged_at ON outbox.ledger (purged_at);

-- Duplicate enqueues of purged intents have no intent row to take the kind from.
ALTER TABLE outbox.enqueue_duplicates ADD COLUMN kind text;

-- One row per configured schedule: the last tick enqueued. Relays take turns
-- on it (FOR UPDATE SKIP LOCKED) so a tick is enqueued once, not once per relay.
CREATE TABLE outbox.schedules (
    name       text PRIMARY KEY,
    last_tick  timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Per-key ordering: the live intents of each ordering key, in enqueue order.
CREATE INDEX intents_ordering ON outbox.intents (ordering_key, id)
    WHERE ordering_key IS NOT NULL AND state IN ('pending', 'claimed', 'ambiguous', 'dead');

CREATE OR REPLACE FUNCTION outbox.fingerprint(p_payload jsonb)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT sha256(convert_to(p_payload::text, 'UTF8')) $$;

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
AS $$
DECLARE
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
    IF pg_column_size(p_payload) > 1048576 THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is % bytes; the limit is 1 MiB',
            p_key, pg_column_size(p_payload) USING ERRCODE = '54000';
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

CREATE INDEX ledger_intent_id ON outbox.ledger (intent_id);
