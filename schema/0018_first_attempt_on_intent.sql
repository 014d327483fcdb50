-- A delivery that succeeds at its intent's first attempt, most of them, is
-- recorded on the intent row instead of in a row of its own in
-- outbox.attempts: the completion already rewrites the intent row, and an
-- attempt row costs the database a heap tuple, two index entries and a
-- foreign-key check per intent (about a sixth of Postgres's CPU per
-- delivered intent and a fifth of its WAL; docs/performance.md). Every
-- other attempt (a failure, a retry, a lost lease, a completion the fence
-- refused) keeps its row in outbox.attempts, and relays of earlier
-- versions, which do not know these columns, write a row for every attempt.
--
-- 1. The first attempt's own facts; its attempt number is 1, its outcome
--    `delivered`, and its fence, key generation and provider reference are
--    the intent's own while these columns are set (see 3).
SET LOCAL lock_timeout = '10s';
ALTER TABLE outbox.intents
    ADD COLUMN first_attempt_started_at  timestamptz,
    ADD COLUMN first_attempt_finished_at timestamptz,
    ADD COLUMN first_attempt_owner       text,
    ADD COLUMN first_attempt_status      integer,
    ADD COLUMN first_attempt_replayed    boolean;

-- 2. Every attempt, wherever it is kept: what `show`, the console and SQL
--    read. Columns as outbox.attempts; `id` is NULL for an attempt kept on
--    its intent row.
CREATE VIEW outbox.attempt_history AS
SELECT a.id, a.intent_id, a.attempt, a.fence, a.owner, a.started_at, a.finished_at,
       a.outcome, a.status, a.provider_ref, a.error, a.replayed, a.accepted, a.key_generation
  FROM outbox.attempts a
UNION ALL
SELECT NULL::bigint, i.id, 1, i.fence, i.first_attempt_owner, i.first_attempt_started_at,
       i.first_attempt_finished_at, 'delivered'::text, i.first_attempt_status, i.provider_ref,
       NULL::text, i.first_attempt_replayed, true, i.key_generation
  FROM outbox.intents i
 WHERE i.first_attempt_started_at IS NOT NULL;

-- 3. Before anything changes what the intent row says of that attempt (an
--    operator's retry or resolve, a new claim after it, a new effect's key
--    generation), the attempt moves to outbox.attempts, whoever makes the
--    change and with whatever version: the row then describes only the
--    intent.
CREATE FUNCTION outbox.move_first_attempt()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
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
REVOKE EXECUTE ON FUNCTION outbox.move_first_attempt() FROM PUBLIC;

CREATE TRIGGER intents_move_first_attempt
    BEFORE UPDATE ON outbox.intents
    FOR EACH ROW
    WHEN (OLD.first_attempt_started_at IS NOT NULL
          AND (NEW.state IS DISTINCT FROM OLD.state
               OR NEW.fence IS DISTINCT FROM OLD.fence
               OR NEW.key_generation IS DISTINCT FROM OLD.key_generation
               OR NEW.provider_ref IS DISTINCT FROM OLD.provider_ref))
    EXECUTE FUNCTION outbox.move_first_attempt();
