"""psycopg 3's AsyncConnection and AsyncCursor; SQLAlchemy's AsyncSession and AsyncConnection."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import (
    Conflict,
    Enqueued,
    Item,
    Webhook,
    enqueue,
    enqueue_async,
    enqueue_many_async,
)


@pytest.mark.asyncio
async def test_an_async_connection_commits_the_row_and_the_intent_together(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("async")
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            await conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'a')", (unique.order_id,))
            r = await enqueue_async(conn, key, Webhook(url=receiver.url(unique.path()), body=[1]))
        async with conn.transaction(), conn.cursor() as cur:
            again = await enqueue_async(
                cur, key, Webhook(url=receiver.url(unique.path()), body=[1])
            )
        with pytest.raises(Conflict) as raised:
            async with conn.transaction():
                await enqueue_async(conn, key, Webhook(url=receiver.url(unique.path()), body=[2]))
        with pytest.raises(TypeError, match="is async: use enqueue_async"):
            enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body=[1]))
    assert again == Enqueued(r.id, True)
    assert raised.value.key == key
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == [1]
    assert "webhook-id" in got.headers


@pytest.mark.asyncio
async def test_an_async_rollback_leaves_neither(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO orders (id, note) VALUES (%s, 'a')", (unique.order_id,)
                )
                await enqueue_many_async(
                    conn, [(unique.key("x"), Webhook(url=receiver.url("/x"), body=1))]
                )
                raise RuntimeError("abandon")
    assert not db.order_exists(unique.order_id)
    assert db.intent(unique.key("x")) is None


@pytest.mark.asyncio
async def test_enqueue_many_async_answers_in_input_order(
    database_url: str, receiver: Receiver, unique: Unique
) -> None:
    url = receiver.url(unique.path())
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            old = await enqueue_async(conn, unique.key("old"), Webhook(url=url, body=0))
        async with conn.transaction():
            got = await enqueue_many_async(
                conn,
                [
                    Item(unique.key("new1"), Webhook(url=url, body=1)),
                    (unique.key("old"), Webhook(url=url, body=0)),
                    (unique.key("new2"), Webhook(url=url, body=2)),
                ],
            )
    assert [g.duplicate for g in got] == [False, True, False]
    assert got[1].id == old.id
    assert got[0].id < got[2].id


@pytest.mark.asyncio
async def test_a_sqlalchemy_async_session(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    engine = create_async_engine(
        database_url.replace("postgres://", "postgresql+psycopg://", 1).replace(
            "postgresql://", "postgresql+psycopg://", 1
        )
    )
    try:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'async orm')"),
                {"id": unique.order_id},
            )
            r = await enqueue_async(
                session, unique.key("orm"), Webhook(url=receiver.url(unique.path()), body="orm")
            )
        async with engine.begin() as aconn:
            dup = await enqueue_async(
                aconn, unique.key("orm"), Webhook(url=receiver.url(unique.path()), body="orm")
            )
    finally:
        await engine.dispose()
    assert dup == Enqueued(r.id, True)
    row = db.intent(unique.key("orm"))
    assert row is not None
    assert row["id"] == r.id
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == "orm"
