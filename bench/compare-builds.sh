#!/usr/bin/env bash
# bench/compare-builds.sh: two builds of the relay on the same webhook drain,
# in alternating rounds, by what each costs Postgres per intent.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
#     bench/compare-builds.sh A_BENCH B_BENCH [ROUNDS] [INTENTS] [BENCH_ARGS...]
#
# A_BENCH and B_BENCH are two outbox-relay-bench binaries (for instance
# `target/release/outbox-relay-bench` copied aside before a change, and the
# build after it). Each round runs A, then B (B first in every other round),
# each with `--drain-rounds 1`: a scratch database of its own migrated by that
# build, INTENTS webhooks (default 20000) drained by one `outbox-relay run`
# process, 16 in flight, both in plain text unless DATABASE_URL names an
# sslmode. Prints each round's drain/s, Postgres CPU and WAL bytes per
# intent, then the medians and B's over A's. BENCH_ARGS go to both builds'
# bench (`--in-flight 64`: the relay's default concurrency and room per
# host, against the bench's 16). Needs jq. Ratios within one run
# are what count: the machine is shared.
set -euo pipefail

[ $# -ge 2 ] || {
	echo "usage: $0 A_BENCH B_BENCH [ROUNDS] [INTENTS] [BENCH_ARGS...]" >&2
	exit 2
}
A=$1
B=$2
ROUNDS=${3:-3}
INTENTS=${4:-20000}
shift $(($# < 4 ? $# : 4))
BENCH_ARGS=("$@")
CHECKS_NAME="compare-builds"
# shellcheck source=bench/lib/checks.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/checks.sh"
needs_executables "$A" "$B"
command -v jq >/dev/null || {
	echo "compare-builds: needs jq (Debian: apt-get install jq)" >&2
	exit 2
}
: "${DATABASE_URL:?set DATABASE_URL to the Postgres server to measure on}"
# both builds over the same transport, whatever each one's default
case $DATABASE_URL in
*sslmode=*) ;;
*\?*) export DATABASE_URL="$DATABASE_URL&sslmode=disable" ;;
*) export DATABASE_URL="$DATABASE_URL?sslmode=disable" ;;
esac

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

one() { # LABEL BIN ROUND
	RUST_LOG=error "$2" --intents "$INTENTS" --drain-rounds 1 --json "${BENCH_ARGS[@]}" >"$OUT/$1.$3.json"
	jq -r --arg l "$1" --arg r "$3" '.rounds[0] |
		"\($r)\t\($l)\t\(.drain_per_s | round)\t\(.cpu.postgres_us_per_job * 10 | round / 10)\t\(.cpu.wal_bytes_per_job | round)\t\(.cpu.relay_us_per_job * 10 | round / 10)"' \
		"$OUT/$1.$3.json" | tee -a "$OUT/rows.tsv"
}

printf 'round\tbuild\tdrain/s\tPostgres µs\tWAL B\trelay µs\n'
for r in $(seq 1 "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then
		one A "$A" "$r"
		one B "$B" "$r"
	else
		one B "$B" "$r"
		one A "$A" "$r"
	fi
done

median() { # BUILD COLUMN
	awk -F'\t' -v b="$1" -v c="$2" '$2 == b { print $c }' "$OUT/rows.tsv" | sort -g |
		awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
printf '\nmedians\tdrain/s\tPostgres µs\tWAL B\trelay µs\n'
for b in A B; do
	printf '%s\t%s\t%s\t%s\t%s\n' "$b" "$(median "$b" 3)" "$(median "$b" 4)" "$(median "$b" 5)" "$(median "$b" 6)"
done
awk -v d="$(median B 3)/$(median A 3)" -v p="$(median B 4)/$(median A 4)" -v w="$(median B 5)/$(median A 5)" \
	'BEGIN { split(d, x, "/"); split(p, y, "/"); split(w, z, "/");
	         printf "B over A\t%.2fx\t%.2fx\t%.2fx\n", x[1] / x[2], y[1] / y[2], z[1] / z[2] }'
