-- bench/pgbench/keyed-enqueue-loop.sql: the loop of outbox.enqueue with every key in
-- a narrow table of its own (ks.intent_keys) and the intent in a
-- partitioned log without an index on the key; keyed-enqueue.sh puts it in
-- place of outbox.enqueue's own loop, as ks.enqueue.
    LOOP
        -- The key first. Its primary key sees every committed key, live or
        -- purged, whatever the snapshot: a conflict with a key the
        -- snapshot cannot see is a serialization failure (40001), which
        -- the application retries.
        INSERT INTO ks.intent_keys AS k (key, intent_id)
        VALUES (p_key, nextval('ks.intent_ids'))
        ON CONFLICT (key) DO NOTHING
        RETURNING k.intent_id INTO v_id;

        IF v_id IS NOT NULL THEN
            INSERT INTO ks.intent_log_head (id, key, kind, destination, payload, run_after,
                                            ordering_key, source, waiting, traceparent, tracestate)
            VALUES (v_id, p_key, p_kind, p_destination, p_payload, coalesce(p_run_after, now()),
                    p_ordering_key, p_source, v_waiting, v_traceparent, v_tracestate);
            IF coalesce(p_run_after, now()) <= now() THEN
                PERFORM pg_notify('outbox_intents', '');
            END IF;
            id := v_id; duplicate := false;
            RETURN NEXT;
            RETURN;
        END IF;

        -- The key is taken: by a live intent, a purged one the ledger
        -- remembers, or one deleted since, whose key is free again.
        SELECT k.intent_id INTO v_id FROM ks.intent_keys k WHERE k.key = p_key;
        CONTINUE WHEN NOT FOUND;
        SELECT i.kind, i.destination, i.payload INTO v_kind, v_dest, v_payload
          FROM ks.intent_log i WHERE i.id = v_id;
        IF FOUND THEN
            IF v_kind <> p_kind OR v_dest IS DISTINCT FROM p_destination OR v_payload <> p_payload THEN
                RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                    USING ERRCODE = 'OB409';
            END IF;
            INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind) VALUES (v_id, p_source, v_kind);
            id := v_id; duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT * INTO v_ledger FROM outbox.ledger l WHERE l.key = p_key;
        IF FOUND THEN
            IF v_ledger.kind <> p_kind OR v_ledger.destination IS DISTINCT FROM p_destination
               OR v_ledger.fingerprint <> outbox.fingerprint(p_payload) THEN
                RAISE EXCEPTION 'outbox.enqueue: key % was already used for a different intent', p_key
                    USING ERRCODE = 'OB409';
            END IF;
            INSERT INTO outbox.enqueue_duplicates (intent_id, source, kind)
            VALUES (v_ledger.intent_id, p_source, v_ledger.kind);
            id := v_ledger.intent_id; duplicate := true;
            RETURN NEXT;
            RETURN;
        END IF;
        DELETE FROM ks.intent_keys k WHERE k.key = p_key AND k.intent_id = v_id;
    END LOOP;
