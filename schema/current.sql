--
-- PostgreSQL database dump
--



SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: outbox; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA outbox;


--
-- Name: build_open_log(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.build_open_log() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    c_columns  CONSTANT text := 'l.id, l.xid, l.key, l.kind, l.destination, l.payload, l.run_after,'
                                ' l.ordering_key, l.waiting, l.source, l.traceparent, l.tracestate,'
                                ' l.created_at';
    v_log      text;
    v_open     text;
    v_outcomes text;
BEGIN
    SELECT string_agg(format('SELECT %s FROM outbox.%I l', c_columns, 'intent_log_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment),
           string_agg(format('SELECT %s, false AS in_tail FROM outbox.%I l', c_columns,
                             'intent_log_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment),
           string_agg(format('SELECT o.intent_id, o.outcome, o.owner, o.started_at,'
                             ' o.finished_at, o.status, o.provider_ref, o.replayed, o.at'
                             ' FROM outbox.%I o', 'log_outcomes_' || s.segment),
                      ' UNION ALL ' ORDER BY s.segment)
      INTO v_log, v_open, v_outcomes
      FROM outbox.log_segments s
     WHERE s.state = 'open';
    EXECUTE format('CREATE OR REPLACE VIEW outbox.intent_log_open AS'
                   ' %s UNION ALL SELECT %s, true FROM outbox.intent_log_tail l',
                   v_open, c_columns);
    EXECUTE 'CREATE OR REPLACE VIEW outbox.intent_log_batchable AS ' || v_log;
    EXECUTE 'CREATE OR REPLACE VIEW outbox.log_outcomes_open AS ' || v_outcomes;
END
$$;


--
-- Name: check_dead_alert(bigint, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.check_dead_alert(p_threshold bigint, p_alert_url text, p_alert_endpoint text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_dead  bigint;
    v_at    timestamptz;
BEGIN
    SELECT count(*) INTO v_dead FROM outbox.intent_rows WHERE state = 'dead';
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


--
-- Name: check_kafka_headers(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.check_kafka_headers() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    v_headers jsonb := NEW.payload -> 'headers';
    v_name    text;
    v_value   jsonb;
BEGIN
    IF v_headers IS NULL OR jsonb_typeof(v_headers) = 'null' THEN
        RETURN NEW;
    END IF;
    IF jsonb_typeof(v_headers) <> 'object' THEN
        RAISE EXCEPTION 'kafka payload for key %: "headers" must be an object', NEW.key
            USING ERRCODE = '22023';
    END IF;
    FOR v_name, v_value IN SELECT h.key, h.value FROM jsonb_each(v_headers) h LOOP
        IF octet_length(v_name) NOT BETWEEN 1 AND 1024
           OR v_name !~ '^[\x20-\x7e]+$'
           OR v_name ~ '^ ' OR v_name ~ ' $' THEN
            RAISE EXCEPTION 'kafka payload for key %: header name % is not a valid header name (1 to 1024 printable ASCII characters, no leading or trailing space)',
                NEW.key, to_json(v_name)::text
                USING ERRCODE = '22023';
        END IF;
        IF lower(v_name) = 'outbox-effect-key' THEN
            RAISE EXCEPTION 'kafka payload for key %: header % is set by the relay (the effect key consumers dedupe on)',
                NEW.key, to_json(v_name)::text
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(v_value) <> 'string' THEN
            RAISE EXCEPTION 'kafka payload for key %: header % must be a string', NEW.key, to_json(v_name)::text
                USING ERRCODE = '22023';
        END IF;
        IF (v_value #>> '{}') ~ '[\x01-\x1f\x7f-\u009f]' THEN
            RAISE EXCEPTION 'kafka payload for key %: header % has a control character (CR, LF or another) in its value',
                NEW.key, to_json(v_name)::text
                USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN NEW;
END
$_$;


--
-- Name: close_idle_breaker(text, text, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.close_idle_breaker(p_name text, p_owner text, p_alert_url text, p_alert_endpoint text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: close_log_segment(interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.close_log_segment(p_grace interval DEFAULT '00:00:01'::interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_old outbox.log_segments;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT o.* INTO v_old
      FROM outbox.log_segments o
     WHERE o.state = 'open'
       AND EXISTS (SELECT 1 FROM outbox.log_segments n
                    WHERE n.state = 'open' AND n.segment > o.segment
                      AND n.opened_at < now() - p_grace)
     ORDER BY o.segment LIMIT 1;
    IF v_old.segment IS NULL OR NOT outbox.log_segment_done(v_old) THEN
        RETURN 'idle';
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        EXECUTE format('CREATE TRIGGER log_segment_closed BEFORE INSERT ON outbox.%I'
                       ' FOR EACH ROW EXECUTE FUNCTION outbox.log_segment_closed()',
                       'intent_log_' || v_old.segment);
        IF NOT outbox.log_segment_done(v_old) THEN
            -- an insert committed meanwhile: this block's undoing drops the
            -- trigger and its lock
            RAISE object_not_in_prerequisite_state;
        END IF;
        UPDATE outbox.log_segments SET state = 'closed', closed_at = now()
         WHERE segment = v_old.segment;
        PERFORM outbox.build_open_log();
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION
        WHEN lock_not_available THEN RETURN 'busy';
        WHEN object_not_in_prerequisite_state THEN RETURN 'idle';
    END;
    RETURN 'closed';
END
$$;


--
-- Name: derive_key(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.derive_key(parent text, step text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
    SELECT encode(sha256(convert_to(
        octet_length(convert_to(parent, 'UTF8'))::text || ':' || parent || step, 'UTF8')), 'hex')
$$;


--
-- Name: destination_failed(text, text, boolean, text, integer, interval, interval, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.destination_failed(p_name text, p_error text, p_probe boolean, p_owner text, p_threshold integer, p_cooldown interval, p_max_cooldown interval, p_alert_url text, p_alert_endpoint text) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: destination_of(text, text, jsonb); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.destination_of(p_kind text, p_destination text, p_payload jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $_$
    SELECT CASE p_kind
        WHEN 'webhook' THEN coalesce(
            p_destination,
            p_payload->>'subscription',
            CASE WHEN p_payload->>'url' ~ ('^https?://'
                    '((([a-z0-9-]+\.)*[a-z-][a-z0-9-]*)'
                    '|((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}'
                     '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))'
                    '(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}'
                      '|655[0-2][0-9]|6553[0-5]))?([/?#]|$)')
                 THEN regexp_replace(
                        substring(p_payload->>'url' FROM '^https?://[^/?#]*'),
                        '^(https://[^/]*):443$|^(http://[^/]*):80$', '\1\2')
                 ELSE outbox.url_origin(p_payload->>'url')
            END)
        WHEN 'email' THEN 'smtp'
        ELSE p_kind
    END;
$_$;


--
-- Name: destination_succeeded(text, boolean, text, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.destination_succeeded(p_name text, p_probe boolean, p_owner text, p_alert_url text, p_alert_endpoint text) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: disable_failing_subscriptions(interval, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.disable_failing_subscriptions(p_after interval, p_alert_url text, p_alert_endpoint text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_n     integer := 0;
    s       record;
    v_event jsonb;
BEGIN
    FOR s IN
        UPDATE outbox.subscriptions AS u
           SET disabled_at = v_now,
               disabled_reason = format('its deliveries have failed since %s (subscriptions.disable_after): %s',
                                        d.opened_at, coalesce(d.last_error, 'unknown')),
               updated_at = v_now
          FROM outbox.destinations d
         WHERE d.name = u.id AND u.disabled_at IS NULL
           AND d.state IN ('open', 'half_open') AND d.opened_at < v_now - p_after
        RETURNING u.id, u.tenant, u.url, d.opened_at, d.last_error
    LOOP
        v_n := v_n + 1;
        v_event := jsonb_build_object('subscription', s.id, 'tenant', s.tenant,
                                      'failing_since', s.opened_at, 'last_error', s.last_error,
                                      'disabled_at', v_now);
        PERFORM outbox.raise_alert('subscription.disabled', s.id, v_now, v_event, p_alert_url,
                                   p_alert_endpoint);
        PERFORM outbox.enqueue('outbox.subscription.disabled ' || s.id || ' '
                                   || extract(epoch FROM v_now)::text,
                               'event',
                               jsonb_build_object('type', 'outbox.subscription.disabled',
                                                  'tenant', NULL, 'data', v_event),
                               NULL, v_now, NULL, 'outbox-relay', NULL, NULL);
    END LOOP;
    RETURN v_n;
END
$$;


--
-- Name: enqueue(text, text, jsonb, text, timestamp with time zone, text, text, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.enqueue(p_key text, p_kind text, p_payload jsonb, p_destination text DEFAULT NULL::text, p_run_after timestamp with time zone DEFAULT now(), p_ordering_key text DEFAULT NULL::text, p_source text DEFAULT NULL::text, p_traceparent text DEFAULT NULL::text, p_tracestate text DEFAULT NULL::text) RETURNS TABLE(id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    -- bytes of p_payload::text (canonical jsonb text, UTF-8); 1 MiB
    c_payload_limit constant integer := 1048576;
    -- no value at this nesting level (the payload itself is level 0)
    c_depth_limit   constant integer := 64;
    -- characters of p_source (it becomes a metric label value)
    c_source_limit  constant integer := 128;
    v_waiting  boolean := false;
    v_size     integer;
    v_id       bigint;
    v_kind     text;
    v_dest     text;
    v_payload  jsonb;
    v_ledger   outbox.ledger%ROWTYPE;
    v_traceparent text;
    v_tracestate  text;
BEGIN
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.enqueue', current_setting('outbox.require_transaction'));
    END IF;
    IF p_key IS NULL OR length(p_key) = 0 THEN
        RAISE EXCEPTION 'outbox.enqueue: key must not be empty' USING ERRCODE = '22023';
    END IF;
    IF length(p_key) > 512 THEN
        RAISE EXCEPTION 'outbox.enqueue: key is % characters long; the limit is 512', length(p_key)
            USING ERRCODE = '22023';
    END IF;
    IF p_kind IS NULL OR length(p_kind) > 64 OR p_kind !~ '^[a-z][a-z0-9_.-]*$' THEN
        RAISE EXCEPTION 'outbox.enqueue: kind % is not a valid kind name', quote_nullable(p_kind)
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'outbox.enqueue: payload must not be NULL (key %)', p_key
            USING ERRCODE = '22023';
    END IF;
    v_size := octet_length(p_payload::text);
    IF v_size > c_payload_limit THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is % bytes; the limit is % bytes (1 MiB)',
            p_key, v_size, c_payload_limit
            USING ERRCODE = 'OB413',
                  DETAIL = 'the size is that of the payload''s JSON text (payload::text)',
                  HINT = 'store large content elsewhere and put a reference in the payload';
    END IF;
    IF length(p_source) > c_source_limit THEN
        RAISE EXCEPTION 'outbox.enqueue: source is % characters long; the limit is %',
            length(p_source), c_source_limit
            USING ERRCODE = '22023',
                  HINT = 'p_source names the enqueuing client (a service name), not a request';
    END IF;
    IF jsonb_path_exists(p_payload, 'strict $.**{64}') THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % is nested more than % levels deep; the limit is %',
            p_key, c_depth_limit - 1, c_depth_limit - 1
            USING ERRCODE = '22023';
    END IF;
    -- jsonb prints a number with all its digits, never an exponent: one
    -- beyond +/-1e308 takes at least 309 characters of the text.
    IF v_size >= 309 AND jsonb_path_exists(p_payload,
           'strict $.** ? (@.type() == "number" && (@ > 1e308 || @ < -1e308))') THEN
        RAISE EXCEPTION 'outbox.enqueue: payload for key % has a number beyond +/-1e308, which JSON parsers cannot read as a number',
            p_key USING ERRCODE = '22023';
    END IF;

    -- Behind a live intent of the same ordering key, the new one waits
    -- outside the claim index until the one ahead finishes (a trigger
    -- promotes it); see outbox.promote_next_in_order.
    IF p_ordering_key IS NOT NULL THEN
        v_waiting := EXISTS (SELECT 1 FROM outbox.intent_rows e
                              WHERE e.ordering_key = p_ordering_key
                                AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead'));
    END IF;

    -- The trace context: the explicit traceparent when one is given (a
    -- malformed one, '' too, gives none), else the setting's ('' after an
    -- earlier transaction's SET LOCAL: none); the tracestate of the same
    -- origin, only with a valid traceparent. Never an error.
    v_traceparent := coalesce(p_traceparent, current_setting('outbox.traceparent', true));
    IF v_traceparent IS NOT NULL THEN
        v_traceparent := outbox.valid_traceparent(v_traceparent);
        IF v_traceparent IS NOT NULL THEN
            v_tracestate := outbox.valid_tracestate(
                CASE WHEN p_traceparent IS NULL THEN current_setting('outbox.tracestate', true)
                     ELSE p_tracestate END);
        END IF;
    END IF;

    LOOP
        -- The key first. outbox.intent_keys holds every key, live or purged
        -- until the ledger forgets it. Its primary key sees every committed
        -- key whatever the snapshot: under REPEATABLE READ or SERIALIZABLE a
        -- conflict with a key the snapshot cannot see is a serialization
        -- failure (40001), which the application retries.
        INSERT INTO outbox.intent_keys AS k (key, intent_id)
        VALUES (p_key, nextval('outbox.intent_ids'))
        ON CONFLICT (key) DO NOTHING
        RETURNING k.intent_id INTO v_id;

        IF v_id IS NOT NULL THEN
            INSERT INTO outbox.intent_log (id, key, kind, destination, payload, run_after,
                                           ordering_key, source, waiting, traceparent, tracestate)
            VALUES (v_id, p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()),
                    p_ordering_key, p_source, v_waiting, v_traceparent, v_tracestate);
            IF coalesce(p_run_after, now()) <= now() THEN
                PERFORM pg_notify('outbox_intents', '');
            END IF;
            id := v_id; duplicate := false;
            RETURN NEXT;
            RETURN;
        END IF;

        -- The key is taken: by a live intent, by a purged one the ledger
        -- remembers, or by one deleted since, whose key is free again.
        SELECT k.intent_id INTO v_id FROM outbox.intent_keys k WHERE k.key = p_key;
        -- forgotten meanwhile (the ledger's retention): try again
        CONTINUE WHEN NOT FOUND;

        SELECT i.kind, i.destination, i.payload
          INTO v_kind, v_dest, v_payload
          FROM outbox.intent_log i WHERE i.id = v_id AND i.key = p_key;
        IF NOT FOUND THEN
            -- an intent with a row outlives its segment of the log (0042)
            SELECT t.kind, t.destination, t.payload
              INTO v_kind, v_dest, v_payload
              FROM outbox.intent_rows t WHERE t.id = v_id AND t.key = p_key;
        END IF;
        IF FOUND THEN
            IF v_kind <> p_kind OR v_dest IS DISTINCT FROM p_destination OR v_payload <> p_payload THEN
                RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                    USING ERRCODE = 'OB409',
                          DETAIL = format('existing intent %s has kind %s; the new request differs in %s',
                                          v_id, v_kind,
                                          CASE WHEN v_kind <> p_kind THEN 'kind'
                                               WHEN v_dest IS DISTINCT FROM p_destination THEN 'destination'
                                               ELSE 'payload' END),
                          HINT = 'use a new key for a new operation, or resend the original payload';
            END IF;
            INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind) VALUES (v_id, p_source, v_kind);
            id := v_id; duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;

        -- Purged: the ledger answers (its purge removed the log row and
        -- wrote the entry in one transaction, so one of the two is seen).
        SELECT * INTO v_ledger FROM outbox.ledger l WHERE l.key = p_key;
        IF FOUND THEN
            IF v_ledger.kind <> p_kind OR v_ledger.destination IS DISTINCT FROM p_destination
               OR v_ledger.fingerprint <> outbox.fingerprint(p_payload) THEN
                RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                    USING ERRCODE = 'OB409',
                          DETAIL = format('intent %s (purged, kept in the ledger) has kind %s and was %s',
                                          v_ledger.intent_id, v_ledger.kind, v_ledger.state),
                          HINT = 'use a new key for a new operation, or resend the original payload';
            END IF;
            INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind)
            VALUES (v_ledger.intent_id, p_source, v_ledger.kind);
            id := v_ledger.intent_id; duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;

        -- Neither: its intent was deleted and is not remembered, so the
        -- key is free. Taken over on the next pass (by this call or a
        -- racing one).
        DELETE FROM outbox.intent_keys k WHERE k.key = p_key AND k.intent_id = v_id;
    END LOOP;
END
$_$;


--
-- Name: enqueue_many(text[], text[], jsonb[], text[], timestamp with time zone[], text[], text, text[], text[]); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.enqueue_many(p_keys text[], p_kinds text[], p_payloads jsonb[], p_destinations text[] DEFAULT NULL::text[], p_run_afters timestamp with time zone[] DEFAULT NULL::timestamp with time zone[], p_ordering_keys text[] DEFAULT NULL::text[], p_source text DEFAULT NULL::text, p_traceparents text[] DEFAULT NULL::text[], p_tracestates text[] DEFAULT NULL::text[]) RETURNS TABLE(ord integer, id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    n            integer := coalesce(cardinality(p_keys), 0);
    v_seq        regclass := pg_get_serial_sequence('outbox.intents', 'id')::regclass;
    v_bad        record;
    v_ins_ords   integer[] := '{}';
    v_ins_ids    bigint[]  := '{}';
    v_rest_ords  integer[] := '{}';
    v_rest_ids   bigint[]  := '{}';
    v_rest_dups  boolean[] := '{}';
    v_new_ids    bigint[];
    v_new_keys   text[];
    v_new_runs   timestamptz[];
    v_planned    integer := 0;
    v_lost       text[];
    v_row        record;
    v_id         bigint;
    v_dup        boolean;
    -- the setting's trace context, read once for the whole batch
    v_set_tp     text := outbox.valid_traceparent(current_setting('outbox.traceparent', true));
    v_set_ts     text;
    -- each row's trace context, when p_traceparents is given
    v_tps        text[];
    v_tss        text[];
BEGIN
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.enqueue_many', current_setting('outbox.require_transaction'));
    END IF;
    IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR (p_destinations IS NOT NULL AND cardinality(p_destinations) <> n)
       OR (p_run_afters IS NOT NULL AND cardinality(p_run_afters) <> n)
       OR (p_ordering_keys IS NOT NULL AND cardinality(p_ordering_keys) <> n)
       OR (p_traceparents IS NOT NULL AND cardinality(p_traceparents) <> n)
       OR (p_tracestates IS NOT NULL AND cardinality(p_tracestates) <> n) THEN
        RAISE EXCEPTION 'outbox.enqueue_many: the arrays must have the same length (% keys)', n
            USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    -- The first row outbox.enqueue would refuse (its tests, set-based, with
    -- its shortcuts): outbox.enqueue itself raises its error for it, word
    -- for word. (unnest pads a missing optional array with NULLs.)
    SELECT i.* INTO v_bad
      FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters, p_ordering_keys)
           WITH ORDINALITY AS i(key, kind, payload, destination, run_after, ordering_key, ord),
           -- OFFSET 0 keeps the text computed once a row: pulled up, each
           -- use of x.t would print the payload again
           LATERAL (SELECT i.payload::text AS t OFFSET 0) x
     WHERE i.key IS NULL OR length(i.key) = 0 OR length(i.key) > 512
        OR i.kind IS NULL OR length(i.kind) > 64 OR i.kind !~ '^[a-z][a-z0-9_.-]*$'
        OR i.payload IS NULL OR octet_length(x.t) > 1048576
        OR jsonb_path_exists(i.payload, 'strict $.**{64}')
        OR (octet_length(x.t) >= 309
            AND jsonb_path_exists(i.payload,
                   'strict $.** ? (@.type() == "number" && (@ > 1e308 || @ < -1e308))'))
        OR length(p_source) > 128
     ORDER BY i.ord LIMIT 1;
    IF FOUND THEN
        PERFORM * FROM outbox.enqueue(v_bad.key, v_bad.kind, v_bad.payload, v_bad.destination,
                                      coalesce(v_bad.run_after, now()), v_bad.ordering_key, p_source);
        RAISE EXCEPTION 'outbox.enqueue_many: row % was refused', v_bad.ord USING ERRCODE = '22023';
    END IF;

    -- The trace context of each row, by outbox.enqueue's rule: a row's
    -- explicit traceparent (a malformed one gives none) with its explicit
    -- tracestate, else the setting's pair. Without p_traceparents every
    -- row has the setting's pair, and v_tps and v_tss stay NULL.
    IF v_set_tp IS NOT NULL THEN
        v_set_ts := outbox.valid_tracestate(current_setting('outbox.tracestate', true));
    END IF;
    IF p_traceparents IS NOT NULL THEN
        SELECT array_agg(CASE WHEN t.given THEN t.tp ELSE v_set_tp END ORDER BY t.ord),
               array_agg(CASE WHEN NOT t.given THEN v_set_ts
                              WHEN t.tp IS NOT NULL THEN outbox.valid_tracestate(t.ts) END
                         ORDER BY t.ord)
          INTO v_tps, v_tss
          -- OFFSET 0: each row's traceparent validated once
          FROM (SELECT u.ord, u.tp IS NOT NULL AS given, u.ts,
                       outbox.valid_traceparent(u.tp) AS tp
                  FROM unnest(p_traceparents, p_tracestates) WITH ORDINALITY AS u(tp, ts, ord)
                OFFSET 0) t;
    END IF;

    -- The keys of the rows first, in one INSERT in key order (ties in
    -- input order, so a repeated key's first row wins), ids drawn in input
    -- order; ON CONFLICT skips a key already used, live or purged (those
    -- rows are answered below). Then the rows whose key went in.
    IF p_ordering_keys IS NULL THEN
        WITH f AS MATERIALIZED (
                 SELECT u.*, nextval(v_seq) AS id
                   FROM (SELECT * FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                              p_run_afters, v_tps, v_tss)
                                WITH ORDINALITY AS u(key, kind, payload, destination,
                                                     run_after, traceparent, tracestate, ord)
                          ORDER BY ord OFFSET 0) u),
             keyed AS (
                 INSERT INTO outbox.intent_keys AS k (key, intent_id)
                 SELECT f.key, f.id FROM f ORDER BY f.key, f.ord
                 ON CONFLICT (key) DO NOTHING
                 RETURNING k.intent_id),
             ins AS (
                 INSERT INTO outbox.intent_log AS t (id, key, kind, destination, payload, run_after,
                                                  source, traceparent, tracestate)
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), p_source,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
                   FROM f
                  WHERE f.id IN (SELECT k.intent_id FROM keyed k)
                 RETURNING t.id, t.key, t.run_after)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after)
          INTO v_new_ids, v_new_keys, v_new_runs FROM ins;
    ELSE
        -- Only the rows that will be new are inserted (a key's first row,
        -- the key unused, live or purged, as this statement sees them), so
        -- that a row waits behind an earlier row of its ordering
        -- key only when that row is a new intent, as one enqueue after the
        -- other would have it.
        WITH cand AS (
                 -- ids drawn in input order (OFFSET 0: the rows reach
                 -- nextval in the order of the subquery)
                 SELECT c.*, nextval(v_seq) AS id,
                        c.ordering_key IS NOT NULL AND (c.okey_rank > 1 OR EXISTS (
                            SELECT 1 FROM outbox.intent_rows e
                             WHERE e.ordering_key = c.ordering_key
                               AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')))
                            AS waiting
                   FROM (SELECT u.*, row_number() OVER (PARTITION BY u.ordering_key
                                                        ORDER BY u.ord) AS okey_rank
                           FROM (SELECT u.*, row_number() OVER (PARTITION BY u.key
                                                               ORDER BY u.ord) AS nth
                                   FROM unnest(p_keys, p_kinds, p_payloads, p_destinations,
                                               p_run_afters, p_ordering_keys, v_tps, v_tss)
                                        WITH ORDINALITY AS u(key, kind, payload, destination,
                                                             run_after, ordering_key, traceparent,
                                                             tracestate, ord)) u
                          WHERE u.nth = 1
                            AND NOT EXISTS (SELECT 1 FROM outbox.intent_keys k WHERE k.key = u.key)
                          ORDER BY u.ord OFFSET 0) c),
             keyed AS (
                 INSERT INTO outbox.intent_keys AS k (key, intent_id)
                 SELECT c.key, c.id FROM cand c ORDER BY c.key
                 ON CONFLICT (key) DO NOTHING
                 RETURNING k.intent_id),
             ins AS (
                 INSERT INTO outbox.intent_log AS t (id, key, kind, destination, payload, run_after,
                                                  ordering_key, source, waiting, traceparent,
                                                  tracestate)
                 SELECT f.id, f.key, f.kind, f.destination, f.payload,
                        coalesce(f.run_after, now()), f.ordering_key, p_source, f.waiting,
                        CASE WHEN v_tps IS NULL THEN v_set_tp ELSE f.traceparent END,
                        CASE WHEN v_tps IS NULL THEN v_set_ts ELSE f.tracestate END
                   FROM cand f
                  WHERE f.id IN (SELECT k.intent_id FROM keyed k)
                 RETURNING t.id, t.key, t.run_after)
        SELECT array_agg(ins.id), array_agg(ins.key), array_agg(ins.run_after),
               (SELECT count(*) FROM cand)
          INTO v_new_ids, v_new_keys, v_new_runs, v_planned FROM ins;
    END IF;

    -- Each new row's position is its key's first one in the input.
    SELECT coalesce(array_agg(k.ord ORDER BY k.ord), '{}'),
           coalesce(array_agg(k.id ORDER BY k.ord), '{}'),
           coalesce(bool_or(k.run_after <= now()), false)
      INTO v_ins_ords, v_ins_ids, v_dup
      FROM (SELECT r.id, r.run_after, min(f.ord)::int AS ord
              FROM unnest(v_new_ids, v_new_keys, v_new_runs)
                   AS r(id, key, run_after)
              JOIN unnest(p_keys) WITH ORDINALITY AS f(key, ord) ON f.key = r.key
             GROUP BY r.id, r.key, r.run_after) k;

    -- A row planned as new that is not (a transaction inserted its key
    -- after this statement's snapshot): the rows of
    -- its ordering key that are new get the flag enqueue would give them
    -- now, behind a live intent of the key that is not one of this batch's
    -- new rows, or behind an earlier new row of the batch.
    IF p_ordering_keys IS NOT NULL AND cardinality(v_ins_ids) < v_planned THEN
        SELECT array_agg(DISTINCT u.ordering_key) INTO v_lost
          FROM unnest(p_keys, p_ordering_keys) WITH ORDINALITY AS u(key, ordering_key, ord)
         WHERE u.ordering_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM unnest(v_ins_ords) AS d(ord) WHERE d.ord = u.ord);
        UPDATE outbox.intent_rows t SET waiting = x.waiting
          FROM (SELECT r.id, EXISTS (
                           SELECT 1 FROM outbox.intent_rows e
                            WHERE e.ordering_key = r.ordering_key AND e.id <> r.id
                              AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                              AND (e.id < r.id OR e.id <> ALL(v_ins_ids))) AS waiting
                  FROM outbox.intent_rows r
                 WHERE r.id = ANY(v_ins_ids) AND r.ordering_key = ANY(v_lost)) x
         WHERE t.id = x.id AND t.waiting <> x.waiting;
    END IF;

    IF v_dup THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    IF cardinality(v_ins_ords) = n THEN
        RETURN QUERY SELECT a.ord, a.id, false FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id);
        RETURN;
    END IF;

    -- Everything else, in input order, by outbox.enqueue itself (an
    -- anti-join, not `ord <> ALL(...)`: that would be quadratic), each row
    -- with its own explicit trace context (outbox.enqueue applies the same
    -- rule, the setting's pair when the row has no traceparent).
    FOR v_row IN
        SELECT i.* FROM unnest(p_keys, p_kinds, p_payloads, p_destinations, p_run_afters,
                               p_ordering_keys, p_traceparents, p_tracestates)
                        WITH ORDINALITY AS i(key, kind, payload, destination, run_after,
                                             ordering_key, traceparent, tracestate, ord)
          LEFT JOIN unnest(v_ins_ords) AS done(ord) ON done.ord = i.ord
         WHERE done.ord IS NULL
         ORDER BY i.ord
    LOOP
        SELECT e.id, e.duplicate INTO v_id, v_dup
          FROM outbox.enqueue(v_row.key, v_row.kind, v_row.payload, v_row.destination,
                              coalesce(v_row.run_after, now()), v_row.ordering_key, p_source,
                              v_row.traceparent, v_row.tracestate) e;
        v_rest_ords := v_rest_ords || v_row.ord::int;
        v_rest_ids := v_rest_ids || v_id;
        v_rest_dups := v_rest_dups || v_dup;
    END LOOP;

    RETURN QUERY
        SELECT x.ord, x.id, x.dup FROM (
            SELECT a.ord, a.id, false AS dup FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id)
            UNION ALL
            SELECT b.ord, b.id, b.dup
              FROM unnest(v_rest_ords, v_rest_ids, v_rest_dups) AS b(ord, id, dup)
        ) x ORDER BY x.ord;
END
$_$;


--
-- Name: error_class(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.error_class(p_error text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE
        WHEN p_error IS NULL THEN 'no error recorded'
        WHEN p_error ~ 'HTTP [0-9]{3}' THEN substring(p_error FROM 'HTTP [0-9]{3}')
        ELSE coalesce(nullif(btrim(left(regexp_replace(regexp_replace(p_error, '^[A-Z]+ [^ ]+:? ', ''),
                                                       '[0-9]+', 'N', 'g'), 60)), ''), 'no error text')
    END
$$;


--
-- Name: event_type_matches(text[], text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.event_type_matches(p_patterns text[], p_type text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT cardinality(p_patterns) = 0
        OR EXISTS (SELECT 1 FROM unnest(p_patterns) AS p(pattern)
                    WHERE p.pattern = p_type
                       OR (right(p.pattern, 2) = '.*'
                           AND starts_with(p_type, left(p.pattern, -1))))
$$;


--
-- Name: expand_event(bigint, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.expand_event(p_event bigint, p_subscription text DEFAULT NULL::text) RETURNS TABLE(matched integer, created integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_event   outbox.intent_log;
    v_matched integer;
    v_created integer;
BEGIN
    SELECT * INTO v_event FROM outbox.intent_log l WHERE l.id = p_event AND l.kind = 'event';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox.expand_event: no event has id %', p_event USING ERRCODE = 'P0002';
    END IF;
    WITH subs AS (
             SELECT s.id, outbox.derive_key(v_event.key, 'subscription ' || s.id) AS key
               FROM outbox.subscriptions s
              WHERE s.disabled_at IS NULL
                AND (p_subscription IS NULL OR s.id = p_subscription)
                AND s.tenant IS NOT DISTINCT FROM (v_event.payload->>'tenant')
                AND outbox.event_type_matches(s.event_types, v_event.payload->>'type')),
         fresh AS (
             SELECT s.id, s.key, nextval('outbox.intent_ids') AS intent_id FROM subs s
              WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                 WHERE d.event_id = p_event AND d.subscription_id = s.id)),
         -- a delivery's key not used yet, live or purged
         keyed AS (
             INSERT INTO outbox.intent_keys AS k (key, intent_id)
             SELECT f.key, f.intent_id FROM fresh f ORDER BY f.key
             ON CONFLICT (key) DO NOTHING
             RETURNING k.intent_id),
         -- each delivery names its subscription: the link is made from
         -- what the insert returns, without joining back to `fresh`
         logged AS (
             INSERT INTO outbox.intent_log (id, key, kind, payload, source, traceparent, tracestate)
             SELECT f.intent_id, f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.id,
                        'body', jsonb_build_object(
                            'type', v_event.payload->>'type',
                            'timestamp', to_char(v_event.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', v_event.payload->'data')),
                    'event ' || p_event, v_event.traceparent, v_event.tracestate
               FROM fresh f
              WHERE f.intent_id IN (SELECT k.intent_id FROM keyed k)
             RETURNING intent_log.id, intent_log.payload->>'subscription' AS subscription_id),
         linked AS (
             INSERT INTO outbox.event_deliveries (event_id, subscription_id, intent_id)
             SELECT p_event, g.subscription_id, g.id FROM logged g
             ON CONFLICT ON CONSTRAINT event_deliveries_pkey DO NOTHING
             RETURNING 1)
    SELECT (SELECT count(*) FROM subs)::integer, (SELECT count(*) FROM linked)::integer
      INTO v_matched, v_created;
    -- the relays wake for the deliveries, as for an enqueue
    IF v_created > 0 THEN
        PERFORM pg_notify('outbox_intents', '');
    END IF;
    matched := v_matched;
    created := v_created;
    RETURN NEXT;
END
$$;


--
-- Name: expand_events(bigint[]); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.expand_events(p_events bigint[]) RETURNS TABLE(event_id bigint, is_event boolean, matched integer, created integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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
         -- ids drawn in event and subscription order (OFFSET 0: the rows
         -- reach nextval in the order of the subquery)
         fresh AS (
             SELECT p.*, nextval('outbox.intent_ids') AS intent_id
               FROM (SELECT p.* FROM pairs p
                      WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                         WHERE d.event_id = p.event_id
                                           AND d.subscription_id = p.subscription_id)
                      ORDER BY p.event_id, p.subscription_id OFFSET 0) p),
         -- a delivery's key not used yet, live or purged
         keyed AS (
             INSERT INTO outbox.intent_keys AS k (key, intent_id)
             SELECT f.key, f.intent_id FROM fresh f ORDER BY f.key
             ON CONFLICT (key) DO NOTHING
             RETURNING k.intent_id),
         logged AS (
             INSERT INTO outbox.intent_log (id, key, kind, payload, source, traceparent, tracestate)
             SELECT f.intent_id, f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.subscription_id,
                        'body', jsonb_build_object(
                            'type', e.payload->>'type',
                            'timestamp', to_char(e.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', e.payload->'data')),
                    'event ' || e.id, e.traceparent, e.tracestate
               FROM fresh f JOIN ev e ON e.id = f.event_id
              WHERE f.intent_id IN (SELECT k.intent_id FROM keyed k)
              ORDER BY f.intent_id
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


--
-- Name: expire_probes(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.expire_probes() RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
    n     integer;
BEGIN
    WITH expired AS (
        UPDATE outbox.destinations x
           SET state = 'open', next_probe_at = old.probe_until,
               probe_owner = NULL, probe_until = NULL, updated_at = v_now
          FROM (SELECT name, probe_owner, probe_until FROM outbox.destinations
                 WHERE state = 'half_open' AND probe_until < v_now
                   FOR UPDATE) old
         WHERE x.name = old.name AND x.state = 'half_open' AND x.probe_until < v_now
        RETURNING x.name, old.probe_owner)
    INSERT INTO outbox.destination_events (destination, event, detail)
    SELECT name, 'probe_expired', jsonb_build_object('owner', probe_owner) FROM expired;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


--
-- Name: fingerprint(jsonb); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.fingerprint(p_payload jsonb) RETURNS bytea
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT sha256(convert_to(p_payload::text, 'UTF8')) $$;


--
-- Name: fold_tallies(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.fold_tallies() RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    SET enable_sort TO 'off'
    AS $_$
DECLARE
    v_last pg_snapshot;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 2) THEN
        RETURN false;
    END IF;
    IF NOT (SELECT valid FROM outbox.tally_mark) THEN
        -- counting everything is a pass over the tables
        PERFORM set_config('enable_seqscan', 'on', true);
        DELETE FROM outbox.tallies;
        -- one statement, one snapshot: what it counts, the deltas it drops
        -- and the snapshot it keeps agree
        WITH dropped AS (DELETE FROM outbox.tally_deltas),
             counted AS (
                 SELECT kind, destination, outbox.tally_subscription(kind, destination, payload)
                            AS subscription,
                        outbox.tally_url(kind, destination, payload) AS url, state, count(*) AS n
                   FROM outbox.intent_rows
                  WHERE state IN ('pending', 'claimed', 'ambiguous', 'dead')
                  GROUP BY 1, 2, 3, 4, 5
                 UNION ALL
                 SELECT l.kind, l.destination,
                        outbox.tally_subscription(l.kind, l.destination, l.payload),
                        outbox.tally_url(l.kind, l.destination, l.payload), 'log', count(*)
                   FROM outbox.intent_log l
                  WHERE outbox.log_untracked(l.ordering_key, l.waiting, l.run_after, l.created_at)
                    AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
                    AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = l.id)
                    AND NOT EXISTS (SELECT 1 FROM outbox.log_batches x WHERE x.ids @> ARRAY[l.id])
                  GROUP BY 1, 2, 3, 4),
             ins AS (INSERT INTO outbox.tallies (kind, destination, subscription, url, state, n)
                     SELECT * FROM counted)
        UPDATE outbox.tally_mark SET snapshot = pg_current_snapshot(), valid = true;
        RETURN true;
    END IF;
    SELECT m.snapshot INTO v_last FROM outbox.tally_mark m;
    -- planned with the last snapshot's values, not as a generic plan
    EXECUTE $q$
    WITH d AS (DELETE FROM outbox.tally_deltas RETURNING *),
         -- what this snapshot sees and the last did not: the transactions
         -- from its xmax on, and those it saw running
         arrived AS (
             SELECT l.kind, l.destination, l.payload, l.ordering_key, l.waiting, l.run_after,
                    l.created_at
               FROM outbox.intent_log l
              WHERE l.xid >= pg_snapshot_xmax($1)
             UNION ALL
             SELECT l.kind, l.destination, l.payload, l.ordering_key, l.waiting, l.run_after,
                    l.created_at
               FROM pg_snapshot_xip($1) AS r(xid)
              CROSS JOIN LATERAL (SELECT * FROM outbox.intent_log y
                                   WHERE y.xid = r.xid OFFSET 0) l),
         changes AS (
             SELECT u.kind, u.destination, u.subscription, u.url, u.state, u.n
               FROM d CROSS JOIN LATERAL unnest(d.kinds, d.destinations, d.subscriptions, d.urls,
                                                d.states, d.ns)
                                      AS u(kind, destination, subscription, url, state, n)
             UNION ALL
             SELECT a.kind, a.destination,
                    outbox.tally_subscription(a.kind, a.destination, a.payload),
                    outbox.tally_url(a.kind, a.destination, a.payload), 'log', 1
               FROM arrived a
              WHERE outbox.log_untracked(a.ordering_key, a.waiting, a.run_after, a.created_at)),
         sums AS (SELECT kind, destination, subscription, url, state, sum(n)::bigint AS n
                    FROM changes GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0),
         ins AS (INSERT INTO outbox.tallies AS t (kind, destination, subscription, url, state, n)
                 SELECT * FROM sums
                 ON CONFLICT ON CONSTRAINT tallies_group DO UPDATE SET n = t.n + excluded.n)
    UPDATE outbox.tally_mark SET snapshot = pg_current_snapshot()
    $q$ USING v_last;
    DELETE FROM outbox.tallies WHERE n = 0;
    RETURN true;
END
$_$;


--
-- Name: forget_stale_failures(interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.forget_stale_failures(p_after interval) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_cut     timestamptz := clock_timestamp() - p_after;
    v_expired integer;
    v_deleted integer;
    v_cleared integer;
BEGIN
    v_expired := outbox.expire_probes();
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
    RETURN v_expired + v_deleted + v_cleared;
END
$$;


--
-- Name: intents_write(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.intents_write() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        -- the key, unless it is taken (a unique violation, as for the log's
        -- own key before); a key whose intent is gone and not remembered
        -- is free
        DELETE FROM outbox.intent_keys k
         WHERE k.key = NEW.key
           AND NOT EXISTS (SELECT 1 FROM outbox.intent_log l WHERE l.id = k.intent_id)
           AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = k.intent_id)
           AND NOT EXISTS (SELECT 1 FROM outbox.ledger g WHERE g.key = k.key);
        INSERT INTO outbox.intent_keys (key, intent_id) VALUES (NEW.key, NEW.id);
        INSERT INTO outbox.intent_log (id, key, kind, destination, payload, run_after,
                                       ordering_key, waiting, source, traceparent, tracestate,
                                       created_at)
        VALUES (NEW.id, NEW.key, NEW.kind, NEW.destination, NEW.payload, NEW.run_after,
                NEW.ordering_key, NEW.waiting, NEW.source, NEW.traceparent, NEW.tracestate,
                NEW.created_at);
        -- the log's trigger gave some intents their row already
        DELETE FROM outbox.intent_rows t WHERE t.id = NEW.id;
        INSERT INTO outbox.intent_rows SELECT NEW.*;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        DELETE FROM outbox.intent_log l WHERE l.id = OLD.id;
        IF NOT FOUND THEN
            -- an intent that outlived its segment of the log (0042): its
            -- row, and what the log's triggers would have taken with it
            DELETE FROM outbox.intent_rows t WHERE t.id = OLD.id;
            DELETE FROM outbox.attempts a WHERE a.intent_id = OLD.id;
            DELETE FROM outbox.operator_actions a WHERE a.intent_id = OLD.id;
            DELETE FROM outbox.event_deliveries d WHERE d.intent_id = OLD.id;
            DELETE FROM outbox.event_deliveries d WHERE d.event_id = OLD.id;
        END IF;
        DELETE FROM outbox.intent_keys k WHERE k.key = OLD.key AND k.intent_id = OLD.id;
        RETURN OLD;
    END IF;
    PERFORM outbox.track(ARRAY[OLD.id]);
    -- the row as OLD saw it, or nothing: a row that moved on meanwhile (a
    -- claim took the log intent, a completion settled the row) is left to
    -- what moved it, as an UPDATE of a table re-checks its row
    PERFORM 1 FROM outbox.intent_rows t
      WHERE t.id = OLD.id AND t.state = OLD.state AND t.fence = OLD.fence
      FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF (NEW.key, NEW.kind, NEW.destination, NEW.payload)
       IS DISTINCT FROM (OLD.key, OLD.kind, OLD.destination, OLD.payload) THEN
        UPDATE outbox.intent_log l
           SET key = NEW.key, kind = NEW.kind, destination = NEW.destination, payload = NEW.payload
         WHERE l.id = OLD.id;
        UPDATE outbox.intent_keys k SET key = NEW.key
         WHERE k.key = OLD.key AND k.intent_id = OLD.id AND NEW.key <> OLD.key;
    END IF;
    UPDATE outbox.intent_rows t
       SET (key, kind, destination, payload, state, attempts, attempts_base, run_after,
            ordering_key, provider_ref, last_error, response, owner, lease_expires_at, fence,
            key_generation, duplicates, source, created_at, updated_at, delivered_at, waiting,
            recover_owner, recover_at, traceparent, tracestate, first_attempt_started_at,
            first_attempt_finished_at, first_attempt_owner, first_attempt_status,
            first_attempt_replayed)
         = (NEW.key, NEW.kind, NEW.destination, NEW.payload, NEW.state, NEW.attempts,
            NEW.attempts_base, NEW.run_after, NEW.ordering_key, NEW.provider_ref, NEW.last_error,
            NEW.response, NEW.owner, NEW.lease_expires_at, NEW.fence, NEW.key_generation,
            NEW.duplicates, NEW.source, NEW.created_at, NEW.updated_at, NEW.delivered_at,
            NEW.waiting, NEW.recover_owner, NEW.recover_at, NEW.traceparent, NEW.tracestate,
            NEW.first_attempt_started_at, NEW.first_attempt_finished_at,
            NEW.first_attempt_owner, NEW.first_attempt_status, NEW.first_attempt_replayed)
     WHERE t.id = OLD.id;
    RETURN NEW;
END
$$;


--
-- Name: log_batch_max_id(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_batch_max_id() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    NEW.max_id := (SELECT max(x) FROM unnest(NEW.ids) AS x);
    RETURN NEW;
END
$$;


--
-- Name: log_dependents_follow(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_dependents_follow() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM outbox.attempts a USING gone g WHERE a.intent_id = g.id;
    DELETE FROM outbox.event_deliveries d USING gone g WHERE d.event_id = g.id;
    DELETE FROM outbox.event_deliveries d USING gone g WHERE d.intent_id = g.id;
    DELETE FROM outbox.operator_actions a USING gone g WHERE a.intent_id = g.id;
    RETURN NULL;
END
$$;


--
-- Name: log_outcomes_follow(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_outcomes_follow() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $_$
BEGIN
    -- the fold counts arrivals under this lock, exclusively
    PERFORM pg_advisory_xact_lock_shared(20291, 2);
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- this snapshot may predate a fold that counted these intents
        UPDATE outbox.tally_mark SET valid = false WHERE valid;
        EXECUTE 'DELETE FROM outbox.intent_rows t USING gone WHERE t.id = gone.id';
    ELSE
        EXECUTE $q$
        WITH rows_gone AS (
                 DELETE FROM outbox.intent_rows t USING gone WHERE t.id = gone.id RETURNING t.id)
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT kind, destination, subscription, url, sum(left_log - counted) AS n
                  FROM (SELECT g.kind, g.destination,
                               outbox.tally_subscription(g.kind, g.destination, g.payload)
                                   AS subscription,
                               outbox.tally_url(g.kind, g.destination, g.payload) AS url,
                               (EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                         WHERE o.intent_id = g.id)
                                OR EXISTS (SELECT 1 FROM outbox.log_batches b
                                            WHERE b.ids @> ARRAY[g.id])
                                OR g.id IN (SELECT r.id FROM rows_gone r))::int AS left_log,
                               pg_visible_in_snapshot(g.xid, m.snapshot)::int AS counted
                          FROM gone g, outbox.tally_mark m
                         WHERE outbox.log_untracked(g.ordering_key, g.waiting, g.run_after,
                                                    g.created_at)) x
                 GROUP BY 1, 2, 3, 4 HAVING sum(left_log - counted) <> 0) s
        HAVING count(*) > 0
        $q$;
    END IF;
    DELETE FROM outbox.log_outcomes o USING gone WHERE o.intent_id = gone.id;
    RETURN NULL;
END
$_$;


--
-- Name: log_segment_closed(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_segment_closed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'intent % took its id in a segment of the log that is closed since', NEW.id
        USING ERRCODE = '40001',
              HINT = 'retry the transaction: the retry enqueues into an open segment';
END
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: log_segments; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_segments (
    segment integer NOT NULL,
    first_id bigint NOT NULL,
    end_id bigint NOT NULL,
    state text NOT NULL,
    opened_at timestamp with time zone,
    closed_at timestamp with time zone,
    copied_to bigint,
    copied_xid xid8,
    retired_at timestamp with time zone,
    CONSTRAINT log_segments_check CHECK ((first_id < end_id)),
    CONSTRAINT log_segments_state_check CHECK ((state = ANY (ARRAY['ahead'::text, 'open'::text, 'closed'::text, 'retiring'::text, 'retired'::text])))
);


--
-- Name: TABLE log_segments; Type: COMMENT; Schema: outbox; Owner: -
--

COMMENT ON TABLE outbox.log_segments IS 'The segments of outbox.intent_log and outbox.log_outcomes (outbox.intent_log_N, outbox.log_outcomes_N): the ids each covers and where it stands';


--
-- Name: log_segment_done(outbox.log_segments); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_segment_done(p_seg outbox.log_segments) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    v_done boolean;
BEGIN
    EXECUTE format(
        'SELECT NOT EXISTS (SELECT 1 FROM outbox.%I l
                             WHERE (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                                     ORDER BY c.seq DESC LIMIT 1)
                               AND NOT EXISTS (SELECT 1 FROM outbox.%I o WHERE o.intent_id = l.id)
                               AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t
                                                WHERE t.id = l.id))
            AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                             WHERE b.max_id >= $1
                               AND EXISTS (SELECT 1 FROM unnest(b.ids) i
                                            WHERE i >= $1 AND i < $2))',
        'intent_log_' || p_seg.segment, 'log_outcomes_' || p_seg.segment)
      INTO v_done USING p_seg.first_id, p_seg.end_id;
    RETURN v_done;
END
$_$;


--
-- Name: log_track(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_track() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO outbox.intent_rows (id, key, kind, destination, payload, run_after, ordering_key,
                                    waiting, source, traceparent, tracestate, created_at,
                                    updated_at)
    VALUES (NEW.id, NEW.key, NEW.kind, NEW.destination, NEW.payload, NEW.run_after,
            NEW.ordering_key, NEW.waiting, NEW.source, NEW.traceparent, NEW.tracestate,
            NEW.created_at, NEW.created_at);
    RETURN NULL;
END
$$;


--
-- Name: log_untracked(text, boolean, timestamp with time zone, timestamp with time zone); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.log_untracked(p_ordering_key text, p_waiting boolean, p_run_after timestamp with time zone, p_created_at timestamp with time zone) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT p_ordering_key IS NULL AND NOT p_waiting AND p_run_after <= p_created_at $$;


--
-- Name: move_first_attempt(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.move_first_attempt() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    INSERT INTO outbox.attempts (intent_id, attempt, fence, owner, started_at, finished_at,
                                 outcome, status, provider_ref, replayed, accepted, key_generation)
    VALUES (OLD.id, 1, OLD.fence, OLD.first_attempt_owner, OLD.first_attempt_started_at,
            OLD.first_attempt_finished_at, 'delivered', OLD.first_attempt_status,
            OLD.provider_ref, OLD.first_attempt_replayed, true, OLD.key_generation)
    ON CONFLICT (intent_id, fence) DO NOTHING;
    NEW.first_attempt_started_at := NULL;
    NEW.first_attempt_finished_at := NULL;
    NEW.first_attempt_owner := NULL;
    NEW.first_attempt_status := NULL;
    NEW.first_attempt_replayed := NULL;
    RETURN NEW;
END
$$;


--
-- Name: note_ordering_recheck(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.note_ordering_recheck() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO outbox.ordering_rechecks (ordering_key) VALUES (OLD.ordering_key);
    ELSE
        INSERT INTO outbox.ordering_rechecks (ordering_key) VALUES (NEW.ordering_key);
    END IF;
    RETURN NULL;
END
$$;


--
-- Name: ordering_turn(text, bigint); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.ordering_turn(p_ordering_key text, p_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- 20290 = 0x4f42 ("OB"): our class of advisory locks
    IF NOT pg_catalog.pg_try_advisory_xact_lock(20290, pg_catalog.hashtext(p_ordering_key)) THEN
        RETURN false;
    END IF;
    -- the state list repeats intents_ordering's predicate, so that index
    -- serves the probe
    RETURN NOT EXISTS (
        SELECT 1 FROM outbox.intent_rows e
         WHERE e.ordering_key = p_ordering_key
           AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
           AND e.id <> p_id
           AND (e.state = 'claimed' OR e.id < p_id));
END
$$;


--
-- Name: outbox_insert(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.outbox_insert() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    PERFORM * FROM outbox.enqueue(NEW.key, NEW.kind, NEW.payload, NEW.destination,
                                  coalesce(NEW.run_after, now()), NEW.ordering_key, NEW.source,
                                  NEW.traceparent, NEW.tracestate);
    RETURN NEW;
END
$$;


--
-- Name: pause_destination(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.pause_destination(p_name text, p_reason text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: promote_next_in_order(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.promote_next_in_order() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_id bigint;
BEGIN
    IF OLD.waiting THEN
        UPDATE outbox.intent_rows SET waiting = false WHERE id = NEW.id AND waiting;
        RETURN NULL;
    END IF;
    LOOP
        SELECT w.id INTO v_id FROM outbox.intent_rows w
         WHERE w.ordering_key = OLD.ordering_key AND w.waiting AND w.state = 'pending'
         ORDER BY w.ordering_key, w.id LIMIT 1;
        EXIT WHEN NOT FOUND;
        UPDATE outbox.intent_rows SET waiting = false
         WHERE id = v_id AND waiting AND state = 'pending';
        EXIT WHEN FOUND;
        -- promoted by another finishing intent of the key: done
        PERFORM 1 FROM outbox.intent_rows WHERE id = v_id AND state = 'pending';
        EXIT WHEN FOUND;
    END LOOP;
    RETURN NULL;
END
$$;


--
-- Name: prune_destinations(interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.prune_destinations(p_keep interval) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    DELETE FROM outbox.destination_events WHERE at < now() - p_keep AND (event <> 'paused' OR alerted);
    DELETE FROM outbox.destinations
     WHERE state = 'closed' AND failures = 0 AND updated_at < now() - p_keep;
$$;


--
-- Name: publish(text, text, jsonb, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.publish(p_key text, p_event_type text, p_payload jsonb, p_tenant text DEFAULT NULL::text, p_traceparent text DEFAULT NULL::text) RETURNS TABLE(id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF NOT outbox.valid_event_type(p_event_type) THEN
        RAISE EXCEPTION 'outbox.publish: event type % is not a dotted name (letters, digits, _ and -, at most 200 characters)',
            quote_nullable(p_event_type) USING ERRCODE = '22023';
    END IF;
    IF p_tenant IS NOT NULL AND (length(p_tenant) = 0 OR length(p_tenant) > 200) THEN
        RAISE EXCEPTION 'outbox.publish: tenant must be 1 to 200 characters, or NULL for none'
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'outbox.publish: payload must not be NULL (key %)', p_key
            USING ERRCODE = '22023';
    END IF;
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.publish', current_setting('outbox.require_transaction'));
    END IF;
    RETURN QUERY
    SELECT e.id, e.duplicate
      FROM outbox.enqueue(p_key, 'event',
                          jsonb_build_object('type', p_event_type, 'tenant', p_tenant,
                                             'data', p_payload),
                          NULL, now(), NULL, NULL, p_traceparent, NULL) e;
END
$$;


--
-- Name: publish_many(text[], text[], jsonb[], text[], text[]); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.publish_many(p_keys text[], p_event_types text[], p_payloads jsonb[], p_tenants text[] DEFAULT NULL::text[], p_traceparents text[] DEFAULT NULL::text[]) RETURNS TABLE(ord integer, id bigint, duplicate boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_n   integer := coalesce(cardinality(p_keys), 0);
    v_bad integer;
BEGIN
    IF coalesce(cardinality(p_event_types), 0) <> v_n OR coalesce(cardinality(p_payloads), 0) <> v_n
       OR (p_tenants IS NOT NULL AND cardinality(p_tenants) <> v_n)
       OR (p_traceparents IS NOT NULL AND cardinality(p_traceparents) <> v_n) THEN
        RAISE EXCEPTION 'outbox.publish_many: the arrays must have one element per event (% keys)', v_n
            USING ERRCODE = '22023';
    END IF;
    SELECT min(t.i) INTO v_bad
      FROM generate_subscripts(p_event_types, 1) AS t(i)
     WHERE NOT outbox.valid_event_type(p_event_types[t.i])
        OR (p_tenants IS NOT NULL AND p_tenants[t.i] IS NOT NULL
            AND (length(p_tenants[t.i]) = 0 OR length(p_tenants[t.i]) > 200))
        OR p_payloads[t.i] IS NULL;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.publish_many: event % (key %) has an event type that is not a dotted name, a tenant of 0 or over 200 characters, or a NULL payload',
            v_bad, quote_nullable(p_keys[v_bad]) USING ERRCODE = '22023';
    END IF;
    IF coalesce(current_setting('outbox.require_transaction', true), '') NOT IN ('', 'off') THEN
        PERFORM outbox.require_transaction('outbox.publish_many', current_setting('outbox.require_transaction'));
    END IF;
    RETURN QUERY
    SELECT e.ord, e.id, e.duplicate
      FROM outbox.enqueue_many(
               p_keys,
               array_fill('event'::text, ARRAY[v_n]),
               ARRAY(SELECT jsonb_build_object('type', p_event_types[t.i],
                                               'tenant', p_tenants[t.i],
                                               'data', p_payloads[t.i])
                       FROM generate_subscripts(p_keys, 1) AS t(i) ORDER BY t.i),
               NULL, NULL, NULL, NULL, p_traceparents, NULL) e;
END
$$;


--
-- Name: punycode(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.punycode(p_label text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_cps   integer[];
    v_out   text := '';
    v_n     integer := 128;
    v_delta bigint := 0;
    v_bias  integer := 72;
    v_h     integer;
    v_b     integer;
    v_m     integer;
    v_q     bigint;
    v_k     integer;
    v_t     integer;
    v_d     bigint;
    c       integer;
BEGIN
    SELECT array_agg(ascii(ch) ORDER BY ord) INTO v_cps
      FROM unnest(regexp_split_to_array(p_label, '')) WITH ORDINALITY AS x(ch, ord);
    FOREACH c IN ARRAY v_cps LOOP
        IF c < 128 THEN
            v_out := v_out || chr(c);
        END IF;
    END LOOP;
    v_b := length(v_out);
    v_h := v_b;
    IF v_b > 0 THEN
        v_out := v_out || '-';
    END IF;
    WHILE v_h < cardinality(v_cps) LOOP
        SELECT min(x) INTO v_m FROM unnest(v_cps) x WHERE x >= v_n;
        v_delta := v_delta + (v_m - v_n)::bigint * (v_h + 1);
        v_n := v_m;
        FOREACH c IN ARRAY v_cps LOOP
            IF c < v_n THEN
                v_delta := v_delta + 1;
            END IF;
            IF c = v_n THEN
                v_q := v_delta;
                v_k := 36;
                LOOP
                    v_t := CASE WHEN v_k <= v_bias THEN 1
                                WHEN v_k >= v_bias + 26 THEN 26
                                ELSE v_k - v_bias END;
                    EXIT WHEN v_q < v_t;
                    v_d := v_t + (v_q - v_t) % (36 - v_t);
                    v_out := v_out || substr('abcdefghijklmnopqrstuvwxyz0123456789', v_d::integer + 1, 1);
                    v_q := (v_q - v_t) / (36 - v_t);
                    v_k := v_k + 36;
                END LOOP;
                v_out := v_out || substr('abcdefghijklmnopqrstuvwxyz0123456789', v_q::integer + 1, 1);
                -- adapt the bias
                v_d := CASE WHEN v_h = v_b THEN v_delta / 700 ELSE v_delta / 2 END;
                v_d := v_d + v_d / (v_h + 1);
                v_k := 0;
                WHILE v_d > 455 LOOP
                    v_d := v_d / 35;
                    v_k := v_k + 36;
                END LOOP;
                v_bias := v_k + (36 * v_d) / (v_d + 38);
                v_delta := 0;
                v_h := v_h + 1;
            END IF;
        END LOOP;
        v_delta := v_delta + 1;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_out;
END
$$;


--
-- Name: raise_alert(text, text, timestamp with time zone, jsonb, text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.raise_alert(p_event text, p_subject text, p_at timestamp with time zone, p_detail jsonb, p_url text, p_endpoint text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: raise_alert_summaries(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.raise_alert_summaries(p_alert_url text, p_alert_endpoint text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: raise_pause_alerts(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.raise_pause_alerts(p_alert_url text, p_alert_endpoint text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: recheck_ordering_keys(integer, bigint); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.recheck_ordering_keys(p_limit integer, p_upto bigint) RETURNS TABLE(taken integer, checked integer, promoted integer)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_keys  text[];
    v_key   text;
    v_first bigint;
    v_keep  text[] := '{}';
BEGIN
    checked := 0;
    promoted := 0;
    WITH gone AS (
             DELETE FROM outbox.ordering_rechecks r
              WHERE r.id IN (SELECT c.id FROM outbox.ordering_rechecks c WHERE c.id <= p_upto
                              ORDER BY c.id LIMIT p_limit FOR UPDATE SKIP LOCKED)
             RETURNING r.ordering_key)
    SELECT count(*), coalesce(array_agg(DISTINCT g.ordering_key), '{}') INTO taken, v_keys
      FROM gone g;
    FOREACH v_key IN ARRAY v_keys
    LOOP
        checked := checked + 1;
        SELECT w.id INTO v_first FROM outbox.intent_rows w
         WHERE w.ordering_key = v_key AND w.waiting AND w.state = 'pending'
         ORDER BY w.ordering_key, w.id LIMIT 1;
        CONTINUE WHEN NOT FOUND;
        IF NOT EXISTS (SELECT 1 FROM outbox.intent_rows e
                        WHERE e.ordering_key = v_key AND e.id < v_first
                          AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')) THEN
            UPDATE outbox.intent_rows SET waiting = false
             WHERE id = v_first AND waiting AND state = 'pending';
            IF FOUND THEN
                promoted := promoted + 1;
            ELSE
                -- changed meanwhile (cancelled): look at the key again
                v_keep := v_keep || v_key;
            END IF;
        ELSE
            -- A live intent ahead that no transaction is changing now will
            -- finish later and promote. When every one ahead is being
            -- changed, their triggers may have run before the waiting
            -- intent committed: look again next pass.
            PERFORM 1 FROM outbox.intent_rows e
              WHERE e.ordering_key = v_key AND e.id < v_first
                AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')
              LIMIT 1 FOR SHARE SKIP LOCKED;
            IF NOT FOUND THEN
                v_keep := v_keep || v_key;
            END IF;
        END IF;
    END LOOP;
    IF cardinality(v_keep) > 0 THEN
        INSERT INTO outbox.ordering_rechecks (ordering_key) SELECT unnest(v_keep);
    END IF;
    RETURN NEXT;
END
$$;


--
-- Name: release_probe(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.release_probe(p_name text, p_owner text) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    UPDATE outbox.destinations
       SET state = 'open', probe_owner = NULL, probe_until = NULL,
           next_probe_at = clock_timestamp(), updated_at = clock_timestamp()
     WHERE name = p_name AND state = 'half_open' AND probe_owner = p_owner;
$$;


--
-- Name: require_transaction(text, text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.require_transaction(p_caller text, p_setting text DEFAULT 'on'::text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    CASE lower(btrim(coalesce(p_setting, '')))
    WHEN '', 'off', 'false', 'no', '0' THEN
        RETURN true;
    WHEN 'on', 'true', 'yes', '1' THEN
        NULL;
    ELSE
        RAISE EXCEPTION 'outbox.require_transaction is %: on or off', quote_literal(p_setting)
            USING ERRCODE = '22023';
    END CASE;
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        RAISE EXCEPTION '%: nothing has been written in this transaction yet, so the intent would commit on its own', p_caller
            USING ERRCODE = 'OB428',
                  HINT = 'Write the business rows first, then enqueue, in one transaction (BEGIN ... COMMIT); '
                         'an autocommit connection commits each statement by itself. '
                         'outbox.require_transaction (a setting, or the client''s strict mode) asks for this.';
    END IF;
    RETURN true;
END
$$;


--
-- Name: resume_destination(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.resume_destination(p_name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: retire_log_segment(interval, integer); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.retire_log_segment(p_older_than interval, p_batch integer DEFAULT 50000) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    v_seg  outbox.log_segments;
    v_from bigint;
    v_to   bigint;
    v_lost bigint;
    v_more boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'retiring' ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NOT NULL THEN
        -- a snapshot older than the copy has an xmin at or below the
        -- copy's xid (conservative: a session's xmin is the oldest running
        -- transaction's, anywhere in the cluster, when it took a snapshot);
        -- this step's own was taken after the copy committed
        IF EXISTS (SELECT 1 FROM pg_stat_activity a
                    WHERE a.datname = current_database() AND a.backend_type = 'client backend'
                      AND a.pid <> pg_backend_pid() AND a.backend_xmin IS NOT NULL
                      AND age(a.backend_xmin) >= age(v_seg.copied_xid::xid)) THEN
            RETURN 'idle';
        END IF;
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            EXECUTE format('DROP TABLE outbox.%I, outbox.%I', 'intent_log_' || v_seg.segment,
                           'log_outcomes_' || v_seg.segment);
            SET LOCAL lock_timeout TO DEFAULT;
        EXCEPTION WHEN lock_not_available THEN
            RETURN 'busy';
        END;
        -- an intent given its row after its copy (an operator's retry of
        -- it, say) lives on in the row, and the ledger does not speak for it
        DELETE FROM outbox.ledger g USING outbox.intent_rows t
         WHERE t.id >= v_seg.first_id AND t.id < v_seg.end_id
           AND g.key = t.key AND g.intent_id = t.id;
        UPDATE outbox.log_segments SET state = 'retired', retired_at = now()
         WHERE segment = v_seg.segment;
        RETURN 'dropped';
    END IF;
    SELECT * INTO v_seg FROM outbox.log_segments
     WHERE state = 'closed' AND closed_at < now() - p_older_than
     ORDER BY segment LIMIT 1;
    IF v_seg.segment IS NULL THEN
        RETURN 'idle';
    END IF;
    v_from := coalesce(v_seg.copied_to, v_seg.first_id);
    EXECUTE format('SELECT max(id) + 1 FROM (SELECT l.id FROM outbox.%I l WHERE l.id >= $1
                                              ORDER BY l.id LIMIT $2) b',
                   'intent_log_' || v_seg.segment)
      INTO v_to USING v_from, p_batch;
    v_to := coalesce(v_to, v_seg.end_id);
    -- every intent without a row has its delivery: a closed segment's do
    EXECUTE format(
        'SELECT count(*) FROM outbox.%I l
          WHERE l.id >= $1 AND l.id < $2
            AND NOT EXISTS (SELECT 1 FROM outbox.%I o
                             WHERE o.intent_id = l.id AND o.outcome = ''delivered'')
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment)
      INTO v_lost USING v_from, v_to;
    IF v_lost > 0 THEN
        RAISE WARNING 'segment % of the log holds % intents with neither a delivery nor a row',
                      v_seg.segment, v_lost
            USING HINT = 'the segment is kept; report this as a fault';
        RETURN 'kept';
    END IF;
    EXECUTE format(
        'INSERT INTO outbox.ledger (key, intent_id, kind, destination, fingerprint, state,
                                    provider_ref, created_at, completed_at, effect_at)
         SELECT l.key, l.id, l.kind, l.destination, outbox.fingerprint(l.payload), ''delivered'',
                o.provider_ref, l.created_at, o.at, coalesce(o.finished_at, o.started_at, o.at)
           FROM outbox.%I l
           JOIN outbox.%I o ON o.intent_id = l.id
          WHERE l.id >= $1 AND l.id < $2
            AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
         ON CONFLICT (key) DO NOTHING',
        'intent_log_' || v_seg.segment, 'log_outcomes_' || v_seg.segment)
      USING v_from, v_to;
    DELETE FROM outbox.attempts a
     WHERE a.intent_id >= v_from AND a.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.event_id >= v_from AND d.event_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.event_id);
    DELETE FROM outbox.event_deliveries d
     WHERE d.intent_id >= v_from AND d.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = d.intent_id);
    DELETE FROM outbox.operator_actions a
     WHERE a.intent_id >= v_from AND a.intent_id < v_to
       AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = a.intent_id);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM outbox.%I l WHERE l.id >= $1)',
                   'intent_log_' || v_seg.segment)
      INTO v_more USING v_to;
    IF v_more THEN
        UPDATE outbox.log_segments SET copied_to = v_to WHERE segment = v_seg.segment;
    ELSE
        UPDATE outbox.log_segments
           SET copied_to = v_seg.end_id, state = 'retiring', copied_xid = pg_current_xact_id()
         WHERE segment = v_seg.segment;
    END IF;
    RETURN 'copied';
END
$_$;


--
-- Name: rotate_log(interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.rotate_log(p_span interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
DECLARE
    v_newest outbox.log_segments;
    v_next   outbox.log_segments;
    v_seq    bigint;
    v_empty  boolean;
BEGIN
    IF NOT pg_try_advisory_xact_lock(20291, 5) THEN
        RETURN 'busy';
    END IF;
    SELECT * INTO v_newest FROM outbox.log_segments
     WHERE state = 'open' ORDER BY segment DESC LIMIT 1;
    SELECT * INTO v_next FROM outbox.log_segments WHERE state = 'ahead';
    SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END INTO v_seq
      FROM outbox.intent_ids;
    IF v_newest.opened_at IS NULL THEN
        -- opened in an earlier transaction: the sequence moves in (never back)
        IF v_seq < v_newest.first_id THEN
            PERFORM setval('outbox.intent_ids', v_newest.first_id, false);
        END IF;
        UPDATE outbox.log_segments SET opened_at = now() WHERE segment = v_newest.segment;
        RETURN 'moved';
    END IF;
    IF v_next.segment IS NULL THEN
        -- after the newest, or above the sequence and the tail's intents
        -- when the sequence has been moved past the segments
        v_next.first_id := greatest(v_newest.end_id,
                                    ((greatest(v_seq, (SELECT max(t.id) FROM outbox.intent_log_tail t))
                                      >> 32) + 1) << 32);
        v_next.end_id := v_next.first_id + (1::bigint << 32);
        v_next.segment := (v_next.first_id >> 32)::integer;
        EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.intent_log INCLUDING DEFAULTS,'
                       ' CHECK (id >= %s AND id < %s))',
                       'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
        EXECUTE format('CREATE TABLE outbox.%I (LIKE outbox.log_outcomes INCLUDING DEFAULTS'
                       ' INCLUDING CONSTRAINTS, CHECK (intent_id >= %s AND intent_id < %s))',
                       'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
        INSERT INTO outbox.log_segments (segment, first_id, end_id, state)
        VALUES (v_next.segment, v_next.first_id, v_next.end_id, 'ahead');
        RETURN 'made';
    END IF;
    IF v_seq < v_newest.end_id - (1::bigint << 31) THEN
        IF v_newest.opened_at > now() - p_span THEN
            RETURN 'idle';
        END IF;
        -- a segment that holds nothing stays open: an idle log keeps one
        EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM outbox.%I)',
                       'intent_log_' || v_newest.segment)
          INTO v_empty;
        IF v_empty THEN
            RETURN 'idle';
        END IF;
    END IF;
    BEGIN
        SET LOCAL lock_timeout = '100ms';
        EXECUTE format('ALTER TABLE outbox.intent_log ATTACH PARTITION outbox.%I'
                       ' FOR VALUES FROM (%s) TO (%s)',
                       'intent_log_' || v_next.segment, v_next.first_id, v_next.end_id);
        EXECUTE format('ALTER TABLE outbox.log_outcomes ATTACH PARTITION outbox.%I'
                       ' FOR VALUES FROM (%s) TO (%s)',
                       'log_outcomes_' || v_next.segment, v_next.first_id, v_next.end_id);
        UPDATE outbox.log_segments SET state = 'open' WHERE segment = v_next.segment;
        PERFORM outbox.build_open_log();
        SET LOCAL lock_timeout TO DEFAULT;
    EXCEPTION
        WHEN lock_not_available THEN
            RETURN 'busy';
        WHEN check_violation THEN
            -- the tail took intents in its range meanwhile: made again above
            EXECUTE format('DROP TABLE outbox.%I, outbox.%I', 'intent_log_' || v_next.segment,
                           'log_outcomes_' || v_next.segment);
            DELETE FROM outbox.log_segments WHERE segment = v_next.segment;
            RETURN 'busy';
    END;
    RETURN 'opened';
END
$$;


--
-- Name: slow_destination(text, interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.slow_destination(p_name text, p_for interval) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
    INSERT INTO outbox.destinations AS d (name, slow_until)
    VALUES (p_name, clock_timestamp() + p_for)
    ON CONFLICT (name) DO UPDATE
       SET slow_until = greatest(d.slow_until, excluded.slow_until), updated_at = now();
$$;


--
-- Name: standby_flush_positions(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.standby_flush_positions(OUT timeline integer, OUT streaming integer, OUT hidden integer, OUT flushed bigint[]) RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT p.timeline, p.streaming, p.hidden, p.flushed
      FROM outbox.standby_flush_positions(NULL::text[]) p
$$;


--
-- Name: standby_flush_positions(text[]); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.standby_flush_positions(p_names text[], OUT timeline integer, OUT streaming integer, OUT hidden integer, OUT flushed bigint[], OUT ignored text[]) RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
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


--
-- Name: subscriptions_changed(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.subscriptions_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pg_notify('outbox_subscriptions', '');
    RETURN NULL;
END
$$;


--
-- Name: subscriptions_headers_in_clear(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.subscriptions_headers_in_clear() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NEW.headers IS NULL OR NEW.headers = '{}'::jsonb THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.headers = OLD.headers THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'outbox.subscriptions: subscription %''s header values are stored sealed (headers_sealed, header_names), never in headers',
        NEW.id USING ERRCODE = '23514';
END
$$;


--
-- Name: take_probe(text, text, interval); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.take_probe(p_name text, p_owner text, p_for interval) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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


--
-- Name: take_tokens(text, double precision, double precision, integer); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.take_tokens(p_name text, p_rate double precision, p_burst double precision, p_want integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
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
       SET tokens = v_tokens - v_granted, refilled_at = v_now, updated_at = v_now
     WHERE name = p_name;
    RETURN v_granted;
END
$$;


--
-- Name: tally_batches(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.tally_batches() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $_$
BEGIN
    -- a claim that found nothing inserts no batch, and its statement
    -- still fires this: nothing to plan the read of the log on (a plan
    -- made on an empty log is the session's for good)
    IF NOT EXISTS (SELECT 1 FROM new_batches) THEN
        RETURN NULL;
    END IF;
    INSERT INTO outbox.tally_deltas
    SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
           array_agg('log'::text), array_agg(n)
      FROM (SELECT kind, destination, subscription, url, -sum(n)::bigint AS n
              FROM (SELECT g->>0 AS kind, g->>1 AS destination, g->>2 AS subscription,
                           g->>3 AS url, (g->>4)::bigint AS n
                      FROM new_batches b CROSS JOIN LATERAL jsonb_array_elements(b.tally) AS g
                     WHERE b.tally IS NOT NULL) c
             GROUP BY 1, 2, 3, 4) g
    HAVING count(*) > 0;
    IF EXISTS (SELECT 1 FROM new_batches WHERE tally IS NULL) THEN
        EXECUTE $q$
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT l.kind, l.destination,
                       outbox.tally_subscription(l.kind, l.destination, l.payload) AS subscription,
                       outbox.tally_url(l.kind, l.destination, l.payload) AS url,
                       -count(*) AS n
                  FROM new_batches b CROSS JOIN LATERAL unnest(b.ids) AS x(id)
                  JOIN outbox.intent_log l ON l.id = x.id
                 WHERE b.tally IS NULL
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0
        $q$;
    END IF;
    RETURN NULL;
END
$_$;


--
-- Name: tally_recount(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.tally_recount() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    UPDATE outbox.tally_mark SET valid = false WHERE valid;
    RETURN NULL;
END
$$;


--
-- Name: tally_rows(); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.tally_rows() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET jit TO 'off'
    AS $_$
BEGIN
    -- statements that changed no row (a claim of rows that found none)
    -- fire this too
    IF TG_OP = 'DELETE' THEN
        IF NOT EXISTS (SELECT 1 FROM old_rows) THEN
            RETURN NULL;
        END IF;
    ELSIF NOT EXISTS (SELECT 1 FROM new_rows) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT r.kind, r.destination,
                       outbox.tally_subscription(r.kind, r.destination, r.payload) AS subscription,
                       outbox.tally_url(r.kind, r.destination, r.payload) AS url,
                       r.state, count(*) AS n
                  FROM new_rows r
                 WHERE r.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                 GROUP BY 1, 2, 3, 4, 5) g
        HAVING count(*) > 0;
        -- A row has its log intent's kind, destination, payload, ordering
        -- key, waiting and created_at as they were, and its run_after too
        -- but where a claim set it aside for later (and wrote the row's
        -- updated_at then). So a row with a key or waiting, or with a later
        -- run_after written with its enqueue, is one its log intent had
        -- from its enqueue (never counted in 'log'); one with an earlier
        -- run_after is its log intent leaving 'log', unless a batch took it
        -- before (it has an outcome).
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT r.kind, r.destination,
                       outbox.tally_subscription(r.kind, r.destination, r.payload) AS subscription,
                       outbox.tally_url(r.kind, r.destination, r.payload) AS url, -count(*) AS n
                  FROM new_rows r
                 WHERE r.ordering_key IS NULL AND NOT r.waiting AND r.run_after <= r.created_at
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                    WHERE o.intent_id = r.id OFFSET 0)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                    WHERE b.ids @> ARRAY[r.id] OFFSET 0)
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0;
        -- a later run_after written after the enqueue: a claim's set-aside
        -- (or a row written so by hand), checked against the log
        IF EXISTS (SELECT 1 FROM new_rows r
                    WHERE r.ordering_key IS NULL AND NOT r.waiting
                      AND r.run_after > r.created_at AND r.updated_at <> r.created_at) THEN
            EXECUTE $q$
            INSERT INTO outbox.tally_deltas
            SELECT array_agg(kind), array_agg(destination), array_agg(subscription),
                   array_agg(url), array_agg('log'::text), array_agg(n)
              FROM (SELECT l.kind, l.destination,
                           outbox.tally_subscription(l.kind, l.destination, l.payload)
                               AS subscription,
                           outbox.tally_url(l.kind, l.destination, l.payload) AS url,
                           -count(*) AS n
                      FROM new_rows r
                      JOIN outbox.intent_log l ON l.id = r.id
                     WHERE r.ordering_key IS NULL AND NOT r.waiting
                       AND r.run_after > r.created_at AND r.updated_at <> r.created_at
                       AND outbox.log_untracked(l.ordering_key, l.waiting, l.run_after,
                                                l.created_at)
                       AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o
                                        WHERE o.intent_id = l.id)
                       AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b
                                        WHERE b.ids @> ARRAY[l.id])
                     GROUP BY 1, 2, 3, 4) g
            HAVING count(*) > 0
            $q$;
        END IF;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT kind, destination, subscription, url, state, sum(n) AS n
                  FROM (SELECT o.kind, o.destination,
                               outbox.tally_subscription(o.kind, o.destination, o.payload)
                                   AS subscription,
                               outbox.tally_url(o.kind, o.destination, o.payload) AS url,
                               o.state, -1 AS n
                          FROM old_rows o
                         WHERE o.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                        UNION ALL
                        SELECT r.kind, r.destination,
                               outbox.tally_subscription(r.kind, r.destination, r.payload),
                               outbox.tally_url(r.kind, r.destination, r.payload), r.state, 1
                          FROM new_rows r
                         WHERE r.state IN ('pending', 'claimed', 'ambiguous', 'dead')) d
                 GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0) g
        HAVING count(*) > 0;
    ELSE
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg(state), array_agg(n)
          FROM (SELECT o.kind, o.destination,
                       outbox.tally_subscription(o.kind, o.destination, o.payload) AS subscription,
                       outbox.tally_url(o.kind, o.destination, o.payload) AS url,
                       o.state, -count(*) AS n
                  FROM old_rows o
                 WHERE o.state IN ('pending', 'claimed', 'ambiguous', 'dead')
                 GROUP BY 1, 2, 3, 4, 5) g
        HAVING count(*) > 0;
        EXECUTE $q$
        INSERT INTO outbox.tally_deltas
        SELECT array_agg(kind), array_agg(destination), array_agg(subscription), array_agg(url),
               array_agg('log'::text), array_agg(n)
          FROM (SELECT l.kind, l.destination,
                       outbox.tally_subscription(l.kind, l.destination, l.payload) AS subscription,
                       outbox.tally_url(l.kind, l.destination, l.payload) AS url, count(*) AS n
                  FROM old_rows o
                  JOIN outbox.intent_log l ON l.id = o.id
                 WHERE outbox.log_untracked(l.ordering_key, l.waiting, l.run_after, l.created_at)
                   AND (l.xid, l.id) > (SELECT c.xid, c.id FROM outbox.log_cursor c
                                         ORDER BY c.seq DESC LIMIT 1)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes x WHERE x.intent_id = l.id)
                   AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b WHERE b.ids @> ARRAY[l.id])
                 GROUP BY 1, 2, 3, 4) g
        HAVING count(*) > 0
        $q$;
    END IF;
    RETURN NULL;
END
$_$;


--
-- Name: tally_subscription(text, text, jsonb); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.tally_subscription(p_kind text, p_destination text, p_payload jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT CASE WHEN p_kind = 'webhook' AND p_destination IS NULL
                  THEN p_payload->>'subscription' END $$;


--
-- Name: tally_url(text, text, jsonb); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.tally_url(p_kind text, p_destination text, p_payload jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT CASE WHEN p_kind = 'webhook' AND p_destination IS NULL
                       AND p_payload->>'subscription' IS NULL
                  THEN p_payload->>'url' END $$;


--
-- Name: track(bigint[]); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.track(p_ids bigint[]) RETURNS SETOF bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unnest(p_ids) AS x(id)
                    WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = x.id)) THEN
        RETURN QUERY SELECT t.id FROM outbox.intent_rows t WHERE t.id = ANY(p_ids);
        RETURN;
    END IF;
    -- a claim of log intents holds this lock for its transaction: an
    -- intent no batch holds once it is taken stays unclaimed until commit
    PERFORM pg_advisory_xact_lock(20291, 0);
    WITH moved AS (
             INSERT INTO outbox.log_outcomes (intent_id, outcome)
             SELECT DISTINCT c.id
                    , 'moved'
               FROM outbox.log_batches b CROSS JOIN LATERAL unnest(b.ids) AS c(id)
              WHERE b.ids && p_ids AND c.id = ANY(p_ids)
                -- a batch keeps the ids of intents purged since
                AND EXISTS (SELECT 1 FROM outbox.intent_log l WHERE l.id = c.id)
                AND NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = c.id)
             ON CONFLICT (intent_id) DO NOTHING
             RETURNING intent_id)
    INSERT INTO outbox.intent_rows (id, key, kind, destination, payload, state, attempts,
                                    run_after, owner, lease_expires_at, fence, source,
                                    created_at, updated_at, traceparent, tracestate)
    SELECT l.id, l.key, l.kind, l.destination, l.payload, 'claimed', 1, l.run_after, b.owner,
           b.lease_expires_at, 1, l.source, l.created_at, b.claimed_at, l.traceparent,
           l.tracestate
      FROM moved m
      JOIN outbox.intent_log l ON l.id = m.intent_id
      JOIN LATERAL (SELECT b.owner, b.lease_expires_at, b.claimed_at FROM outbox.log_batches b
                     WHERE b.ids @> ARRAY[m.intent_id] ORDER BY b.batch DESC LIMIT 1) b ON true
    ON CONFLICT (id) DO NOTHING;

    INSERT INTO outbox.intent_rows (id, key, kind, destination, payload, state, attempts,
                                    run_after, provider_ref, fence, source, created_at,
                                    updated_at, delivered_at, traceparent, tracestate,
                                    first_attempt_started_at, first_attempt_finished_at,
                                    first_attempt_owner, first_attempt_status,
                                    first_attempt_replayed)
    SELECT l.id, l.key, l.kind, l.destination, l.payload, 'delivered', 1, l.run_after,
           o.provider_ref, 1, l.source, l.created_at, o.at, o.at, l.traceparent, l.tracestate,
           o.started_at, o.finished_at, o.owner, o.status, o.replayed
      FROM outbox.log_outcomes o JOIN outbox.intent_log l ON l.id = o.intent_id
     WHERE o.intent_id = ANY(p_ids) AND o.outcome = 'delivered'
    ON CONFLICT (id) DO NOTHING;

    INSERT INTO outbox.intent_rows (id, key, kind, destination, payload, run_after,
                                    ordering_key, waiting, source, created_at, updated_at,
                                    traceparent, tracestate)
    SELECT l.id, l.key, l.kind, l.destination, l.payload, l.run_after, l.ordering_key,
           l.waiting, l.source, l.created_at, l.created_at, l.traceparent, l.tracestate
      FROM outbox.intent_log l
     WHERE l.id = ANY(p_ids)
       AND NOT EXISTS (SELECT 1 FROM outbox.log_outcomes o WHERE o.intent_id = l.id)
       AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b WHERE b.ids @> ARRAY[l.id])
    ON CONFLICT (id) DO NOTHING;

    RETURN QUERY SELECT t.id FROM outbox.intent_rows t WHERE t.id = ANY(p_ids);
END
$$;


--
-- Name: url_origin(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.url_origin(p_url text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'outbox', 'pg_temp'
    AS $_$
DECLARE
    v_text   text;
    v_scheme text;
    v_auth   text;
    v_host   text;
    v_port   text;
    v_bytes  bytea := '\x'::bytea;
    v_parts  text[];
    v_part   text;
    v_radix  integer;
    v_value  numeric;
    v_addr   numeric := 0;
    v_labels text[];
    i        integer;
BEGIN
    IF p_url IS NULL THEN
        RETURN NULL;
    END IF;
    -- tabs and line breaks anywhere are dropped, spaces and controls
    -- around the URL trimmed
    v_text := regexp_replace(p_url, '[\t\n\r]', '', 'g');
    v_text := regexp_replace(v_text, '^[\x01-\x20]+|[\x01-\x20]+$', '', 'g');
    v_scheme := lower(substring(v_text FROM '^([A-Za-z][A-Za-z0-9+.-]*):'));
    IF v_scheme IS NULL OR v_scheme NOT IN ('http', 'https') THEN
        RETURN NULL;
    END IF;
    -- any slashes (or backslashes) after the scheme, the authority up to
    -- the path, query or fragment, the credentials up to its last @
    v_auth := substring(substr(v_text, length(v_scheme) + 2) FROM '^[/\\]*([^/\\?#]*)');
    v_auth := regexp_replace(v_auth, '^.*@', '');
    IF v_auth LIKE '[%' THEN
        v_host := substring(v_auth FROM '^\[([^\]]*)\]');
        v_port := substr(v_auth, length(v_host) + 3);
        IF v_host IS NULL OR v_host !~ '^[0-9A-Fa-f:.]+$' THEN
            RETURN NULL;
        END IF;
        BEGIN
            v_host := host(v_host::inet);
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN NULL;
        END;
        IF v_host LIKE '::ffff:%.%' THEN
            v_host := substr(v_host, 8);
        ELSIF v_host LIKE '%.%' THEN
            -- an embedded IPv4 (::a.b.c.d) in hexadecimal, as the parser writes it
            v_parts := regexp_split_to_array(substring(v_host FROM '[0-9.]+$'), '\.');
            v_host := regexp_replace(v_host, '[0-9.]+$', '')
                      || to_hex(v_parts[1]::integer * 256 + v_parts[2]::integer) || ':'
                      || to_hex(v_parts[3]::integer * 256 + v_parts[4]::integer);
            v_host := '[' || v_host || ']';
        ELSE
            v_host := '[' || v_host || ']';
        END IF;
    ELSE
        v_host := split_part(v_auth, ':', 1);
        v_port := CASE WHEN strpos(v_auth, ':') > 0
                       THEN substr(v_auth, strpos(v_auth, ':')) ELSE '' END;
        -- percent-decoded, as UTF-8
        i := 1;
        WHILE i <= length(v_host) LOOP
            IF substr(v_host, i, 1) = '%' AND substr(v_host, i + 1, 2) ~ '^[0-9A-Fa-f]{2}$' THEN
                v_bytes := v_bytes || decode(substr(v_host, i + 1, 2), 'hex');
                i := i + 3;
            ELSE
                v_bytes := v_bytes || convert_to(substr(v_host, i, 1), 'UTF8');
                i := i + 1;
            END IF;
        END LOOP;
        BEGIN
            v_host := convert_from(v_bytes, 'UTF8');
        EXCEPTION WHEN character_not_in_repertoire OR untranslatable_character THEN
            RETURN NULL;
        END;
        -- the ideographic full stops are dots; lowercase, compatibility forms
        v_host := lower(normalize(translate(v_host, E'\u3002\uFF0E\uFF61', '...'), NFKC));
        IF v_host = '' OR v_host ~ '[\x01-\x20#%/:<>?@\[\\\]^|\x7f]' THEN
            RETURN NULL;
        END IF;
        v_parts := string_to_array(v_host, '.');
        IF cardinality(v_parts) > 1 AND v_parts[cardinality(v_parts)] = '' THEN
            v_parts := v_parts[1:cardinality(v_parts) - 1];
        END IF;
        v_part := v_parts[cardinality(v_parts)];
        IF v_part ~ '^[0-9]+$' OR v_part ~ '^0x[0-9a-f]*$' THEN
            -- a host that ends in a number is an IPv4 address, or nothing
            IF cardinality(v_parts) > 4 THEN
                RETURN NULL;
            END IF;
            FOR i IN 1 .. cardinality(v_parts) LOOP
                v_part := v_parts[i];
                v_radix := 10;
                IF v_part ~ '^0x' THEN
                    v_radix := 16;
                    v_part := substr(v_part, 3);
                ELSIF length(v_part) > 1 AND v_part LIKE '0%' THEN
                    v_radix := 8;
                    v_part := substr(v_part, 2);
                END IF;
                IF v_parts[i] = '' OR (v_radix = 10 AND v_part !~ '^[0-9]+$')
                   OR (v_radix = 8 AND v_part !~ '^[0-7]+$')
                   OR (v_radix = 16 AND v_part !~ '^[0-9a-f]*$') THEN
                    RETURN NULL;
                END IF;
                v_value := 0;
                FOR j IN 1 .. length(v_part) LOOP
                    v_value := v_value * v_radix
                               + strpos('0123456789abcdef', substr(v_part, j, 1)) - 1;
                END LOOP;
                IF i < cardinality(v_parts) THEN
                    IF v_value > 255 THEN
                        RETURN NULL;
                    END IF;
                    v_addr := v_addr + v_value * 256 ^ (4 - i);
                ELSE
                    IF v_value >= 256 ^ (5 - cardinality(v_parts)) THEN
                        RETURN NULL;
                    END IF;
                    v_addr := v_addr + v_value;
                END IF;
            END LOOP;
            v_host := concat_ws('.', div(v_addr, 16777216), mod(div(v_addr, 65536), 256),
                                mod(div(v_addr, 256), 256), mod(v_addr, 256));
        ELSE
            -- a domain: without its trailing dots, each label in ASCII
            v_host := rtrim(v_host, '.');
            IF v_host = '' THEN
                RETURN NULL;
            END IF;
            v_labels := string_to_array(v_host, '.');
            FOR i IN 1 .. cardinality(v_labels) LOOP
                IF v_labels[i] ~ '[^\x01-\x7f]' THEN
                    v_labels[i] := 'xn--' || outbox.punycode(v_labels[i]);
                END IF;
            END LOOP;
            v_host := array_to_string(v_labels, '.');
        END IF;
    END IF;
    -- the port: digits only, without leading zeros, none when it is the default
    IF v_port <> '' THEN
        IF v_port !~ '^:[0-9]*$' THEN
            RETURN NULL;
        END IF;
        v_port := ltrim(substr(v_port, 2), '0');
        IF length(v_port) > 5 OR (v_port <> '' AND v_port::integer > 65535) THEN
            RETURN NULL;
        END IF;
        IF substr(v_auth, strpos(v_auth, ':') + 1) ~ '^0+$' THEN
            v_port := '0';
        END IF;
        IF v_port = '' OR (v_scheme = 'http' AND v_port = '80')
           OR (v_scheme = 'https' AND v_port = '443') THEN
            v_port := '';
        ELSE
            v_port := ':' || v_port;
        END IF;
    END IF;
    RETURN v_scheme || '://' || v_host || v_port;
END
$_$;


--
-- Name: valid_event_type(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.valid_event_type(p_type text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$
    SELECT p_type IS NOT NULL AND length(p_type) <= 200
       AND p_type ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'
$_$;


--
-- Name: valid_traceparent(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.valid_traceparent(p_value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN (((length(p_value) = 55) OR ((length(p_value) > 55) AND (substr(p_value, 56, 1) = '-'::text) AND ("left"(p_value, 2) <> '00'::text))) AND (substr(p_value, 3, 1) = '-'::text) AND (substr(p_value, 36, 1) = '-'::text) AND (substr(p_value, 53, 1) = '-'::text) AND ("left"(p_value, 55) ~ '^[0-9a-f]+-[0-9a-f]+-[0-9a-f]+-[0-9a-f]+$'::text) AND ("left"(p_value, 2) <> 'ff'::text) AND (substr(p_value, 4, 32) <> '00000000000000000000000000000000'::text) AND (substr(p_value, 37, 16) <> '0000000000000000'::text)) THEN "left"(p_value, 55) ELSE NULL::text END;


--
-- Name: valid_tracestate(text); Type: FUNCTION; Schema: outbox; Owner: -
--

CREATE FUNCTION outbox.valid_tracestate(p_value text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN ((length(p_value) <= 512) AND (strpos(p_value, '='::text) > 0) AND ((length(p_value) - length(replace(p_value, '='::text, ''::text))) <= 32) AND (p_value !~ '[^ -~]'::text) AND (p_value ~ '^ *([a-z0-9][a-z0-9_*/@-]*=[^,=]*[^ ,=])? *(, *([a-z0-9][a-z0-9_*/@-]*=[^,=]*[^ ,=])? *)*$'::text)) THEN p_value ELSE NULL::text END;


--
-- Name: alert_latches; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.alert_latches (
    name text NOT NULL,
    raised_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: alert_windows; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.alert_windows (
    event text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    raised integer DEFAULT 0 NOT NULL,
    suppressed integer DEFAULT 0 NOT NULL,
    subjects text[] DEFAULT '{}'::text[] NOT NULL,
    summarised boolean DEFAULT false NOT NULL
);


--
-- Name: attempts; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.attempts (
    id bigint NOT NULL,
    intent_id bigint NOT NULL,
    attempt integer NOT NULL,
    fence bigint NOT NULL,
    owner text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone,
    outcome text NOT NULL,
    status integer,
    provider_ref text,
    error text,
    replayed boolean DEFAULT false NOT NULL,
    accepted boolean DEFAULT true NOT NULL,
    key_generation integer DEFAULT 0 NOT NULL
);


--
-- Name: intent_rows; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.intent_rows (
    id bigint NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    attempts_base integer DEFAULT 0 NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    provider_ref text,
    last_error text,
    response jsonb,
    owner text,
    lease_expires_at timestamp with time zone,
    fence bigint DEFAULT 0 NOT NULL,
    key_generation integer DEFAULT 0 NOT NULL,
    duplicates integer DEFAULT 0 NOT NULL,
    source text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    delivered_at timestamp with time zone,
    waiting boolean DEFAULT false NOT NULL,
    recover_owner text,
    recover_at timestamp with time zone,
    traceparent text,
    tracestate text,
    first_attempt_started_at timestamp with time zone,
    first_attempt_finished_at timestamp with time zone,
    first_attempt_owner text,
    first_attempt_status integer,
    first_attempt_replayed boolean,
    CONSTRAINT intents_claim_shape CHECK (((state = 'claimed'::text) = ((owner IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT intents_key_not_empty CHECK (((length(key) >= 1) AND (length(key) <= 512))),
    CONSTRAINT intents_kind_shape CHECK (((length(kind) <= 64) AND (kind ~ '^[a-z][a-z0-9_.-]*$'::text))),
    CONSTRAINT intents_state_known CHECK ((state = ANY (ARRAY['pending'::text, 'claimed'::text, 'delivered'::text, 'rejected'::text, 'dead'::text, 'ambiguous'::text, 'cancelled'::text])))
)
WITH (fillfactor='80', autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02');


--
-- Name: log_outcomes; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_outcomes (
    intent_id bigint NOT NULL,
    outcome text NOT NULL,
    owner text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    status integer,
    provider_ref text,
    replayed boolean,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT log_outcomes_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'moved'::text])))
)
PARTITION BY RANGE (intent_id);


--
-- Name: attempt_history; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.attempt_history AS
 SELECT a.id,
    a.intent_id,
    a.attempt,
    a.fence,
    a.owner,
    a.started_at,
    a.finished_at,
    a.outcome,
    a.status,
    a.provider_ref,
    a.error,
    a.replayed,
    a.accepted,
    a.key_generation
   FROM outbox.attempts a
UNION ALL
 SELECT NULL::bigint AS id,
    i.id AS intent_id,
    1 AS attempt,
    i.fence,
    i.first_attempt_owner AS owner,
    i.first_attempt_started_at AS started_at,
    i.first_attempt_finished_at AS finished_at,
    'delivered'::text AS outcome,
    i.first_attempt_status AS status,
    i.provider_ref,
    NULL::text AS error,
    i.first_attempt_replayed AS replayed,
    true AS accepted,
    i.key_generation
   FROM outbox.intent_rows i
  WHERE (i.first_attempt_started_at IS NOT NULL)
UNION ALL
 SELECT NULL::bigint AS id,
    o.intent_id,
    1 AS attempt,
    (1)::bigint AS fence,
    o.owner,
    o.started_at,
    o.finished_at,
    'delivered'::text AS outcome,
    o.status,
    o.provider_ref,
    NULL::text AS error,
    o.replayed,
    true AS accepted,
    0 AS key_generation
   FROM outbox.log_outcomes o
  WHERE ((o.outcome = 'delivered'::text) AND (NOT (EXISTS ( SELECT 1
           FROM outbox.intent_rows t
          WHERE (t.id = o.intent_id)))));


--
-- Name: attempts_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.attempts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.attempts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: destination_events; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.destination_events (
    id bigint NOT NULL,
    destination text NOT NULL,
    event text NOT NULL,
    detail jsonb,
    actor text DEFAULT CURRENT_USER NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    alerted boolean DEFAULT false NOT NULL
);


--
-- Name: destination_events_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.destination_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.destination_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: destinations; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.destinations (
    name text NOT NULL,
    state text DEFAULT 'closed'::text NOT NULL,
    failures integer DEFAULT 0 NOT NULL,
    last_error text,
    opened_at timestamp with time zone,
    cooldown interval,
    next_probe_at timestamp with time zone,
    probe_owner text,
    probe_until timestamp with time zone,
    paused_by text,
    paused_at timestamp with time zone,
    tokens double precision,
    refilled_at timestamp with time zone,
    slow_until timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT destinations_name_check CHECK (((length(name) >= 1) AND (length(name) <= 512))),
    CONSTRAINT destinations_state_check CHECK ((state = ANY (ARRAY['closed'::text, 'open'::text, 'half_open'::text, 'paused'::text])))
);


--
-- Name: enqueue_duplicates; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.enqueue_duplicates (
    id bigint NOT NULL,
    intent_id bigint NOT NULL,
    source text,
    at timestamp with time zone DEFAULT now() NOT NULL,
    kind text
);


--
-- Name: enqueue_duplicates_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.enqueue_duplicates ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.enqueue_duplicates_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: event_deliveries; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.event_deliveries (
    event_id bigint NOT NULL,
    subscription_id text NOT NULL,
    intent_id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: intents; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.intents AS
SELECT
    NULL::bigint AS id,
    NULL::text AS key,
    NULL::text AS kind,
    NULL::text AS destination,
    NULL::jsonb AS payload,
    NULL::text AS state,
    NULL::integer AS attempts,
    NULL::integer AS attempts_base,
    NULL::timestamp with time zone AS run_after,
    NULL::text AS ordering_key,
    NULL::text AS provider_ref,
    NULL::text AS last_error,
    NULL::jsonb AS response,
    NULL::text AS owner,
    NULL::timestamp with time zone AS lease_expires_at,
    NULL::bigint AS fence,
    NULL::integer AS key_generation,
    NULL::integer AS duplicates,
    NULL::text AS source,
    NULL::timestamp with time zone AS created_at,
    NULL::timestamp with time zone AS updated_at,
    NULL::timestamp with time zone AS delivered_at,
    NULL::boolean AS waiting,
    NULL::text AS recover_owner,
    NULL::timestamp with time zone AS recover_at,
    NULL::text AS traceparent,
    NULL::text AS tracestate,
    NULL::timestamp with time zone AS first_attempt_started_at,
    NULL::timestamp with time zone AS first_attempt_finished_at,
    NULL::text AS first_attempt_owner,
    NULL::integer AS first_attempt_status,
    NULL::boolean AS first_attempt_replayed;


--
-- Name: intent_ids; Type: SEQUENCE; Schema: outbox; Owner: -
--

CREATE SEQUENCE outbox.intent_ids
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: intent_ids; Type: SEQUENCE OWNED BY; Schema: outbox; Owner: -
--

ALTER SEQUENCE outbox.intent_ids OWNED BY outbox.intents.id;


--
-- Name: intent_keys; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.intent_keys (
    key text NOT NULL,
    intent_id bigint NOT NULL
);


--
-- Name: TABLE intent_keys; Type: COMMENT; Schema: outbox; Owner: -
--

COMMENT ON TABLE outbox.intent_keys IS 'Every intent''s key, live or purged until the ledger forgets it, and its intent''s id';


--
-- Name: intent_log; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.intent_log (
    id bigint DEFAULT nextval('outbox.intent_ids'::regclass) NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    waiting boolean DEFAULT false NOT NULL,
    source text,
    traceparent text,
    tracestate text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY RANGE (id);


--
-- Name: intent_log_0; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.intent_log_0 (
    id bigint DEFAULT nextval('outbox.intent_ids'::regclass) NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    waiting boolean DEFAULT false NOT NULL,
    source text,
    traceparent text,
    tracestate text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: intent_log_batchable; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.intent_log_batchable AS
 SELECT l.id,
    l.xid,
    l.key,
    l.kind,
    l.destination,
    l.payload,
    l.run_after,
    l.ordering_key,
    l.waiting,
    l.source,
    l.traceparent,
    l.tracestate,
    l.created_at
   FROM outbox.intent_log_0 l;


--
-- Name: VIEW intent_log_batchable; Type: COMMENT; Schema: outbox; Owner: -
--

COMMENT ON VIEW outbox.intent_log_batchable IS 'The open segments of outbox.intent_log, whose intents a claim may put in a batch: what the deliveries at the first attempt and the reads of the batches in flight read';


--
-- Name: intent_log_tail; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.intent_log_tail (
    id bigint DEFAULT nextval('outbox.intent_ids'::regclass) NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    key text NOT NULL,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    run_after timestamp with time zone DEFAULT now() NOT NULL,
    ordering_key text,
    waiting boolean DEFAULT false NOT NULL,
    source text,
    traceparent text,
    tracestate text,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: intent_log_open; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.intent_log_open AS
 SELECT l.id,
    l.xid,
    l.key,
    l.kind,
    l.destination,
    l.payload,
    l.run_after,
    l.ordering_key,
    l.waiting,
    l.source,
    l.traceparent,
    l.tracestate,
    l.created_at,
    false AS in_tail
   FROM outbox.intent_log_0 l
UNION ALL
 SELECT l.id,
    l.xid,
    l.key,
    l.kind,
    l.destination,
    l.payload,
    l.run_after,
    l.ordering_key,
    l.waiting,
    l.source,
    l.traceparent,
    l.tracestate,
    l.created_at,
    true AS in_tail
   FROM outbox.intent_log_tail l;


--
-- Name: VIEW intent_log_open; Type: COMMENT; Schema: outbox; Owner: -
--

COMMENT ON VIEW outbox.intent_log_open IS 'The open segments of outbox.intent_log and its tail (in_tail), which the relays'' claims of the log and reads of the due intents read';


--
-- Name: intents_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.intent_rows ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME outbox.intents_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: ledger; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.ledger (
    key text NOT NULL,
    intent_id bigint NOT NULL,
    kind text NOT NULL,
    destination text,
    fingerprint bytea NOT NULL,
    state text NOT NULL,
    provider_ref text,
    last_error text,
    created_at timestamp with time zone NOT NULL,
    completed_at timestamp with time zone NOT NULL,
    purged_at timestamp with time zone DEFAULT now() NOT NULL,
    effect_at timestamp with time zone
);


--
-- Name: log_batches; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_batches (
    batch bigint NOT NULL,
    owner text NOT NULL,
    claimed_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_expires_at timestamp with time zone NOT NULL,
    ids bigint[] NOT NULL,
    tally jsonb,
    max_id bigint NOT NULL
);


--
-- Name: log_batches_batch_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.log_batches ALTER COLUMN batch ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.log_batches_batch_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: log_cursor; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_cursor (
    seq bigint NOT NULL,
    xid xid8 NOT NULL,
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: log_cursor_seq_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.log_cursor ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.log_cursor_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: log_outcomes_0; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_outcomes_0 (
    intent_id bigint NOT NULL,
    outcome text NOT NULL,
    owner text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    status integer,
    provider_ref text,
    replayed boolean,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT log_outcomes_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'moved'::text])))
);


--
-- Name: log_outcomes_open; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.log_outcomes_open AS
 SELECT o.intent_id,
    o.outcome,
    o.owner,
    o.started_at,
    o.finished_at,
    o.status,
    o.provider_ref,
    o.replayed,
    o.at
   FROM outbox.log_outcomes_0 o;


--
-- Name: VIEW log_outcomes_open; Type: COMMENT; Schema: outbox; Owner: -
--

COMMENT ON VIEW outbox.log_outcomes_open IS 'The outcomes of the intents of outbox.intent_log_batchable, which the relays'' hot statements read';


--
-- Name: log_outcomes_tail; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.log_outcomes_tail (
    intent_id bigint NOT NULL,
    outcome text NOT NULL,
    owner text,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    status integer,
    provider_ref text,
    replayed boolean,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT log_outcomes_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'moved'::text])))
);


--
-- Name: operator_actions; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.operator_actions (
    id bigint NOT NULL,
    intent_id bigint NOT NULL,
    action text NOT NULL,
    detail jsonb,
    actor text DEFAULT CURRENT_USER NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: operator_actions_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.operator_actions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.operator_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: ordering_rechecks; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.ordering_rechecks (
    id bigint NOT NULL,
    ordering_key text NOT NULL
);


--
-- Name: ordering_rechecks_id_seq; Type: SEQUENCE; Schema: outbox; Owner: -
--

ALTER TABLE outbox.ordering_rechecks ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME outbox.ordering_rechecks_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);


--
-- Name: outbox; Type: VIEW; Schema: outbox; Owner: -
--

CREATE VIEW outbox.outbox AS
 SELECT intent_rows.key,
    intent_rows.kind,
    intent_rows.payload,
    intent_rows.destination,
    intent_rows.run_after,
    intent_rows.ordering_key,
    intent_rows.source,
    intent_rows.traceparent,
    intent_rows.tracestate
   FROM outbox.intent_rows
  WHERE false;


--
-- Name: relays; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.relays (
    owner text NOT NULL,
    version text NOT NULL,
    kinds text[] NOT NULL,
    known_kinds text[] NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    stopped_at timestamp with time zone,
    standbys_needed integer DEFAULT 0 NOT NULL,
    standbys_streaming integer,
    standby_waits integer DEFAULT 0 NOT NULL,
    standbys_behind_since timestamp with time zone
);


--
-- Name: schedule_configs; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.schedule_configs (
    name text NOT NULL,
    fingerprint text NOT NULL,
    definition text NOT NULL,
    first_seen timestamp with time zone NOT NULL,
    last_seen timestamp with time zone NOT NULL,
    seen_by text
);


--
-- Name: schedules; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.schedules (
    name text NOT NULL,
    last_tick timestamp with time zone NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    fingerprint text
);


--
-- Name: subscriptions; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.subscriptions (
    id text NOT NULL,
    tenant text,
    event_types text[] DEFAULT '{}'::text[] NOT NULL,
    url text NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb,
    rate double precision,
    description text,
    secret bytea NOT NULL,
    previous_secret bytea,
    previous_until timestamp with time zone,
    disabled_at timestamp with time zone,
    disabled_reason text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    header_names text[] DEFAULT '{}'::text[] NOT NULL,
    headers_sealed bytea,
    CONSTRAINT subscriptions_description_check CHECK (((description IS NULL) OR (length(description) <= 1000))),
    CONSTRAINT subscriptions_headers_check CHECK ((jsonb_typeof(headers) = 'object'::text)),
    CONSTRAINT subscriptions_headers_sealed CHECK ((((headers_sealed IS NULL) = (headers IS NOT NULL)) AND ((headers_sealed IS NULL) OR (cardinality(header_names) > 0)))),
    CONSTRAINT subscriptions_id_check CHECK ((id ~ '^sub_[A-Za-z0-9]{8,64}$'::text)),
    CONSTRAINT subscriptions_previous CHECK (((previous_secret IS NULL) = (previous_until IS NULL))),
    CONSTRAINT subscriptions_rate_check CHECK (((rate IS NULL) OR (rate > (0)::double precision))),
    CONSTRAINT subscriptions_tenant_check CHECK (((tenant IS NULL) OR ((length(tenant) >= 1) AND (length(tenant) <= 200)))),
    CONSTRAINT subscriptions_url_check CHECK ((url ~ '^https?://'::text))
);


--
-- Name: tallies; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.tallies (
    kind text NOT NULL,
    destination text,
    subscription text,
    url text,
    state text NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT tallies_state_check CHECK ((state = ANY (ARRAY['log'::text, 'pending'::text, 'claimed'::text, 'ambiguous'::text, 'dead'::text])))
);


--
-- Name: tally_deltas; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.tally_deltas (
    kinds text[] NOT NULL,
    destinations text[] NOT NULL,
    subscriptions text[] NOT NULL,
    urls text[] NOT NULL,
    states text[] NOT NULL,
    ns bigint[] NOT NULL
)
WITH (autovacuum_vacuum_scale_factor='0', autovacuum_vacuum_threshold='1000');


--
-- Name: tally_mark; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.tally_mark (
    one boolean DEFAULT true NOT NULL,
    snapshot pg_snapshot NOT NULL,
    valid boolean NOT NULL,
    CONSTRAINT tally_mark_one_check CHECK (one)
);


--
-- Name: totals; Type: TABLE; Schema: outbox; Owner: -
--

CREATE TABLE outbox.totals (
    name text NOT NULL,
    value bigint NOT NULL
);


--
-- Name: intent_log_0; Type: TABLE ATTACH; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_log ATTACH PARTITION outbox.intent_log_0 FOR VALUES FROM (MINVALUE) TO ('4294967296');


--
-- Name: intent_log_tail; Type: TABLE ATTACH; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_log ATTACH PARTITION outbox.intent_log_tail DEFAULT;


--
-- Name: log_outcomes_0; Type: TABLE ATTACH; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_outcomes ATTACH PARTITION outbox.log_outcomes_0 FOR VALUES FROM (MINVALUE) TO ('4294967296');


--
-- Name: log_outcomes_tail; Type: TABLE ATTACH; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_outcomes ATTACH PARTITION outbox.log_outcomes_tail DEFAULT;


--
-- Name: intents id; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN id SET DEFAULT nextval('outbox.intent_ids'::regclass);


--
-- Name: intents state; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN state SET DEFAULT 'pending'::text;


--
-- Name: intents attempts; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN attempts SET DEFAULT 0;


--
-- Name: intents attempts_base; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN attempts_base SET DEFAULT 0;


--
-- Name: intents run_after; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN run_after SET DEFAULT now();


--
-- Name: intents fence; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN fence SET DEFAULT 0;


--
-- Name: intents key_generation; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN key_generation SET DEFAULT 0;


--
-- Name: intents duplicates; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN duplicates SET DEFAULT 0;


--
-- Name: intents created_at; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN created_at SET DEFAULT now();


--
-- Name: intents updated_at; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN updated_at SET DEFAULT now();


--
-- Name: intents waiting; Type: DEFAULT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intents ALTER COLUMN waiting SET DEFAULT false;


--
-- Name: alert_latches alert_latches_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.alert_latches
    ADD CONSTRAINT alert_latches_pkey PRIMARY KEY (name);


--
-- Name: alert_windows alert_windows_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.alert_windows
    ADD CONSTRAINT alert_windows_pkey PRIMARY KEY (event, started_at);


--
-- Name: attempts attempts_once_per_claim; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.attempts
    ADD CONSTRAINT attempts_once_per_claim UNIQUE (intent_id, fence);


--
-- Name: attempts attempts_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (id);


--
-- Name: destination_events destination_events_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.destination_events
    ADD CONSTRAINT destination_events_pkey PRIMARY KEY (id);


--
-- Name: destinations destinations_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.destinations
    ADD CONSTRAINT destinations_pkey PRIMARY KEY (name);


--
-- Name: enqueue_duplicates enqueue_duplicates_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.enqueue_duplicates
    ADD CONSTRAINT enqueue_duplicates_pkey PRIMARY KEY (id);


--
-- Name: event_deliveries event_deliveries_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.event_deliveries
    ADD CONSTRAINT event_deliveries_pkey PRIMARY KEY (event_id, subscription_id);


--
-- Name: intent_keys intent_keys_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_keys
    ADD CONSTRAINT intent_keys_pkey PRIMARY KEY (key);


--
-- Name: intent_log intent_log_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_log
    ADD CONSTRAINT intent_log_pkey PRIMARY KEY (id);


--
-- Name: intent_log_0 intent_log_0_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_log_0
    ADD CONSTRAINT intent_log_0_pkey PRIMARY KEY (id);


--
-- Name: intent_log_tail intent_log_tail_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_log_tail
    ADD CONSTRAINT intent_log_tail_pkey PRIMARY KEY (id);


--
-- Name: intent_rows intent_rows_key_unique; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_rows
    ADD CONSTRAINT intent_rows_key_unique UNIQUE (key);


--
-- Name: intent_rows intents_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.intent_rows
    ADD CONSTRAINT intents_pkey PRIMARY KEY (id);


--
-- Name: ledger ledger_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.ledger
    ADD CONSTRAINT ledger_pkey PRIMARY KEY (key);


--
-- Name: log_batches log_batches_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_batches
    ADD CONSTRAINT log_batches_pkey PRIMARY KEY (batch);


--
-- Name: log_cursor log_cursor_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_cursor
    ADD CONSTRAINT log_cursor_pkey PRIMARY KEY (seq);


--
-- Name: log_outcomes log_outcomes_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_outcomes
    ADD CONSTRAINT log_outcomes_pkey PRIMARY KEY (intent_id);


--
-- Name: log_outcomes_0 log_outcomes_0_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_outcomes_0
    ADD CONSTRAINT log_outcomes_0_pkey PRIMARY KEY (intent_id);


--
-- Name: log_outcomes_tail log_outcomes_tail_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_outcomes_tail
    ADD CONSTRAINT log_outcomes_tail_pkey PRIMARY KEY (intent_id);


--
-- Name: log_segments log_segments_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.log_segments
    ADD CONSTRAINT log_segments_pkey PRIMARY KEY (segment);


--
-- Name: operator_actions operator_actions_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.operator_actions
    ADD CONSTRAINT operator_actions_pkey PRIMARY KEY (id);


--
-- Name: ordering_rechecks ordering_rechecks_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.ordering_rechecks
    ADD CONSTRAINT ordering_rechecks_pkey PRIMARY KEY (id);


--
-- Name: relays relays_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.relays
    ADD CONSTRAINT relays_pkey PRIMARY KEY (owner);


--
-- Name: schedule_configs schedule_configs_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.schedule_configs
    ADD CONSTRAINT schedule_configs_pkey PRIMARY KEY (name, fingerprint);


--
-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);


--
-- Name: subscriptions subscriptions_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.subscriptions
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY (id);


--
-- Name: tallies tallies_group; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.tallies
    ADD CONSTRAINT tallies_group UNIQUE NULLS NOT DISTINCT (kind, destination, subscription, url, state);


--
-- Name: tally_mark tally_mark_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.tally_mark
    ADD CONSTRAINT tally_mark_pkey PRIMARY KEY (one);


--
-- Name: totals totals_pkey; Type: CONSTRAINT; Schema: outbox; Owner: -
--

ALTER TABLE ONLY outbox.totals
    ADD CONSTRAINT totals_pkey PRIMARY KEY (name);


--
-- Name: attempts_started_brin; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX attempts_started_brin ON outbox.attempts USING brin (started_at) WITH (pages_per_range='32');


--
-- Name: destination_events_destination; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX destination_events_destination ON outbox.destination_events USING btree (destination, at);


--
-- Name: destinations_unhealthy; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX destinations_unhealthy ON outbox.destinations USING btree (name) WHERE ((state <> 'closed'::text) OR (failures > 0) OR (slow_until IS NOT NULL));


--
-- Name: enqueue_duplicates_intent; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX enqueue_duplicates_intent ON outbox.enqueue_duplicates USING btree (intent_id);


--
-- Name: event_deliveries_intent; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX event_deliveries_intent ON outbox.event_deliveries USING btree (intent_id);


--
-- Name: event_deliveries_subscription; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX event_deliveries_subscription ON outbox.event_deliveries USING btree (subscription_id, event_id);


--
-- Name: intent_log_events; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_events ON ONLY outbox.intent_log USING btree (created_at) WHERE (kind = 'event'::text);


--
-- Name: intent_log_0_events; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_0_events ON outbox.intent_log_0 USING btree (created_at) WHERE (kind = 'event'::text);


--
-- Name: intent_log_xid; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_xid ON ONLY outbox.intent_log USING btree (xid, id);


--
-- Name: intent_log_0_xid; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_0_xid ON outbox.intent_log_0 USING btree (xid, id);


--
-- Name: intent_log_tail_created_at_idx; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_tail_created_at_idx ON outbox.intent_log_tail USING btree (created_at) WHERE (kind = 'event'::text);


--
-- Name: intent_log_tail_xid_id_idx; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intent_log_tail_xid_id_idx ON outbox.intent_log_tail USING btree (xid, id);


--
-- Name: intents_blocked; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_blocked ON outbox.intent_rows USING btree (ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state = ANY (ARRAY['dead'::text, 'ambiguous'::text])));


--
-- Name: intents_due; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_due ON outbox.intent_rows USING btree (run_after, id) WHERE ((state = 'pending'::text) AND (NOT waiting));


--
-- Name: intents_first_attempt_brin; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_first_attempt_brin ON outbox.intent_rows USING brin (first_attempt_started_at) WITH (pages_per_range='32');


--
-- Name: intents_leases; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_leases ON outbox.intent_rows USING btree (lease_expires_at) WHERE (state = 'claimed'::text);


--
-- Name: intents_ordering; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_ordering ON outbox.intent_rows USING btree (ordering_key, id) WHERE ((ordering_key IS NOT NULL) AND (state = ANY (ARRAY['pending'::text, 'claimed'::text, 'ambiguous'::text, 'dead'::text])));


--
-- Name: intents_unsettled; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_unsettled ON outbox.intent_rows USING btree (state, kind, id) WHERE (state <> 'delivered'::text);


--
-- Name: intents_waiting; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX intents_waiting ON outbox.intent_rows USING btree (ordering_key, id) WHERE waiting;


--
-- Name: ledger_intent_id; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX ledger_intent_id ON outbox.ledger USING btree (intent_id);


--
-- Name: ledger_purged_at; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX ledger_purged_at ON outbox.ledger USING btree (purged_at);


--
-- Name: log_batches_ids; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX log_batches_ids ON outbox.log_batches USING gin (ids) WITH (fastupdate=off);


--
-- Name: log_batches_leases; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX log_batches_leases ON outbox.log_batches USING btree (lease_expires_at);


--
-- Name: log_batches_max_id; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX log_batches_max_id ON outbox.log_batches USING btree (max_id);


--
-- Name: operator_actions_intent; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX operator_actions_intent ON outbox.operator_actions USING btree (intent_id);


--
-- Name: subscriptions_tenant; Type: INDEX; Schema: outbox; Owner: -
--

CREATE INDEX subscriptions_tenant ON outbox.subscriptions USING btree (tenant) WHERE (disabled_at IS NULL);


--
-- Name: intent_log_0_events; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_events ATTACH PARTITION outbox.intent_log_0_events;


--
-- Name: intent_log_0_pkey; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_pkey ATTACH PARTITION outbox.intent_log_0_pkey;


--
-- Name: intent_log_0_xid; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_xid ATTACH PARTITION outbox.intent_log_0_xid;


--
-- Name: intent_log_tail_created_at_idx; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_events ATTACH PARTITION outbox.intent_log_tail_created_at_idx;


--
-- Name: intent_log_tail_pkey; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_pkey ATTACH PARTITION outbox.intent_log_tail_pkey;


--
-- Name: intent_log_tail_xid_id_idx; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.intent_log_xid ATTACH PARTITION outbox.intent_log_tail_xid_id_idx;


--
-- Name: log_outcomes_0_pkey; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.log_outcomes_pkey ATTACH PARTITION outbox.log_outcomes_0_pkey;


--
-- Name: log_outcomes_tail_pkey; Type: INDEX ATTACH; Schema: outbox; Owner: -
--

ALTER INDEX outbox.log_outcomes_pkey ATTACH PARTITION outbox.log_outcomes_tail_pkey;


--
-- Name: intents _RETURN; Type: RULE; Schema: outbox; Owner: -
--

CREATE OR REPLACE VIEW outbox.intents AS
 SELECT t.id,
    t.key,
    t.kind,
    t.destination,
    t.payload,
    t.state,
    t.attempts,
    t.attempts_base,
    t.run_after,
    t.ordering_key,
    t.provider_ref,
    t.last_error,
    t.response,
    t.owner,
    t.lease_expires_at,
    t.fence,
    t.key_generation,
    t.duplicates,
    t.source,
    t.created_at,
    t.updated_at,
    t.delivered_at,
    t.waiting,
    t.recover_owner,
    t.recover_at,
    t.traceparent,
    t.tracestate,
    t.first_attempt_started_at,
    t.first_attempt_finished_at,
    t.first_attempt_owner,
    t.first_attempt_status,
    t.first_attempt_replayed
   FROM outbox.intent_rows t
UNION ALL
 SELECT l.id,
    k.key,
    l.kind,
    l.destination,
    l.payload,
    'delivered'::text AS state,
    1 AS attempts,
    0 AS attempts_base,
    l.run_after,
    l.ordering_key,
    o.provider_ref,
    NULL::text AS last_error,
    NULL::jsonb AS response,
    NULL::text AS owner,
    NULL::timestamp with time zone AS lease_expires_at,
    (1)::bigint AS fence,
    0 AS key_generation,
    0 AS duplicates,
    l.source,
    l.created_at,
    o.at AS updated_at,
    o.at AS delivered_at,
    false AS waiting,
    NULL::text AS recover_owner,
    NULL::timestamp with time zone AS recover_at,
    l.traceparent,
    l.tracestate,
    o.started_at AS first_attempt_started_at,
    o.finished_at AS first_attempt_finished_at,
    o.owner AS first_attempt_owner,
    o.status AS first_attempt_status,
    o.replayed AS first_attempt_replayed
   FROM ((outbox.log_outcomes o
     JOIN outbox.intent_log l ON ((l.id = o.intent_id)))
     LEFT JOIN outbox.intent_keys k ON (((k.key = l.key) AND (k.intent_id = l.id))))
  WHERE ((o.outcome = 'delivered'::text) AND (NOT (EXISTS ( SELECT 1
           FROM outbox.intent_rows t
          WHERE (t.id = o.intent_id)))))
UNION ALL
 SELECT l.id,
    k.key,
    l.kind,
    l.destination,
    l.payload,
    'claimed'::text AS state,
    1 AS attempts,
    0 AS attempts_base,
    l.run_after,
    l.ordering_key,
    NULL::text AS provider_ref,
    NULL::text AS last_error,
    NULL::jsonb AS response,
    b.owner,
    b.lease_expires_at,
    (1)::bigint AS fence,
    0 AS key_generation,
    0 AS duplicates,
    l.source,
    l.created_at,
    b.claimed_at AS updated_at,
    NULL::timestamp with time zone AS delivered_at,
    false AS waiting,
    NULL::text AS recover_owner,
    NULL::timestamp with time zone AS recover_at,
    l.traceparent,
    l.tracestate,
    NULL::timestamp with time zone AS first_attempt_started_at,
    NULL::timestamp with time zone AS first_attempt_finished_at,
    NULL::text AS first_attempt_owner,
    NULL::integer AS first_attempt_status,
    NULL::boolean AS first_attempt_replayed
   FROM (((outbox.log_batches b
     CROSS JOIN LATERAL unnest(b.ids) c(id))
     JOIN outbox.intent_log l ON ((l.id = c.id)))
     LEFT JOIN outbox.intent_keys k ON (((k.key = l.key) AND (k.intent_id = l.id))))
  WHERE ((NOT (EXISTS ( SELECT 1
           FROM outbox.log_outcomes o
          WHERE (o.intent_id = c.id)))) AND (NOT (EXISTS ( SELECT 1
           FROM outbox.intent_rows t
          WHERE (t.id = c.id)))))
UNION ALL
 SELECT l.id,
    k.key,
    l.kind,
    l.destination,
    l.payload,
    'pending'::text AS state,
    0 AS attempts,
    0 AS attempts_base,
    l.run_after,
    l.ordering_key,
    NULL::text AS provider_ref,
    NULL::text AS last_error,
    NULL::jsonb AS response,
    NULL::text AS owner,
    NULL::timestamp with time zone AS lease_expires_at,
    (0)::bigint AS fence,
    0 AS key_generation,
    0 AS duplicates,
    l.source,
    l.created_at,
    l.created_at AS updated_at,
    NULL::timestamp with time zone AS delivered_at,
    l.waiting,
    NULL::text AS recover_owner,
    NULL::timestamp with time zone AS recover_at,
    l.traceparent,
    l.tracestate,
    NULL::timestamp with time zone AS first_attempt_started_at,
    NULL::timestamp with time zone AS first_attempt_finished_at,
    NULL::text AS first_attempt_owner,
    NULL::integer AS first_attempt_status,
    NULL::boolean AS first_attempt_replayed
   FROM (outbox.intent_log l
     LEFT JOIN outbox.intent_keys k ON (((k.key = l.key) AND (k.intent_id = l.id))))
  WHERE (((l.xid, l.id) > ( SELECT c.xid,
            c.id
           FROM outbox.log_cursor c
          ORDER BY c.seq DESC
         LIMIT 1)) AND (NOT (EXISTS ( SELECT 1
           FROM outbox.intent_rows t
          WHERE (t.id = l.id)))) AND ((l.id > ( SELECT GREATEST(COALESCE(( SELECT max(o.intent_id) AS max
                   FROM outbox.log_outcomes o), (0)::bigint), COALESCE(( SELECT max(b.max_id) AS max
                   FROM outbox.log_batches b), (0)::bigint)) AS "greatest")) OR ((NOT (EXISTS ( SELECT 1
           FROM outbox.log_outcomes o
          WHERE (o.intent_id = l.id)))) AND (NOT (EXISTS ( SELECT 1
           FROM outbox.log_batches b
          WHERE (b.ids @> ARRAY[l.id])))))));


--
-- Name: intent_log intent_log_dependents_follow; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intent_log_dependents_follow AFTER DELETE ON outbox.intent_log REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_dependents_follow();


--
-- Name: intent_log intent_log_kafka_headers; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intent_log_kafka_headers BEFORE INSERT ON outbox.intent_log FOR EACH ROW WHEN (((new.kind = 'kafka'::text) AND (new.payload ? 'headers'::text))) EXECUTE FUNCTION outbox.check_kafka_headers();


--
-- Name: intent_log intent_log_outcomes_follow; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intent_log_outcomes_follow AFTER DELETE ON outbox.intent_log REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_outcomes_follow();


--
-- Name: intent_log intent_log_track; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intent_log_track AFTER INSERT ON outbox.intent_log FOR EACH ROW WHEN (((new.ordering_key IS NOT NULL) OR new.waiting OR (new.run_after > new.created_at))) EXECUTE FUNCTION outbox.log_track();


--
-- Name: intent_rows intents_kafka_headers; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_kafka_headers BEFORE INSERT ON outbox.intent_rows FOR EACH ROW WHEN (((new.kind = 'kafka'::text) AND (new.payload ? 'headers'::text))) EXECUTE FUNCTION outbox.check_kafka_headers();


--
-- Name: intent_rows intents_move_first_attempt; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_move_first_attempt BEFORE UPDATE ON outbox.intent_rows FOR EACH ROW WHEN (((old.first_attempt_started_at IS NOT NULL) AND ((new.state IS DISTINCT FROM old.state) OR (new.fence IS DISTINCT FROM old.fence) OR (new.key_generation IS DISTINCT FROM old.key_generation) OR (new.provider_ref IS DISTINCT FROM old.provider_ref)))) EXECUTE FUNCTION outbox.move_first_attempt();


--
-- Name: intent_rows intents_note_live_delete; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_note_live_delete AFTER DELETE ON outbox.intent_rows FOR EACH ROW WHEN (((old.ordering_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'claimed'::text, 'ambiguous'::text, 'dead'::text])))) EXECUTE FUNCTION outbox.note_ordering_recheck();


--
-- Name: intent_rows intents_note_waiting_insert; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_note_waiting_insert AFTER INSERT ON outbox.intent_rows FOR EACH ROW WHEN ((new.waiting AND (new.ordering_key IS NOT NULL))) EXECUTE FUNCTION outbox.note_ordering_recheck();


--
-- Name: intent_rows intents_note_waiting_update; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_note_waiting_update AFTER UPDATE OF state, waiting ON outbox.intent_rows FOR EACH ROW WHEN ((new.waiting AND (new.state = 'pending'::text) AND (new.ordering_key IS NOT NULL) AND (NOT (old.waiting AND (old.state = 'pending'::text))))) EXECUTE FUNCTION outbox.note_ordering_recheck();


--
-- Name: intent_rows intents_promote_next_in_order; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_promote_next_in_order AFTER UPDATE OF state ON outbox.intent_rows FOR EACH ROW WHEN (((old.ordering_key IS NOT NULL) AND (old.state = ANY (ARRAY['pending'::text, 'claimed'::text, 'ambiguous'::text, 'dead'::text])) AND (new.state = ANY (ARRAY['delivered'::text, 'rejected'::text, 'cancelled'::text])))) EXECUTE FUNCTION outbox.promote_next_in_order();


--
-- Name: intent_rows intents_tally_delete; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_tally_delete AFTER DELETE ON outbox.intent_rows REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();


--
-- Name: intent_rows intents_tally_insert; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_tally_insert AFTER INSERT ON outbox.intent_rows REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();


--
-- Name: intent_rows intents_tally_truncate; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_tally_truncate AFTER TRUNCATE ON outbox.intent_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_recount();


--
-- Name: intent_rows intents_tally_update; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_tally_update AFTER UPDATE ON outbox.intent_rows REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_rows();


--
-- Name: intents intents_write; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER intents_write INSTEAD OF INSERT OR DELETE OR UPDATE ON outbox.intents FOR EACH ROW EXECUTE FUNCTION outbox.intents_write();


--
-- Name: log_batches log_batches_max_id; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER log_batches_max_id BEFORE INSERT ON outbox.log_batches FOR EACH ROW WHEN ((new.max_id IS NULL)) EXECUTE FUNCTION outbox.log_batch_max_id();


--
-- Name: log_batches log_batches_tally; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER log_batches_tally AFTER INSERT ON outbox.log_batches REFERENCING NEW TABLE AS new_batches FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_batches();


--
-- Name: log_batches log_batches_tally_truncate; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER log_batches_tally_truncate AFTER TRUNCATE ON outbox.log_batches FOR EACH STATEMENT EXECUTE FUNCTION outbox.tally_recount();


--
-- Name: outbox outbox_insert; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON outbox.outbox FOR EACH ROW EXECUTE FUNCTION outbox.outbox_insert();


--
-- Name: subscriptions subscriptions_changed; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER subscriptions_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON outbox.subscriptions FOR EACH STATEMENT EXECUTE FUNCTION outbox.subscriptions_changed();


--
-- Name: subscriptions subscriptions_headers_in_clear; Type: TRIGGER; Schema: outbox; Owner: -
--

CREATE TRIGGER subscriptions_headers_in_clear BEFORE INSERT OR UPDATE OF headers ON outbox.subscriptions FOR EACH ROW EXECUTE FUNCTION outbox.subscriptions_headers_in_clear();


--
-- PostgreSQL database dump complete
--
