"""The guide's first example (docs/guides/client-python.md) runs as written,
with its order number and URL made this test's own; so does its example of
publishing an event."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import Db, Receiver, Relay, Unique

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "client-python.md"


def test_the_guides_example_runs_and_is_delivered(
    db: Db, relay: Relay, receiver: Receiver, unique: Unique, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    example: str = blocks[0]
    assert len(example.strip().splitlines()) <= 10
    n = str(unique.order_id)
    code = example.replace("45", n).replace(
        "http://127.0.0.1:48080/orders", receiver.url(unique.path())
    )
    exec(compile(code, str(GUIDE), "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed[1] == "False"
    assert db.order_exists(unique.order_id)
    row = db.intent(f"order:{n}:confirmation")
    assert row is not None
    assert str(row["id"]) == printed[0]

    relay.run_once()
    [got] = receiver.at(unique.path())
    assert got.json() == {"order": unique.order_id, "total": 2500}


def test_the_guides_publish_example_runs(
    db: Db, unique: Unique, capsys: pytest.CaptureFixture[str]
) -> None:
    section = GUIDE.read_text().split("## Publishing events", 1)[1]
    example: str = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[0]
    assert len(example.strip().splitlines()) <= 10
    n = str(unique.order_id)
    exec(compile(example.replace("50", n), str(GUIDE), "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed[1] == "False"
    assert db.order_exists(unique.order_id)
    row = db.intent(f"order:{n}:paid")
    assert row is not None
    assert str(row["id"]) == printed[0]
    assert row["kind"] == "event"
    assert row["payload"] == {
        "type": "order.paid",
        "tenant": "acme",
        "data": {"order": unique.order_id, "total": 1999},
    }
