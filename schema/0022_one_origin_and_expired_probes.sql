-- Destination health: one origin however a URL spells it, probes whose
-- relay died, and rate-limit buckets kept while in use.

-- The origin of a webhook URL as the relay names it, by the URL
-- Standard's host parser: scheme://host[:port], lowercase, without
-- credentials or a default port; a percent-encoded host decoded, a
-- domain without its trailing dot and in its ASCII (punycode) form, an
-- IPv4 address in its dotted form however written (127.1, 0x7f.1,
-- 2130706433, 0177.0.0.1, [::ffff:127.0.0.1]), an IPv6 address
-- compressed, a port without leading zeros. NULL for a URL that is not
-- http(s) or that the relay cannot parse. The relay's own
-- (config::destinations::origin) gives the same name for every URL; a
-- table test holds both to it.
CREATE FUNCTION outbox.url_origin(p_url text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, outbox, pg_temp
AS $$
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
$$;

-- A label's Punycode (RFC 3492), without the xn-- prefix.
CREATE FUNCTION outbox.punycode(p_label text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, outbox, pg_temp
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

-- The destination of an intent, as the relay names it: a webhook's
-- origin by outbox.url_origin (a URL already in that form is read
-- without calling it), a named endpoint by its name, which the relay maps
-- to its origin.
CREATE OR REPLACE FUNCTION outbox.destination_of(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, outbox, pg_temp
AS $$
    SELECT CASE p_kind
        WHEN 'webhook' THEN coalesce(
            p_destination,
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
$$;

-- A probe whose relay died (or overran) leaves the breaker half-open with
-- nobody to settle it: once its time is up the breaker is open again,
-- its probe due, for the next intent to take; with nothing pending for
-- the destination, the relays then close it as idle
-- (close_idle_breaker, a minute past the due probe). This runs with the
-- relays' minutely forgetting of stale failures.
CREATE FUNCTION outbox.expire_probes()
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
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

CREATE OR REPLACE FUNCTION outbox.forget_stale_failures(p_after interval)
RETURNS integer
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
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

-- Take up to p_want tokens of p_name's bucket, as in 0007; the take
-- touches the row, so that a bucket in use is never pruned as idle.
CREATE OR REPLACE FUNCTION outbox.take_tokens(
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
       SET tokens = v_tokens - v_granted, refilled_at = v_now, updated_at = v_now
     WHERE name = p_name;
    RETURN v_granted;
END
$$;

REVOKE ALL ON FUNCTION outbox.url_origin(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.punycode(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox.expire_probes() FROM PUBLIC;

-- destination_of and forget_stale_failures run with their caller's rights
-- and now call these: whoever may call them (a role of roles.sql, or one an
-- operator granted) may call what they call, from this migration on, so
-- that a relay of the previous version and the console keep working before
-- roles.sql is run again.
DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN
        SELECT DISTINCT a.grantee, c.callee
          FROM (VALUES ('outbox.destination_of(text, text, jsonb)'::regprocedure,
                        'outbox.url_origin(text)'),
                       ('outbox.destination_of(text, text, jsonb)'::regprocedure,
                        'outbox.punycode(text)'),
                       ('outbox.forget_stale_failures(interval)'::regprocedure,
                        'outbox.expire_probes()')) AS c(caller, callee),
               pg_proc p, aclexplode(p.proacl) a
         WHERE p.oid = c.caller AND a.privilege_type = 'EXECUTE'
           AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I',
                       v_grant.callee, pg_get_userbyid(v_grant.grantee));
    END LOOP;
END
$$;
