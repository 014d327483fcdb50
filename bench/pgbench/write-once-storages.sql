-- bench/pgbench/write-once-storages.sql: the candidate storages that
-- write-once.sh measures beside outbox.intents (see its header).

-- receipts: immutable intents, append-only receipts and outcomes
CREATE SCHEMA receipts;
CREATE TABLE receipts.intents (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key text NOT NULL UNIQUE,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    ordering_key text,
    run_after timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    source text,
    traceparent text,
    tracestate text);
-- the claim cursor of a lane: the lowest id a claim looks at
CREATE TABLE receipts.cursor (lane int PRIMARY KEY, next_id bigint NOT NULL);
INSERT INTO receipts.cursor VALUES (0, 1);
-- a receipt per claimed intent, in a ring of partitions a rotation truncates
CREATE TABLE receipts.claims (
    slot smallint NOT NULL,
    intent_id bigint NOT NULL,
    fence bigint NOT NULL,
    owner text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()) PARTITION BY LIST (slot);
CREATE TABLE receipts.claims_0 PARTITION OF receipts.claims FOR VALUES IN (0);
CREATE TABLE receipts.claims_1 PARTITION OF receipts.claims FOR VALUES IN (1);
CREATE INDEX ON receipts.claims (intent_id);
-- an outcome per finished attempt, in the same ring
CREATE TABLE receipts.outcomes (
    slot smallint NOT NULL,
    intent_id bigint NOT NULL,
    fence bigint NOT NULL,
    state text NOT NULL,
    provider_ref text,
    status int,
    owner text NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL) PARTITION BY LIST (slot);
CREATE TABLE receipts.outcomes_0 PARTITION OF receipts.outcomes FOR VALUES IN (0);
CREATE TABLE receipts.outcomes_1 PARTITION OF receipts.outcomes FOR VALUES IN (1);
CREATE INDEX ON receipts.outcomes (intent_id);

-- ticks: immutable intents with their transaction ids, snapshots as ticks,
-- a row per claim and a row per completion statement
CREATE SCHEMA ticks;
CREATE TABLE ticks.intents (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    key text NOT NULL UNIQUE,
    kind text NOT NULL,
    destination text,
    payload jsonb NOT NULL,
    ordering_key text,
    run_after timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    source text,
    traceparent text,
    tracestate text);
CREATE INDEX ticks_intents_xid ON ticks.intents (xid, id);
CREATE TABLE ticks.ticks (
    tick bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    snap pg_snapshot NOT NULL,
    at timestamptz NOT NULL DEFAULT now());
-- a claim: of the intents committed between ticks lo_tick and tick, those
-- after (upto_xid, upto_id) of the claim before it in the same range, up to
-- its own (upto_xid, upto_id)
CREATE TABLE ticks.claims (
    claim bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    lo_tick bigint NOT NULL,
    tick bigint NOT NULL,
    upto_xid xid8 NOT NULL,
    upto_id bigint NOT NULL,
    owner text NOT NULL,
    fence bigint NOT NULL,
    lease_expires_at timestamptz NOT NULL);
CREATE TABLE ticks.outcomes (
    claim bigint NOT NULL,
    owner text NOT NULL,
    ids bigint[] NOT NULL,
    states text[] NOT NULL,
    refs text[] NOT NULL,
    statuses int[] NOT NULL,
    started timestamptz[] NOT NULL,
    finished timestamptz[] NOT NULL);
CREATE INDEX ON ticks.outcomes (claim);

CREATE SEQUENCE public.bench_keys;
