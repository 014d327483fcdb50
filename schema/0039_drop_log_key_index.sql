-- The log's unique index on the key goes: outbox.intent_keys keeps the
-- key unique (schema 0038), and the enqueue no longer names the index. So
-- do the triggers that copied the keys of the intents an earlier enqueue
-- wrote, with the copy's function and state.
--
-- An enqueue that began before schema 0038 committed runs the earlier text
-- to its end, which names the index and relies on the trigger, so
-- `outbox-relay migrate` applies this only once every transaction that was
-- running when 0038 committed has ended. Dropping the index and the
-- trigger locks the log; the lock is waited for at most 100 ms at a time,
-- so that the claims and the enqueues never queue behind a long wait, for
-- at most a minute.
DO $$
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            LOCK TABLE outbox.intent_log IN ACCESS EXCLUSIVE MODE;
            DROP TRIGGER intent_log_copy_keys ON outbox.intent_log;
            DROP TRIGGER intent_log_copy_changed_keys ON outbox.intent_log;
            ALTER TABLE outbox.intent_log DROP CONSTRAINT intent_log_key_unique;
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.intent_log within a minute'
        USING HINT = 'run outbox-relay migrate again';
END
$$;

DROP FUNCTION outbox.copy_intent_key();
DROP FUNCTION outbox.fill_intent_keys(integer);
DROP TABLE outbox.intent_keys_fill;
