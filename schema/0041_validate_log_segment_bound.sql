-- The first segment's CHECKs (schema 0040), validated: each is a read of
-- its table under a lock that lets the enqueues, the claims and the
-- completions go on.
ALTER TABLE outbox.intent_log VALIDATE CONSTRAINT intent_log_first_segment;
ALTER TABLE outbox.log_outcomes VALIDATE CONSTRAINT log_outcomes_first_segment;
