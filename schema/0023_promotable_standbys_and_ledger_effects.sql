-- Which walsenders count as standbys, what the ledger remembers of an
-- effect, and who may clear a recovery mark.
--
-- 1. outbox.standby_flush_positions(p_names): as the function of 0017, but
--    counting only the walsenders a failover may promote. A WAL archiver
--    (pg_receivewal, Barman's receive-wal) and the WAL stream of a running
--    pg_basebackup -X stream are physical walsenders in state `streaming`
--    too, and pg_receivewal --synchronous flushes at once: counted, their
--    flush would release effects that the standby a failover promotes does
--    not have yet. A walsender is told by its application_name, compared
--    case-insensitively as synchronous_standby_names compares it:
--      - p_names NULL (relay.standby_names unset): every physical
--        walsender except those named pg_receivewal, pg_basebackup or
--        barman_receive_wal, the names those tools connect with unless
--        told otherwise;
--      - p_names given: only the walsenders named in it.
--    `ignored` lists the application_names of the streaming walsenders not
--    counted, for the relay's log. The function of 0017 stays for relays
--    that call it (a rolling upgrade) and now counts as p_names NULL does.
-- 2. outbox.ledger.effect_at: when a provider last answered success to an
--    attempt of the purged intent (NULL: no effect is known to have
--    happened). Written by the purge from the attempts it deletes, and by a
--    completion that arrives after its intent was purged, so that "did it
--    happen?" answers from the ledger as it did from the live row.
-- 3. An operator's change (retry, cancel, resolve) clears an intent's
--    recovery mark (recover_owner, recover_at of 0015): a retried intent is
--    claimed afresh. A role that may change intents column by column (the
--    console's, deploy/sql/roles.sql) gets those two columns beside the
--    fencing token it already updates.

CREATE FUNCTION outbox.standby_flush_positions(
    p_names text[],
    OUT timeline integer, OUT streaming integer, OUT hidden integer, OUT flushed bigint[],
    OUT ignored text[])
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    WITH w AS (
        SELECT r.state, r.flush_lsn, r.application_name,
               CASE WHEN p_names IS NULL
                    THEN lower(coalesce(r.application_name, ''))
                         <> ALL (ARRAY['pg_receivewal', 'pg_basebackup', 'barman_receive_wal'])
                    ELSE lower(coalesce(r.application_name, ''))
                         = ANY (SELECT lower(n) FROM unnest(p_names) AS n)
               END AS counted
          FROM pg_stat_replication r
          JOIN pg_stat_activity a ON a.pid = r.pid
         WHERE a.datid IS NULL)
    SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer,
           count(*) FILTER (WHERE w.state = 'streaming' AND w.counted)::integer,
           count(*) FILTER (WHERE w.state IS NULL)::integer,
           coalesce(array_agg((w.flush_lsn - '0/0'::pg_lsn)::bigint ORDER BY w.flush_lsn DESC)
                        FILTER (WHERE w.state = 'streaming' AND w.counted
                                  AND w.flush_lsn IS NOT NULL),
                    '{}'),
           coalesce(array_agg(coalesce(w.application_name, '') ORDER BY w.application_name)
                        FILTER (WHERE w.state = 'streaming' AND NOT w.counted),
                    '{}')
      FROM w
$$;
REVOKE EXECUTE ON FUNCTION outbox.standby_flush_positions(text[]) FROM PUBLIC;

-- The new function gets the old one's owner (it runs as its owner, and the
-- old one calls it) and every EXECUTE grant of the old one (the relay role's,
-- from deploy/sql/roles.sql), as 0016 did for enqueue.
DO $$
DECLARE
    v_old   oid := 'outbox.standby_flush_positions()'::regprocedure;
    v_owner oid;
    v_grant record;
BEGIN
    SELECT proowner INTO v_owner FROM pg_proc WHERE oid = v_old;
    IF v_owner <> (SELECT proowner FROM pg_proc
                    WHERE oid = 'outbox.standby_flush_positions(text[])'::regprocedure) THEN
        EXECUTE format('ALTER FUNCTION outbox.standby_flush_positions(text[]) OWNER TO %I',
                       pg_get_userbyid(v_owner));
    END IF;
    FOR v_grant IN
        SELECT DISTINCT a.grantee, a.is_grantable
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = v_old AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION outbox.standby_flush_positions(text[]) TO %s%s',
                       CASE WHEN v_grant.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(v_grant.grantee)) END,
                       CASE WHEN v_grant.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- CREATE OR REPLACE keeps its owner and grants.
CREATE OR REPLACE FUNCTION outbox.standby_flush_positions(
    OUT timeline integer, OUT streaming integer, OUT hidden integer, OUT flushed bigint[])
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.timeline, p.streaming, p.hidden, p.flushed
      FROM outbox.standby_flush_positions(NULL::text[]) p
$$;

ALTER TABLE outbox.ledger ADD COLUMN effect_at timestamptz;

DO $$
DECLARE
    v_grantee oid;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT a.grantee
          FROM pg_attribute att, aclexplode(att.attacl) a
         WHERE att.attrelid = 'outbox.intents'::regclass AND att.attname = 'fence'
           AND a.privilege_type = 'UPDATE' AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT UPDATE (recover_owner, recover_at) ON outbox.intents TO %I',
                       pg_get_userbyid(v_grantee));
    END LOOP;
END
$$;
