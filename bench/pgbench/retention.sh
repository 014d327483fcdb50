#!/usr/bin/env bash
# bench/pgbench/retention.sh: what purging delivered intents costs Postgres,
# row by row as the relay's retention does, against retiring whole
# segments of an intent log partitioned by id.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/retention.sh [INTENTS] [SEGMENTS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# writes INTENTS (default 1000000) webhooks delivered at the first attempt
# two days ago: a row of outbox.intent_log and one of outbox.log_outcomes
# each, as a drain leaves them. The same intents are copied into a
# candidate storage, schema seg: the log and the outcomes partitioned by
# RANGE (id) into SEGMENTS (default 4) segments of equal ranges, each with
# its own unique index on the key, and a ledger like outbox.ledger. Then:
#   rows      the relay's purge as it runs: PURGE_ROWS and PURGE_LOG from
#             relay/store/retention.rs, batch after batch of 500 (the
#             default [retention] batch_size), each statement committed
#             on its own, until nothing is left; then VACUUM of the tables
#             it left dead rows in, which autovacuum would otherwise do
#   segments  per segment: check that every intent in it is delivered and
#             old enough, copy its keys into the ledger, DROP its two
#             partitions; one transaction per segment
#   keyed     the same, where every key, live or purged, is kept unique in
#             one narrow table of its own (seg.keys, which the retirement
#             leaves alone): what the ledger holds besides the key goes
#             into seg.ledger_facts, keyed by the intent's id
# and prints, for each, the wall time, the server's CPU (its processes'
# time, as write-once.sh reads it) and WAL per intent, and the dead rows
# left. Both end with every key in a ledger; it checks so.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
INTENTS=${1:-1000000}
SEGMENTS=${2:-4}
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database retention

PURGE_ROWS=$(statement purge_rows)
PURGE_LOG=$(statement purge_log)
for s in "$PURGE_ROWS" "$PURGE_LOG"; do
	[ -n "$s" ] || { echo "could not read the purge statements from relay/store/retention.rs" >&2; exit 1; }
done

echo "writing $INTENTS delivered intents, three times ..." >&2
SPAN=$(((INTENTS + SEGMENTS - 1) / SEGMENTS))
psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
INSERT INTO outbox.intent_log (key, kind, payload, created_at, run_after)
SELECT 'r:' || g, 'webhook',
       jsonb_build_object('url', 'http://127.0.0.1:9/hooks/' || (g % 1000),
                          'body', jsonb_build_object('event', 'order.created', 'order_id', g,
                                                     'customer', 'cus_0123456789', 'amount', 1999,
                                                     'note', 'bench payload padded to about three hundred bytes')),
       now() - interval '2 days', now() - interval '2 days'
  FROM generate_series(1, $INTENTS) g;
-- each key in outbox.intent_keys, as outbox.enqueue writes it
INSERT INTO outbox.intent_keys (key, intent_id) SELECT key, id FROM outbox.intent_log;
INSERT INTO outbox.log_outcomes (intent_id, outcome, owner, started_at, finished_at, status,
                                 provider_ref, replayed, at)
SELECT id, 'delivered', 'bench', created_at, created_at, 200, 'ref-' || id, false, created_at
  FROM outbox.intent_log;

CREATE SCHEMA seg;
CREATE TABLE seg.intent_log (LIKE outbox.intent_log INCLUDING DEFAULTS) PARTITION BY RANGE (id);
ALTER TABLE seg.intent_log ADD PRIMARY KEY (id);
CREATE INDEX ON seg.intent_log (xid, id);
CREATE TABLE seg.log_outcomes (LIKE outbox.log_outcomes INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (intent_id);
ALTER TABLE seg.log_outcomes ADD PRIMARY KEY (intent_id);
CREATE TABLE seg.ledger (LIKE outbox.ledger INCLUDING ALL);
CREATE TABLE seg.keys (key text PRIMARY KEY, intent_id bigint NOT NULL);
CREATE TABLE seg.ledger_facts (LIKE outbox.ledger INCLUDING DEFAULTS);
ALTER TABLE seg.ledger_facts ADD PRIMARY KEY (intent_id);
CREATE TABLE seg.keyed_log (LIKE outbox.intent_log INCLUDING DEFAULTS) PARTITION BY RANGE (id);
ALTER TABLE seg.keyed_log ADD PRIMARY KEY (id);
CREATE INDEX ON seg.keyed_log (xid, id);
CREATE TABLE seg.keyed_outcomes (LIKE outbox.log_outcomes INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (intent_id);
ALTER TABLE seg.keyed_outcomes ADD PRIMARY KEY (intent_id);
DO \$\$
DECLARE
    lo bigint := (SELECT min(id) FROM outbox.intent_log);
    t  text;
BEGIN
    FOR s IN 0 .. $SEGMENTS - 1 LOOP
        FOREACH t IN ARRAY ARRAY['intent_log', 'log_outcomes', 'keyed_log', 'keyed_outcomes'] LOOP
            EXECUTE format('CREATE TABLE seg.%s_%s PARTITION OF seg.%s FOR VALUES FROM (%s) TO (%s)',
                           t, s, t, lo + s * $SPAN, lo + (s + 1) * $SPAN);
        END LOOP;
        EXECUTE format('CREATE UNIQUE INDEX ON seg.intent_log_%s (key)', s);
    END LOOP;
END
\$\$;
INSERT INTO seg.intent_log SELECT * FROM outbox.intent_log;
INSERT INTO seg.log_outcomes SELECT * FROM outbox.log_outcomes;
INSERT INTO seg.keyed_log SELECT * FROM outbox.intent_log;
INSERT INTO seg.keyed_outcomes SELECT * FROM outbox.log_outcomes;
INSERT INTO seg.keys SELECT key, id FROM outbox.intent_log;
VACUUM ANALYZE;
CHECKPOINT;
SQL

dead() { # SCHEMA
	psql -X -At "$URL" -c "SELECT coalesce(string_agg(relname || ' ' || n_dead_tup, ', ' ORDER BY relname), 'none')
	                         FROM pg_stat_user_tables WHERE schemaname = '$1' AND n_dead_tup > 0"
}

measure "rows: purge" "
DO \$purge\$
DECLARE
    n bigint;
    m bigint;
BEGIN
    LOOP
        EXECUTE \$q\$ $PURGE_ROWS \$q\$ INTO n USING ARRAY['delivered', 'rejected', 'cancelled'], 86400000::bigint, 500::bigint;
        COMMIT;
        EXECUTE \$q\$ $PURGE_LOG \$q\$ INTO m USING ARRAY['delivered', 'rejected', 'cancelled'], 86400000::bigint, 500::bigint;
        COMMIT;
        EXIT WHEN n < 500 AND m < 500;
    END LOOP;
END
\$purge\$;"
sleep 1 # the statistics collector's report
echo "  dead rows left: $(dead outbox)"
measure "rows: vacuum after" "VACUUM outbox.intent_log, outbox.log_outcomes, outbox.ledger, outbox.tally_deltas;"

retire() { # LOG OUTCOMES LEDGER: the SQL that retires every segment
	local sql="" s
	for ((s = 0; s < SEGMENTS; s++)); do
		sql+="
BEGIN;
DO \$check\$
BEGIN
    IF EXISTS (SELECT 1 FROM seg.$1_$s l
                WHERE NOT EXISTS (SELECT 1 FROM seg.$2_$s o
                                   WHERE o.intent_id = l.id AND o.outcome = 'delivered'
                                     AND o.at < now() - interval '1 day')) THEN
        RAISE EXCEPTION 'segment $s holds an intent not yet purgeable';
    END IF;
END
\$check\$;
INSERT INTO seg.$3 (key, intent_id, kind, destination, fingerprint, state, provider_ref,
                    created_at, completed_at, effect_at)
SELECT l.key, l.id, l.kind, l.destination, outbox.fingerprint(l.payload), 'delivered', o.provider_ref,
       l.created_at, o.at, coalesce(o.finished_at, o.started_at, o.at)
  FROM seg.$1_$s l JOIN seg.$2_$s o ON o.intent_id = l.id
ON CONFLICT DO NOTHING;
DROP TABLE seg.$1_$s, seg.$2_$s;
COMMIT;"
	done
	echo "$sql"
}
measure "segments: retire" "$(retire intent_log log_outcomes ledger)"
measure "keyed: retire" "$(retire keyed_log keyed_outcomes ledger_facts)"
sleep 1
echo "  dead rows left: $(dead seg)"

psql -X -At "$URL" -c "SELECT (SELECT count(*) FROM outbox.ledger), (SELECT count(*) FROM outbox.intent_log),
                              (SELECT count(*) FROM seg.ledger), (SELECT count(*) FROM seg.intent_log),
                              (SELECT count(*) FROM seg.ledger_facts f JOIN seg.keys k ON k.intent_id = f.intent_id),
                              (SELECT count(*) FROM seg.keyed_log)" |
	awk -F'|' -v n="$INTENTS" '{
		printf "purged keys answered: rows %s (log left %s), segments %s (%s), keyed %s (%s)\n", $1, $2, $3, $4, $5, $6
		if ($1 != n || $3 != n || $5 != n || $2 + $4 + $6 != 0) { print "a purge left intents behind or lost a key" > "/dev/stderr"; exit 1 } }'
