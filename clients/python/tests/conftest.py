"""The harness: the migrated database of DATABASE_URL, the relay binary of
OUTBOX_RELAY_BIN run with `run --once`, and a receiver on 127.0.0.1 that
records every request (webhooks, and the charge API's PaymentIntents)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set (clients/python/check.sh takes it)", pytrace=False)
    return value


@pytest.fixture(scope="session")
def database_url() -> str:
    return _env("DATABASE_URL")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """An HTTP server that answers 200 and keeps what it was sent."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                with lock:
                    receiver.requests.append(Request("POST", self.path, headers, body))
                reply = b"{}"
                if self.path.startswith("/v1/payment_intents"):  # the charge API
                    pi = f"pi_{uuid.uuid4().hex[:24]}"
                    reply = json.dumps(
                        {"id": pi, "object": "payment_intent", "status": "succeeded"}
                    ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return self.base + path

    def at(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]


@pytest.fixture(scope="session")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


class Relay:
    """`outbox-relay run --once`: deliver everything due, then exit."""

    def __init__(self, binary: str, database_url: str, receiver: Receiver) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS": '["127.0.0.0/8"]',
            "OUTBOX_RELAY__RELAY__METRICS_ADDR": '"127.0.0.1:0"',
            "OUTBOX_RELAY__CHARGE__API_BASE": receiver.base,
            "STRIPE_API_KEY": "sk_test_python_client",
            # the tests share a database: one test's unreachable destination
            # must not hold another's intents behind an open breaker
            "OUTBOX_RELAY__BREAKER__ENABLED": "false",
            "RUST_LOG": "warn",
        }
        # no file, and no trace export: the relay then sends an intent's
        # traceparent on unchanged
        for name in [n for n in self.env if n.startswith("OTEL_")] + ["OUTBOX_RELAY_CONFIG"]:
            self.env.pop(name, None)

    def run_once(self, **env: str) -> None:
        out = subprocess.run(
            [self.binary, "run", "--once"],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, f"outbox-relay run --once failed:\n{out.stdout}\n{out.stderr}"


@pytest.fixture(scope="session")
def relay(database_url: str, receiver: Receiver) -> Relay:
    return Relay(_env("OUTBOX_RELAY_BIN"), database_url, receiver)


class Db:
    """Reads and set-up on a connection of its own (autocommit)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, total bigint, note text)"
        )

    def order_exists(self, order_id: int) -> bool:
        row = self.conn.execute("SELECT count(*) FROM orders WHERE id = %s", (order_id,)).fetchone()
        return row is not None and row[0] == 1

    def intent(self, key: str) -> dict[str, Any] | None:
        cur = self.conn.cursor(row_factory=dict_row)
        return cur.execute(
            "SELECT id, kind, payload, destination, run_after, ordering_key, source, state,"
            " last_error, traceparent, tracestate FROM outbox.intents WHERE key = %s",
            (key,),
        ).fetchone()

    def attempts(self, key: str) -> int:
        row = self.conn.execute(
            "SELECT attempts FROM outbox.intents WHERE key = %s", (key,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    def state(self, key: str) -> str | None:
        row = self.intent(key)
        return None if row is None else str(row["state"])


@pytest.fixture(scope="session")
def db(database_url: str) -> Iterator[Db]:
    d = Db(database_url)
    yield d
    d.conn.close()


class Unique:
    """Keys, order ids and receiver paths no other test (or run) uses."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:12]
        self.order_id = uuid.uuid4().int % (2**62)

    def key(self, name: str) -> str:
        return f"py:{self.tag}:{name}"

    def path(self, name: str = "hook") -> str:
        return f"/{self.tag}/{name}"


@pytest.fixture
def unique() -> Unique:
    return Unique()
