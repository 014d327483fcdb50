"""The webhook drain of `outbox-relay-bench`, done by PgQueuer.

Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
receiver), JOBS, CONCURRENCY. Optional tuning: BATCH_SIZE (jobs per dequeue,
default 2 x CONCURRENCY, the best of a sweep of 8, 16, 32 and 64 on the
bench machine).

Timed as the bench times the relay: a QueueManager starts on an empty queue
and sits idle for a second; all JOBS jobs are enqueued in one statement;
the clock runs from that commit until every job is handled and its
completion written (PgQueuer removes a job from its queue table then).
Each job is a POST of the bench's body to the same receiver through one
keep-alive aiohttp session whose connector allows CONCURRENCY connections:
that caps the requests in flight, while the queue may hold up to two
batches of picked jobs (its own minimum). Prints one JSON line.
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

    worker = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(worker)))
    handled = 0
    failed = 0
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

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

    running = asyncio.create_task(
        qm.run(
            batch_size=batch_size,
            dequeue_timeout=timedelta(seconds=1),
            max_concurrent_tasks=2 * batch_size,
        )
    )
    # idle and listening before the work arrives, as the bench's relays are
    await asyncio.sleep(1)

    payloads = [json.dumps({"url": hook, "body": body(n)}).encode() for n in range(jobs)]
    await queries.enqueue(["deliver"] * jobs, payloads, [0] * jobs)
    started = time.perf_counter()
    deadline = started + 600
    # every job handled, then its completion written
    while handled < jobs or await setup.fetchval("SELECT EXISTS (SELECT 1 FROM pgqueuer)"):
        if running.done():
            running.result()
            raise RuntimeError("the queue manager stopped before the work was done")
        if time.perf_counter() > deadline:
            print(f"pgqueuer peer: {handled} of {jobs} jobs handled after 10 minutes", file=sys.stderr)
            sys.exit(1)
        await asyncio.sleep(0.005 if handled < jobs else 0.02)
    seconds = time.perf_counter() - started
    qm.shutdown.set()
    await running
    await session.close()
    await worker.close()
    await setup.close()
    print(json.dumps({
        "peer": "pgqueuer", "version": version("pgqueuer"), "jobs": jobs,
        "concurrency": concurrency, "batch_size": batch_size, "handled": handled,
        "failed": failed, "drain_per_s": jobs / seconds,
    }))


asyncio.run(main())
