-- Strict mode: an enqueue that would commit on its own is refused.
--
-- An intent is only as good as the transaction it is written in: on an
-- autocommit connection (a bare pool, psycopg with autocommit=True, Django
-- outside atomic()) outbox.enqueue commits it by itself, apart from the
-- business rows it was meant to go with. outbox.require_transaction tells
-- that case, and outbox.enqueue and outbox.enqueue_many refuse it when the
-- setting outbox.require_transaction is on (SET, ALTER ROLE ... SET, the
-- connection's options); the clients' strict mode calls it in their
-- enqueue statement whatever the setting.
--
-- The test is that the caller's transaction has written (or locked) nothing
-- yet, i.e. has no transaction id: true of every autocommit statement that
-- only enqueues, whatever the protocol. (transaction_timestamp() against
-- statement_timestamp() does not tell it: with the extended protocol the
-- transaction starts at the Parse or Bind message and the statement at
-- Execute.) A trigger or a statement that writes rows first, and a
-- transaction that wrote its business rows before enqueueing, pass; a
-- transaction that enqueues before writing anything is refused too.
CREATE FUNCTION outbox.require_transaction(p_caller text, p_setting text DEFAULT 'on')
RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    CASE lower(btrim(coalesce(p_setting, '')))
    WHEN '', 'off', 'false', 'no', '0' THEN
        RETURN true;
    WHEN 'on', 'true', 'yes', '1' THEN
        NULL;
    ELSE
        RAISE EXCEPTION 'outbox.require_transaction is %: on or off', quote_literal(p_setting)
            USING ERRCODE = '22023';
    END CASE;
    IF pg_current_xact_id_if_assigned() IS NULL THEN
        RAISE EXCEPTION '%: nothing has been written in this transaction yet, so the intent would commit on its own', p_caller
            USING ERRCODE = 'OB428',
                  HINT = 'Write the business rows first, then enqueue, in one transaction (BEGIN ... COMMIT); '
                         'an autocommit connection commits each statement by itself. '
                         'outbox.require_transaction (a setting, or the client''s strict mode) asks for this.';
    END IF;
    RETURN true;
END
$$;

-- Any role that may enqueue may ask: it reads nothing but its own
-- transaction's state, and the schema's USAGE still decides who reaches it.
GRANT EXECUTE ON FUNCTION outbox.require_transaction(text, text) TO PUBLIC;

-- outbox.enqueue and outbox.enqueue_many check the setting first. Each is
-- redefined from its current definition (pg_get_functiondef), with these
-- lines after its body's BEGIN and nothing else changed: whatever earlier
-- migrations made of them stays. CREATE OR REPLACE keeps the owner and the
-- grants. An overload without a top-level BEGIN line fails the migration.
DO $$
DECLARE
    v_fn  record;
    v_def text;
    v_new text;
BEGIN
    FOR v_fn IN
        SELECT p.oid, 'outbox.' || p.proname AS name
          FROM pg_proc p
         WHERE p.pronamespace = 'outbox'::regnamespace
           AND p.proname IN ('enqueue', 'enqueue_many')
    LOOP
        v_def := pg_get_functiondef(v_fn.oid);
        CONTINUE WHEN strpos(v_def, 'outbox.require_transaction(') > 0;
        v_new := regexp_replace(v_def, E'\nBEGIN\n', format(E'\nBEGIN\n'
            '    IF coalesce(current_setting(''outbox.require_transaction'', true), '''') NOT IN ('''', ''off'') THEN\n'
            '        PERFORM outbox.require_transaction(%L, current_setting(''outbox.require_transaction''));\n'
            '    END IF;\n', v_fn.name));
        IF v_new = v_def THEN
            RAISE EXCEPTION '% has no line BEGIN to put the check after', v_fn.oid::regprocedure;
        END IF;
        EXECUTE v_new;
    END LOOP;
END
$$;
