-- The highest id the claims of the log have taken, so that a claim probes
-- only the intents that may have been taken before.
--
-- An intent gets an outcome (outbox.log_outcomes) or a place in a batch
-- (outbox.log_batches) only once a claim has taken it. So a log intent
-- whose id is above every outcome's and above every id a batch holds has
-- neither, and the claim skips the two probes for it: the outcomes' primary
-- key and the batches' GIN index, two of the three it made for every
-- intent it looked at. The mark is two reads of an index end per claim:
-- max(intent_id) of the outcomes, and max(max_id) of the batches.
--
-- A batch keeps its highest id in max_id. The claim writes it; a relay of
-- an earlier release, running beside this schema during an upgrade, does
-- not, and a trigger fills it in for its batches.
--
-- It changes a table relays use while it runs: it takes the batches' lock
-- with a wait shorter than Postgres's deadlock check, and tries again, for
-- at most a minute. The table holds only the claims in flight.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            LOCK TABLE outbox.log_batches IN ACCESS EXCLUSIVE MODE;
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.log_batches within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;

ALTER TABLE outbox.log_batches ADD COLUMN max_id bigint;
UPDATE outbox.log_batches SET max_id = (SELECT max(x) FROM unnest(ids) AS x);

CREATE FUNCTION outbox.log_batch_max_id() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    NEW.max_id := (SELECT max(x) FROM unnest(NEW.ids) AS x);
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.log_batch_max_id() FROM PUBLIC;

CREATE TRIGGER log_batches_max_id BEFORE INSERT ON outbox.log_batches
    FOR EACH ROW WHEN (NEW.max_id IS NULL) EXECUTE FUNCTION outbox.log_batch_max_id();

ALTER TABLE outbox.log_batches ALTER COLUMN max_id SET NOT NULL;
CREATE INDEX log_batches_max_id ON outbox.log_batches (max_id);
