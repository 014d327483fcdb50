"""publish and publish_many: an event is one intent of kind `event`, written
in the caller's transaction through outbox.enqueue (its duplicates and
conflicts), with the payload `{"type", "tenant", "data"}`."""

from __future__ import annotations

import psycopg
import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from conftest import Db, Unique
from outbox_relay import (
    Conflict,
    Enqueued,
    Event,
    OutboxError,
    publish,
    publish_async,
    publish_many,
    publish_many_async,
)


def _sa_url(database_url: str, driver: str) -> str:
    return f"postgresql+{driver}://{database_url.split('://', 1)[1]}"


def test_an_event_commits_with_its_business_row_and_a_rollback_leaves_neither(
    database_url: str, db: Db, unique: Unique
) -> None:
    key = unique.key("order.paid")
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'paid')", (unique.order_id,))
            r = publish(conn, key, "order.paid", {"order": 42, "amount": 1999})
            assert db.intent(key) is None  # not before the commit
        assert r.duplicate is False
        row = db.intent(key)
        assert row is not None
        assert row["id"] == r.id
        assert row["kind"] == "event"
        assert row["payload"] == {
            "type": "order.paid",
            "tenant": None,
            "data": {"order": 42, "amount": 1999},
        }
        assert row["destination"] is None
        assert db.order_exists(unique.order_id)

        gone = unique.key("rolled-back")
        with pytest.raises(RuntimeError, match="payment failed"), conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id + 1,))
            publish(conn, gone, "order.paid", {"order": 43})
            raise RuntimeError("payment failed")
    assert db.intent(gone) is None
    assert not db.order_exists(unique.order_id + 1)


def test_the_same_event_again_is_a_duplicate_and_another_under_its_key_a_conflict(
    database_url: str, db: Db, unique: Unique
) -> None:
    key = unique.key("invoice")
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            first = publish(conn, key, "invoice.created", {"invoice": 7, "lines": [1, 2]})
        with conn.transaction():
            # key order does not make another event
            again = publish(conn, key, "invoice.created", {"lines": [1, 2], "invoice": 7})
        assert again == Enqueued(first.id, True)

        with pytest.raises(Conflict) as raised, conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id,))
            publish(conn, key, "invoice.created", {"invoice": 8})
        with pytest.raises(Conflict), conn.transaction():
            publish(conn, key, "invoice.paid", {"invoice": 7, "lines": [1, 2]})
    err = raised.value
    assert err.sqlstate == "OB409"
    assert err.key == key
    assert key in err.message
    assert isinstance(err.__cause__, psycopg.Error)
    assert not db.order_exists(unique.order_id)
    row = db.intent(key)
    assert row is not None
    assert row["payload"]["data"] == {"invoice": 7, "lines": [1, 2]}


def test_a_bad_event_type_or_tenant_is_refused_and_nothing_is_written(
    database_url: str, db: Db, unique: Unique
) -> None:
    with psycopg.connect(database_url) as conn:
        for event_type in ("order paid", "order..paid", ".order", "", "x" * 201):
            with pytest.raises(OutboxError) as raised, conn.transaction():
                conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", (unique.order_id,))
                publish(conn, unique.key("bad"), event_type, {"order": 1})
            assert raised.value.sqlstate == "22023"
            assert not isinstance(raised.value, Conflict)
            assert "is not a dotted name" in raised.value.message, raised.value.message
        for tenant in ("", "t" * 201):
            with pytest.raises(OutboxError) as raised, conn.transaction():
                publish(conn, unique.key("bad"), "order.paid", 1, tenant=tenant)
            assert raised.value.sqlstate == "22023"
            assert "tenant must be 1 to 200 characters" in raised.value.message
        with pytest.raises(OutboxError) as raised, conn.transaction():
            publish_many(
                conn,
                [(unique.key("fine"), "order.paid", 1), (unique.key("bad"), "order paid", 2)],
            )
        assert raised.value.sqlstate == "22023"
        assert f"event 2 (key '{unique.key('bad')}')" in raised.value.message
    assert db.intent(unique.key("bad")) is None
    assert db.intent(unique.key("fine")) is None
    assert not db.order_exists(unique.order_id)
    with pytest.raises(TypeError, match="an event type is a str"):
        publish(object(), "k", 1, {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"cannot publish on a builtins\.object"):
        publish(object(), "k", "order.paid", {})
    with pytest.raises(TypeError, match=r"\(key, event_type, data\) or Event"):
        publish_many(object(), [("k", "order.paid")])  # type: ignore[list-item]


def test_publish_many_answers_in_input_order_new_and_duplicate_mixed(
    database_url: str, db: Db, unique: Unique
) -> None:
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            b = publish(conn, unique.key("b"), "order.shipped", {"n": 2}, tenant="acme")
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'many')", (unique.order_id,))
            got = publish_many(
                conn,
                [
                    (unique.key("a"), "order.created", {"n": 1}),
                    Event(unique.key("b"), "order.shipped", {"n": 2}, tenant="acme"),
                    Event(unique.key("c"), "order.paid", None, tenant="acme"),
                    (unique.key("a"), "order.created", {"n": 1}),
                ],
            )
        assert publish_many(conn, []) == []
    assert [g.duplicate for g in got] == [False, True, False, True]
    assert got[1].id == b.id
    assert got[3].id == got[0].id
    assert got[0].id < got[2].id
    rows = {n: db.intent(unique.key(n)) for n in "abc"}
    assert {n: (r or {}).get("id") for n, r in rows.items()} == {
        "a": got[0].id,
        "b": b.id,
        "c": got[2].id,
    }
    assert [(r or {}).get("payload") for r in rows.values()] == [
        {"type": "order.created", "tenant": None, "data": {"n": 1}},
        {"type": "order.shipped", "tenant": "acme", "data": {"n": 2}},
        {"type": "order.paid", "tenant": "acme", "data": None},
    ]
    assert {(r or {}).get("kind") for r in rows.values()} == {"event"}

    with (
        psycopg.connect(database_url) as conn,
        pytest.raises(Conflict) as raised,
        conn.transaction(),
    ):
        publish_many(
            conn,
            [(unique.key("d"), "order.paid", 1), (unique.key("b"), "order.shipped", {"n": 3})],
        )
    assert raised.value.key == unique.key("b")
    assert db.intent(unique.key("d")) is None


def test_a_tenant_or_none_is_the_events_own(database_url: str, db: Db, unique: Unique) -> None:
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            none = publish(conn, unique.key("none"), "user.created", {"user": 1})
            acme = publish(conn, unique.key("acme"), "user.created", {"user": 1}, tenant="acme")
        # the tenant is part of the event: the same key under another tenant conflicts
        with pytest.raises(Conflict), conn.transaction():
            publish(conn, unique.key("none"), "user.created", {"user": 1}, tenant="acme")
        with conn.transaction():
            again = publish(conn, unique.key("acme"), "user.created", {"user": 1}, tenant="acme")
    assert again == Enqueued(acme.id, True)
    assert none.id != acme.id
    for name, tenant in (("none", None), ("acme", "acme")):
        row = db.intent(unique.key(name))
        assert row is not None
        assert row["payload"] == {"type": "user.created", "tenant": tenant, "data": {"user": 1}}


def test_strict_mode_refuses_an_event_that_would_commit_on_its_own(
    database_url: str, db: Db, unique: Unique
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(OutboxError) as one:
            publish(conn, unique.key("one"), "order.paid", 1, require_transaction=True)
        with pytest.raises(OutboxError) as many:
            publish_many(conn, [(unique.key("many"), "order.paid", 1)], require_transaction=True)
        for err, function in ((one, "outbox.publish"), (many, "outbox.publish_many")):
            assert err.value.sqlstate == "OB428"
            assert err.value.message.startswith(f"{function}: nothing has been written")
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'strict')", (unique.order_id,))
            publish(conn, unique.key("after"), "order.paid", 1, require_transaction=True)
    assert db.intent(unique.key("one")) is None
    assert db.intent(unique.key("many")) is None
    assert db.intent(unique.key("after")) is not None


def test_psycopg2_and_sqlalchemy_connections_publish_too(
    database_url: str, db: Db, unique: Unique
) -> None:
    conn = psycopg2.connect(database_url)
    try:
        pg2 = publish(conn, unique.key("pg2"), "order.paid", {"via": "psycopg2"})
        assert db.intent(unique.key("pg2")) is None  # the caller commits
        conn.commit()
        with pytest.raises(Conflict):
            publish(conn, unique.key("pg2"), "order.paid", {"via": "other"})
        conn.rollback()
    finally:
        conn.close()
    engine = create_engine(_sa_url(database_url, "psycopg"))
    try:
        with Session(engine) as session, session.begin():
            session.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'sa')"), {"id": unique.order_id}
            )
            [dup, new] = publish_many(
                session,
                [
                    (unique.key("pg2"), "order.paid", {"via": "psycopg2"}),
                    Event(unique.key("sa"), "order.paid", {"via": "sqlalchemy"}, tenant="t1"),
                ],
            )
    finally:
        engine.dispose()
    assert dup == Enqueued(pg2.id, True)
    assert new.duplicate is False
    row = db.intent(unique.key("sa"))
    assert row is not None
    assert row["payload"] == {"type": "order.paid", "tenant": "t1", "data": {"via": "sqlalchemy"}}


@pytest.mark.asyncio
async def test_async_connections_publish(database_url: str, db: Db, unique: Unique) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            r = await publish_async(conn, unique.key("async"), "order.paid", [1], tenant="t")
        with pytest.raises(TypeError, match="is async: use publish_async"):
            publish(conn, unique.key("async"), "order.paid", [1])
    engine = create_async_engine(_sa_url(database_url, "psycopg"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            got = await publish_many_async(
                session,
                [
                    Event(unique.key("async"), "order.paid", [1], tenant="t"),
                    (unique.key("async-many"), "order.paid", [2]),
                ],
            )
    finally:
        await engine.dispose()
    assert got == [Enqueued(r.id, True), Enqueued(got[1].id, False)]
    row = db.intent(unique.key("async-many"))
    assert row is not None
    assert row["payload"] == {"type": "order.paid", "tenant": None, "data": [2]}
