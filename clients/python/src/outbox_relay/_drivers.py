"""Running a statement on the caller's connection, whichever driver made it.

Drivers are recognised by their classes in `sys.modules`: a driver the
application does not use is never imported. Nothing here begins, commits or
rolls back a transaction.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from ._errors import Conflict, OutboxError, conflict_key
from ._sql import Statement

Rows = list[Sequence[Any]]

SUPPORTED = (
    "a psycopg 3 Connection or Cursor, a psycopg2 connection or cursor, a SQLAlchemy "
    "Connection or Session, or a Django connection"
)
SUPPORTED_ASYNC = (
    "a psycopg 3 AsyncConnection or AsyncCursor, or a SQLAlchemy AsyncConnection or AsyncSession"
)


def _is(obj: object, module: str, *names: str) -> bool:
    """Is `obj` an instance of one of `module`'s classes `names` (when it is loaded)?"""
    mod = sys.modules.get(module)
    if mod is None:
        return False
    for name in names:
        cls = getattr(mod, name, None)
        if isinstance(cls, type) and isinstance(obj, cls):
            return True
    return False


def _psycopg_sql(cursor: object, stmt: Statement) -> tuple[str, list[object]]:
    if _is(cursor, "psycopg", "RawCursor", "AsyncRawCursor"):
        return stmt.dollar_style()
    return stmt.format_style()


def _sqlalchemy_text(stmt: Statement) -> tuple[Any, dict[str, object]]:
    from sqlalchemy import text

    sql, params = stmt.named_style()
    return text(sql), params


def run(conn: object, stmt: Statement, keys: Iterable[str], verb: str = "enqueue") -> Rows:
    """Execute `stmt` on `conn` and return its rows as tuples (`verb`: the
    call's name, `enqueue` or `publish`, for the messages)."""
    c: Any = conn
    try:
        if _is(c, "psycopg", "Connection", "Cursor"):
            from psycopg.rows import tuple_row

            pg = c if _is(c, "psycopg", "Connection") else c.connection
            with pg.cursor(row_factory=tuple_row) as cur:
                cur.execute(*_psycopg_sql(cur, stmt))
                return list(cur.fetchall())
        if _is(c, "psycopg2.extensions", "connection", "cursor"):
            import psycopg2.extensions

            pg = c if _is(c, "psycopg2.extensions", "connection") else c.connection
            with pg.cursor(cursor_factory=psycopg2.extensions.cursor) as cur:
                cur.execute(*stmt.format_style())
                return list(cur.fetchall())
        if _is(c, "sqlalchemy.engine", "Connection") or _is(
            c, "sqlalchemy.orm", "Session", "scoped_session"
        ):
            return list(c.execute(*_sqlalchemy_text(stmt)).all())
        if _is(c, "django.db.backends.base.base", "BaseDatabaseWrapper") or _is(
            c, "django.utils.connection", "ConnectionProxy"
        ):
            if c.vendor != "postgresql":
                raise TypeError(f"outbox-relay needs PostgreSQL, not Django's {c.vendor!r}")
            with c.cursor() as cur:
                cur.execute(*stmt.format_style())
                return list(cur.fetchall())
    except Exception as e:
        refusal = translate(e, keys)
        if refusal is None:
            raise
        raise refusal from e
    if _is(c, "psycopg", "AsyncConnection", "AsyncCursor") or _is(
        c, "sqlalchemy.ext.asyncio", "AsyncConnection", "AsyncSession", "async_scoped_session"
    ):
        raise TypeError(f"{type(conn).__name__} is async: use {verb}_async / {verb}_many_async")
    raise TypeError(
        f"cannot {verb} on a {type(conn).__module__}.{type(conn).__name__}: {SUPPORTED}"
    )


async def run_async(
    conn: object, stmt: Statement, keys: Iterable[str], verb: str = "enqueue"
) -> Rows:
    """Execute `stmt` on the async `conn` and return its rows as tuples."""
    c: Any = conn
    try:
        if _is(c, "psycopg", "AsyncConnection", "AsyncCursor"):
            from psycopg.rows import tuple_row

            pg = c if _is(c, "psycopg", "AsyncConnection") else c.connection
            async with pg.cursor(row_factory=tuple_row) as cur:
                await cur.execute(*_psycopg_sql(cur, stmt))
                return list(await cur.fetchall())
        if _is(
            c, "sqlalchemy.ext.asyncio", "AsyncConnection", "AsyncSession", "async_scoped_session"
        ):
            return list((await c.execute(*_sqlalchemy_text(stmt))).all())
    except Exception as e:
        refusal = translate(e, keys)
        if refusal is None:
            raise
        raise refusal from e
    raise TypeError(
        f"cannot {verb}_async on a {type(conn).__module__}.{type(conn).__name__}: "
        f"{SUPPORTED_ASYNC} (sync connections: use {verb} / {verb}_many)"
    )


def ended(sqlstate: str) -> bool:
    """A session or statement ended from outside rather than a refusal: class
    08 (connection exception), class 57 (operator intervention: terminated,
    cancelled, shut down, the database dropped, an idle session timed out),
    and the server's transaction timeouts that close the session (25P03,
    25P04)."""
    return sqlstate[:2] in ("08", "57") or sqlstate in ("25P03", "25P04")


def translate(exc: BaseException, keys: Iterable[str]) -> OutboxError | None:
    """The refusal a driver's exception carries (psycopg's `sqlstate`, psycopg2's
    `pgcode`, behind SQLAlchemy's `orig` or Django's `__cause__`), or None when
    it is no refusal: no SQLSTATE (a programming error) or a connection or
    statement ended from outside (`ended`), left as the driver raised it."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if isinstance(code, str) and code:
            if ended(code):
                return None
            diag = getattr(e, "diag", None)
            message = getattr(diag, "message_primary", None) or str(e).strip()
            detail = getattr(diag, "message_detail", None)
            hint = getattr(diag, "message_hint", None)
            if code == "OB409":
                return Conflict(conflict_key(message, keys), message, detail=detail, hint=hint)
            return OutboxError(code, message, detail=detail, hint=hint)
        orig = getattr(e, "orig", None)
        e = orig if isinstance(orig, BaseException) else e.__cause__
    return None
