-- The life of a segment of the log (schema 0042): made ahead, opened,
-- closed, retired. outbox.log_segments says where each stands; the relays
-- call outbox.rotate_log(), outbox.close_log_segment() and
-- outbox.retire_log_segment() from their retention task, each one step per
-- call, in its own short transaction. Each takes its locks at most 100 ms
-- at a time and answers 'busy' when it could not, so that neither the
-- enqueues nor the claims ever queue behind a long wait; the next call
-- tries again.
--
--   ahead    the next segment's two tables, made but not attached: no id
--            can reach them (an id past the segments goes to the tail,
--            outbox.intent_log_tail, which the claims always read and
--            which is never retired: a claim gives its intents rows, and
--            they are purged row by row);
--   open     attached, and in the views the relays' hot statements read
--            (outbox.intent_log_open, outbox.intent_log_batchable,
--            outbox.log_outcomes_open): it may hold an intent no claim
--            has taken or one in a claim's batch. A segment joins the views in the transaction
--            that attaches it, before the sequence moves into it (a later
--            call), so no claim reads a view that leaves out a committed
--            intent;
--   closed   no longer in them: the sequence has moved past it, nothing
--            can insert into it, and every intent in it has its outcome
--            or its row in outbox.intent_rows and is in no batch;
--   retiring its intents delivered at the first attempt are in the ledger
--            (copied in bounded steps, the last one's transaction is
--            copied_xid); its tables are dropped once no snapshot is older
--            than the copy (a DROP is not MVCC: a snapshot from before the
--            copy would see neither the intent nor its ledger entry), by
--            the next call that can lock the log for a moment;
--   retired  dropped; the row stays as a record.
-- The intents with rows outlive their segment in outbox.intent_rows, which
-- holds every column of an intent; they are purged row by row.
CREATE TABLE outbox.log_segments (
    segment    integer     PRIMARY KEY,
    first_id   bigint      NOT NULL,
    end_id     bigint      NOT NULL,
    state      text        NOT NULL
               CHECK (state IN ('ahead', 'open', 'closed', 'retiring', 'retired')),
    opened_at  timestamptz,
    closed_at  timestamptz,
    copied_to  bigint,
    copied_xid xid8,
    retired_at timestamptz,
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

-- The views the hot statements read, UNION ALL of tables, which Postgres
-- reads as those tables:
--   outbox.intent_log_open       the open segments and the tail, with
--                                in_tail: what the claims of the log and
--                                the reads of the due intents read (a claim
--                                gives an intent of the tail its row, so
--                                that no batch holds one);
--   outbox.intent_log_batchable  the open segments: what the deliveries at
--                                the first attempt and the reads of the
--                                batches in flight read;
--   outbox.log_outcomes_open     the outcomes of the open segments.
CREATE FUNCTION outbox.build_open_log() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    c_columns  CONSTANT text := 'l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after,'
                                ' l.ordering_key, l.waiting, l.source, l.traceparent, l.tracestate,'
                                ' l.created_at';
    v_log      text;
    v_open     text;
    v_outcomes text;
BEGIN
    SELECT string_agg(format('SELECT %s FROM outbox.%I l', c_columns, 'intent_log_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment),
           string_agg(format('SELECT %s, false AS in_tail FROM outbox.%I l', c_columns,
                             'intent_log_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment),
           string_agg(format('SELECT o.intent_id, o.outcome, o.owner, o.started_at,'
                             ' o.finished_at, o.status, o.provider_ref, o.replayed, o.at'
                             ' FROM outbox.%I o', 'log_outcomes_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment)
      INTO v_log, v_open, v_outcomes
      FROM outbox.log_segments s
     WHERE s.state = 'open';
    EXECUTE format('CREATE OR REPLACE VIEW outbox.intent_log_open AS'
                   ' %s UNION ALL SELECT %s, true FROM outbox.intent_log_tail l',
                   v_open, c_columns);
    EXECUTE 'CREATE OR REPLACE VIEW outbox.intent_log_batchable AS ' || v_log;
    EXECUTE 'CREATE OR REPLACE VIEW outbox.log_outcomes_open AS ' || v_outcomes;
END
$$;

CREATE VIEW outbox.intent_log_batchable AS
SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after, l.ordering_key,
       l.waiting, l.source, l.traceparent, l.tracestate, l.created_at
  FROM outbox.intent_log l;

COMMENT ON VIEW outbox.intent_log_batchable IS
    'The open segments of outbox.intent_log, whose intents a claim may put in a batch: what the deliveries at the first attempt and the reads of the batches in flight read';

CREATE VIEW outbox.log_outcomes_open AS
SELECT o.intent_id, o.outcome, o.owner, o.started_at, o.finished_at, o.status, o.provider_ref,
       o.replayed, o.at
  FROM outbox.log_outcomes o;

COMMENT ON VIEW outbox.log_outcomes_open IS
    'The outcomes of the intents of outbox.intent_log_batchable, which the relays'' hot statements read';

-- the tail's flag goes last, as a replaced view's new columns must
CREATE OR REPLACE VIEW outbox.intent_log_open AS
SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after, l.ordering_key,
       l.waiting, l.source, l.traceparent, l.tracestate, l.created_at, false AS in_tail
  FROM outbox.intent_log l;

COMMENT ON VIEW outbox.intent_log_open IS
    'The open segments of outbox.intent_log and its tail (in_tail), which the relays'' claims of the log and reads of the due intents read';

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
        EXECUTE format('GRANT SELECT ON outbox.log_outcomes_open, outbox.intent_log_batchable TO %I',
                       pg_get_userbyid(g.grantee));
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

-- One step of rotation. In order: move the sequence into the newest open
-- segment if it is not there yet; make the next segment ahead; once the
-- newest open segment has held intents for p_span, or the sequence has
-- passed the last 2^31 ids of it, attach the next one and open it.
-- Answers what it did: 'moved', 'made', 'opened', 'idle' or 'busy'.
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
        -- opened in an earlier transaction: the sequence moves in (never back)
        IF v_seq < v_newest.first_id THEN
            PERFORM setval('outbox.intent_ids', v_newest.first_id, false);
        END IF;
        UPDATE outbox.log_segments SET opened_at = now() WHERE segment = v_newest.segment;
        RETURN 'moved';
    END IF;
    IF v_next.segment IS NULL THEN
        -- after the newest, or above the sequence and the tail's intents
        -- when the sequence has been moved past the segments
        v_next.first_id := greatest(v_newest.end_id,
                                    ((greatest(v_seq, (SELECT max(t.id) FROM outbox.intent_log_tail t))
                                      >> 32) + 1) << 32);
        v_next.end_id := v_next.first_id + (1::bigint << 32);
        v_next.segment := (v_next.first_id >> 32)::integer;
        EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.intent_log INCLUDING DEFAULTS,'
                       ' CHECK (id >= %s AND id < %s))',
                       'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
        EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.log_outcomes INCLUDING DEFAULTS'
                       ' INCLUDING CONSTRAINTS, CHECK (intent_id >= %s AND intent_id < %s))',
                       'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
        INSERT INTO outbox.log_segments (segment, first_id, end_id, state)
        VALUES (v_next.segment, v_next.first_id, v_next.end_id, 'ahead');
        RETURN 'made';
    END IF;
    IF v_seq < v_newest.end_id - (1::bigint << 31) THEN
        IF v_newest.opened_at > now() - p_span THEN
            RETURN 'idle';
        END IF;
        -- a segment that holds nothing stays open: an idle log keeps one
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM outbox.%I)',
                       'intent_log_' || v_newest.segment)
          INTO v_empty;
        IF v_empty THEN
            RETURN 'idle';
        END IF;
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        EXECUTE format('ALTER TABLE outbox.intent_log ATTACH PARTITION outbox.%I'
                       ' FOR VALUES FROM (%s) TO (%s)',
                       'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
        EXECUTE format('ALTER TABLE outbox.log_outcomes ATTACH PARTITION outbox.%I'
                       ' FOR VALUES FROM (%s) TO (%s)',
                       'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
        UPDATE outbox.log_segments SET state = 'open' WHERE segment = v_next.segment;
        PERFORM outbox.build_open_log();
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION
        WHEN lock_not_available THEN
            RETURN 'busy';
        WHEN check_violation THEN
            -- the tail took intents in its range meanwhile: made again above
            EXECUTE format('DROP TABLE outbox.%I, outbox.%I', 'intent_log_' || v_next.segment,
                           'log_outcomes_' || v_next.segment);
            DELETE FROM outbox.log_segments WHERE segment = v_next.segment;
            RETURN 'busy';
    END;
    RETURN 'opened';
END
$$;

-- The test that every intent of a segment has its outcome or its row and
-- none is in a batch in flight, in one snapshot (a claim commits its
-- batch, its rows and the cursor together). After the cursor an intent
-- may have its outcome or row already: the cursor passes only intents
-- older than every transaction running.
CREATE FUNCTION outbox.log_segment_done(p_seg outbox.log_segments) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_done boolean;
BEGIN
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
        'intent_log_' || p_seg.segment, 'log_outcomes_' || p_seg.segment)
      INTO v_done USING p_seg.first_id, p_seg.end_id;
    RETURN v_done;
END
$$;

-- One step of closing: the oldest open segment that the sequence has left
-- more than p_grace ago closes once it is done (outbox.log_segment_done)
-- and nothing can insert into it any more: the trigger that makes an
-- insert fail (outbox.log_segment_closed) takes a lock that waits for the
-- inserts in flight, and the test runs again under it. Answers 'closed',
-- 'idle' or 'busy'.
CREATE FUNCTION outbox.close_log_segment(p_grace interval DEFAULT '1 second') RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_old outbox.log_segments;
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
    IF v_old.segment IS NULL OR NOT outbox.log_segment_done(v_old) THEN
        RETURN 'idle';
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        EXECUTE format('CREATE TRIGGER log_segment_closed BEFORE INSERT ON outbox.%I'
                       ' FOR EACH ROW EXECUTE FUNCTION outbox.log_segment_closed()',
                       'intent_log_' || v_old.segment);
        IF NOT outbox.log_segment_done(v_old) THEN
            -- an insert committed meanwhile: this block's undoing drops the
            -- trigger and its lock
            RAISE object_not_in_prerequisite_state;
        END IF;
        UPDATE outbox.log_segments SET state = 'closed', closed_at = now()
         WHERE segment = v_old.segment;
        PERFORM outbox.build_open_log();
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION
        WHEN lock_not_available THEN RETURN 'busy';
        WHEN object_not_in_prerequisite_state THEN RETURN 'idle';
    END;
    RETURN 'closed';
END
$$;

-- One step of retirement, p_batch intents at a time. A segment closed
-- more than p_older_than ago (every outcome in it is older: a closed
-- segment gets none) has the next p_batch of its intents delivered at
-- the first attempt copied into the ledger, and their attempts, event
-- deliveries and operator actions deleted (a delivery at the first
-- attempt normally has none); after its last batch it is 'retiring', and
-- a later call drops its two tables once no snapshot is older than the
-- copy, which locks the log for a moment. The intents with rows stay in
-- outbox.intent_rows. Answers 'copied', 'dropped', 'idle' (nothing to do,
-- or a drop waiting for an older snapshot) or 'busy', or 'kept' (with a
-- warning) for a segment holding an intent with neither its delivery nor
-- a row, which no closed segment should: it is kept, and so are the
-- later ones.
CREATE FUNCTION outbox.retire_log_segment(p_older_than interval, p_batch integer DEFAULT 50000)
    RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_seg  outbox.log_segments;
    v_from bigint;
    v_to   bigint;
    v_lost bigint;
    v_more boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'retiring' ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NOT NULL THEN
        -- a snapshot older than the copy has an xmin at or below the
        -- copy's xid (conservative: a session's xmin is the oldest running
        -- transaction's, anywhere in the cluster, when it took a snapshot);
        -- this step's own was taken after the copy committed
        IF EXISTS (SELECT 1 FROM pg_stat_activity a
                    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
                      AND a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL
                      AND age(a.backend_xmin) >= age(v_seg.copied_xid::xid)) THEN
            RETURN 'idle';
        END IF;
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            EXECUTE format('DROP TABLE outbox.%I, outbox.%I', 'intent_log_' || v_seg.segment,
                           'log_outcomes_' || v_seg.segment);
            SET LOCAL lock_timeout TO DEFAULT;
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        -- an intent given its row after its copy (an operator's retry of
        -- it, say) lives on in the row, and the ledger does not speak for it
        DELETE FROM outbox.ledger g USING outbox.intent_rows t
         WHERE t.id >= v_seg.first_id AND t.id < v_seg.end_id
           AND g.key = t.key AND g.intent_id = t.id;
        UPDATE outbox.log_segments SET state = 'retired', retired_at = now()
         WHERE segment = v_seg.segment;
        RETURN 'dropped';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'closed' AND closed_at < now() - p_older_than
     ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NULL THEN
        RETURN 'idle';
    END IF;
    v_from := coalesce(v_seg.copied_to, v_seg.first_id);
    EXECUTE format('SELECT max(id) + 1 FROM (SELECT l.id FROM outbox.%I l WHERE l.id >= $1
                                              ORDER BY l.id LIMIT $2) b',
                   'intent_log_' || v_seg.segment)
      INTO v_to USING v_from, p_batch;
    v_to := coalesce(v_to, v_seg.end_id);
    -- every intent without a row has its delivery: a closed segment's do
    EXECUTE format(
        'SELECT count(*) FROM outbox.%I l
          WHERE l.id >= $1 AND l.id < $2
            AND NOT EXISTS (SELECT 1 FROM outbox.%I o
                             WHERE o.intent_id = l.id AND o.outcome = ''delivered'')
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment)
      INTO v_lost USING v_from, v_to;
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
          WHERE l.id >= $1 AND l.id < $2
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
         ON CONFLICT (key) DO NOTHING',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment)
      USING v_from, v_to;
    DELETE FROM outbox.attempts a
     WHERE a.intent_id >= v_from AND a.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.event_id >= v_from AND d.event_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.event_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.intent_id >= v_from AND d.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.intent_id);
    DELETE FROM outbox.operator_actions a
     WHERE a.intent_id >= v_from AND a.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM outbox.%I l WHERE l.id >= $1)',
                   'intent_log_' || v_seg.segment)
      INTO v_more USING v_to;
    IF v_more THEN
        UPDATE outbox.log_segments SET copied_to = v_to WHERE segment = v_seg.segment;
    ELSE
        UPDATE outbox.log_segments
           SET copied_to = v_seg.end_id, state = 'retiring', copied_xid = pg_current_xact_id()
         WHERE segment = v_seg.segment;
    END IF;
    RETURN 'copied';
END
$$;

REVOKE EXECUTE ON FUNCTION outbox.build_open_log(), outbox.log_segment_closed(),
                           outbox.log_segment_done(outbox.log_segments),
                           outbox.rotate_log(interval), outbox.close_log_segment(interval),
                           outbox.retire_log_segment(interval, integer)
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
                           'outbox.retire_log_segment(interval, integer) TO %I',
                           pg_get_userbyid(g.grantee));
        ELSE
            EXECUTE format('GRANT SELECT ON outbox.log_segments TO %I', pg_get_userbyid(g.grantee));
        END IF;
    END LOOP;
END
$$;
