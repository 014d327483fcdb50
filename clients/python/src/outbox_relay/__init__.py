"""Write outbox-relay intents inside your own Postgres transaction.

    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("INSERT INTO orders (id, total) VALUES (%s, %s)", (42, 1999))
        enqueue(conn, "order:42:confirmation",
                Webhook(url="https://hooks.example.com/orders", body={"order": 42}))

`publish` (and `publish_many`) writes an event the same way; after the commit
the relay delivers it to every matching subscription.

The SQL API (`outbox.enqueue`, `outbox.enqueue_many`, `outbox.publish`,
`outbox.publish_many`) is the source of truth; this package only types it.
It never begins, commits or rolls back a transaction, and imports no driver:
it uses the connection it is given.
"""

from ._api import (
    Enqueued,
    Item,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    publish,
    publish_async,
    publish_many,
    publish_many_async,
)
from ._errors import Conflict, OutboxError
from ._intents import JSON, Amqp, Charge, Email, IntentLike, Kafka, Nats, Webhook
from ._sql import Event, RunAfter

__all__ = [
    "JSON",
    "Amqp",
    "Charge",
    "Conflict",
    "Email",
    "Enqueued",
    "Event",
    "IntentLike",
    "Item",
    "Kafka",
    "Nats",
    "OutboxError",
    "RunAfter",
    "Webhook",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "publish",
    "publish_async",
    "publish_many",
    "publish_many_async",
]
