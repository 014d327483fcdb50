-- no-transaction
-- The (state, kind, id) index of every intent gives way to
-- intents_unsettled (0020). Dropped CONCURRENTLY, so that no relay or
-- application waits on the table's lock meanwhile.
DROP INDEX CONCURRENTLY IF EXISTS outbox.intents_state_kind;
