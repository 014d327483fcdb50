-- outbox.intent_keys: every intent's key, live or purged, in one narrow
-- table whose primary key keeps it unique. It takes over from the unique
-- index on outbox.intent_log's key and from the ledger's probe in the
-- enqueue (schema 0038), so that the log needs no index on the key.
--
-- This migration adds the table and keeps it current: from its commit on,
-- triggers copy the key of every intent the log receives, and follow a
-- key an earlier release's view writes change (a key row taken by such an
-- intent points at it: the log's unique index makes it the key's only
-- holder). The keys already there, in the log and in the ledger, are
-- copied afterwards in short transactions by outbox.fill_intent_keys(),
-- which `outbox-relay migrate` calls until it answers true, before schema
-- 0038: a copy inside this migration would hold the enqueues for as long
-- as it takes.
CREATE TABLE outbox.intent_keys (
    key       text   PRIMARY KEY,
    intent_id bigint NOT NULL
);

COMMENT ON TABLE outbox.intent_keys IS
    'Every intent''s key, live or purged until the ledger forgets it, and its intent''s id';

-- Where the copy of the earlier keys stands: the log by id up to the
-- highest id committed when the triggers took over, then the ledger by
-- key. The log goes first: an
-- intent purged while its part of the log is copied has its key in the
-- ledger by the time the ledger is copied, and a key purged after its
-- part is copied is in the table already.
CREATE TABLE outbox.intent_keys_fill (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    log_end     bigint  NOT NULL,
    log_next    bigint  NOT NULL DEFAULT 0,
    ledger_next text,
    log_done    boolean NOT NULL DEFAULT false,
    done_at     timestamptz
);

CREATE FUNCTION outbox.copy_intent_key() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO outbox.intent_keys AS k (key, intent_id)
    SELECT n.key, n.id FROM new_rows n
    ON CONFLICT (key) DO UPDATE SET intent_id = excluded.intent_id
        WHERE k.intent_id <> excluded.intent_id;
    RETURN NULL;
END
$$;

-- Taking their lock waits for the transactions writing the log: every
-- intent written after this is copied by a trigger, and every one before
-- it is committed by then, at or below the highest id the next statement
-- sees (or, purged since, in the ledger) for the fill to find. The lock is
-- waited for at most 100 ms at a time, so that the enqueues never queue
-- behind a long transaction's, for at most a minute.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            LOCK TABLE outbox.intent_log IN SHARE ROW EXCLUSIVE MODE;
            CREATE TRIGGER intent_log_copy_keys AFTER INSERT ON outbox.intent_log
                REFERENCING NEW TABLE AS new_rows
                FOR EACH STATEMENT EXECUTE FUNCTION outbox.copy_intent_key();
            CREATE TRIGGER intent_log_copy_changed_keys AFTER UPDATE ON outbox.intent_log
                REFERENCING NEW TABLE AS new_rows
                FOR EACH STATEMENT EXECUTE FUNCTION outbox.copy_intent_key();
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.intent_log within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;

INSERT INTO outbox.intent_keys_fill (log_end)
SELECT coalesce(max(id), 0) FROM outbox.intent_log;

-- One step of the copy, in the caller's transaction: up to p_batch keys
-- of the log, or else of the ledger. True once both are copied.
CREATE FUNCTION outbox.fill_intent_keys(p_batch integer DEFAULT 10000) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    f      outbox.intent_keys_fill;
    v_last bigint;
    v_key  text;
BEGIN
    SELECT * INTO f FROM outbox.intent_keys_fill FOR UPDATE;
    IF f.done_at IS NOT NULL THEN
        RETURN true;
    END IF;
    IF NOT f.log_done THEN
        WITH part AS (
                 SELECT l.id, l.key FROM outbox.intent_log l
                  WHERE l.id >= f.log_next AND l.id <= f.log_end
                  ORDER BY l.id LIMIT p_batch),
             copied AS (
                 INSERT INTO outbox.intent_keys (key, intent_id)
                 SELECT p.key, p.id FROM part p
                 ON CONFLICT (key) DO NOTHING)
        SELECT max(p.id) INTO v_last FROM part p;
        IF v_last IS NULL THEN
            UPDATE outbox.intent_keys_fill SET log_done = true;
        ELSE
            UPDATE outbox.intent_keys_fill SET log_next = v_last + 1;
        END IF;
        RETURN false;
    END IF;
    WITH part AS (
             SELECT g.key, g.intent_id FROM outbox.ledger g
              WHERE f.ledger_next IS NULL OR g.key > f.ledger_next
              ORDER BY g.key LIMIT p_batch),
         copied AS (
             INSERT INTO outbox.intent_keys (key, intent_id)
             SELECT p.key, p.intent_id FROM part p
             ON CONFLICT (key) DO NOTHING)
    SELECT max(p.key) INTO v_key FROM part p;
    IF v_key IS NULL THEN
        UPDATE outbox.intent_keys_fill SET done_at = now();
        RETURN true;
    END IF;
    UPDATE outbox.intent_keys_fill SET ledger_next = v_key;
    RETURN false;
END
$$;

REVOKE EXECUTE ON FUNCTION outbox.copy_intent_key(), outbox.fill_intent_keys(integer) FROM PUBLIC;

-- Whoever may read or write the log may do the same with the keys.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox.intent_log'::regclass AND a.grantee <> c.relowner
           AND a.grantee <> 0 AND a.privilege_type IN ('SELECT', 'INSERT', 'UPDATE', 'DELETE')
    LOOP
        EXECUTE format('GRANT %s ON outbox.intent_keys TO %I', g.privilege_type,
                       pg_get_userbyid(g.grantee));
    END LOOP;
END
$$;
