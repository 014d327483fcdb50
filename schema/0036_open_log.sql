-- outbox.intent_log_open: the part of the log that the relays' hot
-- statements read. The claim of the log, the deliveries at the first
-- attempt, the sweeper's and the gauges' reads of the batches in flight,
-- and the reads of the next due and oldest due intents find every intent
-- they need in it: those no claim has taken, and those in a claim's batch.
-- The statements that may meet any intent of the log (a completion through
-- its row, `outbox.track`, retention, the view `outbox.intents`) read
-- `outbox.intent_log` itself.
--
-- The log is one table, and the view is all of it. Postgres inlines a view
-- into each statement that reads it, so the statements' plans are the
-- table's (tests/it/intent_log.rs reads them).
CREATE VIEW outbox.intent_log_open AS
SELECT l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after, l.ordering_key,
       l.waiting, l.source, l.traceparent, l.tracestate, l.created_at
  FROM outbox.intent_log l;

COMMENT ON VIEW outbox.intent_log_open IS
    'The part of outbox.intent_log that can hold an intent no claim has taken or one in a claim''s batch, which the relays'' hot statements read';

-- Whoever reads the log reads the view (deploy/sql/roles.sql grants it to
-- the relay's role as well, with every table of the schema).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT a.grantee
          FROM pg_class c, aclexplode(c.relacl) a
         WHERE c.oid = 'outbox.intent_log'::regclass AND a.grantee <> c.relowner
           AND a.grantee <> 0 AND a.privilege_type = 'SELECT'
    LOOP
        EXECUTE format('GRANT SELECT ON outbox.intent_log_open TO %I', pg_get_userbyid(g.grantee));
    END LOOP;
END
$$;
