"""The statements, `outbox.enqueue`, `outbox.enqueue_many`, `outbox.publish` and
`outbox.publish_many`, with their parameters.

Every parameter is text (or a list of texts) cast in SQL, so that each driver
binds it the same way: JSON as text cast to jsonb, times as ISO 8601 text cast
to timestamptz, delays as interval text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ._intents import JSON, IntentLike
from ._trace import active_context

RunAfter = datetime | timedelta
"""When an intent becomes due: a time with a timezone, or a delay from the database's now()."""


@dataclass(frozen=True)
class Options:
    destination: str | None = None
    run_after: RunAfter | None = None
    ordering_key: str | None = None
    source: str | None = None
    traceparent: str | None = None


@dataclass(frozen=True)
class Statement:
    """SQL with `{name}` placeholders, and the value of each name."""

    sql: str
    params: dict[str, object]

    def format_style(self) -> tuple[str, list[object]]:
        """`%s` placeholders and a list: psycopg, psycopg2, Django."""
        values: list[object] = []

        def one(m: re.Match[str]) -> str:
            values.append(self.params[m.group(1)])
            return "%s"

        return _PLACEHOLDER.sub(one, self.sql), values

    def dollar_style(self) -> tuple[str, list[object]]:
        """`$1` placeholders and a list: psycopg's RawCursor."""
        _, values = self.format_style()
        n = iter(range(1, len(values) + 1))
        return _PLACEHOLDER.sub(lambda _: f"${next(n)}", self.sql), values

    def named_style(self) -> tuple[str, dict[str, object]]:
        """`:name` placeholders and a dict: SQLAlchemy's text()."""
        return _PLACEHOLDER.sub(r":\1", self.sql), dict(self.params)


_PLACEHOLDER = re.compile(r"\{(\w+)\}")

_ENQUEUE = """SELECT id, duplicate FROM outbox.enqueue(
    p_key => <KEY>,
    p_kind => CAST({kind} AS text),
    p_payload => CAST({payload} AS jsonb),
    p_destination => CAST({destination} AS text),
    p_run_after => COALESCE(CAST({run_at} AS timestamptz), now() + CAST({delay} AS interval)),
    p_ordering_key => CAST({ordering_key} AS text),
    p_source => CAST({source} AS text),
    p_traceparent => CAST({traceparent} AS text),
    p_tracestate => CAST({tracestate} AS text))"""

_ENQUEUE_MANY = """SELECT ord, id, duplicate FROM outbox.enqueue_many(
    p_keys => <KEY>,
    p_kinds => CAST({kinds} AS text[]),
    p_payloads => CAST({payloads} AS jsonb[]),
    p_destinations => CAST({destinations} AS text[]),
    p_run_afters => (SELECT array_agg(COALESCE(u.at, now() + u.delay) ORDER BY u.ord)
                       FROM unnest(CAST({run_ats} AS timestamptz[]), CAST({delays} AS interval[]))
                            WITH ORDINALITY AS u(at, delay, ord)),
    p_ordering_keys => CAST({ordering_keys} AS text[]),
    p_source => CAST({source} AS text),
    p_traceparents => CAST({traceparents} AS text[]),
    p_tracestates => CAST({tracestates} AS text[]))
ORDER BY ord"""


_PUBLISH = """SELECT id, duplicate FROM outbox.publish(
    p_key => <KEY>,
    p_event_type => CAST({event_type} AS text),
    p_payload => CAST({payload} AS jsonb),
    p_tenant => CAST({tenant} AS text),
    p_traceparent => CAST({traceparent} AS text))"""

_PUBLISH_MANY = """SELECT ord, id, duplicate FROM outbox.publish_many(
    p_keys => <KEY>,
    p_event_types => CAST({event_types} AS text[]),
    p_payloads => CAST({payloads} AS jsonb[]),
    p_tenants => CAST({tenants} AS text[]),
    p_traceparents => CAST({traceparents} AS text[]))
ORDER BY ord"""


def _with_key(sql: str, key: str, function: str, require_transaction: bool) -> str:
    """The statement with its key argument. With `require_transaction`, the key
    goes through outbox.require_transaction, which the server runs before the
    call (an argument is evaluated first) and which refuses, with SQLSTATE
    OB428, a transaction that has written nothing yet."""
    if require_transaction:
        key = f"CASE WHEN outbox.require_transaction('{function}') THEN {key} END"
    return sql.replace("<KEY>", key)


def json_text(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def payload_text(intent: IntentLike) -> str:
    if not isinstance(intent, IntentLike):
        raise TypeError(
            f"not an intent: {type(intent).__name__} (use Webhook, Email, Charge, Nats, Amqp, "
            "or an object with `kind` and `payload()`)"
        )
    return json_text(intent.payload())


def _check(key: object, intent: IntentLike, options: Options) -> None:
    if not isinstance(key, str):
        raise TypeError(f"an intent key is a str, not {type(key).__name__}")
    if intent.kind == "webhook":
        has_url = "url" in intent.payload()
        if has_url and options.destination is not None:
            raise ValueError(
                f"webhook {key!r} has a url and a destination ({options.destination!r}): "
                "give one or the other"
            )
        if not has_url and options.destination is None:
            raise ValueError(
                f"webhook {key!r} has no url: give url= to Webhook or destination= to enqueue"
            )
    run_after = options.run_after
    if isinstance(run_after, datetime) and run_after.utcoffset() is None:
        raise ValueError(
            "run_after is a naive datetime: give it a timezone (datetime.now(timezone.utc))"
        )
    if run_after is not None and not isinstance(run_after, datetime | timedelta):
        raise TypeError(f"run_after is a datetime or a timedelta, not {type(run_after).__name__}")


def _run_at(run_after: RunAfter | None) -> str | None:
    return run_after.isoformat() if isinstance(run_after, datetime) else None


def _delay(run_after: RunAfter | None) -> str | None:
    if not isinstance(run_after, timedelta):
        return None
    d = run_after
    return f"{d.days} days {d.seconds} seconds {d.microseconds} microseconds"


def _trace(
    options: Options, active: tuple[str, str | None] | None
) -> tuple[str | None, str | None]:
    """An explicit traceparent (alone), else the active span's context, else none."""
    if options.traceparent is not None:
        return options.traceparent, None
    return active or (None, None)


def enqueue(
    key: str, intent: IntentLike, options: Options, require_transaction: bool = False
) -> Statement:
    payload = payload_text(intent)
    _check(key, intent, options)
    traceparent, tracestate = _trace(options, active_context())
    return Statement(
        _with_key(_ENQUEUE, "CAST({key} AS text)", "outbox.enqueue", require_transaction),
        {
            "key": key,
            "kind": intent.kind,
            "payload": payload,
            "destination": options.destination,
            "run_at": _run_at(options.run_after),
            "delay": _delay(options.run_after),
            "ordering_key": options.ordering_key,
            "source": options.source,
            "traceparent": traceparent,
            "tracestate": tracestate,
        },
    )


def _array(values: list[str | None]) -> list[str | None] | None:
    """The list, or NULL when every element is NULL (the parameter's default)."""
    return values if any(v is not None for v in values) else None


def enqueue_many(
    items: Sequence[tuple[str, IntentLike, Options]], require_transaction: bool = False
) -> Statement:
    sources = {o.source for _, _, o in items}
    if len(sources) > 1:
        raise ValueError(
            "enqueue_many writes one source per call, and these items name "
            f"{sorted(sources, key=str)}: split them into one call per source"
        )
    payloads = [payload_text(i) for _, i, _ in items]
    for key, intent, options in items:
        _check(key, intent, options)
    active = active_context()
    traces = [_trace(o, active) for _, _, o in items]
    return Statement(
        _with_key(
            _ENQUEUE_MANY, "CAST({keys} AS text[])", "outbox.enqueue_many", require_transaction
        ),
        {
            "keys": [k for k, _, _ in items],
            "kinds": [i.kind for _, i, _ in items],
            "payloads": payloads,
            "destinations": _array([o.destination for _, _, o in items]),
            "run_ats": _array([_run_at(o.run_after) for _, _, o in items]),
            "delays": _array([_delay(o.run_after) for _, _, o in items]),
            "ordering_keys": _array([o.ordering_key for _, _, o in items]),
            "source": sources.pop(),
            "traceparents": _array([tp for tp, _ in traces]),
            "tracestates": _array([ts for _, ts in traces]),
        },
    )


@dataclass(frozen=True)
class Event:
    """One event of `publish_many`, with the options `publish` takes."""

    key: str
    event_type: str
    data: JSON
    tenant: str | None = None
    traceparent: str | None = None


def _check_event(event: Event) -> None:
    if not isinstance(event.key, str):
        raise TypeError(f"an event key is a str, not {type(event.key).__name__}")
    if not isinstance(event.event_type, str):
        raise TypeError(f"an event type is a str, not {type(event.event_type).__name__}")
    if event.tenant is not None and not isinstance(event.tenant, str):
        raise TypeError(f"a tenant is a str or None, not {type(event.tenant).__name__}")


def _traceparent(event: Event, active: tuple[str, str | None] | None) -> str | None:
    """An explicit traceparent, else the active span's (outbox.publish takes no
    tracestate), else none."""
    if event.traceparent is not None:
        return event.traceparent
    return active[0] if active else None


def publish(event: Event, require_transaction: bool = False) -> Statement:
    _check_event(event)
    payload = json_text(event.data)
    return Statement(
        _with_key(_PUBLISH, "CAST({key} AS text)", "outbox.publish", require_transaction),
        {
            "key": event.key,
            "event_type": event.event_type,
            "payload": payload,
            "tenant": event.tenant,
            "traceparent": _traceparent(event, active_context()),
        },
    )


def publish_many(events: Sequence[Event], require_transaction: bool = False) -> Statement:
    for event in events:
        _check_event(event)
    payloads = [json_text(e.data) for e in events]
    active = active_context()
    return Statement(
        _with_key(
            _PUBLISH_MANY, "CAST({keys} AS text[])", "outbox.publish_many", require_transaction
        ),
        {
            "keys": [e.key for e in events],
            "event_types": [e.event_type for e in events],
            "payloads": payloads,
            "tenants": _array([e.tenant for e in events]),
            "traceparents": _array([_traceparent(e, active) for e in events]),
        },
    )
