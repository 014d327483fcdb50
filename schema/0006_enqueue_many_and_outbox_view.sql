-- Set-based enqueue and the insertable outbox (contract names in
-- design.md).
--
--   outbox.enqueue_many(p_keys, p_kinds, p_payloads, p_destinations,
--                       p_run_afters, p_ordering_keys, p_source)
--     RETURNS TABLE (ord int, id bigint, duplicate boolean)
--
-- Per row exactly outbox.enqueue's semantics, in one statement. The common
-- case (new keys, READ COMMITTED) is one INSERT for the whole batch; every
-- row that is not simply new — a key already used (duplicate or OB409), a
-- key the ledger remembers, a key repeated within the batch, a race with a
-- purge — is answered by outbox.enqueue itself, in input order, so the
-- answers and errors are that function's to the letter. A row that
-- outbox.enqueue would refuse (key, kind, payload limits) refuses the
-- whole statement, naming the first such row. Under REPEATABLE READ or
-- SERIALIZABLE every row goes through outbox.enqueue (its ledger probe).
--
--   outbox.outbox: a view with the columns key, kind, payload, destination,
--   run_after, ordering_key, source. An INSERT into it is outbox.enqueue
--   (a duplicate is a no-op, another payload under a used key raises
--   OB409), for ORMs that can only insert rows. It reads nothing.

CREATE FUNCTION outbox.enqueue_many(
    p_keys          text[],
    p_kinds         text[],
    p_payloads      jsonb[],
    p_destinations  text[]        DEFAULT NULL,
    p_run_afters    timestamptz[] DEFAULT NULL,
    p_ordering_keys text[]        DEFAULT NULL,
    p_source        text          DEFAULT NULL)
RETURNS TABLE (ord int, id bigint, duplicate boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
DECLARE
    n           integer := coalesce(cardinality(p_keys), 0);
    v_dests     text[];
    v_runs      timestamptz[];
    v_okeys     text[];
    v_bad       record;
    v_ins_ords  integer[] := '{}';
    v_ins_ids   bigint[]  := '{}';
    v_purged_ids bigint[] := '{}';
    v_rest_ords integer[] := '{}';
    v_rest_ids  bigint[]  := '{}';
    v_rest_dups boolean[] := '{}';
    v_row       record;
    v_id        bigint;
    v_dup       boolean;
BEGIN
    IF coalesce(cardinality(p_kinds), 0) <> n OR coalesce(cardinality(p_payloads), 0) <> n
       OR (p_destinations IS NOT NULL AND cardinality(p_destinations) <> n)
       OR (p_run_afters IS NOT NULL AND cardinality(p_run_afters) <> n)
       OR (p_ordering_keys IS NOT NULL AND cardinality(p_ordering_keys) <> n) THEN
        RAISE EXCEPTION 'outbox.enqueue_many: the arrays must have the same length (% keys)', n
            USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;
    v_dests := coalesce(p_destinations, array_fill(NULL::text, ARRAY[n]));
    v_runs := coalesce(p_run_afters, array_fill(NULL::timestamptz, ARRAY[n]));
    v_okeys := coalesce(p_ordering_keys, array_fill(NULL::text, ARRAY[n]));

    -- The first row outbox.enqueue would refuse (its tests, set-based):
    -- outbox.enqueue itself raises its error for it, word for word.
    SELECT * INTO v_bad
      FROM unnest(p_keys, p_kinds, p_payloads, v_dests, v_runs, v_okeys) WITH ORDINALITY
           AS i(key, kind, payload, destination, run_after, ordering_key, ord)
     WHERE i.key IS NULL OR length(i.key) = 0 OR length(i.key) > 512
        OR i.kind IS NULL OR i.kind !~ '^[a-z][a-z0-9_.-]{0,63}$'
        OR i.payload IS NULL OR octet_length(i.payload::text) > 1048576
        OR jsonb_path_exists(i.payload, 'strict $.**{64}')
        OR jsonb_path_exists(i.payload,
               'strict $.** ? (@.type() == "number" && (@ > 1e308 || @ < -1e308))')
        OR length(p_source) > 128
     ORDER BY i.ord LIMIT 1;
    IF FOUND THEN
        PERFORM * FROM outbox.enqueue(v_bad.key, v_bad.kind, v_bad.payload, v_bad.destination,
                                      coalesce(v_bad.run_after, now()), v_bad.ordering_key, p_source);
        RAISE EXCEPTION 'outbox.enqueue_many: row % was refused', v_bad.ord USING ERRCODE = '22023';
    END IF;

    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- The fast path: one INSERT of each key's first row. Behind a live
        -- intent of its ordering key, or behind an earlier row of the batch
        -- with that key, a row waits (see 0005).
        WITH input AS (
                 SELECT i.*,
                        row_number() OVER (PARTITION BY i.key ORDER BY i.ord) AS key_rank,
                        row_number() OVER (PARTITION BY i.ordering_key ORDER BY i.ord) AS okey_rank
                   FROM unnest(p_keys, p_kinds, p_payloads, v_dests, v_runs, v_okeys) WITH ORDINALITY
                        AS i(key, kind, payload, destination, run_after, ordering_key, ord)),
             ins AS (
                 INSERT INTO outbox.intents AS t (key, kind, destination, payload, run_after,
                                                  ordering_key, source, waiting)
                 SELECT f.key, f.kind, f.destination, f.payload, coalesce(f.run_after, now()),
                        f.ordering_key, p_source,
                        f.ordering_key IS NOT NULL AND (f.okey_rank > 1 OR EXISTS (
                            SELECT 1 FROM outbox.intents e
                             WHERE e.ordering_key = f.ordering_key
                               AND e.state IN ('pending', 'claimed', 'ambiguous', 'dead')))
                   FROM input f
                  WHERE f.key_rank = 1
                  ORDER BY f.ord
                 ON CONFLICT ON CONSTRAINT intents_key_unique DO NOTHING
                 RETURNING t.id, t.key, t.run_after),
             kept AS (
                 -- A new row whose key the ledger remembers is not new: as
                 -- in outbox.enqueue (looked up after the insert, so a
                 -- racing purge is seen too), outbox.enqueue answers for it.
                 SELECT ins.*, EXISTS (SELECT 1 FROM outbox.ledger l WHERE l.key = ins.key) AS purged
                   FROM ins)
        SELECT coalesce(array_agg(f.ord::int ORDER BY f.ord) FILTER (WHERE NOT k.purged), '{}'),
               coalesce(array_agg(k.id ORDER BY f.ord) FILTER (WHERE NOT k.purged), '{}'),
               coalesce(array_agg(k.id) FILTER (WHERE k.purged), '{}'),
               coalesce(bool_or(NOT k.purged AND k.run_after <= now()), false)
          INTO v_ins_ords, v_ins_ids, v_purged_ids, v_dup
          FROM kept k JOIN input f ON f.key = k.key AND f.key_rank = 1;
        IF cardinality(v_purged_ids) > 0 THEN
            DELETE FROM outbox.intents t WHERE t.id = ANY(v_purged_ids);
        END IF;
        IF v_dup THEN
            PERFORM pg_notify('outbox_intents', '');
        END IF;
    END IF;

    -- Everything else, in input order, by outbox.enqueue itself (an
    -- anti-join, not `ord <> ALL(...)`: that would be quadratic).
    FOR v_row IN
        SELECT i.* FROM unnest(p_keys, p_kinds, p_payloads, v_dests, v_runs, v_okeys) WITH ORDINALITY
               AS i(key, kind, payload, destination, run_after, ordering_key, ord)
          LEFT JOIN unnest(v_ins_ords) AS done(ord) ON done.ord = i.ord
         WHERE done.ord IS NULL AND cardinality(v_ins_ords) < n
         ORDER BY i.ord
    LOOP
        SELECT e.id, e.duplicate INTO v_id, v_dup
          FROM outbox.enqueue(v_row.key, v_row.kind, v_row.payload, v_row.destination,
                              coalesce(v_row.run_after, now()), v_row.ordering_key, p_source) e;
        v_rest_ords := v_rest_ords || v_row.ord::int;
        v_rest_ids := v_rest_ids || v_id;
        v_rest_dups := v_rest_dups || v_dup;
    END LOOP;

    RETURN QUERY
        SELECT x.ord, x.id, x.dup FROM (
            SELECT a.ord, a.id, false AS dup FROM unnest(v_ins_ords, v_ins_ids) AS a(ord, id)
            UNION ALL
            SELECT b.ord, b.id, b.dup
              FROM unnest(v_rest_ords, v_rest_ids, v_rest_dups) AS b(ord, id, dup)
        ) x ORDER BY x.ord;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.enqueue_many(text[], text[], jsonb[], text[], timestamptz[], text[], text) FROM PUBLIC;

CREATE VIEW outbox.outbox AS
    SELECT key, kind, payload, destination, run_after, ordering_key, source
      FROM outbox.intents WHERE false;

CREATE FUNCTION outbox.outbox_insert()
RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, outbox, pg_temp
AS $$
BEGIN
    PERFORM * FROM outbox.enqueue(NEW.key, NEW.kind, NEW.payload, NEW.destination,
                                  coalesce(NEW.run_after, now()), NEW.ordering_key, NEW.source);
    RETURN NEW;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.outbox_insert() FROM PUBLIC;

CREATE TRIGGER outbox_insert INSTEAD OF INSERT ON outbox.outbox
    FOR EACH ROW EXECUTE FUNCTION outbox.outbox_insert();

REVOKE ALL ON outbox.outbox FROM PUBLIC;
