"""The client imports no driver: an application that uses psycopg 3 loads
neither psycopg2, SQLAlchemy nor Django by enqueueing."""

from __future__ import annotations

import subprocess
import sys

from conftest import Unique

OTHERS = ("psycopg2", "sqlalchemy", "django")

SCRIPT = """
import json, sys
import outbox_relay
before = sorted(m for m in ("psycopg", *{others}) if m in sys.modules)
import psycopg
with psycopg.connect(sys.argv[1]) as conn, conn.transaction():
    r = outbox_relay.enqueue(conn, sys.argv[2], outbox_relay.Nats(subject="a.b", body=1))
after = sorted(m for m in {others} if m in sys.modules)
print(json.dumps({{"before": before, "after": after, "id": r.id}}))
"""


def test_enqueue_with_psycopg_loads_no_other_driver(database_url: str, unique: Unique) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(others=OTHERS), database_url, unique.key("imp")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().startswith('{"before": [], "after": [], "id": ')
