"""Each builder's exact payload, and what the relay does with it: webhook,
email and charge are delivered (to the receiver, a small SMTP server and the
receiver as the charge API); nats and amqp, with no broker to reach, fail to
connect (transient) instead of being rejected for their shape, as a wrong
payload beside them is."""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

import psycopg
import pytest

from conftest import Db, Receiver, Relay, Unique
from outbox_relay import JSON, Amqp, Charge, Email, Kafka, Nats, Webhook, enqueue


def test_the_payloads_are_the_kinds_own() -> None:
    assert Webhook(url="https://h.example/x", body={"a": [1, None]}).payload() == {
        "url": "https://h.example/x",
        "body": {"a": [1, None]},
    }
    assert Webhook(body=None, headers={"x-tenant": "7"}).payload() == {
        "body": None,
        "headers": {"x-tenant": "7"},
    }
    assert Email(to="a@example.com", subject="Hi", text="t").payload() == {
        "to": ["a@example.com"],
        "subject": "Hi",
        "text": "t",
    }
    assert Email(
        from_="Shop <shop@example.com>",
        to=["a@example.com", "B <b@example.org>"],
        cc="c@example.com",
        bcc=["d@example.com"],
        reply_to="help@example.com",
        subject="Receipt",
        text="plain",
        html="<p>html</p>",
    ).payload() == {
        "from": "Shop <shop@example.com>",
        "to": ["a@example.com", "B <b@example.org>"],
        "cc": ["c@example.com"],
        "bcc": ["d@example.com"],
        "reply_to": "help@example.com",
        "subject": "Receipt",
        "text": "plain",
        "html": "<p>html</p>",
    }
    assert Charge(amount=1999, currency="usd", payment_method="pm_card_visa").payload() == {
        "amount": 1999,
        "currency": "usd",
        "payment_method": "pm_card_visa",
    }
    assert Charge(
        amount=500,
        currency="eur",
        payment_method="pm_x",
        customer="cus_1",
        description="Order 42",
        metadata={"order": "42"},
    ).payload() == {
        "amount": 500,
        "currency": "eur",
        "payment_method": "pm_x",
        "customer": "cus_1",
        "description": "Order 42",
        "metadata": {"order": "42"},
    }
    assert Nats(subject="orders.created", body={"id": 42}, headers={"tenant": "t"}).payload() == {
        "subject": "orders.created",
        "body": {"id": 42},
        "headers": {"tenant": "t"},
    }
    assert Amqp(exchange="", routing_key="q", body=[1], headers={"n": 1, "b": True}).payload() == {
        "exchange": "",
        "routing_key": "q",
        "body": [1],
        "headers": {"n": 1, "b": True},
    }
    assert Kafka(topic="orders.v1", body=None).payload() == {"topic": "orders.v1", "body": None}
    assert Kafka(
        topic="orders.v1", key="acct-1", body={"id": 1}, headers={"source": "shop"}, partition=2
    ).payload() == {
        "topic": "orders.v1",
        "key": "acct-1",
        "body": {"id": 1},
        "headers": {"source": "shop"},
        "partition": 2,
    }


def test_a_builder_refuses_what_its_kind_cannot_take() -> None:
    with pytest.raises(ValueError, match="text or html"):
        Email(to="a@example.com", subject="s")
    with pytest.raises(ValueError, match="at least one address"):
        Email(to=[], subject="s", text="t")
    with pytest.raises(TypeError, match="amount"):
        Charge(amount=19.99, currency="usd", payment_method="pm")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="amount"):
        Charge(amount=True, currency="usd", payment_method="pm")
    with pytest.raises(TypeError, match="headers"):
        Nats(subject="a", body=1, headers={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="amqp header"):
        Amqp(exchange="", routing_key="q", body=1, headers={"x": 1.5})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        Webhook(url="https://h/x")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="partition"):
        Kafka(topic="t", body=1, partition=-1)
    with pytest.raises(TypeError, match="key"):
        Kafka(topic="t", body=1, key=5)  # type: ignore[arg-type]


@dataclass
class Smtp:
    """A small SMTP server on 127.0.0.1 that accepts and keeps every message."""

    messages: list[tuple[str, list[str], str]] = field(default_factory=list)
    port: int = 0


@pytest.fixture(scope="module")
def smtp() -> Iterator[Smtp]:
    box = Smtp()

    class Handler(socketserver.StreamRequestHandler):
        def say(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")

        def handle(self) -> None:
            self.say("220 localhost ESMTP test")
            sender, rcpts = "", list[str]()
            while line := self.rfile.readline().decode("utf-8", "replace"):
                verb = line[:4].upper()
                if verb in ("EHLO", "HELO"):
                    self.say("250 localhost")
                elif verb == "MAIL":
                    sender, rcpts = line.strip(), []
                    self.say("250 OK")
                elif verb == "RCPT":
                    rcpts.append(line.strip())
                    self.say("250 OK")
                elif verb == "DATA":
                    self.say("354 go ahead")
                    data = []
                    while (chunk := self.rfile.readline().decode()) not in (".\r\n", ""):
                        data.append(chunk)
                    box.messages.append((sender, rcpts, "".join(data)))
                    self.say(f"250 OK queued as Q{len(box.messages)}")
                elif verb == "QUIT":
                    self.say("221 bye")
                    return
                else:  # RSET, NOOP
                    self.say("250 OK")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    box.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield box
    server.shutdown()


@dataclass(frozen=True)
class Wrong:
    """An intent whose payload its kind does not take (the control)."""

    kind: str
    body: dict[str, JSON]

    def payload(self) -> dict[str, JSON]:
        return self.body


def test_the_relay_takes_each_builders_payload(
    database_url: str, db: Db, relay: Relay, receiver: Receiver, smtp: Smtp, unique: Unique
) -> None:
    k = unique.key
    with psycopg.connect(database_url) as conn, conn.transaction():
        enqueue(
            conn,
            k("webhook"),
            Webhook(url=receiver.url(unique.path()), body={"a": 1}, headers={"x-tenant": "7"}),
        )
        enqueue(
            conn,
            k("email"),
            Email(
                from_="Shop <shop@example.com>",
                to=["a@example.com"],
                cc="c@example.com",
                reply_to="help@example.com",
                subject=f"Receipt {unique.tag}",
                text="Thanks",
                html="<p>Thanks</p>",
            ),
        )
        enqueue(
            conn,
            k("charge"),
            Charge(
                amount=1999,
                currency="usd",
                payment_method="pm_card_visa",
                customer="cus_1",
                description=f"Order {unique.tag}",
                metadata={"order": "42"},
            ),
        )
        enqueue(conn, k("nats"), Nats(subject="orders.created", body={"id": 1}, headers={"t": "1"}))
        enqueue(
            conn,
            k("amqp"),
            Amqp(
                exchange="orders",
                routing_key="created",
                body=1,
                headers={"n": 1, "b": False, "s": "x"},
            ),
        )
        enqueue(conn, k("nats-wrong"), Wrong("nats", {"subject": "orders.*", "body": 1}))
        enqueue(conn, k("amqp-wrong"), Wrong("amqp", {"exchange": "o", "routing_key": "r"}))

    brokers = [k(name) for name in ("nats", "amqp", "nats-wrong", "amqp-wrong")]
    # a breaker an earlier run opened on this database would hold them back
    db.conn.execute("SELECT outbox.resume_destination('nats'), outbox.resume_destination('amqp')")
    for _ in range(8):
        relay.run_once(
            OUTBOX_RELAY__EMAIL__SMTP_URL=f"smtp://127.0.0.1:{smtp.port}",
            OUTBOX_RELAY__NATS__URL="nats://127.0.0.1:1",  # nothing listens there
            OUTBOX_RELAY__AMQP__URL="amqp://relay@127.0.0.1:1/",
        )
        # other tests' nats intents may have made a broker's in-flight share
        # defer some of these (back to pending in half a second, no attempt)
        if all(db.attempts(key) > 0 for key in brokers):
            break
        time.sleep(0.6)

    [hook] = receiver.at(unique.path())
    assert hook.headers["x-tenant"] == "7"
    assert db.state(k("webhook")) == "delivered"

    [mail] = [m for m in smtp.messages if f"Receipt {unique.tag}" in m[2]]
    assert "shop@example.com" in mail[0]
    assert len(mail[1]) == 2  # to and cc
    assert db.state(k("email")) == "delivered"

    [pi] = [
        r
        for r in receiver.at("/v1/payment_intents")
        if parse_qs(r.body.decode()).get("description") == [f"Order {unique.tag}"]
    ]
    form = parse_qs(pi.body.decode())
    assert (form["amount"], form["currency"], form["payment_method"]) == (
        ["1999"],
        ["usd"],
        ["pm_card_visa"],
    )
    assert form["metadata[order]"] == ["42"]
    assert db.state(k("charge")) == "delivered"

    for kind in ("nats", "amqp"):
        row = db.intent(k(kind))
        assert row is not None
        assert row["state"] == "pending", row
        assert "cannot connect" in row["last_error"]
        wrong = db.intent(k(f"{kind}-wrong"))
        assert wrong is not None
        assert wrong["state"] == "rejected", wrong
