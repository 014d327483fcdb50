// The webhook drain of `outbox-relay-bench`, done by Graphile Worker.
//
// Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
// receiver), JOBS, CONCURRENCY. Optional tuning: LOCAL_QUEUE_SIZE (default
// CONCURRENCY + 1, as the Graphile Worker docs advise), COMPLETE_BATCH_DELAY_MS
// (default 50). Both defaults were the best of a sweep on the bench machine
// (sizes 17, 64, 200; delays 0 and 50 ms).
//
// Timed as the bench times the relay: the worker starts on an empty queue
// and sits idle for a second; all JOBS jobs are added in one transaction;
// the clock runs from that commit until the last job is completed (Graphile
// Worker deletes a job when it completes). Each job is a POST of the bench's
// body to the same receiver; CONCURRENCY jobs run at once, fetched in
// batches (localQueue) and completed in batches. Prints one JSON line.
import { run, makeWorkerUtils, Logger } from "graphile-worker";
import { readFileSync } from "node:fs";

const env = (name, dflt) => {
  const v = process.env[name] ?? dflt;
  if (v === undefined) {
    console.error(`graphile-worker peer: ${name} is not set`);
    process.exit(2);
  }
  return v;
};
const connectionString = env("DATABASE_URL");
const hook = env("HOOK_URL");
const jobs = Number(env("JOBS"));
const concurrency = Number(env("CONCURRENCY"));
const localQueueSize = Number(env("LOCAL_QUEUE_SIZE", String(concurrency + 1)));
const completeDelay = Number(env("COMPLETE_BATCH_DELAY_MS", "50"));
const version = JSON.parse(
  readFileSync(new URL("./node_modules/graphile-worker/package.json", import.meta.url)),
).version;

const body = (n) => ({
  event: "order.created", order_id: n, customer: "cus_0123456789", amount: 1999,
  currency: "usd", items: [{ sku: "SKU-42", qty: 1 }],
  note: "bench payload padded to about three hundred bytes",
});
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const quiet = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
const utils = await makeWorkerUtils({ connectionString, logger: quiet });
await utils.migrate();
// cheap enough to ask often: the bench's own check reads two partial indexes
const anyLeft = async () =>
  (await utils.withPgClient((c) =>
    c.query("SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS left"))).rows[0].left;

let handled = 0;
let failed = 0;
const runner = await run({
  connectionString,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  maxPoolSize: concurrency + 4,
  // per-job info lines would cost more than the jobs; errors still show
  logger: quiet,
  preset: {
    worker: {
      localQueue: { size: localQueueSize },
      completeJobBatchDelay: completeDelay,
      failJobBatchDelay: completeDelay,
    },
  },
  taskList: {
    deliver: async (payload, helpers) => {
      const res = await fetch(payload.url, {
        method: "POST",
        headers: { "content-type": "application/json", "webhook-id": `job_${helpers.job.id}` },
        body: JSON.stringify(payload.body),
      });
      await res.arrayBuffer();
      if (!res.ok) {
        failed++;
        throw new Error(`receiver answered ${res.status}`);
      }
      handled++;
    },
  },
});
// idle and listening before the work arrives, as the bench's relays are
await sleep(1000);

const specs = [];
for (let j = 0; j < jobs; j++) {
  specs.push({ identifier: "deliver", payload: { url: hook, body: body(j) } });
}
await utils.addJobs(specs);
const t0 = performance.now();
const deadline = t0 + 600_000;
// every job handled, then its batched completion committed
while (handled < jobs || (await anyLeft())) {
  if (performance.now() > deadline) {
    console.error(`graphile-worker peer: ${handled} of ${jobs} jobs handled after 10 minutes`);
    process.exit(1);
  }
  await sleep(handled < jobs ? 5 : 20);
}
const seconds = (performance.now() - t0) / 1000;
await runner.stop();
await utils.release();
console.log(JSON.stringify({
  peer: "graphile-worker", version, jobs, concurrency, local_queue_size: localQueueSize,
  complete_batch_delay_ms: completeDelay, handled, failed, drain_per_s: jobs / seconds,
}));
