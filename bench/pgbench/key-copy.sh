#!/usr/bin/env bash
# bench/pgbench/key-copy.sh: how long `outbox-relay migrate` takes to copy
# the keys of a deployment's earlier intents into outbox.intent_keys
# (schema 0037), and how long each of its transactions holds.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/key-copy.sh [INTENTS] [LEDGER]
#
# In a scratch database (migrated with the relay binary, then dropped):
# INTENTS intents in the log (default 1,000,000) and LEDGER purged keys in
# the ledger (default 200,000), outbox.intent_keys emptied, and the copy's
# state table and function put back from schema/0037_intent_keys.sql; then
# `SELECT outbox.fill_intent_keys(10000)`, each call its own transaction as
# migrate makes them, until it answers true. Prints the total, the keys
# copied per second and the longest call.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
INTENTS=${1:-1000000}
LEDGER=${2:-200000}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database key_copy
PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42}}'

# the copy's state and function, as schema 0037 makes them
sed -n '/^CREATE TABLE outbox.intent_keys_fill/,/^REVOKE EXECUTE/p' \
	"$REPO_ROOT/schema/0037_intent_keys.sql" | sed '$d' | sed '/^CREATE TRIGGER/,/EXECUTE FUNCTION outbox.copy_intent_key();/d' \
	>"$WORK/copy.sql"
psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
INSERT INTO outbox.intent_log (key, kind, payload)
SELECT 'old-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, $INTENTS) g;
INSERT INTO outbox.ledger (key, intent_id, kind, fingerprint, state, created_at, completed_at)
SELECT 'gone-' || g, -g, 'webhook', '\x00', 'delivered', now(), now()
  FROM generate_series(1, $LEDGER) g;
TRUNCATE outbox.intent_keys;
\i $WORK/copy.sql
VACUUM ANALYZE outbox.intent_log, outbox.ledger;
SQL

start=$(date +%s.%N)
longest=0
calls=0
while :; do
	t0=$(date +%s.%N)
	done=$(psql -X -At "$URL" -c "SELECT outbox.fill_intent_keys(10000)")
	t1=$(date +%s.%N)
	calls=$((calls + 1))
	longest=$(awk -v a="$longest" -v b="$(awk -v x="$t0" -v y="$t1" 'BEGIN { print y - x }')" 'BEGIN { print (b > a) ? b : a }')
	[ "$done" = t ] && break
done
end=$(date +%s.%N)
copied=$(psql -X -At "$URL" -c "SELECT count(*) FROM outbox.intent_keys")
awk -v s="$start" -v e="$end" -v n="$copied" -v c="$calls" -v l="$longest" 'BEGIN {
	printf "copied %d keys in %.1f s (%.0f keys/s), %d calls, the longest %.0f ms (psql included)\n",
		n, e - s, n / (e - s), c, l * 1000 }'
