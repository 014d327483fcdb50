#!/usr/bin/env bash
# deploy/demo.sh: the relay end to end, on this machine, in about a minute.
#
#   deploy/demo.sh [--keep]
#
# Builds the relay and a demo webhook receiver (the binaries alone), uses
# $DATABASE_URL when it is set and answers (else a scratch PostgreSQL cluster),
# enqueues three webhooks (one succeeds, one fails twice then succeeds, one is
# refused with 410) plus a duplicate, runs the relay until they settle, and
# prints what the operator commands show. The scratch cluster is removed on
# exit unless --keep is given (or, at a terminal, you answer yes when asked):
# then it stays up, and the script ends with how to look at it.
set -euo pipefail

KEEP=0
for arg in "$@"; do
	case $arg in
	--keep) KEEP=1 ;;
	-h | --help)
		sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "demo.sh: unknown argument '$arg' (try --help)" >&2
		exit 2
		;;
	esac
done

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO_ROOT"
LOG_PREFIX=demo.sh
# shellcheck source=deploy/lib/scratch-pg.sh
. "$REPO_ROOT/deploy/lib/scratch-pg.sh"

WORK="$REPO_ROOT/.scratch/demo"
CONFIG="$WORK/demo.toml"
RELAY_LOG="$WORK/relay.log"
RECEIVER_PID=""
RELAY_PID=""

stop_pid() {
	[ -n "$1" ] && kill -0 "$1" 2>/dev/null || return 0
	kill -TERM "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
cleanup() {
	stop_pid "$RELAY_PID"
	stop_pid "$RECEIVER_PID"
	scratch_pg_stop
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Print a command the way a user would type it.
show_cmd() {
	local a line='$ outbox-relay'
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_./:=@,-]+$ ]]; then
			line+=" $a"
		else
			line+=" '$a'"
		fi
	done
	printf '\n%s\n' "$line"
}
relay() { RUST_LOG="${RUST_LOG:-warn}" "$RELAY" --config "$CONFIG" "$@"; }
run_cli() {
	show_cmd "$@"
	relay "$@"
}

# "KEY STATE" for each of this run's intents (parses `list --json`, which
# prints one intent object per 2-space-indented block).
intent_states() {
	relay list --json --limit 500 | awk -v run=":$RUN_ID" '
		/^  \{/ { key = ""; state = "" }
		/^    "key": "/ { key = $0; sub(/^    "key": "/, "", key); sub(/",?$/, "", key) }
		/^    "state": "/ { state = $0; sub(/^    "state": "/, "", state); sub(/",?$/, "", state) }
		/^  \}/ {
			n = length(key) - length(run)
			if (n > 0 && substr(key, n + 1) == run) print key, state
		}'
}

have cargo || die "cargo is not on PATH: install Rust (rustup) first"
# shellcheck source=deploy/lib/build-tools.sh
. "$REPO_ROOT/deploy/lib/build-tools.sh"
ensure_build_tools
say "building: cargo build --locked -p outbox-relay -p outbox-demo-receiver --bins"
cargo build --locked -p outbox-relay -p outbox-demo-receiver --bins
BIN_DIR="${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug"
RELAY="$BIN_DIR/outbox-relay"
RECEIVER="$BIN_DIR/demo-receiver"

scratch_pg_setup pg-demo

mkdir -p "$WORK"
rm -f "$WORK/receiver.port"
"$RECEIVER" --port-file "$WORK/receiver.port" &
RECEIVER_PID=$!
for ((i = 0; i < 100; i++)); do
	[ -s "$WORK/receiver.port" ] && break
	kill -0 "$RECEIVER_PID" 2>/dev/null || die "the demo receiver exited"
	sleep 0.1
done
[ -s "$WORK/receiver.port" ] || die "the demo receiver did not report its port within 10s"
PORT=$(cat "$WORK/receiver.port")
say "demo receiver listening on 127.0.0.1:$PORT"

cat >"$CONFIG" <<'EOF'
# Written by deploy/demo.sh.
[relay]
concurrency = 16
poll_interval = "200ms"
sweep_interval = "1s"
metrics_addr = "127.0.0.1:0"

[retry]
schedule = ["1s"]

[webhook]
allowed_networks = ["127.0.0.1/32"]
timeout = "5s"
EOF
say "relay configuration: ${CONFIG#"$REPO_ROOT"/}"

# A run id in every key, so that reruns against the same database are fresh.
RUN_ID=$(date +%s)
K1="demo:order-1001:confirmation:$RUN_ID"
K2="demo:order-1002:confirmation:$RUN_ID"
K3="demo:order-1003:confirmation:$RUN_ID"
[ "$SCRATCH_PG_EXTERNAL" = 1 ] &&
	say "intents are left in that database afterwards, under keys demo:*:$RUN_ID"

enqueue() { # KEY PATH ORDER
	run_cli enqueue --key "$1" --kind webhook \
		--payload "{\"url\":\"http://127.0.0.1:$PORT$2\",\"body\":{\"event\":\"order.confirmed\",\"order\":$3}}"
}
run_cli migrate
enqueue "$K1" /ok 1001
enqueue "$K2" /flaky 1002
enqueue "$K3" /gone 1003
say "the same intent again: the relay's enqueue is idempotent"
enqueue "$K1" /ok 1001

echo
say "starting: outbox-relay run (log: ${RELAY_LOG#"$REPO_ROOT"/})"
NO_COLOR=1 RUST_LOG="${RUST_LOG:-info}" "$RELAY" --config "$CONFIG" run >"$RELAY_LOG" 2>&1 &
RELAY_PID=$!

settled=0
for ((i = 0; i < 120; i++)); do
	sleep 0.5
	if ! kill -0 "$RELAY_PID" 2>/dev/null; then
		tail -n 20 "$RELAY_LOG" >&2 || true
		die "the relay exited early (log above)"
	fi
	states=$(intent_states || true)
	total=$(grep -c . <<<"$states" || true)
	open=$(grep -cE ' (pending|claimed)$' <<<"$states" || true)
	if [ "$total" -eq 3 ] && [ "$open" -eq 0 ]; then
		settled=1
		break
	fi
done
if [ "$settled" = 1 ]; then
	say "all three intents settled after about $(((i + 1) / 2))s; stopping the relay (SIGTERM)"
else
	say "warning: the intents did not settle within 60s; stopping the relay (SIGTERM)"
fi
kill -TERM "$RELAY_PID"
relay_status=0
wait "$RELAY_PID" || relay_status=$?
RELAY_PID=""
say "relay exited with status $relay_status"

run_cli list --limit 10
run_cli show "$K2"
run_cli stats
echo

# Check the outcome the demo promises.
states=$(intent_states || true)
expect() { # KEY STATE
	local got
	got=$(awk -v k="$1" '$1 == k { print $2 }' <<<"$states")
	if [ "$got" = "$2" ]; then
		say "ok: $1 is $2"
	else
		say "unexpected: $1 is ${got:-missing}, expected $2"
		failed=1
	fi
}
failed=0
expect "$K1" delivered
expect "$K2" delivered
expect "$K3" rejected
if [ "$failed" = 0 ] && [ "$relay_status" = 0 ]; then
	say "demo finished: one delivery, one delivery after two 503s, one 410 rejection, one duplicate"
else
	say "demo finished with unexpected results (relay log: ${RELAY_LOG#"$REPO_ROOT"/})"
	exit 1
fi

# Keep the database to look at it: --keep, or yes at a terminal.
if [ "$KEEP" = 0 ] && [ -n "${SCRATCH_PG_DIR:-}" ] && [ -t 0 ] && [ -t 1 ]; then
	printf '\nKeep the demo database running to look at it? [y/N] '
	answer=""
	read -r -t 60 answer || true
	case $answer in [yY]*) KEEP=1 ;; esac
fi
if [ -n "${SCRATCH_PG_DIR:-}" ] && [ "$KEEP" = 0 ]; then
	say "the scratch database is removed on exit; deploy/demo.sh --keep leaves it running"
	exit 0
fi
kept_dir=${SCRATCH_PG_DIR:-}
if [ -n "$kept_dir" ]; then
	# the cleanup leaves a kept cluster alone
	SCRATCH_PG_DIR=""
	rm -f "$SCRATCH_PG_LOCK"
	SCRATCH_PG_LOCK=""
fi
cat <<NEXT

Look at it (the relay is stopped; outbox-relay run starts it again):

  export DATABASE_URL=$DATABASE_URL
  export PATH="$BIN_DIR:\$PATH"
  outbox-relay list                     # newest first
  outbox-relay show '$K3'
  outbox-relay retry '$K3' --dry-run    # what a retry would touch
  outbox-relay stats
  outbox-relay console                  # the operator console, http://127.0.0.1:9188
NEXT
if [ -n "$kept_dir" ]; then
	cat <<NEXT

Stop and remove the kept database when you are done:

  ${SCRATCH_PG_USER:+runuser -u $SCRATCH_PG_USER -- }$PG_CTL -D $kept_dir -m fast stop && rm -rf $kept_dir
NEXT
fi
