-- bench/pgbench/batch-span.sql: a claim's batch found by the range of its
-- ids instead of a GIN index of every id, as `--setup-sql` for the bench's
-- drain rounds (docs/performance.md, "The claim's probes and the
-- completion's statements"). Run on a database just migrated:
--
--   bench/statement-costs.sh target/release/outbox-relay-bench 1 50000 \
--     --setup-sql bench/pgbench/batch-span.sql
--
-- Each batch gets its ids' range as a stored column with a GiST index (one
-- entry per batch, where the GIN index writes one per intent), and the GIN
-- index goes. The relay's statements are left as they are: the claim's
-- probes of the batches run only for intents below the high-water mark
-- (none in a drain), and the completion finds the batches it finishes by
-- a scan of the few in flight. What it measures is the write of the
-- batch's index and its reads, not a finished design.
CREATE FUNCTION outbox.id_span(p_ids bigint[]) RETURNS int8range
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT int8range(min(x), max(x), '[]') FROM unnest(p_ids) AS x $$;
ALTER TABLE outbox.log_batches
    ADD COLUMN span int8range GENERATED ALWAYS AS (outbox.id_span(ids)) STORED;
CREATE INDEX log_batches_span ON outbox.log_batches USING gist (span);
DROP INDEX outbox.log_batches_ids;
