-- bench/pgbench/keyed-segments-leaf.sql: the keyed-segments candidate with
-- the drain's statements naming the segment that takes the inserts
-- (docs/performance.md, "Retention by segment"). Applied after
-- keyed-segments.sql, as one `--setup-sql` file:
--
--   cat bench/pgbench/keyed-segments.sql bench/pgbench/keyed-segments-leaf.sql \
--     > /tmp/keyed-segments-leaf.sql
--
-- and run by a relay built with its claim, completion and tally statements
-- reading `outbox.intent_log_3` in place of `outbox.intent_log` (a
-- prototype build, `sed -E 's/outbox\.intent_log\b/outbox.intent_log_3/g'`
-- over relay/store/{claim_query,claims,log,tallies}.rs). The functions the
-- drain runs that read the log (the claim's tally trigger and the fold of
-- the tallies) are rewritten the same way here. Every intent of a drain
-- lands in segment 3, so this is the case a relay that sends each statement
-- to the segment its ids name would meet: no partition is pruned at run
-- time, and none is merged into a scan.
DO $$
DECLARE
    v_fn  regprocedure;
    v_def text;
BEGIN
    FOREACH v_fn IN ARRAY ARRAY['outbox.tally_batches()'::regprocedure,
                                'outbox.fold_tallies()'::regprocedure]
    LOOP
        v_def := regexp_replace(pg_get_functiondef(v_fn), 'outbox\.intent_log\M',
                                'outbox.intent_log_3', 'g');
        EXECUTE v_def;
    END LOOP;
END
$$;
