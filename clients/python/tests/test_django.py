"""Django's connection (`django.db.connection`, `connections[...]`) inside
`transaction.atomic()`."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import unquote, urlsplit

import django
import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import (
    Charge,
    Conflict,
    Enqueued,
    Event,
    OutboxError,
    Webhook,
    enqueue,
    enqueue_many,
    publish,
    publish_many,
)
from test_lost_connection import HOOK, terminated_while_waiting


@pytest.fixture(scope="module", autouse=True)
def django_settings(database_url: str) -> Iterator[None]:
    u = urlsplit(database_url)
    if not settings.configured:
        settings.configure(
            USE_TZ=True,
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": u.path.lstrip("/"),
                    "USER": unquote(u.username or "postgres"),
                    "PASSWORD": unquote(u.password or ""),
                    "HOST": u.hostname or "127.0.0.1",
                    "PORT": str(u.port or 5432),
                }
            },
        )
        django.setup()
    yield
    connections.close_all()


def test_django_commits_the_row_and_the_intent_together(
    db: Db, relay: Relay, receiver: Receiver, unique: Unique
) -> None:
    key = unique.key("django")
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'dj')", [unique.order_id])
        r = enqueue(connection, key, Webhook(url=receiver.url(unique.path()), body={"dj": 1}))
        assert db.intent(key) is None  # not before the atomic block commits
    assert r.duplicate is False
    assert db.order_exists(unique.order_id)
    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"dj": 1}
    assert got.headers["webhook-id"].startswith("msg_")


def test_django_rollback_duplicate_conflict_and_refusal(
    db: Db, receiver: Receiver, unique: Unique
) -> None:
    conn = connections["default"]
    url = receiver.url(unique.path())
    with pytest.raises(RuntimeError), transaction.atomic():
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", [unique.order_id])
        enqueue(conn, unique.key("rb"), Webhook(url=url, body=1))
        raise RuntimeError("abandon")
    assert not db.order_exists(unique.order_id)
    assert db.intent(unique.key("rb")) is None

    charge = Charge(amount=1999, currency="usd", payment_method="pm_card_visa")
    with transaction.atomic():
        first = enqueue(conn, unique.key("c"), charge)
    with transaction.atomic():
        [again, new] = enqueue_many(
            connection, [(unique.key("c"), charge), (unique.key("w"), Webhook(url=url, body=2))]
        )
    assert again == Enqueued(first.id, True)
    assert new.duplicate is False

    with pytest.raises(Conflict) as raised, transaction.atomic():
        with conn.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'x')", [unique.order_id])
        enqueue(conn, unique.key("c"), Charge(amount=1, currency="usd", payment_method="pm"))
    assert raised.value.key == unique.key("c")
    assert not db.order_exists(unique.order_id)

    with pytest.raises(OutboxError) as refused, transaction.atomic():
        enqueue(conn, "", charge)
    assert refused.value.sqlstate == "22023"


def test_django_publishes_in_atomic_and_rolls_back_with_it(db: Db, unique: Unique) -> None:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'dj')", [unique.order_id])
        r = publish(connection, unique.key("dj-event"), "order.paid", {"dj": 1}, tenant="t1")
        assert db.intent(unique.key("dj-event")) is None  # not before the atomic block commits
    with pytest.raises(RuntimeError), transaction.atomic():
        publish(connection, unique.key("dj-gone"), "order.paid", {"dj": 2})
        raise RuntimeError("abandon")
    with transaction.atomic():
        [again, new] = publish_many(
            connection,
            [
                Event(unique.key("dj-event"), "order.paid", {"dj": 1}, tenant="t1"),
                (unique.key("dj-new"), "order.paid", {"dj": 3}),
            ],
        )
    with pytest.raises(Conflict) as raised, transaction.atomic():
        publish(connection, unique.key("dj-event"), "order.paid", {"dj": 9})
    assert raised.value.key == unique.key("dj-event")
    assert again == Enqueued(r.id, True)
    assert new.duplicate is False
    assert db.intent(unique.key("dj-gone")) is None
    row = db.intent(unique.key("dj-event"))
    assert row is not None
    assert (row["kind"], row["payload"]) == (
        "event",
        {"type": "order.paid", "tenant": "t1", "data": {"dj": 1}},
    )


def test_django_outside_atomic_is_refused_in_strict_mode(
    db: Db, receiver: Receiver, unique: Unique
) -> None:
    hook = Webhook(url=receiver.url(unique.path()), body=3)
    with pytest.raises(OutboxError) as refused:
        enqueue(connection, unique.key("dj-auto"), hook, require_transaction=True)
    assert refused.value.sqlstate == "OB428"
    assert db.intent(unique.key("dj-auto")) is None
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("INSERT INTO orders (id, note) VALUES (%s, 'dj')", [unique.order_id])
        enqueue(connection, unique.key("dj-atomic"), hook, require_transaction=True)
    assert db.intent(unique.key("dj-atomic")) is not None


def test_django_raises_its_own_error_when_the_server_ends_the_connection(
    database_url: str, unique: Unique
) -> None:
    key = unique.key("lost-django")
    with pytest.raises(django.db.OperationalError) as raised, transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            [pid] = cur.fetchone() or [0]
        with terminated_while_waiting(database_url, key, pid):
            enqueue(connection, key, HOOK)
    assert not isinstance(raised.value, OutboxError)
    connection.close()
