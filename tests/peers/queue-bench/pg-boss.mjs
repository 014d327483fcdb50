// The webhook drain of `outbox-relay-bench`, done by pg-boss, tuned as its
// documentation says for throughput: workers fetch jobs in batches
// (`batchSize`), the handler runs a batch's jobs concurrently, and a batch
// is completed by one `complete` of all its ids (what `work()` does when
// the handler resolves); more than one worker is more `work()` calls (v10
// has no team options any more), each polling at its minimum interval.
//
// Environment: DATABASE_URL (a scratch database), HOOK_URL (the bench's
// receiver), JOBS, CONCURRENCY; MODE=enqueue for the bulk-enqueue
// measurement (see shared.js). Knobs: BATCH_SIZE (batchSize), WORKERS
// (`work()` calls); `--sweep` lists the settings the bench tries.
//
// Timed as the bench times the relay: the workers start on an empty queue
// and sit idle for a second; all JOBS jobs are added in one statement
// (`insert`); the clock runs from that commit until every job is in state
// `completed`. pg-boss 10 has no LISTEN/NOTIFY: a worker finds new jobs by
// polling, so up to one polling interval (0.5 s) passes before the first
// fetch, and a worker waits out the rest of its interval after a batch
// that took less: one worker runs at most batchSize per 0.5 s, so the sweep
// goes to large batches (a first sweep of 1000/2000/5000 was best at its
// top), and to 4 workers (a sweep of 1 and 2 was best with 2). Each job is a POST of the bench's body to the same
// receiver over keep-alive connections, at most CONCURRENCY in flight
// across all workers (one agent). Prints one JSON line.
import PgBoss from "pg-boss";
import { answerSweep, body, env, poster, sleep, timeEnqueue, versionOf } from "./shared.js";

answerSweep({ BATCH_SIZE: [2000, 5000, 10000], WORKERS: [1, 2, 4] });

const connectionString = env("DATABASE_URL");
const hook = env("HOOK_URL");
const jobs = Number(env("JOBS"));
const concurrency = Number(env("CONCURRENCY"));
const batchSize = Number(env("BATCH_SIZE", "2000"));
const workers = Number(env("WORKERS", "2"));
const pollingIntervalSeconds = 0.5; // the least pg-boss allows
const version = versionOf("pg-boss");
const queue = "deliver";
const spec = (j) => ({ name: queue, data: { url: hook, body: body(j) } });

const boss = new PgBoss({ connectionString, max: workers + 4 });
boss.on("error", (e) => console.error(`pg-boss peer: ${e.message ?? e}`));
await boss.start();
await boss.createQueue(queue);
const db = boss.getDb();
const query = async (sql) => (await db.executeSql(sql)).rows[0];

if (env("MODE", "drain") === "enqueue") {
  const result = await timeEnqueue(
    (specs) => boss.insert(specs),
    async () => Number((await query(`SELECT count(*) AS n FROM pgboss.job WHERE name = '${queue}'`)).n),
    spec,
  );
  await boss.stop({ graceful: false, wait: true });
  console.log(JSON.stringify({ peer: "pg-boss", version, api: "insert", ...result }));
  process.exit(0);
}

// open jobs only: created, retry or active (completed jobs stay until archived)
const anyOpen = async () =>
  (await query(`SELECT EXISTS (SELECT 1 FROM pgboss.job WHERE name = '${queue}' AND state < 'completed') AS open`)).open;

const post = poster(concurrency);
let handled = 0;
let failed = 0;
const deliver = async (job) => {
  const status = await post(job.data.url, `job_${job.id}`, job.data.body);
  if (status >= 300) {
    failed++;
    throw new Error(`receiver answered ${status}`);
  }
  handled++;
};
for (let w = 0; w < workers; w++) {
  // resolving completes the whole batch in one statement; a rejection fails it
  await boss.work(queue, { batchSize, pollingIntervalSeconds }, (batch) =>
    Promise.all(batch.map(deliver)));
}
// idle and polling before the work arrives, as the bench's relays are
await sleep(1000);

const specs = [];
for (let j = 0; j < jobs; j++) specs.push(spec(j));
await boss.insert(specs);
const t0 = performance.now();
// wall-clock seconds, for the bench's CPU readings of the same window
const startedUnix = Date.now() / 1000;
const deadline = t0 + 600_000;
// every job handled, then its batch's completion committed
while (handled < jobs || (await anyOpen())) {
  if (performance.now() > deadline) {
    console.error(`pg-boss peer: ${handled} of ${jobs} jobs handled after 10 minutes`);
    process.exit(1);
  }
  await sleep(handled < jobs ? 5 : 20);
}
const seconds = (performance.now() - t0) / 1000;
const endedUnix = Date.now() / 1000;
await boss.stop({ graceful: true, wait: true });
console.log(JSON.stringify({
  peer: "pg-boss", version, jobs, concurrency,
  knobs: { batchSize, workers, pollingIntervalSeconds },
  handled, failed, drain_per_s: jobs / seconds,
  drain_started_unix: startedUnix, drain_ended_unix: endedUnix,
}));
// the agent's idle keep-alive connections would hold the process open
process.exit(0);
