-- no-transaction
-- The console's chart of attempts per minute reads the first attempts kept
-- on intent rows (0018) by their start, as it reads outbox.attempts: a
-- block-range index, which costs a completion next to nothing (a B-tree
-- would be one more index entry per delivered intent). Built CONCURRENTLY,
-- outside a transaction, so that relays and applications keep writing
-- intents while it builds on a long history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS intents_first_attempt_brin
    ON outbox.intents USING brin (first_attempt_started_at) WITH (pages_per_range = 32);
