-- Roles for outbox-relay, least privilege. Run once per database as its
-- owner, after `outbox-relay migrate` (psql -v ON_ERROR_STOP=1 -f roles.sql),
-- and again after upgrades (it is idempotent). The roles are NOLOGIN groups:
-- grant them to your login roles, e.g. GRANT outbox_app TO checkout_service.
--
--   outbox_app       EXECUTE outbox.enqueue / outbox.derive_key; nothing else:
--                    cannot read payloads, cannot change states
--   outbox_relay     the daemon: read and write the outbox tables
--   outbox_operator  read-only: list, show, stats, schedules
--   outbox_console   `outbox-relay console`: reads what outbox_operator reads,
--                    and changes only what operator actions change (the
--                    state columns of intents, operator_actions rows,
--                    pause/resume): never a payload, never a new intent,
--                    never a delete
--
-- Migrations are applied by the database owner (outbox-relay migrate), not
-- by these roles; `outbox-relay run` skips migrating when the schema is
-- current, so the relay role never needs DDL rights.

DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['outbox_app', 'outbox_relay', 'outbox_operator', 'outbox_console'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object THEN
            NULL; -- exists already (roles are cluster-wide)
        END;
    END LOOP;
END
$$;

GRANT USAGE ON SCHEMA outbox TO outbox_app, outbox_relay, outbox_operator, outbox_console;

-- (0016 added p_traceparent, p_tracestate and p_traceparents, p_tracestates)
GRANT EXECUTE ON FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)
    TO outbox_app, outbox_relay;
GRANT EXECUTE ON FUNCTION
    outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text, text[], text[])
    TO outbox_app, outbox_relay;
-- the insertable outbox (0006): INSERT only, for ORMs; it reads nothing
GRANT INSERT ON outbox.outbox TO outbox_app;
-- (0029) events: published as the application enqueues
GRANT EXECUTE ON FUNCTION outbox.publish(text, text, jsonb, text, text),
                          outbox.publish_many(text[], text[], jsonb[], text[], text[])
    TO outbox_app, outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.expand_event(bigint, text),
                          outbox.disable_failing_subscriptions(interval, text, text)
    TO outbox_relay;
-- (0031) and in batches
GRANT EXECUTE ON FUNCTION outbox.expand_events(bigint[]) TO outbox_relay;
-- (0033) the gauges fold what changed into outbox.tallies before reading them
GRANT EXECUTE ON FUNCTION outbox.fold_tallies(), outbox.tally_subscription(text, text, jsonb),
                          outbox.tally_url(text, text, jsonb) TO outbox_relay;
-- (0043) retention rotates, closes and retires the log's segments, which
-- are tables: the functions do it as the schema's owner
GRANT EXECUTE ON FUNCTION outbox.rotate_log(interval), outbox.close_log_segment(interval),
                          outbox.retire_log_segment(interval, integer) TO outbox_relay;
GRANT EXECUTE ON FUNCTION outbox.derive_key(text, text) TO outbox_app, outbox_relay, outbox_operator;
GRANT EXECUTE ON FUNCTION outbox.fingerprint(jsonb) TO outbox_relay;
-- the claim asks it whose turn it is within an ordering key (0005)
GRANT EXECUTE ON FUNCTION outbox.ordering_turn(text, bigint) TO outbox_relay;
-- relay.wait_for_standbys reads the standbys' flushed positions, and only
-- them, through these functions (0017; 0023 counts only promotable standbys,
-- by application_name): no statistics privilege
GRANT EXECUTE ON FUNCTION outbox.standby_flush_positions(),
                          outbox.standby_flush_positions(text[]) TO outbox_relay;
-- the xmin horizon gauges (outbox_oldest_xmin_age_*) read pg_stat_activity,
-- pg_prepared_xacts and pg_replication_slots, which every role may read:
-- every holder's xmin, but when another role's session began only for
-- members of pg_read_all_stats. For outbox_oldest_xmin_age_seconds to count
-- the applications' sessions too, grant that role to the relays' login role
-- (it also shows them every session's query text, and only a role allowed to
-- grant pg_read_all_stats may: it is left to you):
--   GRANT pg_read_all_stats TO relay_login;
-- the sweeper promotes intents a race left waiting, from the keys noted (0012)
GRANT EXECUTE ON FUNCTION outbox.recheck_ordering_keys(integer, bigint) TO outbox_relay;
-- destination health (0007): the relay keeps breakers, buckets and alerts;
-- operators pause and resume destinations (recorded with their role)
GRANT EXECUTE ON FUNCTION
    outbox.raise_alert(text, text, timestamptz, jsonb, text, text),
    outbox.take_tokens(text, double precision, double precision, integer),
    outbox.destination_failed(text, text, boolean, text, integer, interval, interval, text, text),
    outbox.destination_succeeded(text, boolean, text, text, text),
    outbox.take_probe(text, text, interval),
    outbox.slow_destination(text, interval),
    outbox.check_dead_alert(bigint, text, text),
    outbox.raise_pause_alerts(text, text),
    outbox.release_probe(text, text),
    outbox.prune_destinations(interval),
    outbox.close_idle_breaker(text, text, text, text),
    outbox.destination_of(text, text, jsonb),
    -- (0015) failures past their window; alert summaries
    outbox.forget_stale_failures(interval),
    outbox.raise_alert_summaries(text, text),
    -- (0022) a half-open breaker whose probe's time is up is open again
    outbox.expire_probes()
    TO outbox_relay;
GRANT EXECUTE ON FUNCTION
    outbox.pause_destination(text, text),
    outbox.resume_destination(text),
    outbox.destination_of(text, text, jsonb),
    -- (0022) destination_of reads an origin spelt otherwise through these
    outbox.url_origin(text),
    outbox.punycode(text)
    TO outbox_relay, outbox_operator, outbox_console;

-- the console (0008): the failure groups' error class; retry, cancel and
-- resolve update only these columns of intents (the promotion trigger of an
-- ordering key sets `waiting` on the next intent), and record each action
GRANT EXECUTE ON FUNCTION outbox.error_class(text) TO outbox_relay, outbox_operator, outbox_console;
GRANT SELECT ON ALL TABLES IN SCHEMA outbox TO outbox_console;
GRANT UPDATE (state, run_after, attempts_base, owner, lease_expires_at, fence, key_generation,
              updated_at, last_error, delivered_at, provider_ref, waiting,
              -- (0023) an operator's change clears the recovery mark
              recover_owner, recover_at)
    ON outbox.intents TO outbox_console;
-- (0027) the same columns of the rows behind outbox.intents, which the
-- console changes after giving a log intent its row
GRANT UPDATE (state, run_after, attempts_base, owner, lease_expires_at, fence, key_generation,
              updated_at, last_error, delivered_at, provider_ref, waiting,
              recover_owner, recover_at)
    ON outbox.intent_rows TO outbox_console;
GRANT EXECUTE ON FUNCTION outbox.track(bigint[]) TO outbox_relay, outbox_console;
GRANT INSERT ON outbox.operator_actions TO outbox_console;
-- (0029) the console makes, disables, enables and rotates subscriptions
GRANT INSERT, UPDATE ON outbox.subscriptions TO outbox_console;

GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox TO outbox_relay;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA outbox TO outbox_relay;
GRANT SELECT ON ALL TABLES IN SCHEMA outbox TO outbox_operator;

-- readiness checks read which migrations are applied
GRANT SELECT ON public._sqlx_migrations TO outbox_relay, outbox_operator, outbox_console;
