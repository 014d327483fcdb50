"""The webhook drain of `outbox-relay bench`, done by PgQueuer.

Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
receiver), JOBS, CONCURRENCY. Optional tuning: BATCH_SIZE (jobs per dequeue,
default 2 x CONCURRENCY, the best of a sweep of 8,
16, 32 and 64 on the bench machine).

Installs PgQueuer's schema, adds JOBS jobs in transactions of 100 (as the
bench enqueues intents), then runs a QueueManager in drain mode with
CONCURRENCY jobs in flight (the entrypoint's concurrency limit), each job a
POST of the same body to the same receiver over one keep-alive aiohttp
session. The clock runs from the worker's start until it has drained the
queue and flushed its completions. Prints one JSON line.
"""

import asyncio
import json
import os
import sys
import time
from datetime import timedelta
from importlib.metadata import version

import aiohttp
import asyncpg
from pgqueuer import AsyncpgDriver, Job, QueueManager, Queries
from pgqueuer.domain.types import QueueExecutionMode


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        print(f"pgqueuer peer: {name} is not set", file=sys.stderr)
        sys.exit(2)
    return value


def body(n: int) -> dict:
    return {
        "event": "order.created", "order_id": n, "customer": "cus_0123456789",
        "amount": 1999, "currency": "usd", "items": [{"sku": "SKU-42", "qty": 1}],
        "note": "bench payload padded to about three hundred bytes",
    }


async def main() -> None:
    url = env("DATABASE_URL")
    hook = env("HOOK_URL")
    jobs = int(env("JOBS"))
    concurrency = int(env("CONCURRENCY"))
    batch_size = int(env("BATCH_SIZE", str(2 * concurrency)))

    setup = await asyncpg.connect(url)
    queries = Queries(AsyncpgDriver(setup))
    await queries.install()
    started = time.perf_counter()
    for start in range(0, jobs, 100):
        count = min(100, jobs - start)
        payloads = [
            json.dumps({"url": hook, "body": body(n)}).encode()
            for n in range(start, start + count)
        ]
        await queries.enqueue(["deliver"] * count, payloads, [0] * count)
    enqueue_per_s = jobs / (time.perf_counter() - started)

    worker = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(worker)))
    handled = 0
    failed = 0
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

    # HTTP requests in flight are capped by the session's connector; the
    # queue may hold up to two batches of picked jobs (its own minimum)
    @qm.entrypoint("deliver")
    async def deliver(job: Job) -> None:
        nonlocal handled, failed
        payload = json.loads(job.payload)
        async with session.post(
            payload["url"],
            json=payload["body"],
            headers={"webhook-id": f"job_{job.id}"},
        ) as res:
            await res.read()
            if res.status >= 300:
                failed += 1
                raise RuntimeError(f"receiver answered {res.status}")
        handled += 1

    started = time.perf_counter()
    await qm.run(
        batch_size=batch_size,
        mode=QueueExecutionMode.drain,
        dequeue_timeout=timedelta(seconds=1),
        max_concurrent_tasks=2 * batch_size,
    )
    seconds = time.perf_counter() - started
    await session.close()
    left = await setup.fetchval("SELECT count(*) FROM pgqueuer")
    await worker.close()
    await setup.close()
    if left:
        print(f"pgqueuer peer: {left} jobs left in the queue after the drain", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({
        "peer": "pgqueuer", "version": version("pgqueuer"), "jobs": jobs,
        "concurrency": concurrency, "batch_size": batch_size, "handled": handled,
        "failed": failed, "enqueue_per_s": enqueue_per_s, "drain_per_s": jobs / seconds,
    }))


asyncio.run(main())
