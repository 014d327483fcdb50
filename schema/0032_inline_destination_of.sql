-- outbox.destination_of without a SET clause, so that Postgres inlines it
-- into the statements that call it per row (the claim that sets a
-- congested destination's intents aside, the console's filters, the
-- backlog gauge): a function with SET runs as a call of its own each
-- time, about a hundred microseconds. Every name in it is qualified, and
-- pg_catalog is searched first whatever the caller's search_path.
CREATE OR REPLACE FUNCTION outbox.destination_of(p_kind text, p_destination text, p_payload jsonb)
RETURNS text
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
