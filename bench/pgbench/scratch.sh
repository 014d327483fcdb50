# shellcheck shell=bash
# bench/pgbench/scratch.sh: sourced by the pgbench scripts beside it. Checks
# for pgbench and a built relay, makes a scratch database named
# outbox_<NAME>_<pid> on the server DATABASE_URL points at, migrates it
# with the relay binary, and drops it (and the work directory) on exit.
#
#   scratch_database NAME    sets URL (the scratch database) and WORK
#   step_tps STEP SECONDS    runs $WORK/STEP.sql with pgbench (one client)
#                            and prints its tps, or says why and exits
#   hold_snapshot            another session opens a REPEATABLE READ
#                            transaction and reads, so that its snapshot
#                            holds back the xmin horizon
#   release_snapshot         ends it
#   statement NAME           the SQL of the relay's statement NAME (its
#                            constant's name in lower case), as the relay
#                            runs it, from target/release/outbox-relay-bench
#   measure NAME SQL         runs SQL once and prints its wall time, the
#                            server's CPU and WAL per intent of $INTENTS
#   server_ticks             the CPU clock ticks the server has spent: its
#                            processes' utime + stime, and the postmaster's
#                            cutime + cstime (its exited children's); needs
#                            root or the server's user, the server on this
#                            machine
#
# REPO_ROOT must be set by the sourcing script.

scratch_database() {
	: "${DATABASE_URL:?set DATABASE_URL to a server the scratch database can be made on}"
	command -v pgbench >/dev/null || { echo "pgbench is missing (Debian: postgresql-client)" >&2; exit 2; }
	local relay="$REPO_ROOT/target/release/outbox-relay"
	[ -x "$relay" ] || relay="$REPO_ROOT/target/debug/outbox-relay"
	[ -x "$relay" ] || { echo "build the relay first: cargo build --release" >&2; exit 2; }
	SCRATCH_DB="outbox_$1_$$"
	URL="${DATABASE_URL%/*}/$SCRATCH_DB"
	WORK=$(mktemp -d)
	trap scratch_cleanup EXIT
	psql -X -q "$DATABASE_URL" -c "CREATE DATABASE $SCRATCH_DB"
	DATABASE_URL="$URL" "$relay" migrate >/dev/null
}

# shellcheck disable=SC2317 # called by the EXIT trap
scratch_cleanup() {
	psql -X -q "$DATABASE_URL" -c "DROP DATABASE IF EXISTS $SCRATCH_DB WITH (FORCE)" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}

step_tps() {
	local tps
	tps=$(pgbench -n -T "$2" -c 1 -f "$WORK/$1.sql" "$URL" 2>"$WORK/err" |
		sed -n 's/^tps = \([0-9.]*\).*/\1/p') || true
	if [ -z "$tps" ]; then
		echo "pgbench failed on $1:" >&2
		tail -n 5 "$WORK/err" >&2
		exit 1
	fi
	echo "$tps"
}

hold_snapshot() {
	mkfifo "$WORK/hold"
	psql -X -q "$URL" <"$WORK/hold" >/dev/null &
	HOLDER=$!
	exec 9>"$WORK/hold"
	echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox.relays;" >&9
	sleep 0.3
}

release_snapshot() {
	echo "ROLLBACK;" >&9
	exec 9>&-
	wait "$HOLDER" || true
	rm -f "$WORK/hold"
}

statement() { # NAME
	local bench="$REPO_ROOT/target/release/outbox-relay-bench"
	[ -x "$bench" ] || {
		echo "build the bench first: cargo build --release -p outbox-relay-bench" >&2
		exit 2
	}
	"$bench" --print-statement "$1"
}

server_ticks() {
	local data postmaster total pid
	data=$(psql -X -At "$URL" -c "SHOW data_directory")
	postmaster=$(head -n 1 "$data/postmaster.pid")
	total=$(awk '{print $14 + $15 + $16 + $17}' "/proc/$postmaster/stat")
	for pid in $(pgrep -P "$postmaster"); do
		total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
	done
	echo "$total"
}

measure() { # NAME SQL...: runs the SQL once on $URL and prints its wall time,
	# the server's CPU and the WAL it wrote, per intent of $INTENTS
	local name=$1 t0 t1 c0 c1 w0 w1 bytes
	shift
	w0=$(psql -X -At "$URL" -c "SELECT pg_current_wal_lsn()")
	c0=$(server_ticks)
	t0=$(date +%s.%N)
	psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<<"$*"
	t1=$(date +%s.%N)
	c1=$(server_ticks)
	w1=$(psql -X -At "$URL" -c "SELECT pg_current_wal_lsn()")
	bytes=$(psql -X -At "$URL" -c "SELECT pg_wal_lsn_diff('$w1', '$w0')")
	awk -v s="$name" -v a="$t0" -v b="$t1" -v c=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v w="$bytes" -v n="$INTENTS" \
		'BEGIN { printf "%-22s %8.1f s %8.1f µs of the server and %6.0f B of WAL per intent\n", s, b - a, c / hz / n * 1e6, w / n }'
}
