#!/usr/bin/env bash
# bench/pgbench/write-once-enqueue.sh: what keeping an intent's key unique
# costs one enqueue when the intents live in partitions that retention
# drops, against a plain INSERT and against the log's own insert.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/write-once-enqueue.sh [SECONDS]
#
# A unique index of a partitioned table must hold the partition key, so a
# key cannot be unique across partitions by an index. The candidate takes a
# transaction-scoped advisory lock on the key's hash (two enqueues of one
# key wait for each other), probes every partition's index on the key, and
# inserts. In a scratch database (migrated with the relay binary, then
# dropped), pgbench, one client, SECONDS (default 8) per step, two rounds in
# alternation, one intent per transaction, new keys:
#   plain      INSERT into a table with an identity key and a unique key
#   log        the key into outbox.intent_keys (ON CONFLICT DO NOTHING), then
#              the intent into outbox.intent_log, as outbox.enqueue writes one
#   probed     tk.enqueue(): the lock, the probe and the INSERT, into four
#              partitions of 100,000 intents (the newest takes the inserts)
#              with a primary key, a key index and an (xid, id) index
#   keyed      tk.enqueue_keyed(): the key into one narrow table of every
#              key (its primary key, as awa keeps unique jobs' keys), then
#              the INSERT into the same partitions without their key index
#   enqueue    SELECT outbox.enqueue(...), for scale
# and prints transactions per second and the server's CPU per transaction
# (its processes' time, as write-once.sh reads it). Ratios within one run
# are what count; the CPU is steadier than the rate on a shared machine.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SECONDS_PER_STEP=${1:-8}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database write_once_enqueue
PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'
psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
CREATE TABLE plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, key text UNIQUE NOT NULL,
                    kind text NOT NULL, payload jsonb NOT NULL, created_at timestamptz DEFAULT now());
CREATE SCHEMA tk;
CREATE SEQUENCE tk.ids;
CREATE TABLE tk.intents (
    id bigint NOT NULL DEFAULT nextval('tk.ids'),
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    key text NOT NULL CHECK (length(key) BETWEEN 1 AND 512),
    kind text NOT NULL CHECK (length(kind) <= 64 AND kind ~ '^[a-z][a-z0-9_.-]*\$'),
    destination text,
    payload jsonb NOT NULL,
    ordering_key text,
    run_after timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    source text,
    traceparent text,
    tracestate text,
    PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE INDEX ON tk.intents (key);
CREATE INDEX ON tk.intents (xid, id);
CREATE TABLE tk.intents_1 PARTITION OF tk.intents FOR VALUES FROM (1) TO (100000001);
CREATE TABLE tk.intents_2 PARTITION OF tk.intents FOR VALUES FROM (100000001) TO (200000001);
CREATE TABLE tk.intents_3 PARTITION OF tk.intents FOR VALUES FROM (200000001) TO (300000001);
CREATE TABLE tk.intents_4 PARTITION OF tk.intents FOR VALUES FROM (300000001) TO (400000001);
INSERT INTO tk.intents (id, key, kind, payload)
SELECT p * 100000000 + g, 'old-' || p || '-' || g, 'webhook', '$PAYLOAD'
  FROM generate_series(0, 3) p, generate_series(1, 100000) g;
SELECT setval('tk.ids', 300100001);
CREATE TABLE tk.keyed (LIKE tk.intents INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id);
ALTER TABLE tk.keyed ADD PRIMARY KEY (id);
CREATE INDEX ON tk.keyed (xid, id);
CREATE TABLE tk.keyed_1 PARTITION OF tk.keyed FOR VALUES FROM (1) TO (100000001);
CREATE TABLE tk.keyed_2 PARTITION OF tk.keyed FOR VALUES FROM (100000001) TO (200000001);
CREATE TABLE tk.keyed_3 PARTITION OF tk.keyed FOR VALUES FROM (200000001) TO (300000001);
CREATE TABLE tk.keyed_4 PARTITION OF tk.keyed FOR VALUES FROM (300000001) TO (400000001);
CREATE TABLE tk.keys (key text PRIMARY KEY, id bigint NOT NULL);
INSERT INTO tk.keyed SELECT * FROM tk.intents;
INSERT INTO tk.keys SELECT key, id FROM tk.intents;
VACUUM ANALYZE tk.intents, tk.keyed, tk.keys;
CREATE FUNCTION tk.enqueue(p_key text, p_kind text, p_payload jsonb)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql AS \$\$
DECLARE
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_key, 0));
    SELECT i.id INTO v_id FROM tk.intents i WHERE i.key = p_key;
    IF FOUND THEN
        RETURN QUERY SELECT v_id, true;
        RETURN;
    END IF;
    INSERT INTO tk.intents (key, kind, payload) VALUES (p_key, p_kind, p_payload)
    RETURNING tk.intents.id INTO v_id;
    RETURN QUERY SELECT v_id, false;
END
\$\$;
CREATE FUNCTION tk.enqueue_keyed(p_key text, p_kind text, p_payload jsonb)
RETURNS TABLE (id bigint, duplicate boolean)
LANGUAGE plpgsql AS \$\$
DECLARE
    v_id bigint := nextval('tk.ids');
BEGIN
    INSERT INTO tk.keys (key, id) VALUES (p_key, v_id) ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        RETURN QUERY SELECT k.id, true FROM tk.keys k WHERE k.key = p_key;
        RETURN;
    END IF;
    INSERT INTO tk.keyed (id, key, kind, payload) VALUES (v_id, p_key, p_kind, p_payload);
    RETURN QUERY SELECT v_id, false;
END
\$\$;
SQL

printf '%s\n' '\set n random(1, 2000000000)' \
	"INSERT INTO plain (key, kind, payload) VALUES ('plain-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
	>"$WORK/plain.sql"
printf '%s\n' '\set n random(1, 2000000000)' \
	"WITH k AS (INSERT INTO outbox.intent_keys (key, intent_id) VALUES ('log-' || :n || '-' || :client_id, nextval('outbox.intent_ids')) ON CONFLICT (key) DO NOTHING RETURNING key, intent_id) INSERT INTO outbox.intent_log (id, key, kind, payload) SELECT intent_id, key, 'webhook', '$PAYLOAD' FROM k;" \
	>"$WORK/log.sql"
printf '%s\n' '\set n random(1, 2000000000)' \
	"SELECT * FROM tk.enqueue('probed-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
	>"$WORK/probed.sql"
printf '%s\n' '\set n random(1, 2000000000)' \
	"SELECT * FROM tk.enqueue_keyed('keyed-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
	>"$WORK/keyed.sql"
printf '%s\n' '\set n random(1, 2000000000)' \
	"SELECT * FROM outbox.enqueue('enqueue-' || :n || '-' || :client_id, 'webhook', '$PAYLOAD');" \
	>"$WORK/enqueue.sql"

HZ=$(getconf CLK_TCK)
for round in 1 2; do
	for step in plain log probed keyed enqueue; do
		c0=$(server_ticks)
		tps=$(step_tps "$step" "$SECONDS_PER_STEP")
		c1=$(server_ticks)
		n=$(awk -v t="$tps" -v s="$SECONDS_PER_STEP" 'BEGIN { printf "%d", t * s }')
		awk -v r="$round" -v st="$step" -v tps="$tps" -v c=$((c1 - c0)) -v hz="$HZ" -v n="$n" \
			'BEGIN { printf "round %s  %-8s %8.0f tps %8.1f µs of the server per enqueue\n", r, st, tps, c / hz / n * 1e6 }'
	done
done
# every probed insert went to the newest partition
psql -X -At "$URL" -c "SELECT 'newest partition: ' || count(*) || ' inserted' FROM tk.intents_4 WHERE key LIKE 'probed-%'"
psql -X -At "$URL" -c "SELECT 'newest partition, keyed: ' || count(*) || ' inserted' FROM tk.keyed_4 WHERE key LIKE 'keyed-%'"
