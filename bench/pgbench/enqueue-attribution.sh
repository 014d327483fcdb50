#!/usr/bin/env bash
# bench/pgbench/enqueue-attribution.sh: where the cost of one
# outbox.enqueue (one per transaction) goes, against a plain INSERT.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/enqueue-attribution.sh [SECONDS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# runs pgbench, one client, SECONDS (default 8) per step, two rounds in
# alternation, for:
#   plain     INSERT into a table with an identity key and a unique key
#   columns   the same into a table with outbox.intents' columns, defaults
#             and CHECK constraints, but only its primary and unique keys
#   indexes   that table with the other indexes of outbox.intents too
#   intents   INSERT into outbox.intents itself
#   enqueue   SELECT outbox.enqueue(...)
# and prints transactions per second. Ratios within one run are what
# count (these machines are noisy); docs/performance.md has a run.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_STEP=${1:-8}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database enqueue_attribution
psql -X -q "$URL" <<'SQL'
CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text UNIQUE NOT NULL,
                    kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now());
CREATE TABLE columns (LIKE outbox.intents INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY);
ALTER TABLE columns ADD PRIMARY KEY (id), ADD UNIQUE (key);
CREATE TABLE indexes (LIKE outbox.intents INCLUDING ALL);
SQL

PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
for table in plain columns indexes outbox.intents; do
	name=${table#outbox.}
	printf '%s\n' '\set n random(1, 2000000000)' \
		"INSERT INTO $table (key, kind, payload) VALUES ('$name-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
		>"$WORK/$name.sql"
done
printf '%s\n' '\set n random(1, 2000000000)' \
	"SELECT * FROM outbox.enqueue('enqueue-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
	>"$WORK/enqueue.sql"

for round in 1 2; do
	for step in plain columns indexes intents enqueue; do
		tps=$(step_tps "$step" "$SECONDS_PER_STEP")
		printf 'round %s  %-8s %10.0f tps\n' "$round" "$step" "$tps"
	done
done
