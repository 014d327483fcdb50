-- bench/pgbench/open-segments.sql: the keyed-segments candidate with the
-- relay's hot statements reading `outbox.intent_log_open` over the newest
-- segments only (docs/performance.md, "Retention by segment"). Applied
-- after keyed-segments.sql, with the number of segments the view reads in
-- the setting outbox.open_segments (default 1), as one `--setup-sql` file:
--
--   { cat bench/pgbench/keyed-segments.sql
--     echo "SET outbox.open_segments = '2';"
--     cat bench/pgbench/open-segments.sql; } > /tmp/open-2.sql
--
-- Every intent of a drain lands in the newest segment (3). With one
-- segment the view is that segment, as between two rotations; with two it
-- is a `UNION ALL` of segments 2 and 3, as while the segment before the
-- newest still holds intents a claim has not taken or has in a batch. The
-- fold of the tallies and the claim's tally trigger read the view too.
DO $$
DECLARE
    v_n    integer := coalesce(nullif(current_setting('outbox.open_segments', true), ''), '1')::int;
    v_from text;
    v_fn   regprocedure;
    v_def  text;
BEGIN
    SELECT string_agg(format('SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload,
                                     l.run_after, l.ordering_key, l.waiting, l.source,
                                     l.traceparent, l.tracestate, l.created_at
                                FROM outbox.intent_log_%s l', s), ' UNION ALL ')
      INTO v_from
      FROM generate_series(3, 4 - v_n, -1) AS s;
    EXECUTE 'CREATE OR REPLACE VIEW outbox.intent_log_open AS ' || v_from;

    FOREACH v_fn IN ARRAY ARRAY['outbox.tally_batches()'::regprocedure,
                                'outbox.fold_tallies()'::regprocedure]
    LOOP
        v_def := regexp_replace(pg_get_functiondef(v_fn), 'outbox\.intent_log\M',
                                'outbox.intent_log_open', 'g');
        EXECUTE v_def;
    END LOOP;
END
$$;
ANALYZE outbox.intent_log;
