-- no-transaction
-- The console's overview charts read the last hour and day of attempts.
-- Attempts are appended in time order, so a BRIN index finds that range for
-- the cost of a few pages, and costs the hot path next to nothing (a B-tree
-- on started_at would be one more index entry per attempt). Built
-- CONCURRENTLY, outside a transaction, so that relays keep writing
-- attempts while it builds on a long history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS attempts_started_brin
    ON outbox.attempts USING brin (started_at) WITH (pages_per_range = 32);
