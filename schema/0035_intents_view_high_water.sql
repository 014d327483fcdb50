-- The view outbox.intents reads the log's pending intents as the claim
-- does (schema 0034): an intent above the highest id any outcome or batch
-- holds has neither, and is not probed for them. Its columns, defaults,
-- triggers and grants stay as they are; only the query changes.
--
-- Replacing the view locks it alone, and every statement that reads it
-- waits behind the replacement: it waits for its lock at most 100 ms at a
-- time, so that it never queues readers behind a long one, and tries again
-- for at most a minute.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            CREATE OR REPLACE VIEW outbox.intents AS
            SELECT t.id, t.key, t.kind, t.destination, t.payload, t.state, t.attempts,
                   t.attempts_base, t.run_after, t.ordering_key, t.provider_ref, t.last_error,
                   t.response, t.owner, t.lease_expires_at, t.fence, t.key_generation,
                   t.duplicates, t.source, t.created_at, t.updated_at, t.delivered_at, t.waiting,
                   t.recover_owner, t.recover_at, t.traceparent, t.tracestate,
                   t.first_attempt_started_at, t.first_attempt_finished_at,
                   t.first_attempt_owner, t.first_attempt_status, t.first_attempt_replayed
              FROM outbox.intent_rows t
            UNION ALL
            -- delivered at the first attempt, from the log
            SELECT l.id, l.key, l.kind, l.destination, l.payload, 'delivered'::text, 1, 0,
                   l.run_after, l.ordering_key, o.provider_ref, NULL::text, NULL::jsonb,
                   NULL::text, NULL::timestamptz, 1::bigint, 0, 0, l.source, l.created_at, o.at,
                   o.at, false, NULL::text, NULL::timestamptz, l.traceparent, l.tracestate,
                   o.started_at, o.finished_at, o.owner, o.status, o.replayed
              FROM outbox.log_outcomes o JOIN outbox.intent_log l ON l.id = o.intent_id
             WHERE o.outcome = 'delivered'
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = o.intent_id)
            UNION ALL
            -- claimed from the log, no outcome yet
            SELECT l.id, l.key, l.kind, l.destination, l.payload, 'claimed'::text, 1, 0,
                   l.run_after, l.ordering_key, NULL::text, NULL::text, NULL::jsonb, b.owner,
                   b.lease_expires_at, 1::bigint, 0, 0, l.source, l.created_at, b.claimed_at,
                   NULL::timestamptz, false, NULL::text, NULL::timestamptz, l.traceparent,
                   l.tracestate, NULL::timestamptz, NULL::timestamptz, NULL::text,
                   NULL::integer, NULL::boolean
              FROM outbox.log_batches b CROSS JOIN LATERAL unnest(b.ids) AS c(id)
              JOIN outbox.intent_log l ON l.id = c.id
             WHERE NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = c.id)
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = c.id)
            UNION ALL
            -- in the log after the cursor, taken by no claim yet
            SELECT l.id, l.key, l.kind, l.destination, l.payload, 'pending'::text, 0, 0,
                   l.run_after, l.ordering_key, NULL::text, NULL::text, NULL::jsonb, NULL::text,
                   NULL::timestamptz, 0::bigint, 0, 0, l.source, l.created_at, l.created_at,
                   NULL::timestamptz, l.waiting, NULL::text, NULL::timestamptz, l.traceparent,
                   l.tracestate, NULL::timestamptz, NULL::timestamptz, NULL::text,
                   NULL::integer, NULL::boolean
              FROM outbox.intent_log l
             WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                     ORDER BY c.seq DESC LIMIT 1)
               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
               AND (l.id > (SELECT greatest(
                                coalesce((SELECT max(o.intent_id) FROM outbox.log_outcomes o), 0),
                                coalesce((SELECT max(b.max_id) FROM outbox.log_batches b), 0)))
                    OR (NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = l.id)
                        AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                         WHERE b.ids @> ARRAY[l.id])));
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock the view outbox.intents within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;
