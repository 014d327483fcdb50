-- The log and the first-attempt outcomes become tables partitioned by
-- range of intent id (schema 0042), each partition a segment of the log
-- that retention retires whole. The tables as they are become the first
-- segment, which ends at the first multiple of 2^32 more than 2^31 above
-- every id the sequence has given (a rotation opens the next segment by
-- the time the sequence is 2^31 ids from a segment's end): a segment
-- covers 2^32 ids, and a rotation moves the sequence to the next
-- segment's first id.
--
-- Attaching a table as a partition scans it for rows outside the range
-- unless a validated CHECK proves there are none. This migration adds the
-- CHECKs unvalidated, which locks each table only for a moment; schema
-- 0041 validates them, which reads the tables without blocking their
-- writers. The lock is waited for at most 100 ms at a time, so that the
-- claims and the enqueues never queue behind a long wait, 600 times.
CREATE TABLE outbox.log_first_segment (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    ends bigint NOT NULL
);

COMMENT ON TABLE outbox.log_first_segment IS
    'Where the log''s first segment ends, while the log is partitioned (schemas 0040 to 0042)';

INSERT INTO outbox.log_first_segment (ends)
SELECT (((greatest(s.last_value,
                   (SELECT coalesce(max(id), 0) FROM outbox.intent_log),
                   (SELECT coalesce(max(intent_id), 0) FROM outbox.log_outcomes))
           + (1::bigint << 31)) >> 32) + 1) << 32
  FROM outbox.intent_ids s;

DO $$
DECLARE
    v_ends bigint := (SELECT ends FROM outbox.log_first_segment);
BEGIN
    FOR i IN 1 .. 600 LOOP
        BEGIN
            SET LOCAL lock_timeout = '100ms';
            EXECUTE format('ALTER TABLE outbox.intent_log ADD CONSTRAINT intent_log_first_segment'
                           ' CHECK (id < %s) NOT VALID', v_ends);
            EXECUTE format('ALTER TABLE outbox.log_outcomes ADD CONSTRAINT log_outcomes_first_segment'
                           ' CHECK (intent_id < %s) NOT VALID', v_ends);
            SET LOCAL lock_timeout TO DEFAULT;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            PERFORM pg_sleep(0.01 * (i % 10));
        END;
    END LOOP;
    RAISE EXCEPTION 'could not lock outbox.intent_log in 600 tries of 100 ms'
        USING HINT = 'run outbox-relay migrate again';
END
$$;
