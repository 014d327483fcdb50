-- outbox-relay core schema: intents, attempts, the enqueue API.
--
-- Applications need only outbox.enqueue(); everything else is the relay's.
-- Migrations are forward-only and safe to apply while older relays run.

CREATE SCHEMA IF NOT EXISTS outbox;

-- One row per intent. The hot path updates `state`, `owner`, `lease_expires_at`,
-- `fence`, `attempts`, `run_after` and a few text columns; fillfactor leaves room
-- on each page so those updates can stay on the page (HOT) when no indexed
-- column changes.
CREATE TABLE outbox.intents (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key              text        NOT NULL,
    kind             text        NOT NULL,
    destination      text,
    payload          jsonb       NOT NULL,
    state            text        NOT NULL DEFAULT 'pending',
    attempts         integer     NOT NULL DEFAULT 0,
    -- `attempts` when an operator last retried: the retry budget counts from here
    attempts_base    integer     NOT NULL DEFAULT 0,
    run_after        timestamptz NOT NULL DEFAULT now(),
    ordering_key     text,
    provider_ref     text,
    last_error       text,
    -- the provider's answer for a terminal rejection (status, body excerpt)
    response         jsonb,
    -- who holds the claim and until when; NULL unless state = 'claimed'
    owner            text,
    lease_expires_at timestamptz,
    -- fencing token: bumped on every claim; a completion must present it
    fence            bigint      NOT NULL DEFAULT 0,
    -- bumped only by an operator asking for a new effect (retry --new-effect)
    key_generation   integer     NOT NULL DEFAULT 0,
    -- duplicate enqueues folded in from outbox.enqueue_duplicates
    duplicates       integer     NOT NULL DEFAULT 0,
    source           text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CONSTRAINT intents_key_unique UNIQUE (key),
    CONSTRAINT intents_key_not_empty CHECK (length(key) BETWEEN 1 AND 512),
    CONSTRAINT intents_kind_shape CHECK (kind ~ '^[a-z][a-z0-9_.-]{0,63}$'),
    CONSTRAINT intents_state_known CHECK (state IN
        ('pending', 'claimed', 'delivered', 'rejected', 'dead', 'ambiguous', 'cancelled')),
    CONSTRAINT intents_claim_shape CHECK (
        (state = 'claimed') = (owner IS NOT NULL AND lease_expires_at IS NOT NULL))
) WITH (fillfactor = 80,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_analyze_scale_factor = 0.02);

-- Claiming reads only this index: its size is the number of pending rows, not
-- the size of the delivered history.
CREATE INDEX intents_due ON outbox.intents (run_after, id) WHERE state = 'pending';
-- The sweeper reads only live claims.
CREATE INDEX intents_leases ON outbox.intents (lease_expires_at) WHERE state = 'claimed';
-- Operators list and count by state and kind.
CREATE INDEX intents_state_kind ON outbox.intents (state, kind, id);

-- One row per delivery attempt (or per lost attempt found by the sweeper).
CREATE TABLE outbox.attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_id    bigint      NOT NULL REFERENCES outbox.intents (id) ON DELETE CASCADE,
    attempt      integer     NOT NULL,
    fence        bigint      NOT NULL,
    owner        text        NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    -- delivered | rejected | transient | ambiguous | lost | cancelled
    outcome      text        NOT NULL,
    status       integer,
    provider_ref text,
    error        text,
    replayed     boolean     NOT NULL DEFAULT false,
    -- false when the completion was refused because the lease had moved on
    accepted     boolean     NOT NULL DEFAULT true,
    key_generation integer   NOT NULL DEFAULT 0,
    CONSTRAINT attempts_once_per_claim UNIQUE (intent_id, fence)
);

-- Duplicate enqueues are appended here instead of updating the intent row, so an
-- application transaction never holds a lock the relay needs. The relay folds
-- them into intents.duplicates (and its metrics) exactly once.
CREATE TABLE outbox.enqueue_duplicates (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_id bigint      NOT NULL,
    source    text,
    at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX enqueue_duplicates_intent ON outbox.enqueue_duplicates (intent_id);

-- Operator actions that change what the relay will do (retry, cancel, resolve).
CREATE TABLE outbox.operator_actions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    intent_id  bigint      NOT NULL REFERENCES outbox.intents (id) ON DELETE CASCADE,
    action     text        NOT NULL,
    detail     jsonb,
    actor      text        NOT NULL DEFAULT current_user,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operator_actions_intent ON outbox.operator_actions (intent_id);

-- Deterministic downstream key: the same parent and step give the same key on
-- every replica, attempt and restart. The length prefix makes the encoding
-- unambiguous ("a" + "bc" never collides with "ab" + "c").
CREATE FUNCTION outbox.derive_key(parent text, step text)
RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT encode(sha256(convert_to(
        octet_length(convert_to(parent, 'UTF8'))::text || ':' || parent || step, 'UTF8')), 'hex')
$$;

-- The application API. Call it inside the business transaction.
--   new key                         -> a new row, duplicate = false
--   same key, same operation        -> the existing id, duplicate = true
--   same key, different operation   -> SQLSTATE OB409 naming the key
-- "Same operation" compares kind, destination and the payload as jsonb, so key
-- order and whitespace never manufacture a conflict.
CREATE FUNCTION outbox.enqueue(
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
            IF coalesce(p_run_after, now()) <= now() THEN
                PERFORM pg_notify('outbox_intents', '');
            END IF;
            id := v_id; duplicate := false;
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

        INSERT INTO outbox.enqueue_duplicates (intent_id, source) VALUES (v_id, p_source);
        id := v_id; duplicate := true;
        RETURN NEXT;
        RETURN;
    END LOOP;
END
$$;
