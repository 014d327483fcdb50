// The webhook drain of `outbox-relay-bench`, done by Graphile Worker, tuned
// as its performance documentation (worker.graphile.org/docs/performance)
// says: a local queue fetching jobs in batches, and batched completions and
// failures. Its own benchmark ran localQueue.size 500 with both delays 0;
// the option's documentation suggests starting from a delay of 250 ms; the
// sweep spans both.
//
// Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
// receiver), JOBS, CONCURRENCY; MODE=enqueue for the bulk-enqueue
// measurement (see shared.js). Knobs: LOCAL_QUEUE_SIZE (localQueue.size),
// BATCH_DELAY_MS (completeJobBatchDelay and failJobBatchDelay); `--sweep`
// lists the settings the bench tries.
//
// Timed as the bench times the relay: the worker starts on an empty queue
// and sits idle for a second; all JOBS jobs are added in one transaction
// (addJobs); the clock runs from that commit until the last job is
// completed (Graphile Worker deletes a job when it completes). Each job is
// a POST of the bench's body to the same receiver over keep-alive
// connections, CONCURRENCY jobs at once. Prints one JSON line.
import { run, makeWorkerUtils, Logger } from "graphile-worker";
import { answerSweep, body, env, poster, sleep, timeEnqueue, versionOf } from "./shared.js";

answerSweep({ LOCAL_QUEUE_SIZE: [500, 2000, 5000], BATCH_DELAY_MS: [0, 250, 500] });

const connectionString = env("DATABASE_URL");
const hook = env("HOOK_URL");
const jobs = Number(env("JOBS"));
const concurrency = Number(env("CONCURRENCY"));
const localQueueSize = Number(env("LOCAL_QUEUE_SIZE", "500"));
const batchDelay = Number(env("BATCH_DELAY_MS", "0"));
const version = versionOf("graphile-worker");
const spec = (j) => ({ identifier: "deliver", payload: { url: hook, body: body(j) } });

const quiet = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(message);
});
const utils = await makeWorkerUtils({ connectionString, logger: quiet });
await utils.migrate();
const query = async (sql) => (await utils.withPgClient((c) => c.query(sql))).rows[0];

if (env("MODE", "drain") === "enqueue") {
  const result = await timeEnqueue(
    (specs) => utils.addJobs(specs),
    async () => Number((await query("SELECT count(*) AS n FROM graphile_worker._private_jobs")).n),
    spec,
  );
  await utils.release();
  console.log(JSON.stringify({ peer: "graphile-worker", version, api: "addJobs", ...result }));
  process.exit(0);
}

// cheap enough to ask often: there is nothing else in the table
const anyLeft = async () =>
  (await query("SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS left")).left;

const post = poster(concurrency);
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
      completeJobBatchDelay: batchDelay,
      failJobBatchDelay: batchDelay,
    },
  },
  taskList: {
    deliver: async (payload, helpers) => {
      const status = await post(payload.url, `job_${helpers.job.id}`, payload.body);
      if (status >= 300) {
        failed++;
        throw new Error(`receiver answered ${status}`);
      }
      handled++;
    },
  },
});
// idle and listening before the work arrives, as the bench's relays are
await sleep(1000);

const specs = [];
for (let j = 0; j < jobs; j++) specs.push(spec(j));
await utils.addJobs(specs);
const t0 = performance.now();
// wall-clock seconds, for the bench's CPU readings of the same window
const startedUnix = Date.now() / 1000;
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
const endedUnix = Date.now() / 1000;
await runner.stop();
await utils.release();
console.log(JSON.stringify({
  peer: "graphile-worker", version, jobs, concurrency,
  knobs: {
    "localQueue.size": localQueueSize,
    completeJobBatchDelay: batchDelay,
    failJobBatchDelay: batchDelay,
    concurrency,
  },
  handled, failed, drain_per_s: jobs / seconds,
  drain_started_unix: startedUnix, drain_ended_unix: endedUnix,
}));
// the agent's idle keep-alive connections would hold the process open
process.exit(0);
