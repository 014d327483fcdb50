#!/usr/bin/env bash
# bench/pgbench/destination-view.sh: what the gate's reread of the unhealthy
# destinations costs beside many destinations (every relay runs it every
# half second while it delivers; relay/store/destinations.rs `UNHEALTHY_SQL`).
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/destination-view.sh [ORIGINS] [SECONDS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# writes ORIGINS (default 100000) rows of outbox.destinations: 20 paused or
# open, 2000 closed with 3 failures an hour old (origins that refused a few
# intents, past the failure window and not yet pruned), the rest closed and
# healthy (rate-limit buckets, counts reset by a success). It prints the
# plan and time of
#   before  the reread as it was: every row not closed, with failures or
#           slowed down, whenever that was
#   after   UNHEALTHY_SQL: the same through the partial index, recent
#           failures only, bounded
#   pruned  UNHEALTHY_SQL after outbox.forget_stale_failures, which the
#           relays run about every minute
# each with EXPLAIN (ANALYZE, BUFFERS) and pgbench's statements per second
# over SECONDS (default 5), one client.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ORIGINS=${1:-100000}
SECONDS_EACH=${2:-5}
[ "$ORIGINS" -ge 3000 ] || { echo "ORIGINS must be at least 3000" >&2; exit 2; }
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database destination_view
psql -X -q -v ON_ERROR_STOP=1 -v origins="$ORIGINS" "$URL" <<'SQL'
INSERT INTO outbox.destinations (name, state, failures, paused_at, opened_at, next_probe_at, updated_at)
SELECT format('https://o%s.example', g),
       CASE WHEN g <= 10 THEN 'paused' WHEN g <= 20 THEN 'open' ELSE 'closed' END,
       CASE WHEN g <= 20 THEN 0 WHEN g <= 2020 THEN 3 ELSE 0 END,
       CASE WHEN g <= 10 THEN now() END,
       CASE WHEN g BETWEEN 11 AND 20 THEN now() END,
       CASE WHEN g BETWEEN 11 AND 20 THEN now() + interval '30 seconds' END,
       now() - interval '1 hour'
  FROM generate_series(1, :origins) g;
UPDATE outbox.destinations SET tokens = 5, refilled_at = now() - interval '1 hour'
 WHERE failures = 0 AND state = 'closed';
VACUUM ANALYZE outbox.destinations;
SQL
cat >"$WORK/before.sql" <<'SQL'
SELECT name, state, failures, last_error, opened_at, next_probe_at, probe_until,
       paused_by, paused_at, slow_until
  FROM outbox.destinations
 WHERE state <> 'closed' OR failures > 0 OR slow_until > now();
SQL
# relay/store/destinations.rs UNHEALTHY_SQL, with the default failure window (10m) and VIEW_MAX
cat >"$WORK/after.sql" <<'SQL'
SELECT name, state, failures, last_error, opened_at, next_probe_at,
        probe_until, paused_by, paused_at, slow_until
   FROM outbox.destinations
  WHERE (state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL)
    AND (state <> 'closed' OR slow_until > now()
         OR (failures > 0 AND updated_at > now() - interval '10 minutes'))
  ORDER BY state = 'paused' DESC, state = 'closed', updated_at DESC
  LIMIT 10000;
SQL
measure() {
	echo "== $1"
	psql -X -q "$URL" -c "EXPLAIN (ANALYZE, BUFFERS) $(cat "$WORK/$2.sql")" |
		grep -E 'Scan|rows=|Buffers|Execution Time' | sed 's/^ *//' | head -n 8
	echo "statements per second: $(step_tps "$2" "$SECONDS_EACH")"
}
# the schema before 0015 had no index for the reread
psql -X -q "$URL" -c "ALTER INDEX outbox.destinations_unhealthy RENAME TO destinations_unhealthy_off" \
	-c "UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'outbox.destinations_unhealthy_off'::regclass"
measure "before: $ORIGINS destinations, 2000 with stale failures, no index" before
psql -X -q "$URL" -c "UPDATE pg_index SET indisvalid = true WHERE indexrelid = 'outbox.destinations_unhealthy_off'::regclass" \
	-c "ALTER INDEX outbox.destinations_unhealthy_off RENAME TO destinations_unhealthy"
measure "after: the same rows" after
psql -X -q -At "$URL" -c "SELECT 'forget_stale_failures changed ' || outbox.forget_stale_failures(interval '10 minutes') || ' rows'"
# as autovacuum would, soon after
psql -X -q "$URL" -c "VACUUM ANALYZE outbox.destinations"
measure "pruned: after outbox.forget_stale_failures" after
