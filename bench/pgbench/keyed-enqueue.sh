#!/usr/bin/env bash
# bench/pgbench/keyed-enqueue.sh: what `outbox.enqueue` costs when every key
# lives in one narrow table of its own and the intent goes into the
# segment of a partitioned log that takes the inserts, by name, against
# `outbox.enqueue` as it is and a plain INSERT.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/keyed-enqueue.sh [SECONDS] [ROUNDS]
#
# In a scratch database (migrated with the relay binary, then dropped):
#   plain    INSERT into a table with an identity key and a unique key
#   enqueue  SELECT outbox.enqueue(...): the key into outbox.intent_keys,
#            then the intent into the log of one table
#   keyed    SELECT ks.enqueue(...): outbox.enqueue's own text with its
#            tables renamed: the key into ks.intent_keys, then the intent
#            into ks.intent_log_head, the newest segment of ks.intent_log
#            (partitioned by range of id, no index on the key, the log's
#            triggers)
#   routed   the same with the intent inserted into ks.intent_log, which
#            Postgres routes to the segment its id names
# Each table holds 300,000 older intents first. pgbench, one client, one
# intent per transaction, new keys, SECONDS (default 8) per step, ROUNDS
# (default 3) rounds in alternation; prints transactions per second and
# the server's CPU per enqueue (its processes' time). Ratios within one
# run are what count.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_STEP=${1:-8}
ROUNDS=${2:-3}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database keyed_enqueue
PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'

# outbox.enqueue's text, writing the ks tables, as ks.enqueue
psql -X -At "$URL" -c "SELECT pg_get_functiondef('outbox.enqueue(text, text, jsonb, text, timestamptz, text, text, text, text)'::regprocedure)" \
	>"$WORK/enqueue.def"
python3 - "$WORK/enqueue.def" "$WORK/keyed.def" <<'PY'
import sys
out = open(sys.argv[1]).read()
for old, new in [('FUNCTION outbox.enqueue(', 'FUNCTION ks.enqueue('),
                 ("nextval('outbox.intent_ids')", "nextval('ks.intent_ids')"),
                 ('INSERT INTO outbox.intent_log (', 'INSERT INTO ks.intent_log_head ('),
                 ('FROM outbox.intent_log i', 'FROM ks.intent_log i')]:
    assert out.count(old) == 1, old
    out = out.replace(old, new)
out = out.replace('outbox.intent_keys', 'ks.intent_keys')
open(sys.argv[2], 'w').write(out)
routed = out.replace('FUNCTION ks.enqueue(', 'FUNCTION ks.enqueue_routed(', 1)
routed = routed.replace('INSERT INTO ks.intent_log_head (', 'INSERT INTO ks.intent_log (', 1)
open(sys.argv[2], 'a').write(';\n' + routed)
PY

psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text UNIQUE NOT NULL,
                    kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now());
CREATE SCHEMA ks;
CREATE SEQUENCE ks.intent_ids MINVALUE 1 START 4294967296;
CREATE TABLE ks.intent_log (LIKE outbox.intent_log INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (id);
ALTER TABLE ks.intent_log ADD PRIMARY KEY (id);
CREATE INDEX ON ks.intent_log (xid, id);
CREATE INDEX ON ks.intent_log (created_at) WHERE kind = 'event';
CREATE TABLE ks.intent_log_0 PARTITION OF ks.intent_log FOR VALUES FROM (MINVALUE) TO (4294967296);
CREATE TABLE ks.intent_log_head PARTITION OF ks.intent_log
    FOR VALUES FROM (4294967296) TO (8589934592);
CREATE TABLE ks.intent_keys (key text PRIMARY KEY, intent_id bigint NOT NULL);
CREATE TRIGGER intent_log_kafka_headers BEFORE INSERT ON ks.intent_log FOR EACH ROW
    WHEN (new.kind = 'kafka' AND new.payload ? 'headers') EXECUTE FUNCTION outbox.check_kafka_headers();
CREATE TRIGGER intent_log_track AFTER INSERT ON ks.intent_log FOR EACH ROW
    WHEN (new.ordering_key IS NOT NULL OR new.waiting OR new.run_after > new.created_at)
    EXECUTE FUNCTION outbox.log_track();

INSERT INTO plain (key, kind, payload)
SELECT 'old-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, 300000) g;
INSERT INTO outbox.intent_log (key, kind, payload)
SELECT 'old-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, 300000) g;
INSERT INTO outbox.intent_keys SELECT key, id FROM outbox.intent_log;
INSERT INTO ks.intent_log_0 (id, key, kind, payload)
SELECT g, 'old-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, 300000) g;
INSERT INTO ks.intent_keys SELECT key, id FROM ks.intent_log_0;
\i $WORK/keyed.def
VACUUM ANALYZE plain, outbox.intent_log, ks.intent_log, ks.intent_keys;
SQL

for step in plain enqueue keyed routed; do
	case $step in
	plain) call="INSERT INTO plain (key, kind, payload) VALUES ('plain-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" ;;
	enqueue) call="SELECT * FROM outbox.enqueue('enqueue-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" ;;
	keyed) call="SELECT * FROM ks.enqueue('keyed-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" ;;
	routed) call="SELECT * FROM ks.enqueue_routed('routed-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" ;;
	esac
	printf '%s\n' '\set n random(1, 2000000000)' "$call" >"$WORK/$step.sql"
done

HZ=$(getconf CLK_TCK)
for round in $(seq 1 "$ROUNDS"); do
	for step in plain enqueue keyed routed; do
		c0=$(server_ticks)
		tps=$(step_tps "$step" "$SECONDS_PER_STEP")
		c1=$(server_ticks)
		n=$(awk -v t="$tps" -v s="$SECONDS_PER_STEP" 'BEGIN { printf "%d", t * s }')
		awk -v r="$round" -v st="$step" -v tps="$tps" -v c=$((c1 - c0)) -v hz="$HZ" -v n="$n" \
			'BEGIN { printf "round %s  %-8s %8.0f tps %8.1f µs of the server per enqueue\n", r, st, tps, c / hz / n * 1e6 }'
	done
done
# the keyed enqueues went into the newest segment, each with its key
psql -X -At "$URL" -c "SELECT 'newest segment: ' || count(*) || ' intents, '
                              || (SELECT count(*) FROM ks.intent_keys
                                   WHERE key LIKE 'keyed-%' OR key LIKE 'routed-%') || ' keys'
                         FROM ks.intent_log_head"
