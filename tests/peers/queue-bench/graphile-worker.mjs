// The webhook drain of `outbox-relay bench`, done by Graphile Worker.
//
// Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
// receiver), JOBS, CONCURRENCY. Optional tuning: LOCAL_QUEUE_SIZE (default
// CONCURRENCY + 1, as the Graphile Worker docs advise), COMPLETE_BATCH_DELAY_MS
// (default 50). Both defaults were the best of a sweep on the bench machine
// (sizes 17, 64, 200; delays 0 and 50 ms).
//
// Adds JOBS jobs in transactions of 100 (as the bench enqueues intents),
// then starts a worker with CONCURRENCY jobs in flight, batched fetches
// (localQueue) and batched completions, each job a POST of the same body to
// the same receiver. The clock runs from the worker's start until the job
// table is empty (Graphile Worker deletes a job when it completes). Prints
// one JSON line.
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

const quiet = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
const utils = await makeWorkerUtils({ connectionString, logger: quiet });
await utils.migrate();
const tAdd = performance.now();
for (let i = 0; i < jobs; i += 100) {
  const specs = [];
  for (let j = i; j < Math.min(i + 100, jobs); j++) {
    specs.push({ identifier: "deliver", payload: { url: hook, body: body(j) } });
  }
  await utils.addJobs(specs);
}
const enqueuePerS = jobs / ((performance.now() - tAdd) / 1000);
const remaining = async () =>
  Number((await utils.withPgClient((c) => c.query("SELECT count(*) AS n FROM graphile_worker.jobs"))).rows[0].n);

let handled = 0;
let failed = 0;
const t0 = performance.now();
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
while ((await remaining()) > 0) {
  await new Promise((r) => setTimeout(r, 20));
}
const seconds = (performance.now() - t0) / 1000;
await runner.stop();
await utils.release();
console.log(JSON.stringify({
  peer: "graphile-worker", version, jobs, concurrency, local_queue_size: localQueueSize,
  complete_batch_delay_ms: completeDelay, handled, failed,
  enqueue_per_s: enqueuePerS, drain_per_s: jobs / seconds,
}));
