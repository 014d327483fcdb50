"""Strict mode: `require_transaction=True`, or the setting
`outbox.require_transaction`, refuses (SQLSTATE OB428) an enqueue that would
commit on its own, and writes nothing."""

from __future__ import annotations

import psycopg
import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from conftest import Db, Receiver, Unique
from outbox_relay import (
    OutboxError,
    Webhook,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)


def _sa_url(database_url: str, driver: str) -> str:
    return f"postgresql+{driver}://{database_url.split('://', 1)[1]}"


def _refused(err: pytest.ExceptionInfo[OutboxError], function: str) -> None:
    assert err.value.sqlstate == "OB428"
    assert err.value.message.startswith(f"{function}: nothing has been written")
    assert err.value.hint is not None
    assert "BEGIN" in err.value.hint


def test_an_autocommit_enqueue_is_refused_in_strict_mode_and_written_without_it(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        with pytest.raises(OutboxError) as one:
            enqueue(conn, unique.key("one"), hook, require_transaction=True)
        _refused(one, "outbox.enqueue")
        with pytest.raises(OutboxError) as many:
            enqueue_many(conn, [(unique.key("many"), hook)], require_transaction=True)
        _refused(many, "outbox.enqueue_many")
        assert db.intent(unique.key("one")) is None
        assert db.intent(unique.key("many")) is None
        # the default: written, and committed by the statement itself
        enqueue(conn, unique.key("loose"), hook)
        assert db.intent(unique.key("loose")) is not None


def test_strict_mode_passes_after_the_business_rows_in_their_transaction(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=2)
    with psycopg.connect(database_url) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'strict')", (unique.order_id,))
            r = enqueue(conn, unique.key("after"), hook, require_transaction=True)
            [m] = enqueue_many(conn, [(unique.key("after-many"), hook)], require_transaction=True)
        # a transaction that has written nothing yet is refused too: the
        # intent comes after the rows it goes with
        with pytest.raises(OutboxError) as first, conn.transaction():
            enqueue(conn, unique.key("first"), hook, require_transaction=True)
        _refused(first, "outbox.enqueue")
    assert db.order_exists(unique.order_id)
    row = db.intent(unique.key("after"))
    assert row is not None
    assert row["id"] == r.id
    assert db.intent(unique.key("after-many")) is not None
    assert m.duplicate is False
    assert db.intent(unique.key("first")) is None


def test_the_setting_makes_every_enqueue_of_the_session_strict(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=3)
    with psycopg.connect(
        database_url, autocommit=True, options="-c outbox.require_transaction=on"
    ) as conn:
        with pytest.raises(OutboxError) as one:
            enqueue(conn, unique.key("set"), hook)
        _refused(one, "outbox.enqueue")
        with pytest.raises(OutboxError) as many:
            enqueue_many(conn, [(unique.key("set-many"), hook)])
        _refused(many, "outbox.enqueue_many")
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, note) VALUES (%s, 'set')", (unique.order_id,))
            enqueue(conn, unique.key("set-tx"), hook)
        conn.execute("SET outbox.require_transaction = maybe")
        with pytest.raises(OutboxError) as bad:
            enqueue(conn, unique.key("bad"), hook)
        assert bad.value.sqlstate == "22023"
        assert "outbox.require_transaction is 'maybe'" in bad.value.message
    assert db.intent(unique.key("set")) is None
    assert db.intent(unique.key("set-many")) is None
    assert db.intent(unique.key("set-tx")) is not None


def test_psycopg2_and_sqlalchemy_in_autocommit_are_refused_in_strict_mode(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=4)
    conn = psycopg2.connect(database_url)
    conn.autocommit = True
    try:
        with pytest.raises(OutboxError) as pg2:
            enqueue(conn, unique.key("pg2"), hook, require_transaction=True)
        _refused(pg2, "outbox.enqueue")
    finally:
        conn.close()
    autocommit = create_engine(_sa_url(database_url, "psycopg"), isolation_level="AUTOCOMMIT")
    engine = create_engine(_sa_url(database_url, "psycopg2"))
    try:
        with autocommit.connect() as sa, pytest.raises(OutboxError) as auto:
            enqueue(sa, unique.key("sa"), hook, require_transaction=True)
        _refused(auto, "outbox.enqueue")
        with Session(engine) as s, s.begin():
            s.execute(
                text("INSERT INTO orders (id, note) VALUES (:id, 'sa')"), {"id": unique.order_id}
            )
            enqueue(s, unique.key("sa-tx"), hook, require_transaction=True)
    finally:
        autocommit.dispose()
        engine.dispose()
    assert db.intent(unique.key("pg2")) is None
    assert db.intent(unique.key("sa")) is None
    assert db.intent(unique.key("sa-tx")) is not None


@pytest.mark.asyncio
async def test_async_enqueues_are_refused_in_strict_mode_in_autocommit(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=5)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        with pytest.raises(OutboxError) as one:
            await enqueue_async(conn, unique.key("async"), hook, require_transaction=True)
        _refused(one, "outbox.enqueue")
    engine = create_async_engine(_sa_url(database_url, "psycopg"), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as sa:
            with pytest.raises(OutboxError) as many:
                await enqueue_many_async(
                    sa, [(unique.key("async-many"), hook)], require_transaction=True
                )
            _refused(many, "outbox.enqueue_many")
    finally:
        await engine.dispose()
    assert db.intent(unique.key("async")) is None
    assert db.intent(unique.key("async-many")) is None
