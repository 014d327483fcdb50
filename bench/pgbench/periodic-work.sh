#!/usr/bin/env bash
# bench/pgbench/periodic-work.sh: what the relay's periodic statements cost
# Postgres beside a large backlog.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/periodic-work.sh [PENDING] [RUNS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# enqueues PENDING (default 1000000) pending webhooks with outbox.enqueue_many,
# 10,000 per call, over 1,000 receivers; one in ten carries an ordering key
# shared by ten intents, so that nine in a hundred wait behind their key's
# first. Then it runs each periodic statement RUNS times (default 5) and prints
# its mean execution time from EXPLAIN ANALYZE and the buffers it read, with
# how often a relay runs it and so what it costs the server per minute:
#   recount   the first fold of the tallies, which counts every live intent
#             once (after the migration, a TRUNCATE; not periodic)
#   fold      outbox.fold_tallies() with nothing changed since the last, and
#   fold+1k   after 1,000 more intents were enqueued and 100 claimed
#             (each relay folds before its gauges, every 5 s)
#   backlog   the destinations' backlog gauge, every 15 s
#             (relay/store/tallies.rs TALLY_BACKLOG)
#   counts    the gauges' counts of the live states by kind, every 5 s
#             (relay/store/tallies.rs TALLY_COUNTS)
#   oldest    the oldest due intent per kind, every 5 s (OLDEST_DUE)
#   next      when the first pending intent comes due, asked by a relay
#             whenever a claim finds nothing (relay/store/claims.rs
#             NEXT_DUE; "every" is the poll interval, at most)
#   stranded  the stranded ordering intents of every key, as `stats` counts
#             them (relay/store/fleet.rs STRANDED)
#   noted     the same over the keys noted for the next sweep, as the gauge
#             counts them every 5 s (STRANDED_NOTED), beside 100 notes
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PENDING=${1:-1000000}
RUNS=${2:-5}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database periodic_work

echo "enqueueing $PENDING pending intents ..." >&2
psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
DO \$\$
DECLARE
    n int := $PENDING;
    b int := 10000;
    lo int;
BEGIN
    FOR lo IN SELECT generate_series(0, n - 1, b) LOOP
        PERFORM outbox.enqueue_many(
            array_agg('p:' || g ORDER BY g),
            array_agg('webhook'::text ORDER BY g),
            array_agg(jsonb_build_object(
                'url', 'https://r' || (g % 1000) || '.example.com/hooks',
                'body', jsonb_build_object('n', g)) ORDER BY g),
            p_ordering_keys => array_agg(CASE WHEN g % 10 = 0 THEN 'k:' || (g / 100) END ORDER BY g))
          FROM generate_series(lo, least(lo + b, n) - 1) g;
        COMMIT;
    END LOOP;
END
\$\$;
VACUUM ANALYZE outbox.intent_log, outbox.intent_rows;
SQL
psql -X -At "$URL" -c "SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE waiting)
                         FROM outbox.intents" |
	awk -F'|' '{printf "%s pending, %s waiting behind their ordering key\n", $1, $2}'

BACKLOG=$(statement tally_backlog)
COUNTS=$(statement tally_counts)
OLDEST=$(statement oldest_due)
STRANDED=$(statement stranded)
NOTED=$(statement stranded_noted)
# its $1, the kinds the relay does not serve: none
NEXT=$(statement next_due | sed "s/\$1::text\[\]/'{}'::text[]/g")
for s in "$BACKLOG" "$COUNTS" "$OLDEST" "$STRANDED" "$NOTED" "$NEXT"; do
	[ -n "$s" ] || { echo "could not read the statements from relay/store" >&2; exit 1; }
done

measure() { # NAME EVERY_SECONDS SQL [SETUP_SQL]
	local total=0 buffers=0 out ms hit
	for _ in $(seq "$RUNS"); do
		[ -z "${4:-}" ] || psql -X -q "$URL" -c "$4" >/dev/null
		out=$(psql -X -At "$URL" -c "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) $3")
		ms=$(echo "$out" | jq '.[0]["Execution Time"]')
		hit=$(echo "$out" | jq '.[0].Plan["Shared Hit Blocks"] + .[0].Plan["Shared Read Blocks"]')
		total=$(echo "$total + $ms" | bc -l)
		buffers=$hit
	done
	awk -v n="$1" -v e="$2" -v t="$total" -v r="$RUNS" -v b="$buffers" \
		'BEGIN { ms = t / r
		         if (e == 0) { printf "%-9s once      %9.1f ms a run  %8d buffers\n", n, ms, b; exit }
		         printf "%-9s every %2d s  %9.1f ms a run  %8d buffers  %7.0f ms of the server a minute\n",
		         n, e, ms, b, ms * 60 / e }'
}
command -v jq >/dev/null || { echo "needs jq (Debian: apt-get install jq)" >&2; exit 2; }
# the first fold counts everything; RUNS=1 for it, as there is one
RUNS_ASKED=$RUNS
RUNS=1 measure recount 0 "SELECT outbox.fold_tallies()"
RUNS=$RUNS_ASKED
# the load's deltas (one per intent with an ordering key, written as each
# got its row) are folded and deleted: autovacuum clears them within a
# minute (the table asks for it after a thousand), as here
psql -X -q "$URL" -c "VACUUM outbox.tally_deltas, outbox.tallies"
measure fold 5 "SELECT outbox.fold_tallies()"
# a claim's batch of 100 (its trigger writes the tallies' delta) and 1,000
# new intents, as between two folds of a busy relay
CHANGE="SELECT count(*) FROM outbox.enqueue_many(
            ARRAY(SELECT 'more:' || gen_random_uuid() FROM generate_series(1, 1000)),
            array_fill('webhook'::text, ARRAY[1000]),
            ARRAY(SELECT jsonb_build_object('url', 'https://r' || g || '.example.com/hooks')
                    FROM generate_series(1, 1000) g));
        INSERT INTO outbox.log_batches (owner, lease_expires_at, ids)
        SELECT 'bench', now() + interval '1 hour', ARRAY(
            SELECT l.id FROM outbox.intent_log l
             WHERE NOT EXISTS (SELECT 1 FROM outbox.intent_rows t WHERE t.id = l.id)
               AND NOT EXISTS (SELECT 1 FROM outbox.log_batches b WHERE b.ids @> ARRAY[l.id])
             ORDER BY l.xid DESC, l.id DESC LIMIT 100);"
measure fold+1k 5 "SELECT outbox.fold_tallies()" "$CHANGE"
measure backlog 15 "$BACKLOG"
measure counts 5 "$COUNTS"
measure oldest 5 "$OLDEST"
measure next 1 "$NEXT"
measure stranded 5 "$STRANDED"
# the notes between two sweeps of a steady enqueue: one per intent enqueued
# waiting within the sweep interval; here the sweep has taken those of the
# load, and a hundred are new
psql -X -q "$URL" -c "DELETE FROM outbox.ordering_rechecks" \
	-c "INSERT INTO outbox.ordering_rechecks (ordering_key) SELECT 'k:' || g FROM generate_series(1, 100) g"
measure noted 5 "$NOTED"
