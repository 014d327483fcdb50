-- Least privilege: applications need only EXECUTE on outbox.enqueue and
-- outbox.derive_key. enqueue runs with its owner's rights (SECURITY
-- DEFINER, with a fixed search_path), so an application role can write
-- intents without being able to read payloads or change states.
-- deploy/sql/roles.sql creates the application, relay and operator roles.

ALTER FUNCTION outbox.enqueue(text, text, jsonb, text, timestamptz, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, outbox, pg_temp;
ALTER FUNCTION outbox.fingerprint(jsonb) SET search_path = pg_catalog, pg_temp;

REVOKE ALL ON SCHEMA outbox FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA outbox FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA outbox FROM PUBLIC;
