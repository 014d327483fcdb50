-- Events and subscriptions.
--
-- outbox.publish writes one intent of kind 'event' into the log, through
-- outbox.enqueue (so its key, payload check, size limits and ledger are
-- enqueue's), whatever the number of subscriptions. After it commits, a
-- relay claims the event like any intent, and its effect is the expansion:
-- one transaction that adds a 'webhook' intent per matching subscription,
-- keyed by outbox.derive_key(event key, 'subscription ' || id), and links
-- each to its event in outbox.event_deliveries. The key and the link make
-- a second expansion of the same event (a lost completion, a lease taken
-- over) add nothing.

CREATE TABLE outbox.subscriptions (
    id              text        NOT NULL PRIMARY KEY CHECK (id ~ '^sub_[A-Za-z0-9]{8,64}$'),
    -- none: the events published without a tenant
    tenant          text        CHECK (tenant IS NULL OR length(tenant) BETWEEN 1 AND 200),
    -- exact names or 'prefix.*'; empty: every type
    event_types     text[]      NOT NULL DEFAULT '{}',
    url             text        NOT NULL CHECK (url ~ '^https?://'),
    headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    -- deliveries per second at most; none: no bound of its own
    rate            double precision CHECK (rate IS NULL OR rate > 0),
    description     text        CHECK (description IS NULL OR length(description) <= 1000),
    -- the signing secret, sealed by the relay's [subscriptions] secret_key
    -- (nonce and ciphertext); never readable without that key
    secret          bytea       NOT NULL,
    -- the secret a rotation replaced, signed with as well until
    -- previous_until
    previous_secret bytea,
    previous_until  timestamptz,
    disabled_at     timestamptz,
    disabled_reason text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT subscriptions_previous CHECK ((previous_secret IS NULL) = (previous_until IS NULL))
);
CREATE INDEX subscriptions_tenant ON outbox.subscriptions (tenant) WHERE disabled_at IS NULL;

-- The relays keep a subscription's target (URL, headers, secrets) for a
-- moment; any change tells them to forget it.
CREATE FUNCTION outbox.subscriptions_changed() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pg_notify('outbox_subscriptions', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER subscriptions_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON outbox.subscriptions FOR EACH STATEMENT EXECUTE FUNCTION outbox.subscriptions_changed();

-- Each delivery an expansion made: one per (event, subscription). The
-- primary key is what makes an expansion happen once per pair.
CREATE TABLE outbox.event_deliveries (
    event_id        bigint      NOT NULL REFERENCES outbox.intent_log (id) ON DELETE CASCADE,
    subscription_id text        NOT NULL,
    intent_id       bigint      NOT NULL REFERENCES outbox.intent_log (id) ON DELETE CASCADE,
    at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT event_deliveries_pkey PRIMARY KEY (event_id, subscription_id)
);
CREATE INDEX event_deliveries_subscription ON outbox.event_deliveries (subscription_id, event_id);
CREATE INDEX event_deliveries_intent ON outbox.event_deliveries (intent_id);
-- the events of a time window (replay): only event rows are indexed
CREATE INDEX intent_log_events ON outbox.intent_log (created_at) WHERE kind = 'event';

-- An event type: dotted names of letters, digits, '_' and '-'. (It and
-- the next name only pg_catalog's functions, which are found first
-- whatever the search_path, and have no SET clause: the planner inlines
-- them into the statements that call them.)
CREATE FUNCTION outbox.valid_event_type(p_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT p_type IS NOT NULL AND length(p_type) <= 200
       AND p_type ~ '^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$'
$$;

-- Does an event type match a subscription's patterns (none: every type)?
CREATE FUNCTION outbox.event_type_matches(p_patterns text[], p_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT cardinality(p_patterns) = 0
        OR EXISTS (SELECT 1 FROM unnest(p_patterns) AS p(pattern)
                    WHERE p.pattern = p_type
                       OR (right(p.pattern, 2) = '.*'
                           AND starts_with(p_type, left(p.pattern, -1))))
$$;

CREATE FUNCTION outbox.publish(p_key text, p_event_type text, p_payload jsonb,
                               p_tenant text DEFAULT NULL, p_traceparent text DEFAULT NULL)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
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

-- The set-based form: element i of each array is one event. Returns each
-- event's position (1-based) with its id.
CREATE FUNCTION outbox.publish_many(p_keys text[], p_event_types text[], p_payloads jsonb[],
                                    p_tenants text[] DEFAULT NULL,
                                    p_traceparents text[] DEFAULT NULL)
RETURNS TABLE (ord integer, id bigint, duplicate boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
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

-- Expand one event: a webhook intent per enabled subscription of its
-- tenant whose patterns match its type (only p_subscription, when given:
-- a replay's first delivery), unless the pair has one already (or had
-- one, purged since: its key is in the ledger). Returns how many
-- subscriptions matched and how many deliveries this call made.
CREATE FUNCTION outbox.expand_event(p_event bigint, p_subscription text DEFAULT NULL)
RETURNS TABLE (matched integer, created integer)
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
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
             SELECT s.id, s.key FROM subs s
              WHERE NOT EXISTS (SELECT 1 FROM outbox.event_deliveries d
                                 WHERE d.event_id = p_event AND d.subscription_id = s.id)
                AND NOT EXISTS (SELECT 1 FROM outbox.ledger g WHERE g.key = s.key)),
         -- each delivery names its subscription: the link is made from
         -- what the insert returns, without joining back to `fresh`
         logged AS (
             INSERT INTO outbox.intent_log (key, kind, payload, source, traceparent, tracestate)
             SELECT f.key, 'webhook',
                    jsonb_build_object(
                        'subscription', f.id,
                        'body', jsonb_build_object(
                            'type', v_event.payload->>'type',
                            'timestamp', to_char(v_event.created_at AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                            'data', v_event.payload->'data')),
                    'event ' || p_event, v_event.traceparent, v_event.tracestate
               FROM fresh f
             ON CONFLICT (key) DO NOTHING
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

-- A subscription's deliveries are its own destination (health, limits,
-- pause): a webhook whose payload names a subscription goes to it.
CREATE OR REPLACE FUNCTION outbox.destination_of(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, outbox, pg_temp
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

-- Disable every enabled subscription whose breaker has been open for
-- p_after (its deliveries have failed since, probes included): each is
-- raised as an alert 'subscription.disabled' and published as the event
-- 'outbox.subscription.disabled' (no tenant), which subscriptions may
-- subscribe to. Returns how many it disabled.
CREATE FUNCTION outbox.disable_failing_subscriptions(p_after interval, p_alert_url text,
                                                     p_alert_endpoint text)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
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

REVOKE EXECUTE ON FUNCTION outbox.disable_failing_subscriptions(interval, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.expand_event(bigint, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.subscriptions_changed() FROM PUBLIC;
-- (outbox.valid_event_type and outbox.event_type_matches compute only:
-- any role may call them, the operator's and the console's reads of a
-- replay's window included)
REVOKE EXECUTE ON FUNCTION outbox.publish(text, text, jsonb, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION outbox.publish_many(text[], text[], jsonb[], text[], text[]) FROM PUBLIC;

-- Whoever may enqueue may publish; whoever may enqueue_many may
-- publish_many.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT p.proname, a.grantee, a.is_grantable
          FROM pg_proc p, aclexplode(p.proacl) a
         WHERE p.pronamespace = 'outbox'::regnamespace
           AND p.proname IN ('enqueue', 'enqueue_many')
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I%s',
                       CASE g.proname
                           WHEN 'enqueue' THEN 'outbox.publish(text, text, jsonb, text, text)'
                           ELSE 'outbox.publish_many(text[], text[], jsonb[], text[], text[])' END,
                       pg_get_userbyid(g.grantee),
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;
