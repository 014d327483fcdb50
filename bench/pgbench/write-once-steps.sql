-- bench/pgbench/write-once-steps.sql: the pgbench transactions of
-- write-once.sh, one per "-- step:" block. An enqueue step inserts 100
-- intents; a drain step claims up to 100 and completes them as delivered at
-- the first attempt, in two transactions as the engine does.

-- step: enqueue-rewrite
INSERT INTO outbox.intents (key, kind, payload)
SELECT 'k-' || nextval('public.bench_keys'), 'webhook',
       '{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
  FROM generate_series(1, 100);
-- end

-- step: enqueue-receipts
INSERT INTO receipts.intents (key, kind, payload)
SELECT 'k-' || nextval('public.bench_keys'), 'webhook',
       '{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
  FROM generate_series(1, 100);
-- end

-- step: enqueue-ticks
INSERT INTO ticks.intents (key, kind, payload)
SELECT 'k-' || nextval('public.bench_keys'), 'webhook',
       '{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
  FROM generate_series(1, 100);
-- end

-- step: drain-rewrite
WITH due AS (
    SELECT id FROM outbox.intents
     WHERE state = 'pending' AND NOT waiting AND run_after <= now()
     ORDER BY run_after, id LIMIT 100 FOR UPDATE SKIP LOCKED),
claimed AS (
    UPDATE outbox.intents i
       SET state = 'claimed', owner = 'bench', lease_expires_at = now() + interval '60 s',
           fence = i.fence + 1, attempts = i.attempts + 1, updated_at = now()
     WHERE i.id = ANY(ARRAY(SELECT id FROM due))
    RETURNING i.id, i.fence, i.payload::text AS payload)
SELECT coalesce(array_agg(id), '{}')::text AS ids, coalesce(array_agg(fence), '{}')::text AS fences,
       coalesce(array_agg(payload), '{}') AS payloads
  FROM claimed \gset
UPDATE outbox.intents i
   SET state = 'delivered', provider_ref = 'ref-' || i.id, last_error = NULL,
       owner = NULL, lease_expires_at = NULL, updated_at = now(), delivered_at = now(),
       first_attempt_started_at = now(), first_attempt_finished_at = now(),
       first_attempt_owner = 'bench', first_attempt_status = 200, first_attempt_replayed = false
  FROM unnest(:ids::bigint[], :fences::bigint[]) AS u(id, fence)
 WHERE i.id = u.id AND i.fence = u.fence AND (i.state = 'claimed') IS TRUE;
-- end

-- step: drain-receipts
WITH c AS (SELECT next_id FROM receipts.cursor WHERE lane = 0 FOR UPDATE),
picked AS (
    SELECT i.id FROM receipts.intents i
     WHERE i.id >= (SELECT next_id FROM c) AND i.run_after <= now()
       AND NOT EXISTS (SELECT 1 FROM receipts.claims r
                        WHERE r.intent_id = i.id AND r.intent_id >= (SELECT next_id FROM c))
     ORDER BY i.id LIMIT 100),
ins AS (
    INSERT INTO receipts.claims_0 (slot, intent_id, fence, owner, lease_expires_at)
    SELECT 0, id, 1, 'bench', now() + interval '60 s' FROM picked
    RETURNING intent_id, fence),
moved AS (
    UPDATE receipts.cursor SET next_id = (SELECT max(id) + 1 FROM picked)
     WHERE lane = 0 AND EXISTS (SELECT 1 FROM picked))
SELECT coalesce(array_agg(i.id), '{}')::text AS ids,
       coalesce(array_agg(ins.fence), '{}')::text AS fences,
       coalesce(array_agg(i.payload::text), '{}') AS payloads
  FROM ins JOIN receipts.intents i ON i.id = ins.intent_id \gset
-- fenced: only the latest receipt of an intent may complete it
INSERT INTO receipts.outcomes_0 (slot, intent_id, fence, state, provider_ref, status, owner,
                               started_at, finished_at)
SELECT 0, u.id, u.fence, 'delivered', 'ref-' || u.id, 200, 'bench', now(), now()
  FROM unnest(:ids::bigint[], :fences::bigint[]) AS u(id, fence)
 CROSS JOIN LATERAL (SELECT max(r.fence) AS fence FROM receipts.claims r
                      WHERE r.intent_id = u.id) latest
 WHERE latest.fence = u.fence;
-- end

-- step: drain-ticks
-- claims are serialized by a transaction-scoped advisory lock (memory only);
-- each records a tick first, so that what committed before it is claimable
-- at once, without waiting for a ticker
BEGIN;
SELECT pg_advisory_xact_lock(4242);
INSERT INTO ticks.ticks (snap) VALUES (pg_current_snapshot());
WITH last AS (SELECT lo_tick, tick, upto_xid, upto_id FROM ticks.claims ORDER BY claim DESC LIMIT 1),
newest AS (SELECT max(tick) AS tick FROM ticks.ticks),
-- the last claim's range after where it ended, then from that range's end
-- to the newest tick
ranges AS (
    SELECT 1 AS ord, last.lo_tick, last.tick AS hi_tick, last.upto_xid AS ax, last.upto_id AS ai
      FROM last
    UNION ALL
    SELECT 2, last.tick, newest.tick, '0'::xid8, 0 FROM last, newest WHERE newest.tick > last.tick),
cur AS (
    SELECT r.ord, r.lo_tick, r.hi_tick, lo.snap AS lo, hi.snap AS hi,
           greatest(r.ax, pg_snapshot_xmin(lo.snap)) AS ax,
           CASE WHEN r.ax >= pg_snapshot_xmin(lo.snap) THEN r.ai ELSE 0 END AS ai
      FROM ranges r JOIN ticks.ticks lo ON lo.tick = r.lo_tick JOIN ticks.ticks hi ON hi.tick = r.hi_tick),
picked AS (
    SELECT c.ord, c.lo_tick, c.hi_tick, i.xid, i.id, i.payload FROM cur c CROSS JOIN LATERAL (
        SELECT i.xid, i.id, i.payload::text AS payload FROM ticks.intents i
         WHERE (i.xid, i.id) > (c.ax, c.ai) AND i.xid < pg_snapshot_xmax(c.hi)
           AND pg_visible_in_snapshot(i.xid, c.hi) AND NOT pg_visible_in_snapshot(i.xid, c.lo)
         ORDER BY i.xid, i.id LIMIT 100) i),
mine AS (SELECT * FROM picked WHERE ord = (SELECT min(ord) FROM picked)),
ins AS (
    INSERT INTO ticks.claims (lo_tick, tick, upto_xid, upto_id, owner, fence, lease_expires_at)
    SELECT lo_tick, hi_tick, xid, id, 'bench', 1, now() + interval '60 s'
      FROM mine ORDER BY xid DESC, id DESC LIMIT 1
    RETURNING claim, fence),
-- nothing left in the last claim's range and nothing since: step to the newest
skipped AS (
    INSERT INTO ticks.claims (lo_tick, tick, upto_xid, upto_id, owner, fence, lease_expires_at)
    SELECT last.tick, newest.tick, '0'::xid8, 0, 'bench', 0, now()
      FROM last, newest
     WHERE newest.tick > last.tick AND NOT EXISTS (SELECT 1 FROM mine))
SELECT coalesce((SELECT claim FROM ins), 0) AS claim,
       coalesce((SELECT fence FROM ins), 0) AS fence,
       coalesce((SELECT array_agg(m.id) FROM mine m), '{}')::text AS ids,
       coalesce((SELECT array_agg(m.payload) FROM mine m), '{}') AS payloads \gset
COMMIT;
-- fenced: only the claim's latest fence may complete it
INSERT INTO ticks.outcomes (claim, owner, ids, states, refs, statuses, started, finished)
SELECT :claim, 'bench', u.ids,
       array_fill('delivered'::text, ARRAY[cardinality(u.ids)]),
       ARRAY(SELECT 'ref-' || x FROM unnest(u.ids) x),
       array_fill(200, ARRAY[cardinality(u.ids)]),
       array_fill(now(), ARRAY[cardinality(u.ids)]),
       array_fill(now(), ARRAY[cardinality(u.ids)])
  FROM (SELECT :ids::bigint[] AS ids) u
 WHERE cardinality(u.ids) > 0
   AND EXISTS (SELECT 1 FROM ticks.claims c WHERE c.claim = :claim AND c.fence = :fence);
-- end
