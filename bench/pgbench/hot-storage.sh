#!/usr/bin/env bash
# bench/pgbench/hot-storage.sh: what a narrow queue table would save the
# database per intent, against the current storage, on the claim + complete
# path alone.
#
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres bench/pgbench/hot-storage.sh [INTENTS] [ROUNDS]
#
# In a scratch database (migrated with the relay binary, then dropped) it
# claims and completes INTENTS (default 20000) fresh intents in rounds of
# 100 with pgbench, one client, two statements per round each committed on
# its own as the engine's are, for:
#   today   outbox.intents and outbox.attempts as they are: every claim and
#           completion is a non-HOT update of the wide intents row, since
#           six of its indexes name `state`
#   narrow  a copy of the intents columns with only its primary and unique
#           keys (fillfactor 45, so both updates of a row fit on its page,
#           and every update is HOT), beside a narrow queue table of
#           (id, run_after, lease_expires_at) with a due index and a lease
#           index: the claim leases the queue row and updates the intent, the
#           completion updates the intent and deletes the queue row; the
#           attempt rows and their foreign key are the same as today's
# alternating, ROUNDS (default 3) times, and prints intents per second and
# the machine's CPU per intent (all processes, from /proc/stat: on an idle
# machine, Postgres's). Both claims take the oldest due rows by an index in
# claim order, FOR UPDATE SKIP LOCKED, with the fence, owner and lease the
# engine writes; the kind and ordering-key clauses of the engine's claim are
# left out of both. Not modelled: what the narrow design would need so that
# stats, list --state, the gauges and the purge could still find rows by
# state without an index on it. Ratios within one run are what count.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
INTENTS=${1:-20000}
ROUNDS=${2:-3}
[ "$INTENTS" -ge 100 ] || { echo "INTENTS must be at least 100" >&2; exit 2; }
# shellcheck source=bench/pgbench/scratch.sh
. "$REPO_ROOT/bench/pgbench/scratch.sh"
scratch_database hot_storage
psql -X -q -v ON_ERROR_STOP=1 "$URL" <<'SQL'
CREATE SCHEMA narrow;
CREATE TABLE narrow.intents (LIKE outbox.intents INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                             INCLUDING IDENTITY) WITH (fillfactor = 45);
ALTER TABLE narrow.intents ADD PRIMARY KEY (id), ADD UNIQUE (key);
CREATE TABLE narrow.queue (id bigint PRIMARY KEY REFERENCES narrow.intents ON DELETE CASCADE,
                           run_after timestamptz NOT NULL, lease_expires_at timestamptz);
CREATE INDEX queue_due ON narrow.queue (run_after, id) WHERE lease_expires_at IS NULL;
CREATE INDEX queue_leases ON narrow.queue (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
CREATE TABLE narrow.attempts (LIKE outbox.attempts INCLUDING ALL);
ALTER TABLE narrow.attempts ADD FOREIGN KEY (intent_id) REFERENCES narrow.intents ON DELETE CASCADE;
-- leased: the same queue without an index naming the lease, so that leasing
-- a queue row is a HOT update too (claims walk past the leased rows in the
-- due index; a sweeper would scan the queue for expired leases)
CREATE SCHEMA leased;
CREATE TABLE leased.intents (LIKE narrow.intents INCLUDING ALL) WITH (fillfactor = 45);
CREATE TABLE leased.queue (id bigint PRIMARY KEY REFERENCES leased.intents ON DELETE CASCADE,
                           run_after timestamptz NOT NULL, lease_expires_at timestamptz)
    WITH (fillfactor = 50);
CREATE INDEX ON leased.queue (run_after, id);
CREATE TABLE leased.attempts (LIKE outbox.attempts INCLUDING ALL);
ALTER TABLE leased.attempts ADD FOREIGN KEY (intent_id) REFERENCES leased.intents ON DELETE CASCADE;
-- deleted: the claim deletes the queue row, and nothing records the lease
-- outside the intents row: the upper bound of the saving, not a design (a
-- sweeper would have no index to find expired leases by)
CREATE SCHEMA deleted;
CREATE TABLE deleted.intents (LIKE narrow.intents INCLUDING ALL) WITH (fillfactor = 45);
CREATE TABLE deleted.queue (id bigint PRIMARY KEY REFERENCES deleted.intents ON DELETE CASCADE,
                            run_after timestamptz NOT NULL);
CREATE INDEX ON deleted.queue (run_after, id);
CREATE TABLE deleted.attempts (LIKE outbox.attempts INCLUDING ALL);
ALTER TABLE deleted.attempts ADD FOREIGN KEY (intent_id) REFERENCES deleted.intents ON DELETE CASCADE;
SQL

PAYLOAD='{"url": "http://127.0.0.1:9/hook", "body": {"event": "order.created", "order_id": 42, "customer": "cus_0123456789", "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}], "note": "bench payload padded to about three hundred bytes"}}'

# One round: claim 100 (the ids and fences kept by \gset), then complete
# them. Each storage's claim picks its rows its own way into a CTE named
# `picked`; the rest of the round is the same on every side.
rest_of_round() { # SCHEMA, then "dequeue" when the completion deletes the queue row
	local dequeue=""
	[ "${2:-}" = dequeue ] && dequeue=",
dequeued AS (DELETE FROM $1.queue q USING done WHERE q.id = done.id)"
	cat <<SQL
claimed AS (
    UPDATE $1.intents i
       SET state = 'claimed', owner = 'bench', lease_expires_at = now() + interval '60 s',
           fence = i.fence + 1, attempts = i.attempts + 1, updated_at = now()
      FROM picked WHERE i.id = picked.id
    RETURNING i.id, i.fence, i.attempts, i.payload::text)
SELECT coalesce(array_agg(id), '{}')::text AS ids, coalesce(array_agg(fence), '{}')::text AS fences
  FROM claimed \gset
WITH u AS (SELECT * FROM unnest(:ids::bigint[], :fences::bigint[]) AS u(id, fence)),
done AS (
    UPDATE $1.intents i
       SET state = 'delivered', provider_ref = 'ref-' || i.id, last_error = NULL,
           owner = NULL, lease_expires_at = NULL, updated_at = now(), delivered_at = now()
      FROM u WHERE i.id = u.id AND i.fence = u.fence AND (i.state = 'claimed') IS TRUE
    RETURNING i.id, i.fence, i.attempts)$dequeue
INSERT INTO $1.attempts (intent_id, attempt, fence, owner, started_at, finished_at, outcome,
                         status, provider_ref, accepted, key_generation)
SELECT id, attempts, fence, 'bench', now(), now(), 'delivered', 200, 'ref-' || id, true, 0 FROM done
ON CONFLICT (intent_id, fence) DO NOTHING;
SQL
}
{
	cat <<'SQL'
WITH picked AS (
    SELECT id FROM outbox.intents
     WHERE state = 'pending' AND NOT waiting AND run_after <= now()
     ORDER BY run_after, id LIMIT 100 FOR UPDATE SKIP LOCKED),
SQL
	rest_of_round outbox
} >"$WORK/today.sql"
for schema in narrow leased; do
	{
		cat <<SQL
WITH due AS (
    SELECT id FROM $schema.queue
     WHERE lease_expires_at IS NULL AND run_after <= now()
     ORDER BY run_after, id LIMIT 100 FOR UPDATE SKIP LOCKED),
picked AS (
    UPDATE $schema.queue q SET lease_expires_at = now() + interval '60 s'
      FROM due WHERE q.id = due.id RETURNING q.id),
SQL
		rest_of_round "$schema" dequeue
	} >"$WORK/$schema.sql"
done
{
	cat <<'SQL'
WITH picked AS (
    DELETE FROM deleted.queue
     WHERE id IN (SELECT id FROM deleted.queue WHERE run_after <= now()
                   ORDER BY run_after, id LIMIT 100 FOR UPDATE SKIP LOCKED)
    RETURNING id),
SQL
	rest_of_round deleted
} >"$WORK/deleted.sql"

# Empty every storage, then enqueue INTENTS fresh intents into one of them.
load() {
	local fill tables
	if [ "$1" = today ]; then
		fill="INSERT INTO outbox.intents (key, kind, payload)
		      SELECT 'i-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, $INTENTS) g;"
		tables="outbox.intents, outbox.attempts"
	else
		fill="WITH i AS (INSERT INTO $1.intents (key, kind, payload)
		                 SELECT 'i-' || g, 'webhook', '$PAYLOAD' FROM generate_series(1, $INTENTS) g
		                 RETURNING id, run_after)
		      INSERT INTO $1.queue (id, run_after) SELECT id, run_after FROM i;"
		tables="$1.intents, $1.queue, $1.attempts"
	fi
	PGOPTIONS="-c client_min_messages=warning" psql -X -q -v ON_ERROR_STOP=1 "$URL" >/dev/null <<SQL
TRUNCATE outbox.intents, narrow.intents, leased.intents, deleted.intents CASCADE;
$fill
VACUUM ANALYZE $tables;
CHECKPOINT;
SQL
}

# busy and total jiffies of all CPUs, from /proc/stat's first line
cpu_ticks() {
	awk '/^cpu /{busy = $2 + $3 + $4 + $7 + $8 + $9; print busy, busy + $5 + $6; exit}' /proc/stat
}

printf '%-6s %-7s %12s %16s %6s\n' round storage intents/s "CPU µs/intent" busy
for round in $(seq "$ROUNDS"); do
	for storage in today narrow leased deleted; do
		load "$storage"
		read -r busy0 total0 < <(cpu_ticks)
		start=$(date +%s.%N)
		pgbench -n -M prepared -c 1 -t $((INTENTS / 100)) -f "$WORK/$storage.sql" "$URL" \
			>"$WORK/out" 2>"$WORK/err" || { echo "pgbench failed on $storage:" >&2; tail -n 5 "$WORK/err" >&2; exit 1; }
		end=$(date +%s.%N)
		read -r busy1 total1 < <(cpu_ticks)
		table=$([ "$storage" = today ] && echo outbox.intents || echo "$storage.intents")
		left=$(psql -X -At "$URL" -c "SELECT count(*) FROM $table WHERE state <> 'delivered'")
		[ "$left" = 0 ] || { echo "$storage: $left intents were left undelivered" >&2; exit 1; }
		hot=$(psql -X -At "$URL" -c "SELECT n_tup_hot_upd * 100 / greatest(n_tup_upd, 1)
		                               FROM pg_stat_user_tables WHERE relid = '$table'::regclass")
		awk -v r="$round" -v s="$storage" -v n="$INTENTS" -v t0="$start" -v t1="$end" \
			-v b="$((busy1 - busy0))" -v tt="$((total1 - total0))" -v hz="$(getconf CLK_TCK)" -v hot="$hot" \
			'BEGIN { secs = t1 - t0; printf "%-6s %-7s %12.0f %16.1f %5.0f%%  (%s%% of its updates HOT)\n",
			         r, s, n / secs, b / hz / n * 1e6, (tt > 0 ? 100 * b / tt : 0), hot }'
	done
done
