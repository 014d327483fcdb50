#!/usr/bin/env bash
# bench/pgbench/retire-segment.sh: what retention costs Postgres on the
# segments of the log as built (schemas 0042 and 0043), against the
# relay's row-by-row purge of the same intents.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/retire-segment.sh [INTENTS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# writes INTENTS (default 1000000) webhooks delivered at the first attempt
# two days ago into the first segment of the log, with their keys and
# outcomes, as a drain leaves them. It rotates the log (outbox.rotate_log
# until the next segment is open), closes the first segment
# (outbox.close_log_segment), and then:
#   retire   outbox.retire_log_segment: the copy into the ledger, 50,000
#            intents a call, then the drop, each call its own transaction,
#            as the relays make them
# Then it writes as many again, into the next segment, and:
#   rows     the row-by-row purge, as `outbox-relay purge` runs it:
#            PURGE_ROWS and PURGE_LOG from relay/store/retention.rs,
#            batch after batch of 500 (the default [retention]
#            batch_size), each statement committed on its own; then VACUUM
#            of the tables it left dead rows in, which autovacuum would
#            otherwise do
# and prints, for each, the wall time, the server's CPU (its processes'
# time) and WAL per intent, and the rows deleted and dead rows left
# (pg_stat_user_tables). It checks that every key is in the ledger
# afterwards, and that the first segment's tables are gone.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
INTENTS=${1:-1000000}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database retire

PURGE_ROWS=$(statement purge_rows)
PURGE_LOG=$(statement purge_log)
for s in "$PURGE_ROWS" "$PURGE_LOG"; do
	[ -n "$s" ] || { echo "could not read the purge statements from relay/store/retention.rs" >&2; exit 1; }
done

write_intents() { # PREFIX: INTENTS delivered intents, their keys and outcomes
	echo "writing $INTENTS delivered intents ..." >&2
	psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
CREATE TEMPORARY TABLE fresh AS
SELECT nextval('outbox.intent_ids') AS id, '$1:' || g AS key, 'webhook' AS kind,
       jsonb_build_object('url', 'http://127.0.0.1:9/hooks/' || (g % 1000),
                          'body', jsonb_build_object('event', 'order.created', 'order_id', g,
                                                     'customer', 'cus_0123456789', 'amount', 1999,
                                                     'note', 'bench payload padded to about three hundred bytes'))
           AS payload,
       now() - interval '2 days' AS created_at
  FROM generate_series(1, $INTENTS) g;
INSERT INTO outbox.intent_log (id, key, kind, payload, created_at, run_after)
SELECT id, key, kind, payload, created_at, created_at FROM fresh;
INSERT INTO outbox.intent_keys (key, intent_id) SELECT key, id FROM fresh;
INSERT INTO outbox.log_outcomes (intent_id, outcome, owner, started_at, finished_at, status,
                                 provider_ref, replayed, at)
SELECT id, 'delivered', 'bench', created_at, created_at, 200, 'ref-' || id, false, created_at
  FROM fresh;
VACUUM ANALYZE;
CHECKPOINT;
SQL
}
write_intents r

step() { # FUNCTION: one call of it, with a zero interval; prints its answer
	psql -X -At -v ON_ERROR_STOP=1 "$URL" -c "SELECT outbox.$1(interval '0')"
}
for want in made opened moved; do
	got=$(step rotate_log)
	[ "$got" = "$want" ] || { echo "rotate_log answered $got, not $want" >&2; exit 1; }
done
sleep 1.2
got=$(step close_log_segment)
[ "$got" = closed ] || { echo "close_log_segment answered $got" >&2; exit 1; }
psql -X -q "$URL" -c "CHECKPOINT" >/dev/null

deleted() { # SCHEMA: rows deleted and dead rows left, per table
	psql -X -At "$URL" -c "SELECT pg_stat_force_next_flush()" >/dev/null
	sleep 1
	psql -X -At "$URL" -c "SELECT coalesce(string_agg(relname || ' ' || n_tup_del || ' deleted, ' || n_dead_tup || ' dead',
	                                                  '; ' ORDER BY relname), 'none')
	                         FROM pg_stat_user_tables
	                        WHERE schemaname = '$1' AND (n_tup_del > 0 OR n_dead_tup > 0)"
}

echo "  before: $(deleted outbox)"
measure "retire: copy" "
DO \$retire\$
DECLARE
    a text;
    n integer := 0;
BEGIN
    LOOP
        a := outbox.retire_log_segment(interval '0');
        COMMIT;
        EXIT WHEN a <> 'copied';
        n := n + 1;
        EXIT WHEN (SELECT state FROM outbox.log_segments WHERE segment = 0) = 'retiring';
    END LOOP;
    RAISE NOTICE 'copied in % steps, then %', n, a;
END
\$retire\$;"
measure "retire: drop" "
DO \$drop\$
BEGIN
    IF outbox.retire_log_segment(interval '0') <> 'dropped' THEN
        RAISE EXCEPTION 'the drop did not happen';
    END IF;
END
\$drop\$;"
echo "  after:  $(deleted outbox)"

write_intents s

measure "rows: purge" "
DO \$purge\$
DECLARE
    n bigint;
    m bigint;
BEGIN
    LOOP
        EXECUTE \$q\$ $PURGE_ROWS \$q\$ INTO n USING ARRAY['delivered', 'rejected', 'cancelled'], 86400000::bigint, 500::bigint;
        COMMIT;
        EXECUTE \$q\$ $PURGE_LOG \$q\$ INTO m USING ARRAY['delivered', 'rejected', 'cancelled'], 86400000::bigint, 500::bigint;
        COMMIT;
        EXIT WHEN n < 500 AND m < 500;
    END LOOP;
END
\$purge\$;"
echo "  rows: $(deleted outbox)"
measure "rows: vacuum after" "VACUUM outbox.intent_log, outbox.log_outcomes, outbox.ledger, outbox.tally_deltas;"

psql -X -At "$URL" -c "SELECT (SELECT count(*) FROM outbox.ledger), (SELECT count(*) FROM outbox.intent_log),
                              to_regclass('outbox.intent_log_0') IS NULL" |
	awk -F'|' -v n="$INTENTS" '{
		printf "purged keys in the ledger: %s (log left %s), first segment dropped: %s\n", $1, $2, $3
		if ($1 != 2 * n || $2 != 0 || $3 != "t") { print "a purge left intents behind or lost a key" > "/dev/stderr"; exit 1 } }'
