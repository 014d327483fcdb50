-- Destination health: rate limits held across relays, circuit
-- breakers that recover by themselves, manual pause and resume, operator
-- alerts through the outbox itself.
--
-- A destination is where a kind's effects go: a webhook's origin
-- (scheme://host[:port], or the origin of a named endpoint), "smtp",
-- "charge", "nats", "amqp". One row per destination that has ever been
-- limited, failed or paused; a destination without a row is closed and
-- unlimited.
--
--   state      closed | open | half_open | paused
--   failures   consecutive transient failures (a success resets it)
--   cooldown   the current wait before a probe (doubles on a failed probe)
--   tokens     the shared token bucket of a rate limit, refilled at the
--              rate the relays pass (their [limits]); relays take tokens in
--              small batches
--   slow_until a 429 or Retry-After: nothing is sent before it
--
-- Every transition and every operator action is kept in
-- outbox.destination_events. Alerts (breaker opened / closed) are enqueued
-- as webhook intents in the same transaction as the transition, a pause's
-- by the one relay that marks its event alerted, each with a key derived
-- from the event, so that replicas raise each once.

CREATE TABLE outbox.destinations (
    name          text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 512),
    state         text NOT NULL DEFAULT 'closed'
                  CHECK (state IN ('closed', 'open', 'half_open', 'paused')),
    failures      integer NOT NULL DEFAULT 0,
    last_error    text,
    opened_at     timestamptz,
    cooldown      interval,
    next_probe_at timestamptz,
    probe_owner   text,
    probe_until   timestamptz,
    paused_by     text,
    paused_at     timestamptz,
    tokens        double precision,
    refilled_at   timestamptz,
    slow_until    timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox.destination_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination text        NOT NULL,
    event       text        NOT NULL,
    detail      jsonb,
    actor       text        NOT NULL DEFAULT current_user,
    at          timestamptz NOT NULL DEFAULT now(),
    -- a pause's alert has been raised (by one relay, see raise_pause_alerts)
    alerted     boolean     NOT NULL DEFAULT false
);
CREATE INDEX destination_events_destination ON outbox.destination_events (destination, at);

-- Latches for alerts on a level (the dead count above a threshold): raised
-- once per crossing.
CREATE TABLE outbox.alert_latches (
    name      text PRIMARY KEY,
    raised_at timestamptz NOT NULL DEFAULT now()
);

-- Enqueue an operator alert: a webhook intent to p_url (or the named
-- endpoint p_endpoint) whose key is derived from the event, so that every
-- relay raising the same event enqueues it once. No alert target: nothing.
CREATE FUNCTION outbox.raise_alert(
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
BEGIN
    IF p_url IS NULL AND p_endpoint IS NULL THEN
        RETURN;
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

-- Take up to p_want tokens of p_name's bucket (rate p_rate per second,
-- holding at most p_burst), returning how many were granted.
CREATE FUNCTION outbox.take_tokens(
    p_name  text,
    p_rate  double precision,
    p_burst double precision,
    p_want  integer)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_now     timestamptz;
    v_tokens  double precision;
    v_granted integer;
BEGIN
    INSERT INTO outbox.destinations AS d (name, tokens, refilled_at)
    VALUES (p_name, p_burst, clock_timestamp())
    ON CONFLICT (name) DO NOTHING;
    PERFORM 1 FROM outbox.destinations WHERE name = p_name FOR UPDATE;
    -- read the clock under the row lock: each holder's is later than the
    -- last refill, so no interval is credited twice
    v_now := clock_timestamp();
    SELECT least(p_burst, coalesce(d.tokens, p_burst)
                 + p_rate * greatest(0, extract(epoch FROM v_now - coalesce(d.refilled_at, v_now))))
      INTO v_tokens
      FROM outbox.destinations d
     WHERE d.name = p_name;
    v_granted := greatest(0, least(p_want, floor(v_tokens)::integer));
    UPDATE outbox.destinations
       SET tokens = v_tokens - v_granted, refilled_at = v_now
     WHERE name = p_name;
    RETURN v_granted;
END
$$;

-- A transient failure at p_name (a probe's, when p_probe). Opens the
-- breaker at p_threshold consecutive failures; a failed probe reopens it
-- with the cooldown doubled, up to p_max_cooldown. Returns the new state.
CREATE FUNCTION outbox.destination_failed(
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
BEGIN
    INSERT INTO outbox.destinations (name) VALUES (p_name) ON CONFLICT (name) DO NOTHING;
    SELECT * INTO d FROM outbox.destinations WHERE name = p_name FOR UPDATE;
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
    IF d.state = 'closed' AND d.failures + 1 >= p_threshold THEN
        UPDATE outbox.destinations
           SET state = 'open', failures = failures + 1, last_error = p_error,
               opened_at = v_now, cooldown = p_cooldown, next_probe_at = v_now + p_cooldown,
               probe_owner = NULL, probe_until = NULL, updated_at = v_now
         WHERE name = p_name;
        INSERT INTO outbox.destination_events (destination, event, detail, actor)
        VALUES (p_name, 'opened',
                jsonb_build_object('failures', d.failures + 1, 'error', p_error), p_owner);
        PERFORM outbox.raise_alert('breaker.opened', p_name, v_now,
            jsonb_build_object('failures', d.failures + 1, 'last_error', p_error,
                               'next_probe_at', v_now + p_cooldown),
            p_alert_url, p_alert_endpoint);
        RETURN 'open';
    END IF;
    UPDATE outbox.destinations SET failures = failures + 1, last_error = p_error,
           updated_at = v_now WHERE name = p_name;
    RETURN d.state;
END
$$;

-- An answer from p_name (delivered, or refused on purpose): the endpoint
-- is up. Resets the failure count; a probe's success closes the breaker.
-- Returns the new state.
CREATE FUNCTION outbox.destination_succeeded(
    p_name           text,
    p_probe          boolean,
    p_owner          text,
    p_alert_url      text,
    p_alert_endpoint text)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    d     outbox.destinations;
    v_now timestamptz := clock_timestamp();
BEGIN
    SELECT * INTO d FROM outbox.destinations WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'closed';
    END IF;
    IF d.state = 'half_open' AND p_probe AND d.probe_owner = p_owner THEN
        UPDATE outbox.destinations
           SET state = 'closed', failures = 0, opened_at = NULL, cooldown = NULL,
               next_probe_at = NULL, probe_owner = NULL, probe_until = NULL, updated_at = v_now
         WHERE name = p_name;
        INSERT INTO outbox.destination_events (destination, event, detail, actor)
        VALUES (p_name, 'closed',
                jsonb_build_object('open_seconds', extract(epoch FROM v_now - d.opened_at)),
                p_owner);
        PERFORM outbox.raise_alert('breaker.closed', p_name, v_now,
            jsonb_build_object('opened_at', d.opened_at), p_alert_url, p_alert_endpoint);
        RETURN 'closed';
    END IF;
    IF d.state = 'closed' AND d.failures > 0 THEN
        UPDATE outbox.destinations SET failures = 0, updated_at = v_now WHERE name = p_name;
    END IF;
    RETURN d.state;
END
$$;

-- The one probe of an open breaker whose cooldown has passed (or whose
-- last probe's owner went silent): true for the relay that gets it.
CREATE FUNCTION outbox.take_probe(p_name text, p_owner text, p_for interval)
RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    WITH taken AS (
        UPDATE outbox.destinations
           SET state = 'half_open', probe_owner = p_owner,
               probe_until = clock_timestamp() + p_for, updated_at = clock_timestamp()
         WHERE name = p_name
           AND ((state = 'open' AND next_probe_at <= clock_timestamp())
             OR (state = 'half_open' AND probe_until < clock_timestamp()))
        RETURNING 1)
    SELECT EXISTS (SELECT 1 FROM taken);
$$;

-- A 429 or Retry-After: nothing goes to p_name for p_for (on the
-- database's clock, which every relay reads).
CREATE FUNCTION outbox.slow_destination(p_name text, p_for interval)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    INSERT INTO outbox.destinations AS d (name, slow_until)
    VALUES (p_name, clock_timestamp() + p_for)
    ON CONFLICT (name) DO UPDATE
       SET slow_until = greatest(d.slow_until, excluded.slow_until), updated_at = now();
$$;

-- Manual override, recorded with the operator's login role (session_user):
-- pause (nothing is attempted) or resume (closed, failures reset). These
-- run with the owner's rights so that an operator role needs nothing but
-- EXECUTE on them; they take no alert target from the caller: the relays
-- raise a pause's alert to the target they are configured with
-- (raise_pause_alerts).
CREATE FUNCTION outbox.pause_destination(p_name text, p_reason text)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_actor text := session_user::text;
BEGIN
    INSERT INTO outbox.destinations AS d (name, state, paused_by, paused_at)
    VALUES (p_name, 'paused', v_actor, v_now)
    ON CONFLICT (name) DO UPDATE
       SET state = 'paused', paused_by = v_actor, paused_at = v_now,
           probe_owner = NULL, probe_until = NULL, updated_at = v_now;
    INSERT INTO outbox.destination_events (destination, event, detail, actor)
    VALUES (p_name, 'paused', jsonb_build_object('reason', p_reason), v_actor);
END
$$;

CREATE FUNCTION outbox.resume_destination(p_name text)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    UPDATE outbox.destinations
       SET state = 'closed', failures = 0, opened_at = NULL, cooldown = NULL,
           next_probe_at = NULL, probe_owner = NULL, probe_until = NULL,
           paused_by = NULL, paused_at = NULL, slow_until = NULL, updated_at = clock_timestamp()
     WHERE name = p_name;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO outbox.destination_events (destination, event, actor)
    VALUES (p_name, 'resumed', session_user::text);
    RETURN true;
END
$$;

-- The alerts of pauses not yet alerted, each raised by the one relay whose
-- UPDATE takes it. Returns how many.
CREATE FUNCTION outbox.raise_pause_alerts(p_alert_url text, p_alert_endpoint text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    e record;
    n integer := 0;
BEGIN
    FOR e IN
        UPDATE outbox.destination_events SET alerted = true
         WHERE event = 'paused' AND NOT alerted
        RETURNING destination, detail, actor, at
    LOOP
        PERFORM outbox.raise_alert('destination.paused', e.destination, e.at,
            jsonb_build_object('actor', e.actor, 'reason', e.detail->>'reason'),
            p_alert_url, p_alert_endpoint);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- A probe that showed nothing of the destination (refused before it was
-- sent, or held back by the relay): the breaker is open again with its
-- probe due, for the next intent to take.
CREATE FUNCTION outbox.release_probe(p_name text, p_owner text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    UPDATE outbox.destinations
       SET state = 'open', probe_owner = NULL, probe_until = NULL,
           next_probe_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE name = p_name AND state = 'half_open' AND probe_owner = p_owner;
$$;

-- An open breaker with nothing left to send has nothing to probe with: the
-- relay that sees its backlog empty a minute past the due probe closes it
-- (recorded, and alerted as closed), so that it does not stay open, and
-- alerting, for a destination nobody uses any more. A new intent for it is
-- then attempted, and counts towards opening it again.
CREATE FUNCTION outbox.close_idle_breaker(
    p_name text, p_owner text, p_alert_url text, p_alert_endpoint text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    d     outbox.destinations;
    v_now timestamptz := clock_timestamp();
BEGIN
    UPDATE outbox.destinations x
       SET state = 'closed', failures = 0, opened_at = NULL, cooldown = NULL,
           next_probe_at = NULL, probe_owner = NULL, probe_until = NULL, updated_at = v_now
      FROM (SELECT * FROM outbox.destinations WHERE name = p_name FOR UPDATE) old
     WHERE x.name = p_name AND old.state = 'open'
       AND old.next_probe_at < v_now - interval '1 minute'
    RETURNING old.* INTO d;
    IF d.name IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO outbox.destination_events (destination, event, detail, actor)
    VALUES (p_name, 'closed', jsonb_build_object('idle', true), p_owner);
    PERFORM outbox.raise_alert('breaker.closed', p_name, v_now,
        jsonb_build_object('opened_at', d.opened_at, 'idle', true), p_alert_url, p_alert_endpoint);
    RETURN true;
END
$$;

-- Old history: events past p_keep, and closed destinations that have been
-- untouched as long (a bucket in use is touched at every take).
CREATE FUNCTION outbox.prune_destinations(p_keep interval)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    DELETE FROM outbox.destination_events WHERE at < now() - p_keep AND (event <> 'paused' OR alerted);
    DELETE FROM outbox.destinations
     WHERE state = 'closed' AND failures = 0 AND updated_at < now() - p_keep;
$$;

-- The dead count is at or above p_threshold: raise the alert once per
-- crossing (the latch drops when the count falls below again).
CREATE FUNCTION outbox.check_dead_alert(
    p_threshold bigint, p_alert_url text, p_alert_endpoint text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    v_dead  bigint;
    v_at    timestamptz;
BEGIN
    SELECT count(*) INTO v_dead FROM outbox.intents WHERE state = 'dead';
    IF v_dead < p_threshold THEN
        DELETE FROM outbox.alert_latches WHERE name = 'dead';
        RETURN false;
    END IF;
    INSERT INTO outbox.alert_latches (name) VALUES ('dead')
    ON CONFLICT (name) DO NOTHING
    RETURNING raised_at INTO v_at;
    IF v_at IS NOT NULL THEN
        PERFORM outbox.raise_alert('dead.threshold', 'dead', v_at,
            jsonb_build_object('dead', v_dead, 'threshold', p_threshold),
            p_alert_url, p_alert_endpoint);
    END IF;
    RETURN true;
END
$$;

-- The destination of a pending intent, as the relay names it (webhook
-- origins in lowercase without a default port; a named endpoint by its
-- name, which the relay maps to its origin), for counting backlogs.
CREATE FUNCTION outbox.destination_of(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    SELECT CASE p_kind
        WHEN 'webhook' THEN coalesce(
            p_destination,
            regexp_replace(regexp_replace(
                lower(substring(p_payload->>'url' FROM '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')),
                -- never a credential in a label or a listing
                '^([a-z][a-z0-9+.-]*://)[^@]*@', '\1'),
                '^(https://[^/]*):443$|^(http://[^/]*):80$', '\1\2'))
        WHEN 'email' THEN 'smtp'
        ELSE p_kind
    END;
$$;

REVOKE ALL ON FUNCTION outbox.raise_alert(text, text, timestamptz, jsonb, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.take_tokens(text, double precision, double precision, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.destination_failed(text, text, boolean, text, integer, interval, interval, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.destination_succeeded(text, boolean, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.take_probe(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.slow_destination(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.pause_destination(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.resume_destination(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.raise_pause_alerts(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.release_probe(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.prune_destinations(interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.close_idle_breaker(text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.check_dead_alert(bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.destination_of(text, text, jsonb) FROM PUBLIC;
