-- Events expanded in batches: one statement makes the deliveries of many
-- events, as outbox.expand_event makes those of one.

-- For each event id given: whether it is an event (is_event), how many
-- enabled subscriptions match it now (matched) and how many deliveries
-- this call made (created). A pair already made, or whose key is in the
-- ledger, is skipped, so expanding again makes nothing twice. The
-- deliveries are inserted in (event, subscription) order, so that two
-- calls that overlap wait for one another rather than deadlock.
CREATE FUNCTION outbox.expand_events(p_events bigint[])
RETURNS TABLE (event_id bigint, is_event boolean, matched integer, created integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_ids     bigint[];
    v_found   boolean[];
    v_matched integer[];
    v_created integer[];
BEGIN
    WITH ev AS (
             SELECT l.id, l.key, l.payload, l.created_at, l.traceparent, l.tracestate
               FROM outbox.intent_log l
              WHERE l.id = ANY (p_events) AND l.kind = 'event'),
         pairs AS (
             SELECT e.id AS event_id, s.id AS subscription_id,
                    outbox.derive_key(e.key, 'subscription ' || s.id) AS key
               FROM ev e
               JOIN outbox.subscriptions s
                 ON s.disabled_at IS NULL
                AND s.tenant IS NOT DISTINCT FROM (e.payload->>'tenant')
                AND outbox.event_type_matches(s.event_types, e.payload->>'type')),
         fresh AS (
             SELECT p.* FROM pairs p
              WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                 WHERE d.event_id = p.event_id
                                   AND d.subscription_id = p.subscription_id)
                AND NOT EXISTS (SELECT 1 FROM outbox.ledger g WHERE g.key = p.key)),
         logged AS (
             INSERT INTO outbox.intent_log (key, kind, payload, source, traceparent, tracestate)
             SELECT f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.subscription_id,
                        'body', jsonb_build_object(
                            'type', e.payload->>'type',
                            'timestamp', to_char(e.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', e.payload->'data')),
                    'event ' || e.id, e.traceparent, e.tracestate
               FROM fresh f JOIN ev e ON e.id = f.event_id
              ORDER BY f.event_id, f.subscription_id
             ON CONFLICT (key) DO NOTHING
             -- each delivery names its event (its source) and its
             -- subscription: the link is made from what the insert
             -- returns, without joining back to `fresh` (a CTE Postgres
             -- cannot size, joined as a nested loop)
             RETURNING intent_log.id, substr(intent_log.source, 7)::bigint AS event_id,
                       intent_log.payload->>'subscription' AS subscription_id),
         linked AS (
             INSERT INTO outbox.event_deliveries (event_id, subscription_id, intent_id)
             SELECT g.event_id, g.subscription_id, g.id
               FROM logged g
             ON CONFLICT ON CONSTRAINT event_deliveries_pkey DO NOTHING
             RETURNING event_deliveries.event_id),
         counts AS (
             SELECT u.id, e.id IS NOT NULL AS found,
                    coalesce(m.n, 0)::integer AS matched, coalesce(k.n, 0)::integer AS created
               FROM (SELECT DISTINCT unnest(p_events) AS id) u
               LEFT JOIN ev e ON e.id = u.id
               LEFT JOIN (SELECT p.event_id, count(*) AS n FROM pairs p GROUP BY 1) m
                      ON m.event_id = u.id
               LEFT JOIN (SELECT k.event_id, count(*) AS n FROM linked k GROUP BY 1) k
                      ON k.event_id = u.id)
    SELECT array_agg(c.id), array_agg(c.found), array_agg(c.matched), array_agg(c.created)
      INTO v_ids, v_found, v_matched, v_created
      FROM counts c;
    -- the relays wake for the deliveries, as for an enqueue
    IF EXISTS (SELECT 1 FROM unnest(v_created) n WHERE n > 0) THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_found, v_matched, v_created);
END
$$;

REVOKE EXECUTE ON FUNCTION outbox.expand_events(bigint[]) FROM PUBLIC;

-- Whoever may expand one event may expand many.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee, a.is_grantable
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = 'outbox.expand_event(bigint, text)'::regprocedure
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.expand_events(bigint[]) TO %I%s',
                       pg_get_userbyid(g.grantee),
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
