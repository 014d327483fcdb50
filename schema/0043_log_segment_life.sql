-- The life of a segment of the log (schema 0042): made ahead, opened,
-- closed, retired. outbox.log_segments says where each stands; the relays
-- call outbox.rotate_log(), outbox.close_log_segments() and
-- outbox.retire_log_segment() from their retention task, each one step per
-- call, in its own transaction. Each takes its locks at most 100 ms at a
-- time and answers 'busy' when it could not, so that neither the enqueues
-- nor the claims ever queue behind a long wait; the next call tries again.
--
--   ahead    attached to outbox.intent_log and outbox.log_outcomes, empty;
--   open     in outbox.intent_log_open and outbox.log_outcomes_open, the
--            views the relays' hot statements read: it may hold an intent
--            no claim has taken or one in a claim's batch;
--   closed   no longer in them: the sequence has moved past it, nothing
--            can insert into it, and every intent in it has its outcome
--            or its row in outbox.intent_rows and is in no batch;
--   retiring its intents delivered at the first attempt are in the ledger,
--            and its tables are dropped by the next call that can lock
--            the log for a moment.
-- The intents with rows outlive their segment in outbox.intent_rows, which
-- holds every column of an intent; they are purged row by row, as before.
CREATE TABLE outbox.log_segments (
    segment    integer     PRIMARY KEY,
    first_id   bigint      NOT NULL,
    end_id     bigint      NOT NULL,
    state      text        NOT NULL CHECK (state IN ('ahead', 'open', 'closed', 'retiring')),
    opened_at  timestamptz,
    closed_at  timestamptz,
    CHECK (first_id < end_id)
);

COMMENT ON TABLE outbox.log_segments IS
    'The segments of outbox.intent_log and outbox.log_outcomes (outbox.intent_log_N, outbox.log_outcomes_N): the ids each covers and where it stands';

-- the first segment is the log as it was, which the sequence is in
INSERT INTO outbox.log_segments (segment, first_id, end_id, state, opened_at)
SELECT 0, -9223372036854775808, (SELECT pg_catalog.max(r.end_id) FROM (
           SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''(\d+)''\)'))[1]::bigint
             FROM pg_class c WHERE c.oid = 'outbox.intent_log_0'::regclass) r(end_id)),
       'open', now();

-- The views the hot statements read: the open segments, UNION ALL, which
-- Postgres reads as the segments' own tables.
CREATE FUNCTION outbox.build_open_log() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_log      text;
    v_outcomes text;
BEGIN
    SELECT string_agg(format('SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload,'
                             ' l.run_after, l.ordering_key, l.waiting, l.source, l.traceparent,'
                             ' l.tracestate, l.created_at FROM outbox.%I l',
                             'intent_log_' || s.segment), ' UNION ALL ' ORDER BY s.segment),
           string_agg(format('SELECT o.intent_id, o.outcome, o.owner, o.started_at,'
                             ' o.finished_at, o.status, o.provider_ref, o.replayed, o.at'
                             ' FROM outbox.%I o', 'log_outcomes_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment)
      INTO v_log, v_outcomes
      FROM outbox.log_segments s
     WHERE s.state = 'open';
    EXECUTE 'CREATE OR REPLACE VIEW outbox.intent_log_open AS ' || v_log;
    EXECUTE 'CREATE OR REPLACE VIEW outbox.log_outcomes_open AS ' || v_outcomes;
END
$$;

CREATE VIEW outbox.log_outcomes_open AS
SELECT o.intent_id, o.outcome, o.owner, o.started_at, o.finished_at, o.status, o.provider_ref,
       o.replayed, o.at
  FROM outbox.log_outcomes o;

COMMENT ON VIEW outbox.log_outcomes_open IS
    'The outcomes of the intents of outbox.intent_log_open, which the relays'' hot statements read';

SELECT outbox.build_open_log();

-- Whoever reads the outcomes reads the view.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox.log_outcomes'::regclass AND a.grantee <> c.relowner
           AND a.grantee <> 0 AND a.privilege_type = 'SELECT'
    LOOP
        EXECUTE format('GRANT SELECT ON outbox.log_outcomes_open TO %I', pg_get_userbyid(g.grantee));
    END LOOP;
END
$$;

-- An insert into a closed segment: an enqueue that took its id before the
-- sequence moved on and waited since (for another transaction's hold on
-- its key). It fails as a serialization failure, which the application
-- retries, and the retry takes an id in an open segment.
CREATE FUNCTION outbox.log_segment_closed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'intent % took its id in a segment of the log that is closed since', NEW.id
        USING ERRCODE = '40001',
              HINT = 'retry the transaction: the retry enqueues into an open segment';
END
$$;

-- One step of rotation: make the next segment ahead of time; once the
-- newest open segment has been open p_span, open the next one (its tables
-- join the views); in a later call, move the sequence to its first id.
-- The views change before the sequence moves, in an earlier transaction,
-- so that no claim can read an intent its statement's view leaves out.
-- Answers what it did: 'made', 'opened', 'moved', 'idle' or 'busy'.
CREATE FUNCTION outbox.rotate_log(p_span interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_newest outbox.log_segments;
    v_next   outbox.log_segments;
    v_seq    bigint;
    v_empty  boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT * INTO v_newest FROM outbox.log_segments
     WHERE state = 'open' ORDER BY segment DESC LIMIT 1;
    SELECT * INTO v_next FROM outbox.log_segments WHERE state = 'ahead';
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END INTO v_seq
      FROM outbox.intent_ids;
    IF v_newest.opened_at IS NULL THEN
        -- opened: the sequence moves into it (never back)
        IF v_seq < v_newest.first_id THEN
            PERFORM setval('outbox.intent_ids', v_newest.first_id, false);
        END IF;
        UPDATE outbox.log_segments SET opened_at = now() WHERE segment = v_newest.segment;
        RETURN 'moved';
    END IF;
    IF v_next.segment IS NULL THEN
        v_next.segment := (v_newest.end_id >> 32)::integer;
        v_next.first_id := v_newest.end_id;
        v_next.end_id := v_newest.end_id + (1::bigint << 32);
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.intent_log INCLUDING DEFAULTS,'
                           ' CHECK (id >= %s AND id < %s))',
                           'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
            EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.log_outcomes INCLUDING DEFAULTS'
                           ' INCLUDING CONSTRAINTS, CHECK (intent_id >= %s AND intent_id < %s))',
                           'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
            EXECUTE format('ALTER TABLE outbox.intent_log ATTACH PARTITION outbox.%I'
                           ' FOR VALUES FROM (%s) TO (%s)',
                           'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
            EXECUTE format('ALTER TABLE outbox.log_outcomes ATTACH PARTITION outbox.%I'
                           ' FOR VALUES FROM (%s) TO (%s)',
                           'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
            SET LOCAL lock_timeout TO DEFAULT;
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        INSERT INTO outbox.log_segments (segment, first_id, end_id, state)
        VALUES (v_next.segment, v_next.first_id, v_next.end_id, 'ahead');
        RETURN 'made';
    END IF;
    IF v_newest.opened_at > now() - p_span THEN
        RETURN 'idle';
    END IF;
    -- a segment that holds nothing stays open: an idle log keeps one
    EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM outbox.%I)', 'intent_log_' || v_newest.segment)
      INTO v_empty;
    IF v_empty THEN
        RETURN 'idle';
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        UPDATE outbox.log_segments SET state = 'open' WHERE segment = v_next.segment;
        PERFORM outbox.build_open_log();
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    RETURN 'opened';
END
$$;

-- One step of closing: the oldest open segment that the sequence has left
-- more than p_grace ago closes once nothing can insert into it any more
-- (an insert from now on fails, see outbox.log_segment_closed, and none is
-- in flight: the trigger waits for them) and every intent in it has its
-- outcome or its row and is in no batch in flight. Answers 'closed',
-- 'idle' or 'busy'.
CREATE FUNCTION outbox.close_log_segment(p_grace interval DEFAULT '1 second') RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_old  outbox.log_segments;
    v_done boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT o.* INTO v_old
      FROM outbox.log_segments o
     WHERE o.state = 'open'
       AND EXISTS (SELECT 1 FROM outbox.log_segments n
                    WHERE n.state = 'open' AND n.segment > o.segment
                      AND n.opened_at < now() - p_grace)
     ORDER BY o.segment LIMIT 1;
    IF v_old.segment IS NULL THEN
        RETURN 'idle';
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        EXECUTE format('CREATE TRIGGER log_segment_closed BEFORE INSERT ON outbox.%I'
                       ' FOR EACH ROW EXECUTE FUNCTION outbox.log_segment_closed()',
                       'intent_log_' || v_old.segment);
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    -- one snapshot for the cursor, the outcomes, the rows and the
    -- batches: a claim commits its batch, its rows and the cursor together.
    -- After the cursor, an intent may have its outcome or row already (the
    -- cursor passes only intents older than every transaction running).
    EXECUTE format(
        'SELECT NOT EXISTS (SELECT 1 FROM outbox.%I l
                             WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                                     ORDER BY c.seq DESC LIMIT 1)
                               AND NOT EXISTS (SELECT 1 FROM outbox.%I o WHERE o.intent_id = l.id)
                               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t
                                                WHERE t.id = l.id))
            AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                             WHERE b.max_id >= $1
                               AND EXISTS (SELECT 1 FROM unnest(b.ids) i
                                            WHERE i >= $1 AND i < $2))',
        'intent_log_' || v_old.segment, 'log_outcomes_' || v_old.segment)
      INTO v_done USING v_old.first_id, v_old.end_id;
    IF v_done THEN
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            UPDATE outbox.log_segments SET state = 'closed', closed_at = now()
             WHERE segment = v_old.segment;
            PERFORM outbox.build_open_log();
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN 'closed';
        EXCEPTION WHEN lock_not_available THEN
            v_done := NULL;
        END;
    END IF;
    -- not yet: the segment takes inserts again
    EXECUTE format('DROP TRIGGER log_segment_closed ON outbox.%I', 'intent_log_' || v_old.segment);
    RETURN CASE WHEN v_done IS NULL THEN 'busy' ELSE 'idle' END;
END
$$;

-- One step of retirement. A segment closed more than p_older_than ago
-- (every outcome in it is older: a closed segment gets none) has its
-- intents delivered at the first attempt copied into the ledger, and the
-- attempts, event deliveries and operator actions of those intents deleted
-- (a delivery at the first attempt has none of the first); it is
-- then 'retiring', and a later call drops its two tables, which locks the
-- log for a moment. The intents with rows stay in outbox.intent_rows.
-- Answers 'copied', 'dropped', 'idle' or 'busy', or 'kept' (with a
-- warning) for a segment holding an intent with neither its delivery nor
-- a row, which no closed segment should: it is kept, and so are the later
-- ones.
CREATE FUNCTION outbox.retire_log_segment(p_older_than interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_seg   outbox.log_segments;
    v_lost  bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'retiring' ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NOT NULL THEN
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            EXECUTE format('DROP TABLE outbox.%I, outbox.%I', 'intent_log_' || v_seg.segment,
                           'log_outcomes_' || v_seg.segment);
            SET LOCAL lock_timeout TO DEFAULT;
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        DELETE FROM outbox.log_segments WHERE segment = v_seg.segment;
        RETURN 'dropped';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'closed' AND closed_at < now() - p_older_than
     ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NULL THEN
        RETURN 'idle';
    END IF;
    -- every intent without a row has its delivery: a closed segment's do
    EXECUTE format(
        'SELECT count(*) FROM outbox.%I l
          WHERE NOT EXISTS (SELECT 1 FROM outbox.%I o
                             WHERE o.intent_id = l.id AND o.outcome = ''delivered'')
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment)
      INTO v_lost;
    IF v_lost > 0 THEN
        RAISE WARNING 'segment % of the log holds % intents with neither a delivery nor a row',
                      v_seg.segment, v_lost
            USING HINT = 'the segment is kept; report this as a fault';
        RETURN 'kept';
    END IF;
    EXECUTE format(
        'INSERT INTO outbox.ledger (key, intent_id, kind, destination, fingerprint, state,
                                    provider_ref, created_at, completed_at, effect_at)
         SELECT l.key, l.id, l.kind, l.destination, outbox.fingerprint(l.payload), ''delivered'',
                o.provider_ref, l.created_at, o.at, coalesce(o.finished_at, o.started_at, o.at)
           FROM outbox.%I l
           JOIN outbox.%I o ON o.intent_id = l.id
          WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
         ON CONFLICT (key) DO NOTHING',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment);
    DELETE FROM outbox.attempts a
     WHERE a.intent_id >= v_seg.first_id AND a.intent_id < v_seg.end_id
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.event_id >= v_seg.first_id AND d.event_id < v_seg.end_id
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.event_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.intent_id >= v_seg.first_id AND d.intent_id < v_seg.end_id
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.intent_id);
    DELETE FROM outbox.operator_actions a
     WHERE a.intent_id >= v_seg.first_id AND a.intent_id < v_seg.end_id
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    UPDATE outbox.log_segments SET state = 'retiring' WHERE segment = v_seg.segment;
    RETURN 'copied';
END
$$;

REVOKE EXECUTE ON FUNCTION outbox.build_open_log(), outbox.log_segment_closed(),
                           outbox.rotate_log(interval), outbox.close_log_segment(interval),
                           outbox.retire_log_segment(interval)
    FROM PUBLIC;

-- Whoever purges the log (deletes from it) rotates, closes and retires its
-- segments; whoever reads it reads where they stand.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.privilege_type
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox.intent_log'::regclass AND a.grantee <> c.relowner
           AND a.grantee <> 0 AND a.privilege_type IN ('SELECT', 'DELETE')
    LOOP
        IF g.privilege_type = 'DELETE' THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.rotate_log(interval), '
                           'outbox.close_log_segment(interval), '
                           'outbox.retire_log_segment(interval) TO %I',
                           pg_get_userbyid(g.grantee));
        ELSE
            EXECUTE format('GRANT SELECT ON outbox.log_segments TO %I', pg_get_userbyid(g.grantee));
        END IF;
    END LOOP;
END
$$;
