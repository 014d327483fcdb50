-- Subscriptions' header values, sealed.
--
-- A subscription's static headers (an `Authorization: Bearer ...` among
-- them) may carry a credential: their values are stored sealed, as its
-- signing secret is. `headers_sealed` is the JSON object of the headers,
-- names and values, sealed by the relay's [subscriptions] secret_key
-- (nonce and ciphertext, XChaCha20-Poly1305) with `<id>/headers` as
-- associated data, so that a sealed secret never opens as headers nor
-- sealed headers as a secret; NULL when the subscription has no headers.
-- `header_names` are their names, which `list`, `show` and the console
-- print. `headers` holds no value: NULL where the headers are sealed (a
-- relay built for 0029 alone, which reads `headers`, then fails to read
-- the subscription and tries its delivery again later, rather than send
-- it without them), the empty object where there are none.
--
-- This migration has no key, so it cannot seal: a row whose values it
-- finds in `headers` keeps them there (their names copied into
-- `header_names`) until a relay starts with the key, which seals them and
-- clears `headers` in one transaction before it delivers anything. No
-- statement may write a value into `headers` (the trigger below).

ALTER TABLE outbox.subscriptions
    ALTER COLUMN headers DROP NOT NULL,
    ADD COLUMN header_names   text[] NOT NULL DEFAULT '{}',
    ADD COLUMN headers_sealed bytea;

UPDATE outbox.subscriptions
   SET header_names = ARRAY(SELECT k FROM jsonb_object_keys(headers) AS h(k) ORDER BY k COLLATE "C")
 WHERE headers <> '{}'::jsonb;

-- a row's headers are sealed (and named) or in `headers`, not both
ALTER TABLE outbox.subscriptions
    ADD CONSTRAINT subscriptions_headers_sealed
        CHECK ((headers_sealed IS NULL) = (headers IS NOT NULL)
               AND (headers_sealed IS NULL OR cardinality(header_names) > 0));

-- A value in `headers` is refused, whoever writes it: only NULL, the
-- empty object, or what the row held already passes (the relay clears
-- the values this migration found as it seals them). The message names
-- the subscription, never a header.
CREATE FUNCTION outbox.subscriptions_headers_in_clear() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NEW.headers IS NULL OR NEW.headers = '{}'::jsonb THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.headers = OLD.headers THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'outbox.subscriptions: subscription %''s header values are stored sealed (headers_sealed, header_names), never in headers',
        NEW.id USING ERRCODE = '23514';
END
$$;
CREATE TRIGGER subscriptions_headers_in_clear BEFORE INSERT OR UPDATE OF headers
    ON outbox.subscriptions FOR EACH ROW EXECUTE FUNCTION outbox.subscriptions_headers_in_clear();

REVOKE EXECUTE ON FUNCTION outbox.subscriptions_headers_in_clear() FROM PUBLIC;
