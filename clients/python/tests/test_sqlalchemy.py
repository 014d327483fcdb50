"""SQLAlchemy: a Connection (over psycopg2) and a Session (over psycopg 3)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import Conflict, Item, OutboxError, Webhook, enqueue, enqueue_many


def _url(database_url: str, driver: str) -> str:
    rest = database_url.split("://", 1)[1]
    return f"postgresql+{driver}://{rest}"


def test_a_sqlalchemy_connection_over_psycopg2(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    engine = create_engine(_url(database_url, "psycopg2"))
    key = unique.key("sa-conn")
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'sa')"), {"id": unique.order_id}
            )
            r = enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body={"sa": 1}))
            [dup, new] = enqueue_many(
                conn,
                [
                    Item(key, Webhook(url=receiver.url(unique.path()), body={"sa": 1})),
                    Item(unique.key("2"), Webhook(url=receiver.url(unique.path("2")), body=2)),
                ],
            )
        with pytest.raises(Conflict) as raised, engine.begin() as conn:
            enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body={"sa": 2}))
    finally:
        engine.dispose()
    assert dup.id == r.id
    assert dup.duplicate
    assert not new.duplicate
    assert raised.value.key == key
    assert isinstance(raised.value.__cause__, DBAPIError)
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"sa": 1}
    assert "webhook-id" in got.headers
    assert len(receiver.at(unique.path("2"))) == 1


def test_a_sqlalchemy_session_over_psycopg3(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    engine = create_engine(_url(database_url, "psycopg"))
    try:
        with Session(engine) as session, session.begin():
            session.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'orm')"), {"id": unique.order_id}
            )
            r = enqueue(
                session, unique.key("session"), Webhook(url=receiver.url(unique.path()), body=1)
            )

        with pytest.raises(OutboxError) as raised, Session(engine) as session, session.begin():
            session.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'no')"),
                {"id": unique.order_id + 1},
            )
            enqueue(session, "", Webhook(url=receiver.url("/s"), body=1))
    finally:
        engine.dispose()
    row = db.intent(unique.key("session"))
    assert row is not None
    assert row["id"] == r.id
    assert db.order_exists(unique.order_id)
    assert raised.value.sqlstate == "22023"
    assert not db.order_exists(unique.order_id + 1)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == 1
    assert "webhook-id" in got.headers
