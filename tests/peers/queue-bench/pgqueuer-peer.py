"""The webhook drain of `outbox-relay-bench`, done by PgQueuer, tuned as its
performance guide (janbjorge.github.io/pgqueuer/guides/performance-tuning)
says for short jobs: a larger `batch_size` per dequeue, `max_concurrent_tasks`
at its floor of twice that, and for high throughput a connection pool driver
(AsyncpgPoolDriver, `max_size` twice the jobs in flight); the sweep tries
one connection (AsyncpgDriver) too, and batches down to 25 (a sweep of
100/500/2000 was best at 100). Completions are batched by PgQueuer
itself (a buffer of `batch_size` entries). Its durability levels that make
its tables UNLOGGED are not used: the relay's tables, and the other peers',
are durable.

Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
receiver), JOBS, CONCURRENCY; MODE=enqueue for the bulk-enqueue measurement
(ENQUEUE_PER_CALL jobs per `Queries.enqueue` call with lists, no worker
running). Knobs: BATCH_SIZE (batch_size), DRIVER (`pool` or `connection`);
`--sweep` lists the settings the bench tries, one JSON object per line.

Timed as the bench times the relay: a QueueManager starts on an empty queue
and sits idle for a second; all JOBS jobs are enqueued in one statement;
the clock runs from that commit until every job is handled and its
completion written (PgQueuer removes a job from its queue table then).
Each job is a POST of the bench's body to the same receiver through one
keep-alive aiohttp session whose connector allows CONCURRENCY connections:
that caps the requests in flight, while the queue may hold up to two
batches of picked jobs. Prints one JSON line.
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
from pgqueuer import Job, QueueManager, Queries
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver

SWEEP = {"DRIVER": ["connection", "pool"], "BATCH_SIZE": [25, 100, 500, 2000]}


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


async def enqueue(pool: asyncpg.Pool, hook: str, jobs: int) -> None:
    """MODE=enqueue: the batch API, ENQUEUE_PER_CALL jobs per call."""
    per_call = int(env("ENQUEUE_PER_CALL", "1000"))
    queries = Queries(AsyncpgPoolDriver(pool))
    started = time.perf_counter()
    for start in range(0, jobs, per_call):
        end = min(jobs, start + per_call)
        payloads = [json.dumps({"url": hook, "body": body(n)}).encode() for n in range(start, end)]
        await queries.enqueue(["deliver"] * len(payloads), payloads, [0] * len(payloads))
    seconds = time.perf_counter() - started
    enqueued = await pool.fetchval("SELECT count(*) FROM pgqueuer")
    print(json.dumps({
        "peer": "pgqueuer", "version": version("pgqueuer"), "api": "Queries.enqueue (lists)",
        "jobs": jobs, "per_call": per_call, "enqueued": enqueued, "enqueue_per_s": jobs / seconds,
    }))


async def main() -> None:
    url = env("DATABASE_URL")
    hook = env("HOOK_URL")
    jobs = int(env("JOBS"))
    concurrency = int(env("CONCURRENCY"))
    batch_size = int(env("BATCH_SIZE", "100"))
    driver = env("DRIVER", "pool")

    setup = await asyncpg.connect(url)
    await Queries(AsyncpgDriver(setup)).install()
    pool = await asyncpg.create_pool(url, min_size=2, max_size=2 * concurrency)
    if env("MODE", "drain") == "enqueue":
        await enqueue(pool, hook, jobs)
        await pool.close()
        await setup.close()
        return

    if driver == "pool":
        queries = Queries(AsyncpgPoolDriver(pool))
        driver_name = f"AsyncpgPoolDriver(max_size={2 * concurrency})"
    else:
        worker = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(worker))
        driver_name = "AsyncpgDriver"
    qm = QueueManager(queries)
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
    # wall-clock seconds, for the bench's CPU readings of the same window
    started_unix = time.time()
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
    ended_unix = time.time()
    qm.shutdown.set()
    await running
    await session.close()
    if driver != "pool":
        await worker.close()
    await pool.close()
    await setup.close()
    print(json.dumps({
        "peer": "pgqueuer", "version": version("pgqueuer"), "jobs": jobs,
        "concurrency": concurrency,
        "knobs": {
            "batch_size": batch_size, "max_concurrent_tasks": 2 * batch_size,
            "driver": driver_name,
        },
        "handled": handled, "failed": failed, "drain_per_s": jobs / seconds,
        "drain_started_unix": started_unix, "drain_ended_unix": ended_unix,
    }))


def sweep() -> None:
    """--sweep: every combination of SWEEP's values, one JSON object a line."""
    settings: list[dict[str, str]] = [{}]
    for name, values in SWEEP.items():
        settings = [{**s, name: str(v)} for s in settings for v in values]
    for s in settings:
        print(json.dumps(s))


if __name__ == "__main__":
    if sys.argv[1:] == ["--sweep"]:
        sweep()
    else:
        asyncio.run(main())
