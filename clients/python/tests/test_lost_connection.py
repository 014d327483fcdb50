"""A connection the server ends while an enqueue runs (`pg_terminate_backend`,
SQLSTATE 57P01) is raised as the driver's own exception, never as a refusal."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import psycopg2
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError as SqlAlchemyOperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from conftest import Unique
from outbox_relay import OutboxError, Webhook, enqueue, enqueue_async

HOOK = Webhook(url="http://127.0.0.1:9/lost", body={"lost": True})


@contextmanager
def terminated_while_waiting(database_url: str, key: str, pid: int) -> Iterator[None]:
    """Another transaction holds `key` uncommitted, so that an enqueue of
    `key` on backend `pid` waits for it; a watcher terminates `pid` as soon
    as it waits on that lock."""
    holder = psycopg.connect(database_url)
    enqueue(holder, key, HOOK)
    terminated = threading.Event()

    def watch() -> None:
        with psycopg.connect(database_url, autocommit=True) as admin:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                row = admin.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
                if row is not None and row[0] == "Lock":
                    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    terminated.set()
                    return
                time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        watcher.join()
        holder.rollback()
        holder.close()
    assert terminated.is_set(), f"backend {pid} never waited for the held key"


def _sa_url(database_url: str, driver: str) -> str:
    return f"postgresql+{driver}://{database_url.split('://', 1)[1]}"


def test_psycopg_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique
) -> None:
    key = unique.key("lost-psycopg")
    with psycopg.connect(database_url) as conn:
        with (
            pytest.raises(psycopg.OperationalError) as raised,
            terminated_while_waiting(database_url, key, conn.info.backend_pid),
        ):
            enqueue(conn, key, HOOK)
        assert not isinstance(raised.value, OutboxError)
        assert raised.value.sqlstate in (None, "57P01")
        assert conn.closed


@pytest.mark.asyncio
async def test_psycopg_async_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique
) -> None:
    key = unique.key("lost-psycopg-async")
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        with (
            pytest.raises(psycopg.OperationalError) as raised,
            terminated_while_waiting(database_url, key, conn.info.backend_pid),
        ):
            await enqueue_async(conn, key, HOOK)
        assert not isinstance(raised.value, OutboxError)


def test_psycopg2_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique
) -> None:
    key = unique.key("lost-psycopg2")
    conn = psycopg2.connect(database_url)
    try:
        with (
            pytest.raises(psycopg2.OperationalError) as raised,
            terminated_while_waiting(database_url, key, conn.get_backend_pid()),
        ):
            enqueue(conn, key, HOOK)
        assert not isinstance(raised.value, OutboxError)
    finally:
        conn.close()


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_sqlalchemy_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique, driver: str
) -> None:
    key = unique.key(f"lost-sa-{driver}")
    engine = create_engine(_sa_url(database_url, driver))
    try:
        with Session(engine) as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            with (
                pytest.raises(SqlAlchemyOperationalError) as raised,
                terminated_while_waiting(database_url, key, pid),
            ):
                enqueue(session, key, HOOK)
            assert not isinstance(raised.value, OutboxError)
            assert raised.value.connection_invalidated
    finally:
        engine.dispose()


@pytest.mark.asyncio
async def test_sqlalchemy_async_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique
) -> None:
    key = unique.key("lost-sa-async")
    engine = create_async_engine(_sa_url(database_url, "psycopg"))
    try:
        async with engine.connect() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            with (
                pytest.raises(SqlAlchemyOperationalError) as raised,
                terminated_while_waiting(database_url, key, pid),
            ):
                await enqueue_async(conn, key, HOOK)
            assert not isinstance(raised.value, OutboxError)
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    "sqlstate",
    ["08006", "08003", "57P01", "57P02", "57P03", "57P05", "57014", "25P03", "25P04"],
)
def test_an_ended_session_or_cancelled_statement_is_not_a_refusal(sqlstate: str) -> None:
    """Every connection and operator-intervention SQLSTATE, as a driver
    error carrying it: the client leaves it to the driver."""
    from outbox_relay._drivers import translate

    class DriverError(Exception):
        pass

    err = DriverError("terminating connection")
    err.sqlstate = sqlstate  # type: ignore[attr-defined]
    assert translate(err, ["k"]) is None
    refused = DriverError("bad key")
    refused.sqlstate = "22023"  # type: ignore[attr-defined]
    assert isinstance(translate(refused, ["k"]), OutboxError)
