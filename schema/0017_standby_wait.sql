-- relay.wait_for_standbys: an effect is performed only after its intent's
-- commit is flushed on N streaming standbys, so that a failover to one of
-- them cannot lose an intent whose effect already happened.
--
-- 1. outbox.standby_flush_positions(): each physical standby streaming from
--    this server and the WAL position it has flushed (bytes from 0/0). It
--    reads pg_stat_replication as its owner (the role that ran migrate):
--    a role sees another role's walsender positions only as a superuser or
--    a member of pg_read_all_stats, so the relay role gets EXECUTE on this
--    function (deploy/sql/roles.sql) and no statistics privilege. Logical
--    walsenders (a decoding client such as Debezium) are connected to a
--    database and are not standbys; a base backup in progress is not
--    streaming. `timeline` is the server's own: the claim returns the
--    timeline it claimed on, and a position on another timeline (a standby
--    was promoted since) says nothing. `hidden` counts walsenders whose
--    state the owner may not read, so that the relay can say why it sees
--    no standby.
-- 2. outbox.relays gains what each relay reports of its wait, for `stats`
--    and the console: how many standbys it needs, how many stream, how many
--    deliveries wait and since when they have been held up. Columns with
--    defaults: older relays' upsert leaves them as they are.

CREATE FUNCTION outbox.standby_flush_positions(
    OUT timeline integer, OUT streaming integer, OUT hidden integer, OUT flushed bigint[])
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer,
           count(*) FILTER (WHERE r.state = 'streaming')::integer,
           count(*) FILTER (WHERE r.state IS NULL)::integer,
           coalesce(array_agg((r.flush_lsn - '0/0'::pg_lsn)::bigint
                              ORDER BY r.flush_lsn DESC)
                        FILTER (WHERE r.state = 'streaming' AND r.flush_lsn IS NOT NULL),
                    '{}')
      FROM pg_stat_replication r
      JOIN pg_stat_activity a ON a.pid = r.pid
     WHERE a.datid IS NULL
$$;
REVOKE EXECUTE ON FUNCTION outbox.standby_flush_positions() FROM PUBLIC;

ALTER TABLE outbox.relays
    ADD COLUMN standbys_needed    integer NOT NULL DEFAULT 0,
    ADD COLUMN standbys_streaming integer,
    ADD COLUMN standby_waits      integer NOT NULL DEFAULT 0,
    -- set while deliveries have waited past a moment for their commit to
    -- reach the standbys; cleared when the standbys catch up
    ADD COLUMN standbys_behind_since timestamptz;
