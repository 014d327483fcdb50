#!/usr/bin/env bash
# bench/relay-instructions.sh: the instructions the relay process executes
# per webhook it delivers, counted by callgrind: a figure that does not move
# with how busy the machine is, where its CPU time does
# (docs/performance.md, "What a job costs the machine").
#
#   bench/relay-instructions.sh BENCH [BENCH...]
#
# Starts a private cluster (tests/peers/pg-cluster.sh) and a loopback
# receiver that answers every POST with 200 (python3's http.server, HTTP/1.1
# keep-alive). For each BENCH (an outbox-relay-bench binary, run as
# `outbox-relay`), twice: a database migrated by that build, holding
# SMALL, then LARGE webhooks with the bench's payload, drained by one
# `outbox-relay run` under `valgrind --tool=callgrind` (16 in flight, the
# other settings the product's defaults), stopped with SIGTERM once every
# intent is delivered. The difference of the two runs over LARGE - SMALL
# intents is the figure: start-up, the first plans and the shutdown fall
# out. Under callgrind the process runs one thread at a time, some fifty
# times slower, so its claims and completions carry other counts than in a
# drain at full speed: compare builds with one another, not with a drain.
#
#   SMALL (default 1000), LARGE (default 3000): the two drains' sizes.
#
# Needs valgrind, psql and python3, and root or the server's user to run the
# server. Takes about three minutes per build.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
[ $# -ge 1 ] || {
	echo "usage: $0 BENCH [BENCH...]" >&2
	exit 2
}
CHECKS_NAME="relay-instructions"
# shellcheck source=bench/lib/checks.sh
. "$REPO_ROOT/bench/lib/checks.sh"
needs_tools valgrind psql python3
needs_executables "$@"
SMALL=${SMALL:-1000}
LARGE=${LARGE:-3000}
[ "$LARGE" -gt "$SMALL" ] || {
	echo "relay-instructions: LARGE ($LARGE) must be more than SMALL ($SMALL)" >&2
	exit 2
}
export PGOPTIONS="-c client_min_messages=warning"

CLUSTER=$("$REPO_ROOT/tests/peers/pg-cluster.sh" start relay-instructions)
ADMIN=$(sed -n 1p <<<"$CLUSTER")
DIR=$(sed -n 2p <<<"$CLUSTER")
WORK=$(mktemp -d)
RECEIVER=""
RELAY=""
cleanup() {
	[ -z "$RELAY" ] || kill "$RELAY" 2>/dev/null || true
	[ -z "$RECEIVER" ] || kill "$RECEIVER" 2>/dev/null || true
	"$REPO_ROOT/tests/peers/pg-cluster.sh" stop "$DIR" >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT
# plain text, as bench/compare-builds.sh measures (the relay's default
# would be TLS where the server offers it)
url_of() { echo "${ADMIN%/*}/$1?sslmode=disable"; }

# the receiver: its port on its first line of output
python3 -u - >"$WORK/receiver.out" 2>"$WORK/receiver.err" <<'EOF' &
import http.server

class Hook(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
print(server.server_address[1])
server.serve_forever()
EOF
RECEIVER=$!
for _ in $(seq 1 50); do
	[ -s "$WORK/receiver.out" ] && break
	sleep 0.1
done
PORT=$(head -n 1 "$WORK/receiver.out")
[ -n "$PORT" ] || {
	cat "$WORK/receiver.err" >&2
	echo "relay-instructions: the receiver did not start" >&2
	exit 1
}

# the instructions of one relay draining $2 webhooks into a fresh database,
# migrated by build $1
instructions() {
	local bench=$1 n=$2 db delivered
	db=$(url_of relay_instructions)
	psql -X -q "$ADMIN?sslmode=disable" -c "DROP DATABASE IF EXISTS relay_instructions" \
		-c "CREATE DATABASE relay_instructions"
	env -i PATH="$PATH" OUTBOX_RELAY_BENCH_RUN_AS_RELAY=1 DATABASE_URL="$db" RUST_LOG=error \
		"$bench" migrate >/dev/null
	psql -X -q "$db" -c "
	  SELECT count(*) FROM (
	    SELECT outbox.enqueue('instructions-' || g, 'webhook',
	           jsonb_build_object('url', 'http://127.0.0.1:$PORT/hook', 'body', jsonb_build_object(
	             'event', 'order.created', 'order_id', g, 'customer', 'cus_0123456789',
	             'amount', 1999, 'currency', 'usd',
	             'items', jsonb_build_array(jsonb_build_object('sku', 'SKU-42', 'qty', 1)),
	             'note', 'bench payload padded to about three hundred bytes')))
	      FROM generate_series(1, $n) g) e" >/dev/null
	psql -X -q "$db" -c "VACUUM ANALYZE"
	env -i PATH="$PATH" OUTBOX_RELAY_BENCH_RUN_AS_RELAY=1 DATABASE_URL="$db" RUST_LOG=error \
		OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS='["127.0.0.1/32"]' \
		OUTBOX_RELAY__RELAY__CONCURRENCY=16 OUTBOX_RELAY__WEBHOOK__MAX_IN_FLIGHT_PER_HOST=16 \
		OUTBOX_RELAY__RELAY__METRICS_ADDR='"127.0.0.1:0"' \
		valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
		"$bench" run >/dev/null 2>"$WORK/relay.err" </dev/null &
	RELAY=$!
	delivered=0
	for _ in $(seq 1 1200); do
		kill -0 "$RELAY" 2>/dev/null || {
			tail -n 5 "$WORK/relay.err" >&2
			echo "relay-instructions: the relay exited before it delivered $n" >&2
			exit 1
		}
		delivered=$(psql -X -At "$db" -c "SELECT count(*) FROM outbox.intents WHERE state = 'delivered'")
		[ "$delivered" -ge "$n" ] && break
		sleep 1
	done
	[ "$delivered" -ge "$n" ] || {
		echo "relay-instructions: $delivered of $n delivered in 20 minutes" >&2
		exit 1
	}
	kill -TERM "$RELAY"
	wait "$RELAY" || true
	RELAY=""
	sed -n 's/^summary: //p' "$WORK/cg.out"
}

for BENCH in "$@"; do
	small=$(instructions "$BENCH" "$SMALL")
	large=$(instructions "$BENCH" "$LARGE")
	printf '%s: %d instructions per webhook delivered (%d for %d, %d for %d)\n' "$BENCH" \
		$(((large - small) / (LARGE - SMALL))) "$small" "$SMALL" "$large" "$LARGE"
done
