-- bench/pgbench/keyed-segments.sql: the keyed-segments candidate for
-- retention, as `--setup-sql` for the bench's drain rounds
-- (docs/performance.md, "Retention by segment"). Run on a database just
-- migrated, before anything is enqueued:
--
--   target/release/outbox-relay-bench --intents 20000 --drain-rounds 3 \
--     --setup-sql bench/pgbench/keyed-segments.sql
--
-- outbox.intent_log becomes a table partitioned by RANGE (id) into four
-- segments of 2^32 ids, the newest taking the inserts (the sequence is moved
-- to its first id, as a rotation would); the unpartitioned table becomes
-- the oldest segment. The keys stay unique in outbox.intent_keys, which the
-- enqueue writes first (schema 0038), so the segments need no index on the
-- key; everything else reads and writes the parent as it did the table.
-- Not a migration: it expects an empty log.
DO $$
DECLARE
    v_view record;
    v_def  text;
    v_fk   record;
    s      integer;
BEGIN
    IF EXISTS (SELECT 1 FROM outbox.intent_log) THEN
        RAISE EXCEPTION 'keyed-segments.sql expects an empty intent log';
    END IF;

    -- the foreign keys to the log, kept to be made again against the parent
    CREATE TEMP TABLE log_fks ON COMMIT DROP AS
        SELECT c.conrelid::regclass AS tab, c.conname, pg_get_constraintdef(c.oid) AS def
          FROM pg_constraint c
         WHERE c.contype = 'f' AND c.confrelid = 'outbox.intent_log'::regclass;
    FOR v_fk IN SELECT * FROM log_fks LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', v_fk.tab, v_fk.conname);
    END LOOP;
    DROP TRIGGER intent_log_kafka_headers ON outbox.intent_log;
    DROP TRIGGER intent_log_outcomes_follow ON outbox.intent_log;
    DROP TRIGGER intent_log_track ON outbox.intent_log;
    ALTER TABLE outbox.intent_log RENAME TO intent_log_0;

    CREATE TABLE outbox.intent_log (LIKE outbox.intent_log_0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (id);
    ALTER TABLE outbox.intent_log ADD CONSTRAINT intent_log_segments_pkey PRIMARY KEY (id);
    CREATE INDEX intent_log_segments_xid ON outbox.intent_log (xid, id);
    CREATE INDEX intent_log_segments_events ON outbox.intent_log (created_at) WHERE kind = 'event';
    ALTER TABLE outbox.intent_log ATTACH PARTITION outbox.intent_log_0
        FOR VALUES FROM (MINVALUE) TO (4294967296);
    FOR s IN 1 .. 3 LOOP
        EXECUTE format('CREATE TABLE outbox.intent_log_%s PARTITION OF outbox.intent_log
                            FOR VALUES FROM (%s) TO (%s)', s, s * 4294967296, (s + 1) * 4294967296);
    END LOOP;
    PERFORM setval('outbox.intent_ids', 3 * 4294967296);

    CREATE TRIGGER intent_log_kafka_headers BEFORE INSERT ON outbox.intent_log FOR EACH ROW
        WHEN (new.kind = 'kafka' AND new.payload ? 'headers')
        EXECUTE FUNCTION outbox.check_kafka_headers();
    CREATE TRIGGER intent_log_outcomes_follow AFTER DELETE ON outbox.intent_log
        REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_outcomes_follow();
    CREATE TRIGGER intent_log_track AFTER INSERT ON outbox.intent_log FOR EACH ROW
        WHEN (new.ordering_key IS NOT NULL OR new.waiting OR new.run_after > new.created_at)
        EXECUTE FUNCTION outbox.log_track();

    FOR v_fk IN SELECT * FROM log_fks LOOP
        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I %s', v_fk.tab, v_fk.conname,
                       replace(v_fk.def, 'outbox.intent_log_0', 'outbox.intent_log'));
    END LOOP;

    -- the views read the parent (CREATE OR REPLACE keeps their grants and
    -- INSTEAD OF triggers)
    FOR v_view IN
        SELECT DISTINCT c.oid::regclass AS name
          FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class c ON c.oid = r.ev_class
         WHERE d.refobjid = 'outbox.intent_log_0'::regclass AND c.relkind = 'v'
    LOOP
        v_def := replace(pg_get_viewdef(v_view.name), 'outbox.intent_log_0', 'outbox.intent_log');
        EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', v_view.name, v_def);
    END LOOP;

END
$$;

ANALYZE outbox.intent_log;
