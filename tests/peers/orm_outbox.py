#!/usr/bin/env python3
"""An application that can only INSERT rows through its ORM (SQLAlchemy),
writing intents into the insertable view outbox.outbox inside its own
business transaction.

    orm_outbox.py DATABASE_URL RECEIVER_URL

Prints one JSON line of what happened: each step's outcome, and for the
conflict the SQLSTATE the database raised.
"""

import json
import sys

from sqlalchemy import Column, DateTime, Integer, Text, create_engine
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, declarative_base

Base = declarative_base()


class Order(Base):
    __tablename__ = "orm_orders"
    id = Column(Integer, primary_key=True)
    total = Column(Integer, nullable=False)


class OutboxRow(Base):
    """outbox.outbox: an INSERT is outbox.enqueue."""

    __tablename__ = "outbox"
    __table_args__ = {"schema": "outbox"}
    key = Column(Text, primary_key=True)
    kind = Column(Text, nullable=False)
    payload = Column(JSONB, nullable=False)
    destination = Column(Text)
    run_after = Column(DateTime(timezone=True))
    ordering_key = Column(Text)
    source = Column(Text)


def main():
    url, receiver = sys.argv[1], sys.argv[2]
    url = url.replace("postgres://", "postgresql+psycopg2://", 1)
    engine = create_engine(url)
    Order.__table__.create(engine, checkfirst=True)
    hook = lambda n: {"url": receiver, "body": {"order": n}}
    out = {}

    # the business row and its intent, in one transaction
    with Session(engine) as s, s.begin():
        s.add(Order(id=1, total=1999))
        s.add(OutboxRow(key="orm:order:1", kind="webhook", payload=hook(1), source="orm"))
    out["first"] = "committed"

    # several intents in one flush (one INSERT statement for the ORM)
    with Session(engine) as s, s.begin():
        s.add(Order(id=2, total=500))
        s.add_all(
            OutboxRow(key="orm:order:2:%d" % i, kind="webhook", payload=hook(2), source="orm")
            for i in range(3)
        )
    out["batch"] = "committed"

    # a retry of the first transaction's intent: a duplicate, a no-op
    with Session(engine) as s, s.begin():
        s.add(OutboxRow(key="orm:order:1", kind="webhook", payload=hook(1), source="orm"))
    out["duplicate"] = "committed"

    # the same key for another operation: OB409, and the whole business
    # transaction rolls back
    try:
        with Session(engine) as s, s.begin():
            s.add(Order(id=3, total=7))
            s.add(OutboxRow(key="orm:order:1", kind="webhook", payload=hook(99), source="orm"))
        out["conflict"] = "committed"
    except DBAPIError as e:
        out["conflict"] = getattr(e.orig, "pgcode", None) or str(e.orig)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
