"""The client's behaviour, shown with psycopg 3 (sync): what the relay
delivers, a rollback, duplicates, conflicts, refusals, enqueue_many, options."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import (
    Conflict,
    Enqueued,
    Item,
    Nats,
    OutboxError,
    Webhook,
    enqueue,
    enqueue_many,
)


def test_a_business_row_and_its_intent_commit_together_and_are_delivered(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("confirmation")
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'paid')", (unique.order_id,))
        r = enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body={"order": 42}))
    assert r.duplicate is False
    assert r.id > 0
    assert db.order_exists(unique.order_id)

    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"order": 42}
    assert got.headers["webhook-id"].startswith("msg_")
    assert got.headers["idempotency-key"] == got.headers["webhook-id"]
    assert db.state(key) == "delivered"


def test_a_rollback_leaves_neither_the_row_nor_the_intent(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("rolled-back")
    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(RuntimeError, match="payment failed"),
        conn.transaction(),
    ):
        conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id,))
        enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body=1))
        raise RuntimeError("payment failed")
    assert not db.order_exists(unique.order_id)
    assert db.intent(key) is None
    relay.run_once()
    assert receiver.at(unique.path()) == []


def test_the_same_intent_again_is_a_duplicate_with_the_same_id(
    database_url: str, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body={"order": 1, "total": 1999})
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            first = enqueue(conn, unique.key("k"), hook)
        with conn.transaction():
            # key order and 1.0 vs 1 do not make another intent
            again = enqueue(
                conn,
                unique.key("k"),
                Webhook(url=receiver.url(unique.path()), body={"total": 1999.0, "order": 1}),
            )
    assert first == Enqueued(first.id, False)
    assert again == Enqueued(first.id, True)


def test_a_conflict_raises_conflict_with_the_key_and_the_business_row_is_not_committed(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("conflicting")
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            enqueue(conn, key, Webhook(url=receiver.url("/a"), body={"total": 1}))
        with pytest.raises(Conflict) as raised, conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id,))
            enqueue(conn, key, Webhook(url=receiver.url("/a"), body={"total": 2}))
    err = raised.value
    assert err.key == key
    assert err.sqlstate == "OB409"
    assert isinstance(err, OutboxError)
    assert key in err.message
    assert err.hint is not None
    assert isinstance(err.__cause__, psycopg.Error)
    assert not db.order_exists(unique.order_id)


def test_another_refusal_is_an_outbox_error_with_its_sqlstate_and_message(
    database_url: str, receiver: Receiver
) -> None:
    with psycopg.connect(database_url) as conn:
        with pytest.raises(OutboxError) as raised, conn.transaction():
            enqueue(conn, "", Webhook(url=receiver.url("/x"), body=None))
        assert raised.value.sqlstate == "22023"
        assert "key" in raised.value.message
        assert not isinstance(raised.value, Conflict)

        too_big = {"blob": "x" * (1024 * 1024)}
        with pytest.raises(OutboxError) as raised, conn.transaction():
            enqueue(conn, "py:too-big", Webhook(url=receiver.url("/x"), body=too_big))
        assert raised.value.sqlstate == "OB413"
        assert "py:too-big" in raised.value.message


def test_enqueue_many_answers_in_input_order_new_and_duplicate_mixed(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    url = receiver.url(unique.path())
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            b = enqueue(conn, unique.key("b"), Webhook(url=url, body="b"))
            d = enqueue(conn, unique.key("d"), Webhook(url=url, body="d"))
        with conn.transaction():
            got = enqueue_many(
                conn,
                [
                    (unique.key("a"), Webhook(url=url, body="a")),
                    Item(unique.key("b"), Webhook(url=url, body="b")),
                    (unique.key("c"), Webhook(url=url, body="c")),
                    (unique.key("d"), Webhook(url=url, body="d")),
                    Item(unique.key("e"), Nats(subject="orders.created", body={"n": 5})),
                ],
            )
    assert [g.duplicate for g in got] == [False, True, False, True, False]
    assert got[1].id == b.id
    assert got[3].id == d.id
    for name, g in zip("ace", [got[0], got[2], got[4]], strict=True):
        row = db.intent(unique.key(name))
        assert row is not None
        assert row["id"] == g.id
    assert enqueue_many(conn, []) == []


def test_enqueue_many_refuses_a_conflict_naming_its_key(
    database_url: str, receiver: Receiver, unique: Unique
) -> None:
    url = receiver.url(unique.path())
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            enqueue(conn, unique.key("taken key"), Webhook(url=url, body=1))
        with pytest.raises(Conflict) as raised, conn.transaction():
            enqueue_many(
                conn,
                [
                    (unique.key("fresh"), Webhook(url=url, body=1)),
                    (unique.key("taken key"), Webhook(url=url, body=2)),
                ],
            )
    assert raised.value.key == unique.key("taken key")


def test_enqueue_many_takes_one_source_per_call(receiver: Receiver) -> None:
    hook = Webhook(url=receiver.url("/x"), body=1)
    with pytest.raises(ValueError, match="one source per call"):
        enqueue_many(object(), [Item("a", hook, source="api"), Item("b", hook, source="cron")])
    with pytest.raises(ValueError, match="one source per call"):
        enqueue_many(object(), [Item("a", hook, source="api"), ("b", hook)])


def test_the_options_are_stored(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    later = datetime(2999, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with psycopg.connect(database_url) as conn, conn.transaction():
        enqueue(
            conn,
            unique.key("one"),
            Webhook(url=receiver.url(unique.path()), body=1),
            run_after=later,
            ordering_key=unique.key("customer"),
            source="checkout",
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        enqueue(
            conn,
            unique.key("endpoint"),
            Webhook(body={"x": 1}),
            destination="billing",
            run_after=timedelta(hours=1),
        )
        enqueue_many(
            conn,
            [
                Item(unique.key("m1"), Nats(subject="a.b", body=1), run_after=later, source="s"),
                Item(
                    unique.key("m2"),
                    Nats(subject="a.b", body=2),
                    source="s",
                    run_after=timedelta(days=2),
                    ordering_key="o",
                ),
                Item(unique.key("m3"), Nats(subject="a.b", body=3), source="s"),
            ],
        )
    one = db.intent(unique.key("one"))
    assert one is not None
    assert (one["run_after"], one["ordering_key"], one["source"], one["traceparent"]) == (
        later,
        unique.key("customer"),
        "checkout",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    endpoint = db.intent(unique.key("endpoint"))
    assert endpoint is not None
    assert endpoint["destination"] == "billing"
    assert endpoint["payload"] == {"body": {"x": 1}}
    soon = endpoint["run_after"] - datetime.now(timezone.utc)
    assert timedelta(minutes=59) < soon <= timedelta(hours=1)
    m1, m2, m3 = (db.intent(unique.key(k)) for k in ("m1", "m2", "m3"))
    assert m1 is not None
    assert m2 is not None
    assert m3 is not None
    assert m1["run_after"] == later
    assert timedelta(days=2) - timedelta(minutes=1) < m2["run_after"] - datetime.now(timezone.utc)
    assert m3["run_after"] <= datetime.now(timezone.utc)
    assert (m1["source"], m2["ordering_key"], m3["ordering_key"]) == ("s", "o", None)


def test_misuse_is_refused_before_anything_is_sent(receiver: Receiver) -> None:
    no_conn = object()
    with pytest.raises(ValueError, match="naive"):
        enqueue(no_conn, "k", Webhook(url="https://h/x", body=1), run_after=datetime(2030, 1, 1))
    with pytest.raises(ValueError, match="url and a destination"):
        enqueue(no_conn, "k", Webhook(url="https://h/x", body=1), destination="billing")
    with pytest.raises(ValueError, match="no url"):
        enqueue(no_conn, "k", Webhook(body=1))
    with pytest.raises(TypeError, match="not an intent"):
        enqueue(no_conn, "k", {"url": "https://h/x"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cannot enqueue on a builtins\.object"):
        enqueue(no_conn, "k", Webhook(url="https://h/x", body=1))


def test_cursors_and_cursor_factories_of_every_sort_work_too(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body={"via": "cursor"})
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'cursor')", (unique.order_id,))
            r = enqueue(cur, unique.key("via-cursor"), hook)
        with conn.transaction(), conn.cursor(name="server-side") as server_cursor:
            assert enqueue(server_cursor, unique.key("via-cursor"), hook) == Enqueued(r.id, True)
    # a connection whose cursors take $1 placeholders, and one that binds client-side
    nats = Nats(subject="orders.paid", body=1)
    for factory in (psycopg.RawCursor, psycopg.ClientCursor):
        with (
            psycopg.connect(database_url, cursor_factory=factory) as conn,
            conn.transaction(),
        ):
            assert enqueue(conn, unique.key("via-cursor"), hook) == Enqueued(r.id, True)
            [again, new] = enqueue_many(
                conn.cursor(),
                [(unique.key("via-cursor"), hook), (unique.key(factory.__name__), nats)],
            )
        assert again == Enqueued(r.id, True)
        assert new.duplicate is False
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"via": "cursor"}
    assert "webhook-id" in got.headers


def test_a_bigint_id_comes_back_whole(database_url: str, db: Db, unique: Unique) -> None:
    with psycopg.connect(database_url) as conn, conn.transaction():
        # past a double's exact integers (2**53)
        conn.execute(
            "SELECT setval(s, greatest(2^53 + 1, nextval(s))::bigint)"
            " FROM pg_get_serial_sequence('outbox.intents', 'id') AS s"
        )
        r = enqueue(conn, unique.key("big"), Nats(subject="a.b", body=1))
    row = db.conn.execute(
        "SELECT id::text FROM outbox.intents WHERE key = %s", (unique.key("big"),)
    ).fetchone()
    assert row is not None
    assert r.id > 2**53
    assert str(r.id) == row[0]
