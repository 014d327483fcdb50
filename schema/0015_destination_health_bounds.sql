-- Destination health, bounded: a recovered claim that must wait keeps its
-- recovery; failures that stopped long ago stop counting and are pruned,
-- and the relays' reread of the unhealthy destinations reads those only;
-- alerts are aggregated so that an incident is a handful of messages.

-- A claim recovered from an expired lease (the previous attempt's outcome
-- unknown) whose destination may not be called now is deferred like any
-- other; these keep the lost attempt's owner and time until a claim of the
-- intent gets past the destination's gate and reconciles it.
ALTER TABLE outbox.intents
    ADD COLUMN recover_owner text,
    ADD COLUMN recover_at    timestamptz;

-- The destinations the relays reread every half second: the unhealthy ones
-- (a few), not every destination that was ever limited or failed.
CREATE INDEX destinations_unhealthy ON outbox.destinations (name)
 WHERE state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL;

-- A transient failure at p_name, as in 0007, except that failures count as
-- consecutive only while each comes within p_max_cooldown of the last: a
-- closed destination's older count starts anew (the relays reread only
-- recent failures, so a success after that long may not have reset it).
CREATE OR REPLACE FUNCTION outbox.destination_failed(
    p_name         text,
    p_error        text,
    p_probe        boolean,
    p_owner        text,
    p_threshold    integer,
    p_cooldown     interval,
    p_max_cooldown interval,
    p_alert_url    text,
    p_alert_endpoint text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    d        outbox.destinations;
    v_now    timestamptz := clock_timestamp();
    v_next   interval;
    v_count  integer;
BEGIN
    INSERT INTO outbox.destinations (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO d FROM outbox.destinations WHERE name = p_name FOR UPDATE;
    v_count := d.failures;
    IF d.state = 'closed' AND d.updated_at < v_now - p_max_cooldown THEN
        v_count := 0;
    END IF;
    IF d.state = 'paused' THEN
        UPDATE outbox.destinations SET failures = failures + 1, last_error = p_error,
               updated_at = v_now WHERE name = p_name;
        RETURN 'paused';
    END IF;
    IF d.state = 'half_open' AND p_probe AND d.probe_owner = p_owner THEN
        v_next := least(p_max_cooldown, coalesce(d.cooldown, p_cooldown) * 2);
        UPDATE outbox.destinations
           SET state = 'open', failures = failures + 1, last_error = p_error,
               cooldown = v_next, next_probe_at = v_now + v_next,
               probe_owner = NULL, probe_until = NULL, updated_at = v_now
         WHERE name = p_name;
        INSERT INTO outbox.destination_events (destination, event, detail, actor)
        VALUES (p_name, 'probe_failed',
                jsonb_build_object('error', p_error, 'cooldown', extract(epoch FROM v_next)),
                p_owner);
        RETURN 'open';
    END IF;
    IF d.state = 'closed' AND v_count + 1 >= p_threshold THEN
        UPDATE outbox.destinations
           SET state = 'open', failures = v_count + 1, last_error = p_error,
               opened_at = v_now, cooldown = p_cooldown, next_probe_at = v_now + p_cooldown,
               probe_owner = NULL, probe_until = NULL, updated_at = v_now
         WHERE name = p_name;
        INSERT INTO outbox.destination_events (destination, event, detail, actor)
        VALUES (p_name, 'opened',
                jsonb_build_object('failures', v_count + 1, 'error', p_error), p_owner);
        PERFORM outbox.raise_alert('breaker.opened', p_name, v_now,
            jsonb_build_object('failures', v_count + 1, 'last_error', p_error,
                               'next_probe_at', v_now + p_cooldown),
            p_alert_url, p_alert_endpoint);
        RETURN 'open';
    END IF;
    UPDATE outbox.destinations SET failures = v_count + 1, last_error = p_error,
           updated_at = v_now WHERE name = p_name;
    RETURN d.state;
END
$$;

-- What no longer matters: a closed destination whose last failure or
-- slow-down is older than p_after. Its row goes (its history stays in
-- destination_events), or, for a rate limit's bucket, its count and
-- slow-down are cleared. Run by the relays about every minute. Returns how
-- many rows it changed.
CREATE FUNCTION outbox.forget_stale_failures(p_after interval)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_cut     timestamptz := clock_timestamp() - p_after;
    v_deleted integer;
    v_cleared integer;
BEGIN
    DELETE FROM outbox.destinations
     WHERE (state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL)
       AND state = 'closed' AND updated_at < v_cut AND tokens IS NULL
       AND (slow_until IS NULL OR slow_until < v_cut);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    UPDATE outbox.destinations
       SET failures = 0, last_error = NULL, slow_until = NULL
     WHERE (state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL)
       AND state = 'closed' AND updated_at < v_cut
       AND (slow_until IS NULL OR slow_until < v_cut);
    GET DIAGNOSTICS v_cleared = ROW_COUNT;
    RETURN v_deleted + v_cleared;
END
$$;

-- Alerts, aggregated: of each kind of destination event (breaker.opened,
-- breaker.closed, destination.paused) at most 3 are raised one by one in
-- a five-minute window (aligned on the database clock); the others in it
-- are counted, with up to 20 of their subjects, and raised as one
-- alerts.suppressed once the window is over (raise_alert_summaries).
CREATE TABLE outbox.alert_windows (
    event       text        NOT NULL,
    started_at  timestamptz NOT NULL,
    raised      integer     NOT NULL DEFAULT 0,
    suppressed  integer     NOT NULL DEFAULT 0,
    subjects    text[]      NOT NULL DEFAULT '{}',
    summarised  boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (event, started_at)
);

CREATE OR REPLACE FUNCTION outbox.raise_alert(
    p_event      text,
    p_subject    text,
    p_at         timestamptz,
    p_detail     jsonb,
    p_url        text,
    p_endpoint   text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_body jsonb := jsonb_build_object(
        'type', p_event,
        'subject', p_subject,
        'at', to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        'detail', coalesce(p_detail, '{}'::jsonb));
    v_key text := outbox.derive_key('outbox-alert',
        p_event || ':' || p_subject || ':' || extract(epoch FROM p_at)::text);
    v_window timestamptz;
    v_raised integer;
BEGIN
    IF p_url IS NULL AND p_endpoint IS NULL THEN
        RETURN;
    END IF;
    IF p_event IN ('breaker.opened', 'breaker.closed', 'destination.paused') THEN
        v_window := to_timestamp(floor(extract(epoch FROM p_at) / 300) * 300);
        INSERT INTO outbox.alert_windows (event, started_at) VALUES (p_event, v_window)
        ON CONFLICT (event, started_at) DO NOTHING;
        SELECT raised INTO v_raised FROM outbox.alert_windows
         WHERE event = p_event AND started_at = v_window FOR UPDATE;
        IF v_raised >= 3 THEN
            UPDATE outbox.alert_windows
               SET suppressed = suppressed + 1,
                   subjects = CASE WHEN cardinality(subjects) < 20
                                   THEN subjects || p_subject ELSE subjects END
             WHERE event = p_event AND started_at = v_window;
            RETURN;
        END IF;
        UPDATE outbox.alert_windows SET raised = raised + 1
         WHERE event = p_event AND started_at = v_window;
    END IF;
    IF p_endpoint IS NOT NULL THEN
        PERFORM outbox.enqueue(v_key, 'webhook', jsonb_build_object('body', v_body),
                               p_endpoint, now(), NULL, 'outbox-relay alerts');
    ELSE
        PERFORM outbox.enqueue(v_key, 'webhook',
                               jsonb_build_object('url', p_url, 'body', v_body),
                               NULL, now(), NULL, 'outbox-relay alerts');
    END IF;
END
$$;

-- The summaries of the windows that are over and held back alerts, each
-- raised by the one relay whose UPDATE takes it (its key derived from the
-- window). Old windows are dropped after a day. Returns how many.
CREATE FUNCTION outbox.raise_alert_summaries(p_alert_url text, p_alert_endpoint text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    w record;
    n integer := 0;
BEGIN
    DELETE FROM outbox.alert_windows WHERE started_at < clock_timestamp() - interval '1 day';
    IF p_alert_url IS NULL AND p_alert_endpoint IS NULL THEN
        RETURN 0;
    END IF;
    FOR w IN
        UPDATE outbox.alert_windows SET summarised = true
         WHERE NOT summarised AND suppressed > 0
           AND started_at + interval '5 minutes' <= clock_timestamp()
        RETURNING event, started_at, raised, suppressed, subjects
    LOOP
        PERFORM outbox.raise_alert('alerts.suppressed', w.event, w.started_at,
            jsonb_build_object(
                'event', w.event,
                'from', w.started_at,
                'until', w.started_at + interval '5 minutes',
                'raised', w.raised,
                'suppressed', w.suppressed,
                'subjects', to_jsonb(w.subjects)),
            p_alert_url, p_alert_endpoint);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION outbox.forget_stale_failures(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.raise_alert_summaries(text, text) FROM PUBLIC;
