"""The active OpenTelemetry span's trace context goes with the intent, and
the relay sends it on to the receiver."""

from __future__ import annotations

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import Event, Item, Webhook, enqueue, enqueue_many, publish, publish_many

tracer = TracerProvider().get_tracer("checkout")


def test_an_active_spans_trace_id_arrives_at_the_receiver(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("traced")
    with (
        tracer.start_as_current_span("POST /orders") as span,
        psycopg.connect(database_url) as conn,
        conn.transaction(),
    ):
        enqueue(conn, key, Webhook(url=receiver.url(unique.path()), body={"traced": True}))
        ctx = span.get_span_context()
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    row = db.intent(key)
    assert row is not None
    assert row["traceparent"] == expected

    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.headers["traceparent"] == expected
    assert got.headers["traceparent"].split("-")[1] == f"{ctx.trace_id:032x}"


def test_an_explicit_traceparent_wins_and_the_tracestate_comes_along(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    remote = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("rojo", "00f067aa0ba902b7")]),
    )
    explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    url = receiver.url(unique.path())
    with (
        trace.use_span(NonRecordingSpan(remote)),
        psycopg.connect(database_url) as conn,
        conn.transaction(),
    ):
        enqueue(conn, unique.key("span"), Webhook(url=url, body=1))
        enqueue(conn, unique.key("explicit"), Webhook(url=url, body=2), traceparent=explicit)
        enqueue_many(
            conn,
            [
                (unique.key("many-span"), Webhook(url=url, body=3)),
                Item(unique.key("many-explicit"), Webhook(url=url, body=4), traceparent=explicit),
            ],
        )
    from_span = ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=00f067aa0ba902b7")
    stored = {}
    for name in ("span", "explicit", "many-span", "many-explicit"):
        row = db.intent(unique.key(name))
        assert row is not None
        stored[name] = (row["traceparent"], row["tracestate"])
    assert stored == {
        "span": from_span,
        "explicit": (explicit, None),
        "many-span": from_span,
        "many-explicit": (explicit, None),
    }


def test_without_a_span_the_transactions_setting_stands(
    database_url: str, db: Db, receiver: Receiver, unique: Unique
) -> None:
    setting = "00-11111111111111111111111111111111-2222222222222222-01"
    assert not trace.get_current_span().get_span_context().is_valid
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute(f"SET LOCAL outbox.traceparent = '{setting}'")
        enqueue(conn, unique.key("setting"), Webhook(url=receiver.url("/t"), body=1))
        enqueue_many(conn, [(unique.key("setting-many"), Webhook(url=receiver.url("/t"), body=2))])
    with psycopg.connect(database_url) as conn, conn.transaction():
        enqueue(conn, unique.key("none"), Webhook(url=receiver.url("/t"), body=3))
    for name, expected in (("setting", setting), ("setting-many", setting), ("none", None)):
        row = db.intent(unique.key(name))
        assert row is not None
        assert row["traceparent"] == expected, name


def test_an_event_takes_the_active_spans_traceparent_unless_given_one(
    database_url: str, db: Db, unique: Unique
) -> None:
    remote = SpanContext(
        trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
        span_id=0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with (
        trace.use_span(NonRecordingSpan(remote)),
        psycopg.connect(database_url) as conn,
        conn.transaction(),
    ):
        publish(conn, unique.key("span"), "order.paid", 1)
        publish(conn, unique.key("explicit"), "order.paid", 2, traceparent=explicit)
        publish_many(
            conn,
            [
                (unique.key("many-span"), "order.paid", 3),
                Event(unique.key("many-explicit"), "order.paid", 4, traceparent=explicit),
            ],
        )
    with psycopg.connect(database_url) as conn, conn.transaction():
        publish(conn, unique.key("none"), "order.paid", 5)
    from_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    stored = {}
    for name in ("span", "explicit", "many-span", "many-explicit", "none"):
        row = db.intent(unique.key(name))
        assert row is not None
        stored[name] = row["traceparent"]
    assert stored == {
        "span": from_span,
        "explicit": explicit,
        "many-span": from_span,
        "many-explicit": explicit,
        "none": None,
    }
