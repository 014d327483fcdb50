"""Every kind the relay delivers has a builder here, and what each builder
makes is valid by its kind's JSON Schema (schema/kinds/<kind>.json in the
repository, which the relay's own tests hold to its payload checks). A kind
with a schema and no builder fails this test. The `event` kind has no
builder: `publish` writes it, and what it writes, read back from the
database, is checked instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import psycopg
import pytest

from conftest import Db, Unique
from outbox_relay import (
    JSON,
    Amqp,
    Charge,
    Email,
    Event,
    IntentLike,
    Kafka,
    Nats,
    Webhook,
    publish,
    publish_many,
)

SCHEMAS = Path(__file__).resolve().parents[3] / "schema" / "kinds"

# each kind's builders, from the fewest fields to all of them
BUILT: dict[str, list[IntentLike]] = {
    "webhook": [
        Webhook(url="https://h.example/in", body={"n": 1}),
        Webhook(body=None, headers={"x-tenant": "t1"}),
    ],
    "email": [
        Email(to="a@example.com", subject="Hi", text="t"),
        Email(
            from_="Shop <shop@example.com>",
            to=["a@example.com", "B <b@example.org>"],
            cc="c@example.com",
            bcc=["d@example.com"],
            reply_to="help@example.com",
            subject="Receipt",
            text="plain",
            html="<p>html</p>",
        ),
    ],
    "charge": [
        Charge(amount=1999, currency="usd", payment_method="pm_card_visa"),
        Charge(
            amount=500,
            currency="eur",
            payment_method="pm_x",
            customer="cus_1",
            description="Order 42",
            metadata={"order": "42"},
        ),
    ],
    "nats": [
        Nats(subject="orders.created", body={"id": 1}),
        Nats(subject="orders.created", body=[1], headers={"tenant": "t"}),
    ],
    "amqp": [
        Amqp(exchange="", routing_key="work", body=None),
        Amqp(
            exchange="orders", routing_key="created", body=1, headers={"v": 2, "ok": True, "t": "x"}
        ),
    ],
    "kafka": [
        Kafka(topic="orders.v1", body=None),
        Kafka(
            topic="orders.v1", key="acct-1", body={"id": 1}, headers={"source": "shop"}, partition=2
        ),
    ],
}


# the kinds written by a call of their own rather than by enqueue and a builder
PUBLISHED = ["event"]


def _kinds() -> list[str]:
    return sorted(p.stem for p in SCHEMAS.glob("*.json"))


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{kind}.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_schemas_are_found() -> None:
    assert _kinds(), f"no schemas in {SCHEMAS}"


@pytest.mark.parametrize("kind", [k for k in _kinds() if k not in PUBLISHED])
def test_every_kind_has_a_builder_whose_payloads_the_schema_takes(kind: str) -> None:
    validator = _validator(kind)
    assert kind in BUILT, f"the Python client has no builder for the {kind!r} kind"
    for intent in BUILT[kind]:
        assert intent.kind == kind
        errors = [e.message for e in validator.iter_errors(intent.payload())]
        assert not errors, f"{kind} {intent.payload()}: {errors}"


def test_no_builder_is_for_a_kind_without_a_schema() -> None:
    assert sorted([*BUILT, *PUBLISHED]) == _kinds()


def test_the_events_publish_writes_are_valid_by_the_event_schema(
    database_url: str, db: Db, unique: Unique
) -> None:
    validator = _validator("event")
    data: list[JSON] = [{"order": 42, "amount": 1999}, None, [1, "two"], "text"]
    with psycopg.connect(database_url) as conn, conn.transaction():
        publish(conn, unique.key("e0"), "order.paid", data[0], tenant="acme")
        publish(conn, unique.key("e1"), "invoice.created", data[1])
        publish_many(
            conn,
            [
                Event(unique.key("e2"), "a_b-c.D9", data[2], tenant="t" * 200),
                (unique.key("e3"), "x", data[3]),
            ],
        )
    for n in range(4):
        row: dict[str, Any] | None = db.intent(unique.key(f"e{n}"))
        assert row is not None
        assert row["kind"] == "event"
        assert row["payload"]["data"] == data[n]
        errors = [e.message for e in validator.iter_errors(row["payload"])]
        assert not errors, f"event {row['payload']}: {errors}"
