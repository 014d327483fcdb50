"""psycopg2 connections and cursors, in the transaction psycopg2 begins itself."""

from __future__ import annotations

import psycopg2
import psycopg2.extras
import pytest

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import Conflict, Email, Enqueued, OutboxError, Webhook, enqueue, enqueue_many


def test_a_psycopg2_connection_commits_the_row_and_the_intent_together(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("pg2")
    conn = psycopg2.connect(database_url)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'pg2')", (unique.order_id,))
        r = enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body={"pg": 2}))
        assert conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION  # not committed by us
        assert db.intent(key) is None  # invisible until the caller commits
        conn.commit()
    finally:
        conn.close()
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"pg": 2}
    assert got.headers["webhook-id"].startswith("msg_")
    row = db.intent(key)
    assert row is not None
    assert row["id"] == r.id


def test_a_psycopg2_cursor_rollback_duplicate_conflict_and_refusal(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    url = receiver.url(unique.path())
    # a RealDictCursor factory: the client reads its rows all the same
    conn = psycopg2.connect(database_url, cursor_factory=psycopg2.extras.RealDictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'gone')", (unique.order_id,))
            enqueue(cur, unique.key("rb"), Webhook(url=url, body=1))
        conn.rollback()
        assert not db.order_exists(unique.order_id)
        assert db.intent(unique.key("rb")) is None

        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'cur')", (unique.order_id,))
            via_cursor = enqueue(cur, unique.key("cur"), Webhook(url=url, body="cursor"))
        first = enqueue(conn, unique.key("d"), Email(to="a@example.com", subject="s", text="t"))
        conn.commit()
        [again, new] = enqueue_many(
            conn,
            [
                (unique.key("d"), Email(to=["a@example.com"], subject="s", text="t")),
                (unique.key("n"), Webhook(url=receiver.url(unique.path("n")), body=None)),
            ],
        )
        conn.commit()
        assert again == Enqueued(first.id, True)
        assert new.duplicate is False

        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id + 1,))
        with pytest.raises(Conflict) as conflict:
            enqueue(conn, unique.key("d"), Email(to="b@example.com", subject="s", text="t"))
        assert conflict.value.key == unique.key("d")
        assert isinstance(conflict.value.__cause__, psycopg2.Error)
        conn.rollback()
        assert not db.order_exists(unique.order_id + 1)

        with pytest.raises(OutboxError) as refused:
            enqueue(conn, "x" * 513, Webhook(url=url, body=1))
        assert refused.value.sqlstate == "22023"
        assert "512" in refused.value.message
        conn.rollback()
    finally:
        conn.close()
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == "cursor"
    row = db.intent(unique.key("cur"))
    assert row is not None
    assert row["id"] == via_cursor.id
