-- A `kafka` intent's record headers are checked as it is enqueued, by every
-- way in (outbox.enqueue, outbox.enqueue_many, INSERT INTO outbox.outbox):
-- the relay would refuse them at the first attempt, and a header a
-- consumer misreads is worse than a refusal the application sees at once.
--
-- - "headers", when present and not null, is an object of string values;
-- - a name is 1 to 1024 printable ASCII characters (space to '~'), without
--   a leading or trailing space (" outbox-effect-key" and names with an
--   invisible character look like another), and not `outbox-effect-key`
--   in any case (the relay's);
-- - a value has no control character (CR, LF, tab, the other C0 and C1
--   characters, DEL): as a malformed trace context never goes out either.
--
-- Refused with 22023, naming the intent's key and the header. A trigger on
-- outbox.intents, before insert, only for `kafka` rows with "headers": the
-- other kinds' rows pay only its WHEN clause.

CREATE FUNCTION outbox.check_kafka_headers()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
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
$$;

REVOKE EXECUTE ON FUNCTION outbox.check_kafka_headers() FROM PUBLIC;

CREATE TRIGGER intents_kafka_headers
    BEFORE INSERT ON outbox.intents
    FOR EACH ROW
    WHEN (NEW.kind = 'kafka' AND NEW.payload ? 'headers')
    EXECUTE FUNCTION outbox.check_kafka_headers();
