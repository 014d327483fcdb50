-- The log and the first-attempt outcomes in segments: outbox.intent_log
-- and outbox.log_outcomes become tables partitioned by range of intent id,
-- and the tables as they were become their first segment,
-- outbox.intent_log_0 and outbox.log_outcomes_0, attached without a scan
-- after the CHECKs of schemas 0040 and 0041; the ids above the segments
-- go to the tail, outbox.intent_log_tail and outbox.log_outcomes_tail. Later segments cover 2^32 ids
-- each and are made, opened, closed and retired by the functions of schema
-- 0043, which the relays call. Every statement that names the log or the
-- outcomes goes on naming them; the relays' hot statements read the open
-- segments through outbox.intent_log_open.
--
-- An intent that lives on in outbox.intent_rows (dead, ambiguous,
-- scheduled, waiting behind its key, retried) may outlive its segment, so
-- nothing refers to the log by a foreign key any more: attempts, event
-- deliveries and operator actions go with a deleted log intent by a
-- statement trigger, as the outcomes do, and with a retired segment by its
-- retirement (or with their row, once its segment is retired); and a row
-- no longer has to have its log intent.
--
-- The tables are locked for a moment, waiting at most 100 ms at a time, so
-- that the claims and the enqueues never queue behind a long wait, 600
-- times.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            LOCK TABLE outbox.intent_log, outbox.log_outcomes, outbox.intent_rows,
                       outbox.attempts, outbox.event_deliveries, outbox.operator_actions
                IN ACCESS EXCLUSIVE MODE;
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.intent_log in 600 tries of 100 ms'
        USING HINT = 'run outbox-relay migrate again';
END
$$;

-- The views over the two tables, as they read now (with every name
-- qualified), to be bound to the partitioned tables below.
CREATE TEMPORARY TABLE log_views (name text, definition text) ON COMMIT DROP;
DO $$
DECLARE
    v_path text := current_setting('search_path');
BEGIN
    PERFORM set_config('search_path', 'pg_catalog', true);
    INSERT INTO pg_temp.log_views
    SELECT DISTINCT v.oid::regclass::text, pg_get_viewdef(v.oid)
      FROM pg_depend d
      JOIN pg_rewrite r ON r.oid = d.objid
      JOIN pg_class v ON v.oid = r.ev_class
     WHERE d.classid = 'pg_rewrite'::regclass
       AND d.refobjid IN ('outbox.intent_log'::regclass, 'outbox.log_outcomes'::regclass)
       AND v.relkind = 'v';
    PERFORM set_config('search_path', v_path, true);
END
$$;

ALTER TABLE outbox.attempts DROP CONSTRAINT attempts_intent_id_fkey;
ALTER TABLE outbox.event_deliveries DROP CONSTRAINT event_deliveries_event_id_fkey;
ALTER TABLE outbox.event_deliveries DROP CONSTRAINT event_deliveries_intent_id_fkey;
ALTER TABLE outbox.operator_actions DROP CONSTRAINT operator_actions_intent_id_fkey;
ALTER TABLE outbox.intent_rows DROP CONSTRAINT intent_rows_logged;

DROP TRIGGER intent_log_kafka_headers ON outbox.intent_log;
DROP TRIGGER intent_log_outcomes_follow ON outbox.intent_log;
DROP TRIGGER intent_log_track ON outbox.intent_log;

ALTER TABLE outbox.intent_log RENAME TO intent_log_0;
ALTER TABLE outbox.intent_log_0 RENAME CONSTRAINT intent_log_pkey TO intent_log_0_pkey;
ALTER INDEX outbox.intent_log_xid RENAME TO intent_log_0_xid;
ALTER INDEX outbox.intent_log_events RENAME TO intent_log_0_events;
ALTER TABLE outbox.log_outcomes RENAME TO log_outcomes_0;
ALTER TABLE outbox.log_outcomes_0 RENAME CONSTRAINT log_outcomes_pkey TO log_outcomes_0_pkey;

CREATE TABLE outbox.intent_log (
    id          bigint      NOT NULL DEFAULT nextval('outbox.intent_ids'),
    xid         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    key         text        NOT NULL,
    kind        text        NOT NULL,
    destination text,
    payload     jsonb       NOT NULL,
    run_after   timestamptz NOT NULL DEFAULT now(),
    ordering_key text,
    waiting     boolean     NOT NULL DEFAULT false,
    source      text,
    traceparent text,
    tracestate  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT intent_log_pkey PRIMARY KEY (id)
) PARTITION BY RANGE (id);
CREATE INDEX intent_log_xid ON outbox.intent_log (xid, id);
CREATE INDEX intent_log_events ON outbox.intent_log (created_at) WHERE kind = 'event';

CREATE TABLE outbox.log_outcomes (
    intent_id    bigint      NOT NULL,
    outcome      text        NOT NULL,
    owner        text,
    started_at   timestamptz,
    finished_at  timestamptz,
    status       integer,
    provider_ref text,
    replayed     boolean,
    at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT log_outcomes_pkey PRIMARY KEY (intent_id),
    CONSTRAINT log_outcomes_outcome_check CHECK (outcome IN ('delivered', 'moved'))
) PARTITION BY RANGE (intent_id);

-- Comments and grants follow the tables' names.
DO $$
DECLARE
    t record;
    g record;
BEGIN
    FOR t IN SELECT * FROM (VALUES ('intent_log'), ('log_outcomes')) v(name) LOOP
        EXECUTE format('COMMENT ON TABLE outbox.%I IS %L', t.name,
                       obj_description(format('outbox.%I_0', t.name)::regclass, 'pg_class'));
        FOR g IN
            SELECT a.grantee, a.privilege_type
              FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = format('outbox.%I_0', t.name)::regclass
               AND a.grantee <> c.relowner AND a.grantee <> 0
        LOOP
            EXECUTE format('GRANT %s ON outbox.%I TO %I', g.privilege_type, t.name,
                           pg_get_userbyid(g.grantee));
        END LOOP;
    END LOOP;
    EXECUTE format('ALTER TABLE outbox.intent_log ATTACH PARTITION outbox.intent_log_0'
                   ' FOR VALUES FROM (MINVALUE) TO (%s)',
                   (SELECT ends FROM outbox.log_first_segment));
    EXECUTE format('ALTER TABLE outbox.log_outcomes ATTACH PARTITION outbox.log_outcomes_0'
                   ' FOR VALUES FROM (MINVALUE) TO (%s)',
                   (SELECT ends FROM outbox.log_first_segment));
END
$$;
ALTER TABLE outbox.intent_log_0 DROP CONSTRAINT intent_log_first_segment;
ALTER TABLE outbox.log_outcomes_0 DROP CONSTRAINT log_outcomes_first_segment;

-- The tail: every id above the segments, for an application that moves
-- the sequence on (setval) or a log whose rotation has not run in time.
-- It is always open and never retired; its intents are purged row by row.
CREATE TABLE outbox.intent_log_tail PARTITION OF outbox.intent_log DEFAULT;
CREATE TABLE outbox.log_outcomes_tail PARTITION OF outbox.log_outcomes DEFAULT;

CREATE TRIGGER intent_log_kafka_headers BEFORE INSERT ON outbox.intent_log
    FOR EACH ROW WHEN (NEW.kind = 'kafka' AND NEW.payload ? 'headers')
    EXECUTE FUNCTION outbox.check_kafka_headers();
CREATE TRIGGER intent_log_outcomes_follow AFTER DELETE ON outbox.intent_log
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_outcomes_follow();
CREATE TRIGGER intent_log_track AFTER INSERT ON outbox.intent_log
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL OR NEW.waiting OR NEW.run_after > NEW.created_at)
    EXECUTE FUNCTION outbox.log_track();

-- What the foreign keys to the log did on a delete, for attempts, event
-- deliveries and operator actions.
CREATE FUNCTION outbox.log_dependents_follow() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM outbox.attempts a USING gone g WHERE a.intent_id = g.id;
    DELETE FROM outbox.event_deliveries d USING gone g WHERE d.event_id = g.id;
    DELETE FROM outbox.event_deliveries d USING gone g WHERE d.intent_id = g.id;
    DELETE FROM outbox.operator_actions a USING gone g WHERE a.intent_id = g.id;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.log_dependents_follow() FROM PUBLIC;
CREATE TRIGGER intent_log_dependents_follow AFTER DELETE ON outbox.intent_log
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_dependents_follow();

-- The views, bound to the partitioned tables.
DO $$
DECLARE
    v record;
BEGIN
    FOR v IN SELECT * FROM pg_temp.log_views LOOP
        EXECUTE format('CREATE OR REPLACE VIEW %s AS %s', v.name, v.definition);
    END LOOP;
END
$$;

DROP TABLE outbox.log_first_segment;
