#!/usr/bin/env bash
# bench/pgbench/claim-cycle.sh: the instructions Postgres executes per
# intent on the hot path of a drain (a claim of 100 intents from the log,
# committed, then their two completions of 50), counted by callgrind: a
# figure that does not move with how busy the machine is, where CPU time
# does (docs/performance.md, "Instructions per intent").
#
#   bench/pgbench/claim-cycle.sh BENCH [BENCH...]
#
# Starts a private cluster (tests/peers/pg-cluster.sh) and runs its server
# under `valgrind --tool=callgrind`. For each BENCH (an outbox-relay-bench
# binary of this or a later commit): a database migrated by that build,
# holding 52,000 webhooks enqueued as the bench's drain enqueues them, the
# first 2,000 claimed and delivered by the cycle below, then analyzed; the
# build's own statements (`--print-statement log_claim` and `log_complete`,
# their parameters written in) run by pgbench on one connection, 10 and
# then 40 cycles, each in a fresh copy of that database. The difference
# over 30 cycles of 100 intents is the figure: instructions per intent of
# the claim alone and of the whole cycle, the completions being the rest.
# Connection start-up and first plans fall out of the difference. Commits
# write WAL, but what the kernel does for them is not counted, nor the
# server's background processes (autovacuum, the WAL writer).
#
# Needs valgrind, pgbench and psql (Debian: valgrind, postgresql-client), and
# root or the server's user to run the server. Takes about a minute per build.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ $# -ge 1 ] || {
	echo "usage: $0 BENCH [BENCH...]" >&2
	exit 2
}
CHECKS_NAME="claim-cycle"
# shellcheck source=bench/lib/checks.sh
. "$REPO_ROOT/bench/lib/checks.sh"
needs_tools valgrind pgbench psql perl
needs_executables "$@"
LOG_PREFIX="claim-cycle"
export PGOPTIONS="-c client_min_messages=warning"
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh"

CLUSTER=$("$REPO_ROOT/tests/peers/pg-cluster.sh" start claim-cycle)
ADMIN=$(sed -n 1p <<<"$CLUSTER")
DIR=$(sed -n 2p <<<"$CLUSTER")
WORK=$(mktemp -d)
chmod 777 "$WORK"
cleanup() {
	"$REPO_ROOT/tests/peers/pg-cluster.sh" stop "$DIR" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

# the same cluster, its server under callgrind: one profile per process,
# written as the process exits
find_pg_server || die "no PostgreSQL server binaries found"
SCRATCH_PG_USER=$(stat -c %U "$DIR")
[ "$SCRATCH_PG_USER" != root ] || SCRATCH_PG_USER=""
PORT=$(sed -n 4p "$DIR/postmaster.pid")
as_pg_user "$PG_CTL" -D "$DIR" -m fast -w stop >/dev/null
as_pg_user valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.%p" \
	"$(dirname "$PG_CTL")/postgres" -D "$DIR" -p "$PORT" >"$WORK/server.log" 2>&1 &
for _ in $(seq 1 120); do
	psql -X -q "$ADMIN" -c "SELECT 1" >/dev/null 2>&1 && break
	sleep 1
done
psql -X -q "$ADMIN" -c "SELECT 1" >/dev/null || die "the server under callgrind did not start ($WORK/server.log)"
url_of() { echo "${ADMIN%/*}/$1"; }

profiles() { find "$WORK" -maxdepth 1 -name 'cg.*' -printf '%f\n' | sort; }

# instructions of the one connection that runs $1 $2 times, in a fresh
# copy of the database cycle_tpl
instructions() {
	local before f
	psql -X -q "$ADMIN" -c "DROP DATABASE IF EXISTS cycle" -c "CREATE DATABASE cycle TEMPLATE cycle_tpl"
	before=$(profiles)
	pgbench -n -M prepared -c 1 -t "$2" -f "$1" "$(url_of cycle)" >"$WORK/pgbench.log" 2>&1 || {
		tail -n 5 "$WORK/pgbench.log" >&2
		exit 1
	}
	for _ in $(seq 1 30); do
		for f in $(comm -13 <(echo "$before") <(profiles)); do
			# the backend pgbench used: the one that planned
			if grep -q pg_plan_query "$WORK/$f"; then
				sed -n 's/^summary: //p' "$WORK/$f"
				return
			fi
		done
		sleep 1
	done
	die "no profile of pgbench's connection appeared"
}

for BENCH in "$@"; do
	psql -X -q "$ADMIN" -c "DROP DATABASE IF EXISTS cycle_tpl" -c "CREATE DATABASE cycle_tpl"
	RUST_LOG=error OUTBOX_RELAY_BENCH_RUN_AS_RELAY=1 DATABASE_URL=$(url_of cycle_tpl) \
		"$BENCH" migrate >/dev/null
	psql -X -q "$(url_of cycle_tpl)" -c "
	  SELECT count(*) FROM (
	    SELECT outbox.enqueue('cycle-' || g, 'webhook',
	           jsonb_build_object('url', 'http://127.0.0.1:9/hook', 'body', jsonb_build_object(
	             'event', 'order.created', 'order_id', g, 'customer', 'cus_0123456789',
	             'amount', 1999, 'currency', 'usd',
	             'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-42', 'qty', 1)),
	             'note', 'bench payload padded to about three hundred bytes')))
	      FROM generate_series(1, 52000) g) e" >/dev/null
	# the claim's parameters: 100 intents, an owner, a lease of a minute; the
	# completions': the newest batch's first and last 50 ids, delivered now
	"$BENCH" --print-statement log_claim |
		perl -pe "s/\\\$1\b/100/g; s/\\\$2\b/'cycle'/g; s/\\\$3\b/60000/g" >"$WORK/claim.sql"
	{
		echo "BEGIN;"
		echo "SELECT pg_advisory_xact_lock(20291, 0), set_config('jit', 'off', true);"
		cat "$WORK/claim.sql"
		echo ";"
		echo "COMMIT;"
	} >"$WORK/claim-only.sql"
	cp "$WORK/claim-only.sql" "$WORK/cycle.sql"
	for half in "1:50" "51:100"; do
		"$BENCH" --print-statement log_complete | perl -pe "
		  s/\\\$1\b/(SELECT ids[$half] FROM outbox.log_batches ORDER BY batch DESC LIMIT 1)/g;
		  s/\\\$[23]\b/array_fill(now(), ARRAY[50])/g;
		  s/\\\$4\b/array_fill(200, ARRAY[50])/g;
		  s/\\\$5\b/array_fill(NULL::text, ARRAY[50])/g;
		  s/\\\$6\b/array_fill(false, ARRAY[50])/g;
		  s/\\\$7\b/'cycle'/g;
		  s/\\\$8\b/(SELECT array[batch] FROM outbox.log_batches ORDER BY batch DESC LIMIT 1)/g"
		echo ";"
	done >>"$WORK/cycle.sql"
	# 2,000 of them delivered first, so that the plans are made beside
	# outcomes and batches, as a relay's are: planned beside empty tables,
	# each probe of them would be a scan
	pgbench -n -M prepared -c 1 -t 20 -f "$WORK/cycle.sql" "$(url_of cycle_tpl)" >"$WORK/pgbench.log" 2>&1 || {
		tail -n 5 "$WORK/pgbench.log" >&2
		exit 1
	}
	psql -X -q "$(url_of cycle_tpl)" -c "VACUUM ANALYZE"
	claim=$((($(instructions "$WORK/claim-only.sql" 40) - $(instructions "$WORK/claim-only.sql" 10)) / 3000))
	cycle=$((($(instructions "$WORK/cycle.sql" 40) - $(instructions "$WORK/cycle.sql" 10)) / 3000))
	left=$(psql -X -At "$(url_of cycle)" -c "SELECT count(*) FROM outbox.log_batches")
	[ "$left" = 0 ] || die "the completions left $left batches: they did not finish what the claims took"
	printf '%s: claim %d, completions %d, cycle %d instructions per intent\n' \
		"$BENCH" "$claim" $((cycle - claim)) "$cycle"
done
