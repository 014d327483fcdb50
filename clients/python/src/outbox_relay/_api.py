"""enqueue and enqueue_many, publish and publish_many, sync and async."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import _drivers, _sql
from ._intents import JSON, IntentLike
from ._sql import Event, Options, RunAfter


@dataclass(frozen=True)
class Enqueued:
    """The intent's id, and whether the key was already there with the same intent."""

    id: int
    duplicate: bool


@dataclass(frozen=True)
class Item:
    """One intent of `enqueue_many`, with the options `enqueue` takes."""

    key: str
    intent: IntentLike
    destination: str | None = None
    run_after: RunAfter | None = None
    ordering_key: str | None = None
    source: str | None = None
    traceparent: str | None = None

    def options(self) -> Options:
        return Options(
            self.destination, self.run_after, self.ordering_key, self.source, self.traceparent
        )


def _one(rows: _drivers.Rows) -> Enqueued:
    if len(rows) != 1:
        raise RuntimeError(f"outbox.enqueue answered {len(rows)} rows, not 1")
    return Enqueued(int(rows[0][0]), bool(rows[0][1]))


def _items(items: Iterable[Item | tuple[str, IntentLike]]) -> list[tuple[str, IntentLike, Options]]:
    out: list[tuple[str, IntentLike, Options]] = []
    for item in items:
        if isinstance(item, Item):
            out.append((item.key, item.intent, item.options()))
        elif isinstance(item, tuple) and len(item) == 2:
            out.append((item[0], item[1], Options()))
        else:
            raise TypeError(f"an enqueue_many item is (key, intent) or Item(...), not {item!r}")
    return out


def _many(rows: _drivers.Rows, n: int, function: str = "outbox.enqueue_many") -> list[Enqueued]:
    if [int(r[0]) for r in rows] != list(range(1, n + 1)):
        raise RuntimeError(f"{function} answered {len(rows)} rows for {n} items")
    return [Enqueued(int(r[1]), bool(r[2])) for r in rows]


def _events(events: Iterable[Event | tuple[str, str, JSON]]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        if isinstance(event, Event):
            out.append(event)
        elif isinstance(event, tuple) and len(event) == 3:
            out.append(Event(event[0], event[1], event[2]))
        else:
            raise TypeError(
                f"a publish_many event is (key, event_type, data) or Event(...), not {event!r}"
            )
    return out


def enqueue(
    conn: object,
    key: str,
    intent: IntentLike,
    *,
    destination: str | None = None,
    run_after: RunAfter | None = None,
    ordering_key: str | None = None,
    source: str | None = None,
    traceparent: str | None = None,
    require_transaction: bool = False,
) -> Enqueued:
    """Write one intent inside the transaction open on `conn`; it is delivered
    once that transaction commits, and never if it rolls back.

    `conn`: a psycopg 3 Connection or Cursor, a psycopg2 connection or
    cursor, a SQLAlchemy Connection or Session, or a Django connection.
    Raises `Conflict` when `key` was used for another intent, `OutboxError`
    for any other refusal. `require_transaction=True` (strict mode) refuses,
    with SQLSTATE OB428, an enqueue in a transaction that has written
    nothing yet: on an autocommit connection, it would commit on its own.
    """
    options = Options(destination, run_after, ordering_key, source, traceparent)
    stmt = _sql.enqueue(key, intent, options, require_transaction)
    return _one(_drivers.run(conn, stmt, [key]))


def enqueue_many(
    conn: object,
    items: Sequence[Item | tuple[str, IntentLike]],
    *,
    require_transaction: bool = False,
) -> list[Enqueued]:
    """Write many intents in one statement; the answers are in input order.

    An item is `(key, intent)` or `Item(key, intent, **options)`. All items
    of one call have the same `source` (the SQL API takes one per call).
    `require_transaction` as for `enqueue`.
    """
    parsed = _items(items)
    if not parsed:
        return []
    stmt = _sql.enqueue_many(parsed, require_transaction)
    return _many(_drivers.run(conn, stmt, [k for k, _, _ in parsed]), len(parsed))


async def enqueue_async(
    conn: object,
    key: str,
    intent: IntentLike,
    *,
    destination: str | None = None,
    run_after: RunAfter | None = None,
    ordering_key: str | None = None,
    source: str | None = None,
    traceparent: str | None = None,
    require_transaction: bool = False,
) -> Enqueued:
    """`enqueue` on a psycopg 3 AsyncConnection or AsyncCursor, or a SQLAlchemy
    AsyncConnection or AsyncSession."""
    options = Options(destination, run_after, ordering_key, source, traceparent)
    stmt = _sql.enqueue(key, intent, options, require_transaction)
    return _one(await _drivers.run_async(conn, stmt, [key]))


async def enqueue_many_async(
    conn: object,
    items: Sequence[Item | tuple[str, IntentLike]],
    *,
    require_transaction: bool = False,
) -> list[Enqueued]:
    """`enqueue_many` on an async connection (see `enqueue_async`)."""
    parsed = _items(items)
    if not parsed:
        return []
    stmt = _sql.enqueue_many(parsed, require_transaction)
    return _many(await _drivers.run_async(conn, stmt, [k for k, _, _ in parsed]), len(parsed))


def publish(
    conn: object,
    key: str,
    event_type: str,
    data: JSON,
    *,
    tenant: str | None = None,
    traceparent: str | None = None,
    require_transaction: bool = False,
) -> Enqueued:
    """Publish one event inside the transaction open on `conn`: one intent of
    kind `event`, `{"type": event_type, "tenant": tenant, "data": data}`, which
    the relay expands, after the commit, into one webhook delivery per
    matching subscription; never if the transaction rolls back.

    `conn` as for `enqueue`. The key is enqueue's: the same key and event
    again is a duplicate (same id), another event under it raises `Conflict`.
    An event type is a dotted name (`order.paid`); any other refusal, a bad
    event type or tenant too, is an `OutboxError` (`22023`).
    `require_transaction` as for `enqueue`.
    """
    event = Event(key, event_type, data, tenant, traceparent)
    stmt = _sql.publish(event, require_transaction)
    return _one(_drivers.run(conn, stmt, [key], "publish"))


def publish_many(
    conn: object,
    events: Sequence[Event | tuple[str, str, JSON]],
    *,
    require_transaction: bool = False,
) -> list[Enqueued]:
    """Publish many events in one statement; the answers are in input order.

    An event is `(key, event_type, data)` or `Event(key, event_type, data,
    tenant=..., traceparent=...)`. `require_transaction` as for `enqueue`.
    """
    parsed = _events(events)
    if not parsed:
        return []
    stmt = _sql.publish_many(parsed, require_transaction)
    rows = _drivers.run(conn, stmt, [e.key for e in parsed], "publish")
    return _many(rows, len(parsed), "outbox.publish_many")


async def publish_async(
    conn: object,
    key: str,
    event_type: str,
    data: JSON,
    *,
    tenant: str | None = None,
    traceparent: str | None = None,
    require_transaction: bool = False,
) -> Enqueued:
    """`publish` on an async connection (see `enqueue_async`)."""
    event = Event(key, event_type, data, tenant, traceparent)
    stmt = _sql.publish(event, require_transaction)
    return _one(await _drivers.run_async(conn, stmt, [key], "publish"))


async def publish_many_async(
    conn: object,
    events: Sequence[Event | tuple[str, str, JSON]],
    *,
    require_transaction: bool = False,
) -> list[Enqueued]:
    """`publish_many` on an async connection (see `enqueue_async`)."""
    parsed = _events(events)
    if not parsed:
        return []
    stmt = _sql.publish_many(parsed, require_transaction)
    rows = await _drivers.run_async(conn, stmt, [e.key for e in parsed], "publish")
    return _many(rows, len(parsed), "outbox.publish_many")
