-- no-transaction
-- Validates the kind CHECK that 0010 swapped in NOT VALID. Every row
-- already passed the equal test it replaced, so this only records that;
-- VALIDATE CONSTRAINT takes SHARE UPDATE EXCLUSIVE, so relays and
-- applications keep reading and writing intents while it scans the table.
ALTER TABLE outbox.intents VALIDATE CONSTRAINT intents_kind_shape;
