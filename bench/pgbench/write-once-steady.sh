#!/usr/bin/env bash
# bench/pgbench/write-once-steady.sh: two of write-once.sh's storages under a
# steady arrival, with and without a snapshot held open for the whole run:
# how long an intent waits from its enqueue to its recorded delivery, and
# what the run leaves dead.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
#     bench/pgbench/write-once-steady.sh [SECONDS] [RATE]
#
# For each of rewrite and ticks (see write-once.sh), plain and held, in a
# scratch database: pgbench enqueues one intent per transaction at RATE
# (default 800) a second for SECONDS (default 70); a second pgbench claims
# and completes up to 100 at a time, 200 times a second at most (a relay
# polling every 5 ms; a ticks claim records its tick first).
# "held" opens a REPEATABLE READ transaction and reads before the load starts
# and ends it after. Prints p50, p99 and the maximum of delivered minus
# enqueued (the rows' own timestamps), intents left undelivered, and the dead
# rows of the storage's tables at the end (pg_stat_user_tables).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECS=${1:-70}
RATE=${2:-800}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database write_once_steady
psql -X -q -v ON_ERROR_STOP=1 "$URL" -f "$REPO_ROOT/bench/pgbench/write-once-storages.sql"
for step in drain-rewrite drain-ticks; do
	sed -n "/^-- step: $step\$/,/^-- end\$/p" "$REPO_ROOT/bench/pgbench/write-once-steps.sql" |
		sed '1d;$d' >"$WORK/$step.sql"
done
PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
for table in outbox.intents ticks.intents; do
	echo "INSERT INTO $table (key, kind, payload) VALUES ('k-' || nextval('public.bench_keys'), 'webhook', '$PAYLOAD');" \
		>"$WORK/enqueue-${table%%.*}.sql"
done

reset() {
	PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<'SQL'
TRUNCATE outbox.intents, ticks.intents, ticks.ticks, ticks.claims, ticks.outcomes CASCADE;
INSERT INTO ticks.ticks (snap) VALUES (pg_current_snapshot());
INSERT INTO ticks.claims (lo_tick, tick, upto_xid, upto_id, owner, fence, lease_expires_at)
SELECT max(tick), max(tick), '0'::xid8, 0, 'start', 0, now() FROM ticks.ticks;
VACUUM ANALYZE;
SQL
}

latencies() { # STORAGE: "p50 p99 max left" in ms
	local q
	case $1 in
	rewrite) q="SELECT extract(epoch FROM delivered_at - created_at) * 1000 AS ms
	              FROM outbox.intents WHERE state = 'delivered'" ;;
	ticks) q="SELECT extract(epoch FROM u.finished - i.created_at) * 1000 AS ms
	            FROM ticks.outcomes o, unnest(o.ids, o.finished) AS u(id, finished)
	            JOIN ticks.intents i ON i.id = u.id" ;;
	esac
	psql -X -At -F ' ' "$URL" -c "
	    WITH l AS ($q)
	    SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
	           round(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
	           round(max(ms)::numeric, 1), count(*) FROM l"
}

printf '%-8s %-5s %9s %9s %9s %9s %7s %9s\n' storage held "p50 ms" "p99 ms" "max ms" delivered left dead
for storage in rewrite ticks; do
	for held in plain held; do
		reset
		# a snapshot taken before the load, held until it ends
		[ "$held" = plain ] || hold_snapshot
		pids=()
		schema=$([ "$storage" = rewrite ] && echo outbox || echo ticks)
		pgbench -n -M prepared -c 1 -R "$RATE" -T "$SECS" -f "$WORK/enqueue-$schema.sql" "$URL" \
			>"$WORK/enq.out" 2>&1 &
		pids+=($!)
		pgbench -n -M prepared -c 1 -R 200 -T "$((SECS + 3))" -f "$WORK/drain-$storage.sql" "$URL" \
			>"$WORK/drain.out" 2>&1 &
		pids+=($!)
		for p in "${pids[@]}"; do wait "$p" || { echo "a pgbench failed:" >&2; tail -n 3 "$WORK"/*.out >&2; exit 1; }; done
		read -r p50 p99 max delivered < <(latencies "$storage")
		enqueued=$(psql -X -At "$URL" -c "SELECT count(*) FROM $schema.intents")
		psql -X -At "$URL" -c "SELECT pg_stat_force_next_flush()" >/dev/null
		sleep 0.6
		dead=$(psql -X -At "$URL" -c "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
		                               WHERE schemaname = '$schema'")
		[ "$held" = plain ] || release_snapshot
		printf '%-8s %-5s %9s %9s %9s %9s %7s %9s\n' "$storage" "$held" "$p50" "$p99" "$max" \
			"$delivered" "$((enqueued - delivered))" "$dead"
	done
done
