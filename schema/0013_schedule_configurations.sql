-- Which configuration of each schedule the relays run. Relays that disagree
-- about a schedule (a rolling deploy that changes its cron or payload) must
-- not share its watermark, or each moves it past the other's ticks. Every
-- relay records its configuration's fingerprint here on each evaluation;
-- the configuration that appeared most recently among those still evaluated
-- (last_seen within 15 s) wins and alone moves the watermark; the others
-- stand aside and say so.
CREATE TABLE outbox.schedule_configs (
    name        text NOT NULL,
    -- hex SHA-256 prefix of `definition`
    fingerprint text NOT NULL,
    -- readable: cron, kind, destination, catch_up and a digest of the payload
    definition  text NOT NULL,
    -- when a relay first evaluated it (again after it was gone for 15 s)
    first_seen  timestamptz NOT NULL,
    last_seen   timestamptz NOT NULL,
    -- the relay that evaluated it last
    seen_by     text,
    PRIMARY KEY (name, fingerprint)
);

-- The configuration that moved the watermark last (NULL before this
-- migration).
ALTER TABLE outbox.schedules ADD COLUMN fingerprint text;
