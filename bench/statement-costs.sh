#!/usr/bin/env bash
# bench/statement-costs.sh: what each statement of a webhook drain costs
# Postgres per intent, by the server's own counters (pg_stat_statements):
# shared buffers touched, execution time and WAL records.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:55433/postgres \
#     bench/statement-costs.sh BENCH [ROUNDS] [INTENTS] [BENCH_ARGS...]
#
# BENCH is an outbox-relay-bench binary; each round runs one drain of
# INTENTS webhooks (default 50000) with `--drain-rounds 1 --in-flight 64`
# (IN_FLIGHT=16 for the bench's default instead) and BENCH_ARGS, then
# prints the round's totals and its five costliest statements (the
# enqueue, the bench's own TRUNCATE and the scratch database's creation
# left out). Buffers touched do not depend on how busy
# the machine is, where times do: they are the figure to compare two builds
# by. The server must load the extension (`shared_preload_libraries =
# 'pg_stat_statements'`): a private cluster (`tests/peers/pg-cluster.sh
# start NAME`, the line added to its postgresql.conf, `pg-cluster.sh
# restart DIR`), never a shared server, since the counters are reset.
# Planning is counted only with `pg_stat_statements.track_planning = on`
# there as well (zero otherwise).
# Needs psql and jq.
set -euo pipefail

[ $# -ge 1 ] || {
	echo "usage: $0 BENCH [ROUNDS] [INTENTS] [BENCH_ARGS...]" >&2
	exit 2
}
BENCH=$1
ROUNDS=${2:-1}
INTENTS=${3:-50000}
shift $(($# < 3 ? $# : 3))
BENCH_ARGS=("$@")
CHECKS_NAME="statement-costs"
# shellcheck source=bench/lib/checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/checks.sh"
needs_executables "$BENCH"
needs_tools psql jq
: "${DATABASE_URL:?set DATABASE_URL to a private cluster that loads pg_stat_statements}"
loaded=$(psql "$DATABASE_URL" -Atc "SHOW shared_preload_libraries")
case $loaded in
*pg_stat_statements*) ;;
*)
	echo "statement-costs: the server does not load pg_stat_statements (shared_preload_libraries = '$loaded')" >&2
	exit 2
	;;
esac
psql "$DATABASE_URL" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# the drain's statements: not the enqueue, not the bench's setup
OURS="query NOT LIKE '%outbox.enqueue%' AND query NOT LIKE 'TRUNCATE%'
      AND query NOT LIKE 'CREATE%' AND query NOT LIKE 'DROP%'
      AND query NOT LIKE '%pg_stat_statements%'"
for r in $(seq 1 "$ROUNDS"); do
	# the bench resets the counters as its round starts (the enqueue is left
	# out by OURS)
	RUST_LOG=error "$BENCH" --intents "$INTENTS" --drain-rounds 1 --in-flight "${IN_FLIGHT:-64}" --json \
		"${BENCH_ARGS[@]}" >"$OUT/round.json"
	jq -r --arg r "$r" '.rounds[0] | "round \($r): \(.drain_per_s | round) intents/s, Postgres \(.cpu.postgres_us_per_job * 10 | round / 10) µs and \(.cpu.wal_bytes_per_job | round) B of WAL per intent"' \
		"$OUT/round.json"
	psql "$DATABASE_URL" -At -F $'\t' -c "
	  SELECT 'per intent', round(sum(shared_blks_hit + shared_blks_read) / $INTENTS.0, 1) || ' buffers',
	         round((sum(total_exec_time) * 1000 / $INTENTS)::numeric, 1) || ' µs executing',
	         round((sum(total_plan_time) * 1000 / $INTENTS)::numeric, 1) || ' µs planning',
	         round(sum(wal_records) / $INTENTS.0, 2) || ' WAL records'
	    FROM pg_stat_statements WHERE $OURS"
	printf 'buffers\tµs\tplanning µs\tcalls\tplans\trows/call\tstatement\n'
	psql "$DATABASE_URL" -At -F $'\t' -c "
	  SELECT round((shared_blks_hit + shared_blks_read) / $INTENTS.0, 1),
	         round((total_exec_time * 1000 / $INTENTS)::numeric, 1),
	         round((total_plan_time * 1000 / $INTENTS)::numeric, 1), calls, plans,
	         round(rows::numeric / greatest(calls, 1), 1),
	         left(regexp_replace(query, '\s+', ' ', 'g'), 70)
	    FROM pg_stat_statements WHERE $OURS
	   ORDER BY shared_blks_hit + shared_blks_read DESC LIMIT 5"
done
