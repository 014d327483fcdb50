#!/usr/bin/env bash
# bench/pgbench/publish-cost.sh: what outbox.publish costs the application's
# transaction, against one outbox.enqueue of the same payload, with 1 and
# with 200 subscriptions matching every event.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/publish-cost.sh [SECONDS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# runs pgbench, one client, one call per transaction, SECONDS (default 8)
# per step, three rounds in alternation, for:
#   enqueue       SELECT outbox.enqueue(...) of a webhook, ~300 bytes
#   publish-1     SELECT outbox.publish(...) of the same body, 1 subscription
#   publish-200   the same with 200 subscriptions of the event's tenant
# and prints transactions per second and publish's cost against enqueue's
# (enqueue tps / publish tps). No relay runs: what is measured is the
# application's transaction only (the expansion happens after commit, in
# the relay). Ratios within one run are what count.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_STEP=${1:-8}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database publish_cost

BODY='{"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}'
printf '%s\n' '\set n random(1, 2000000000)' \
	"SELECT * FROM outbox.enqueue('enqueue-' || :n || '-' || :client_id, 'webhook', '{\"url\": \"http://127.0.0.1:9/hook\", \"body\": $BODY}');" \
	>"$WORK/enqueue.sql"
for subs in 1 200; do
	printf '%s\n' '\set n random(1, 2000000000)' \
		"SELECT * FROM outbox.publish('publish-$subs-' || :n || '-' || :client_id, 'order.created', '$BODY', 'acme');" \
		>"$WORK/publish-$subs.sql"
done

# subscriptions of the tenant, matching every type (their secrets are
# never opened here: no relay runs)
subscriptions() {
	psql -X -q "$URL" -c "TRUNCATE outbox.subscriptions;
		INSERT INTO outbox.subscriptions (id, tenant, url, secret)
		SELECT 'sub_bench' || lpad(g::text, 8, '0'), 'acme', 'http://127.0.0.1:9/s' || g, '\\x00'
		  FROM generate_series(1, $1) g;"
}

for round in 1 2 3; do
	enqueue=$(step_tps enqueue "$SECONDS_PER_STEP")
	printf 'round %s  %-12s %10.0f tps\n' "$round" enqueue "$enqueue"
	for subs in 1 200; do
		subscriptions "$subs"
		tps=$(step_tps "publish-$subs" "$SECONDS_PER_STEP")
		printf 'round %s  %-12s %10.0f tps  cost %.2fx enqueue\n' "$round" "publish-$subs" "$tps" \
			"$(awk -v a="$enqueue" -v b="$tps" 'BEGIN { print a / b }')"
	done
done
