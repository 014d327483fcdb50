#!/usr/bin/env bash
# bench/pgbench/write-once.sh: what each candidate storage costs Postgres per
# intent on its hot path (enqueue, claim, completion of a delivery at the
# first attempt), in CPU, WAL and dead rows, with and without a snapshot held
# open by another session.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
#     bench/pgbench/write-once.sh [INTENTS] [ROUNDS] [HELD]
#
# In a scratch database (migrated with the relay binary, then dropped), each
# storage in turn, ROUNDS (default 3) times, alternating:
#   1. enqueues INTENTS (default 20000) intents, 100 per transaction,
#   2. drains them with the claim and the completion of the storage, 100
#      intents per statement, each statement committed on its own as the
#      engine's are (pgbench, one client).
# HELD=held (default: both) runs the drain while another session holds a
# REPEATABLE READ snapshot taken before the enqueue, as a long report would;
# HELD=plain runs without it.
#
# The storages:
#   rewrite   outbox.intents as migrated: the claim and the completion each
#             rewrite the intent row (the engine's statements, without the
#             kind and ordering clauses)
#   receipts  the intent row is written once; a claim appends a narrow
#             receipt per intent (fence, owner, lease) and a completion a
#             narrow outcome per intent; a claim finds unclaimed intents from
#             a cursor row per lane by an anti-join with the receipts (after
#             awa's queue storage, hardbyte/awa docs/adr/019)
#   ticks     the intent row is written once with its transaction id; a
#             claim records a tick (its snapshot) and takes the next intents
#             committed between two ticks in (xid, id) order, appending one
#             row per claim (the range, fence, owner, lease); a completion
#             appends one row per statement holding the batch's outcomes as
#             arrays (after PgQ / PgQue's batches cut by snapshot ticks)
#
# Postgres CPU is the utime + stime of the server's processes (the
# postmaster's children, and what its exited children left in its cutime):
# on a server nothing else uses (tests/peers/pg-cluster.sh start NAME), it is
# the storage's. WAL is pg_current_wal_lsn() before and after. Needs root or
# the server's user, to read the server's /proc entries.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
INTENTS=${1:-20000}
ROUNDS=${2:-3}
HELD=${3:-both}
[ "$INTENTS" -ge 100 ] || { echo "INTENTS must be at least 100" >&2; exit 2; }
case $HELD in plain | held | both) ;; *) echo "HELD is plain, held or both" >&2; exit 2 ;; esac
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database write_once
psql -X -q -v ON_ERROR_STOP=1 "$URL" -f "$REPO_ROOT/bench/pgbench/write-once-storages.sql"
for step in enqueue-rewrite enqueue-receipts enqueue-ticks \
	drain-rewrite drain-receipts drain-ticks; do
	sed -n "/^-- step: $step\$/,/^-- end\$/p" "$REPO_ROOT/bench/pgbench/write-once-steps.sql" |
		sed '1d;$d' >"$WORK/$step.sql"
	[ -s "$WORK/$step.sql" ] || { echo "no step $step in write-once-steps.sql" >&2; exit 1; }
done

wal() { psql -X -At "$URL" -c "SELECT pg_current_wal_lsn() - '0/0'"; }

reset() {
	PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<'SQL'
TRUNCATE outbox.intents, receipts.intents, ticks.intents, ticks.ticks, ticks.claims,
         ticks.outcomes CASCADE;
TRUNCATE receipts.claims, receipts.outcomes;
UPDATE receipts.cursor SET next_id = 1;
INSERT INTO ticks.ticks (snap) VALUES (pg_current_snapshot());
INSERT INTO ticks.claims (lo_tick, tick, upto_xid, upto_id, owner, fence, lease_expires_at)
SELECT max(tick), max(tick), '0'::xid8, 0, 'start', 0, now() FROM ticks.ticks;
VACUUM ANALYZE;
CHECKPOINT;
SQL
}

left_over() { # STORAGE: intents not delivered
	case $1 in
	rewrite) psql -X -At "$URL" -c "SELECT count(*) FROM outbox.intents WHERE state <> 'delivered'" ;;
	receipts) psql -X -At "$URL" -c "SELECT count(*) FROM receipts.intents i
	                                  WHERE NOT EXISTS (SELECT 1 FROM receipts.outcomes o
	                                                     WHERE o.intent_id = i.id AND o.state = 'delivered')" ;;
	ticks) psql -X -At "$URL" -c "SELECT count(*) FROM ticks.intents i
	                               WHERE NOT EXISTS (SELECT 1 FROM ticks.outcomes o
	                                                  WHERE i.id = ANY(o.ids))" ;;
	esac
}

dead_rows() { # STORAGE: dead tuples left in its tables, from pg_stat_user_tables
	psql -X -At "$URL" -c "SELECT pg_stat_force_next_flush(); SELECT pg_sleep(0.6);" >/dev/null
	psql -X -At "$URL" -c "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
	                        WHERE schemaname = '$([ "$1" = rewrite ] && echo outbox || echo "$1")'"
}

# One phase of one storage: prints "seconds ticks wal_bytes"
phase() { # STEP TRANSACTIONS
	local c0 c1 w0 w1 t0 t1
	c0=$(server_ticks)
	w0=$(wal)
	t0=$(date +%s.%N)
	pgbench -n -M prepared -c 1 -t "$2" -f "$WORK/$1.sql" "$URL" >"$WORK/out" 2>"$WORK/err" ||
		{ echo "pgbench failed on $1:" >&2; tail -n 5 "$WORK/err" >&2; exit 1; }
	t1=$(date +%s.%N)
	w1=$(wal)
	c1=$(server_ticks)
	echo "$(echo "$t1 - $t0" | bc) $((c1 - c0)) $((w1 - w0))"
}

HZ=$(getconf CLK_TCK)
printf '%-5s %-5s %-8s | %9s %10s %9s | %9s %10s %9s %8s\n' round held storage \
	"enq/s" "enq µs" "enq WAL" "drain/s" "drain µs" "drain WAL" dead
holds=(plain held)
[ "$HELD" = both ] || holds=("$HELD")
for round in $(seq "$ROUNDS"); do
	for held in "${holds[@]}"; do
		for storage in rewrite receipts ticks; do
			reset
			# a snapshot taken before the load, held until it ends
			[ "$held" = plain ] || hold_snapshot
			read -r es et ew < <(phase "enqueue-$storage" $((INTENTS / 100)))
			# statistics of the loaded tables, as autovacuum keeps them, so
			# that no storage's claim is planned for an empty table
			psql -X -q "$URL" -c "ANALYZE"
			# a claim and a completion per transaction pair; a few more
			# claims than needed find nothing and cost what an idle poll does
			read -r ds dt dw < <(phase "drain-$storage" $((INTENTS / 100 + 2)))
			left=$(left_over "$storage")
			[ "$left" = 0 ] || { echo "$storage: $left intents were left undelivered" >&2; exit 1; }
			dead=$(dead_rows "$storage")
			[ "$held" = plain ] || release_snapshot
			awk -v r="$round" -v h="$held" -v s="$storage" -v n="$INTENTS" -v hz="$HZ" \
				-v es="$es" -v et="$et" -v ew="$ew" -v ds="$ds" -v dt="$dt" -v dw="$dw" -v dead="$dead" \
				'BEGIN { printf "%-5s %-5s %-8s | %9.0f %10.1f %9.0f | %9.0f %10.1f %9.0f %8d\n",
				         r, h, s, n / es, et / hz / n * 1e6, ew / n, n / ds, dt / hz / n * 1e6, dw / n, dead }'
		done
	done
done
