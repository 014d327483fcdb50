#!/usr/bin/env bash
# bench/pgbench/bulk-enqueue-attribution.sh: what one outbox.enqueue_many of
# 1,000 rows costs against writing the same rows with a plain INSERT.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/bulk-enqueue-attribution.sh [SECONDS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# runs pgbench, one client, SECONDS (default 8) per step, two rounds in
# alternation; every transaction writes 1,000 new rows of about 310 bytes
# built by the server (the same generate_series in every step):
#   plain      INSERT ... SELECT into a table with an identity key and a
#              unique key
#   intents    INSERT ... SELECT into outbox.intents itself
#   many       SELECT outbox.enqueue_many(...) (this schema's)
#   many-0006  the same through enqueue_many as migration 0006 wrote it,
#              installed beside it as outbox.enqueue_many_0006
# and prints rows per second. Ratios within one run are what count (these
# machines are noisy); docs/performance.md has a run.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_STEP=${1:-8}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database bulk_attribution
psql -X -q -v ON_ERROR_STOP=1 "$URL" <<'SQL'
CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text UNIQUE NOT NULL,
                    kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now());
SQL
# the 0006 function, renamed, beside the current one
sed -n '/^CREATE FUNCTION outbox.enqueue_many(/,/^\$\$;/p' "$REPO_ROOT/schema/0006_enqueue_many_and_outbox_view.sql" |
	sed 's/^CREATE FUNCTION outbox.enqueue_many(/CREATE FUNCTION outbox.enqueue_many_0006(/' |
	psql -X -q -v ON_ERROR_STOP=1 "$URL"

ROWS="generate_series(1, 1000) g"
KEY="'%s-' || :b || '-' || :client_id || '-' || g"
PAYLOAD="('{\"url\": \"http://127.0.0.1:9/hook\", \"body\": {\"event\": \"order.created\", \"order_id\": ' || g || ', \"customer\": \"cus_0123456789\", \"amount\": 1999, \"currency\": \"usd\", \"items\": [{\"sku\": \"SKU-42\", \"qty\": 1}], \"note\": \"bench payload padded to about three hundred bytes\"}}')::jsonb"
write() { # name, statement
	printf '%s\n' '\set b random(1, 2000000000)' "$2" >"$WORK/$1.sql"
}
# shellcheck disable=SC2059 # KEY is a format with the step's prefix
for table in plain outbox.intents; do
	name=${table#outbox.}
	write "$name" "INSERT INTO $table (key, kind, payload) SELECT $(printf "$KEY" "$name"), 'webhook', $PAYLOAD FROM $ROWS;"
done
# shellcheck disable=SC2059
for fn in many:enqueue_many many-0006:enqueue_many_0006; do
	name=${fn%%:*}
	write "$name" "SELECT count(*) FROM outbox.${fn#*:}(ARRAY(SELECT $(printf "$KEY" "$name") FROM $ROWS), array_fill('webhook'::text, ARRAY[1000]), ARRAY(SELECT $PAYLOAD FROM $ROWS));"
done

for round in 1 2; do
	for step in plain intents many many-0006; do
		tps=$(step_tps "$step" "$SECONDS_PER_STEP")
		printf 'round %s  %-10s %10.0f rows/s\n' "$round" "$step" "$(awk -v t="$tps" 'BEGIN { print t * 1000 }')"
	done
done
