-- outbox.enqueue and outbox.enqueue_many, ready for schema 0027 (the intent
-- log), which turns the table outbox.intents into a view.
--
-- A call that is already running when 0027 commits keeps the body it
-- started with; a statement of it that writes outbox.intents as a table
-- (an INSERT ... ON CONFLICT ON CONSTRAINT intents_key_unique) would then
-- fail against the view. So this migration, a transaction of its own
-- before 0027, redefines both functions as their current body inside a
-- block that, once outbox.intent_log exists, catches that failure and runs
-- the body 0027 gives them instead (the block's work is rolled back first,
-- so nothing is written twice). Until 0027 commits, every call runs the
-- current body, and an error it raises is raised as before. 0027 keeps the
-- second body alone.
--
-- Each function is rewritten from its current definition (owner, grants
-- and settings stay) with these replacements only; a replacement that finds
-- nothing fails the migration.
DO $$
DECLARE
    v_fn    record;
    v_def   text;
    v_at    integer;
    v_head  text;
    v_body  text;
    v_new   text;
    v_pairs text[];
    i       integer;
BEGIN
    FOR v_fn IN
        SELECT p.oid, p.proname
          FROM pg_proc p
         WHERE p.pronamespace = 'outbox'::regnamespace
           AND p.proname IN ('enqueue', 'enqueue_many')
    LOOP
        v_def := pg_get_functiondef(v_fn.oid);
        -- the body's outermost block: DECLARE ... BEGIN at the line's start,
        -- its statements, END at the line's start before $function$
        v_at := strpos(v_def, E'\nBEGIN\n');
        IF v_at = 0 OR v_def !~ E'\nEND\n\\$function\\$\n?$' THEN
            RAISE EXCEPTION '% has an unexpected shape', v_fn.oid::regprocedure;
        END IF;
        v_head := substr(v_def, 1, v_at + 6);
        v_body := regexp_replace(substr(v_def, v_at + 7), E'END\n\\$function\\$\n?$', '');
        v_pairs := CASE v_fn.proname
            WHEN 'enqueue' THEN ARRAY[
                'INSERT INTO outbox.intents AS', 'INSERT INTO outbox.intent_log AS',
                'ON CONFLICT ON CONSTRAINT intents_key_unique',
                'ON CONFLICT ON CONSTRAINT intent_log_key_unique',
                'DELETE FROM outbox.intents', 'DELETE FROM outbox.intent_log',
                'FROM outbox.intents i WHERE i.key = p_key',
                'FROM outbox.intent_log i WHERE i.key = p_key']
            ELSE ARRAY[
                'INSERT INTO outbox.intents AS', 'INSERT INTO outbox.intent_log AS',
                'ON CONFLICT ON CONSTRAINT intents_key_unique',
                'ON CONFLICT ON CONSTRAINT intent_log_key_unique',
                'DELETE FROM outbox.intents', 'DELETE FROM outbox.intent_log',
                'FROM outbox.intents e WHERE e.key = u.key',
                'FROM outbox.intent_log e WHERE e.key = u.key'] END;
        v_new := v_body;
        FOR i IN 1 .. array_length(v_pairs, 1) / 2 LOOP
            IF strpos(v_new, v_pairs[2 * i - 1]) = 0 THEN
                RAISE EXCEPTION '% has no %', v_fn.oid::regprocedure, v_pairs[2 * i - 1];
            END IF;
            v_new := replace(v_new, v_pairs[2 * i - 1], v_pairs[2 * i]);
        END LOOP;
        v_new := regexp_replace(v_new, 'outbox\.intents\M', 'outbox.intent_rows', 'g');
        EXECUTE v_head
            || E'    BEGIN\n'
            || v_body
            || E'    RETURN;\n'
            || E'    EXCEPTION WHEN OTHERS THEN\n'
            || E'        IF to_regclass(''outbox.intent_log'') IS NULL THEN\n'
            || E'            RAISE;\n'
            || E'        END IF;\n'
            || E'    END;\n'
            || E'-- outbox: the body with the intent log\n'
            || v_new
            || E'END\n$function$\n';
    END LOOP;
END
$$;
