-- The operator console.
--
-- outbox.error_class(last_error): the class a failure is grouped under on
-- /failures and filtered by (`class`): "HTTP 503" where the error names an
-- HTTP status, else the error without its leading "VERB <target>" and with
-- its numbers as N, cut at 60 characters and trimmed (never empty). One definition, so that a group's
-- count and the intents its action touches are the same set.
CREATE FUNCTION outbox.error_class(p_error text)
RETURNS text
LANGUAGE sql
IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN p_error IS NULL THEN 'no error recorded'
        WHEN p_error ~ 'HTTP [0-9]{3}' THEN substring(p_error FROM 'HTTP [0-9]{3}')
        ELSE coalesce(nullif(btrim(left(regexp_replace(regexp_replace(p_error, '^[A-Z]+ [^ ]+:? ', ''),
                                                       '[0-9]+', 'N', 'g'), 60)), ''), 'no error text')
    END
$$;
REVOKE ALL ON FUNCTION outbox.error_class(text) FROM PUBLIC;
