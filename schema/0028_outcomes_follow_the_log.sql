-- A log intent's outcome goes with its log row, by a statement trigger
-- rather than a foreign key.
--
-- The foreign key from outbox.log_outcomes to outbox.intent_log checked
-- every outcome written on the hot path: a lookup per row through the
-- referential-integrity trigger, which also locks the log row FOR KEY
-- SHARE and so writes to the page of a row that is otherwise never
-- touched again. The completion that writes an outcome already checks
-- that the log row exists in the same statement. What the foreign key
-- gave besides, its ON DELETE CASCADE, is kept by a trigger that runs
-- once per DELETE statement on the log (retention's purge, the view's
-- DELETE) over the rows that statement removed.
--
-- An outcome written for an intent whose log row a concurrent purge is
-- removing can outlive it: it names an id no intent has, and nothing
-- reads an outcome without its log row.

ALTER TABLE outbox.log_outcomes DROP CONSTRAINT log_outcomes_intent_id_fkey;

CREATE FUNCTION outbox.log_outcomes_follow() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    DELETE FROM outbox.log_outcomes o USING gone WHERE o.intent_id = gone.id;
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.log_outcomes_follow() FROM PUBLIC;

CREATE TRIGGER intent_log_outcomes_follow AFTER DELETE ON outbox.intent_log
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.log_outcomes_follow();
