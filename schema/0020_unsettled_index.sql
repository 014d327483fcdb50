-- no-transaction
-- Operators list and count intents by state and kind: every state but
-- `delivered`, which holds most rows and is read in primary-key order
-- instead. Unlike the (state, kind, id) index of every intent it replaces
-- (0021), a delivery leaves it alone, so a completion that delivers writes
-- one index entry fewer (docs/performance.md). Built CONCURRENTLY, outside
-- a transaction, so that relays and applications keep writing intents
-- while it builds on a long history.
CREATE INDEX CONCURRENTLY IF NOT EXISTS intents_unsettled
    ON outbox.intents (state, kind, id) WHERE state <> 'delivered';
