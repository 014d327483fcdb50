// What the Node.js peers of `outbox-relay-bench` share: their environment,
// the bench's job body, the POST over keep-alive connections, the sweep of
// their batch knobs and the bulk-enqueue measurement. (Not a peer itself:
// run-peer.sh runs PEER.mjs.)
//
// Protocol with the bench (run-peer.sh passes it on):
// - `PEER.mjs --sweep` prints the settings to try, one JSON object of
//   environment variables per line, and exits;
// - MODE=enqueue: add JOBS jobs with the peer's bulk API, ENQUEUE_PER_CALL
//   (1000) per call, no worker running, and print
//   {"enqueue_per_s", "enqueued", ...};
// - otherwise (a drain): print {"drain_per_s", "knobs", "drain_started_unix",
//   "drain_ended_unix", ...}, `knobs` naming the peer's own settings as its
//   API spells them, and the two times (wall-clock seconds) bounding the
//   timed drain, over which the bench reads the machine's CPU.
import http from "node:http";
import { readFileSync } from "node:fs";

export function env(name, dflt) {
  const v = process.env[name] ?? dflt;
  if (v === undefined) {
    console.error(`queue-bench peer: ${name} is not set`);
    process.exit(2);
  }
  return v;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The installed version of a package, from its package.json. */
export const versionOf = (pkg) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${pkg}/package.json`, import.meta.url))).version;

/** The bench's webhook body (about 310 bytes with the URL). */
export const body = (n) => ({
  event: "order.created", order_id: n, customer: "cus_0123456789", amount: 1999,
  currency: "usd", items: [{ sku: "SKU-42", qty: 1 }],
  note: "bench payload padded to about three hundred bytes",
});

/**
 * A POST function over one keep-alive agent whose `maxSockets` is the
 * bench's in-flight limit: at most `concurrency` requests reach the receiver
 * at once, whatever the queue runs, and connections are reused. Resolves
 * with the status once the answer is read.
 */
export function poster(concurrency) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
  return (url, webhookId, payload) =>
    new Promise((resolve, reject) => {
      const data = JSON.stringify(payload);
      const req = http.request(url, {
        method: "POST",
        agent,
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(data),
          "webhook-id": webhookId,
        },
      }, (res) => {
        res.on("error", reject);
        res.on("end", () => resolve(res.statusCode));
        res.resume();
      });
      req.on("error", reject);
      req.end(data);
    });
}

/**
 * With `--sweep`, print every combination of `knobs` (environment variable
 * → values) as one JSON line each and exit.
 */
export function answerSweep(knobs) {
  if (process.argv[2] !== "--sweep") return;
  let settings = [{}];
  for (const [name, values] of Object.entries(knobs)) {
    settings = settings.flatMap((s) => values.map((v) => ({ ...s, [name]: String(v) })));
  }
  for (const s of settings) console.log(JSON.stringify(s));
  process.exit(0);
}

/**
 * MODE=enqueue: time `add(specs)` over JOBS jobs in calls of
 * ENQUEUE_PER_CALL, one after another, then `count()` what arrived.
 */
export async function timeEnqueue(add, count, spec) {
  const jobs = Number(env("JOBS"));
  const perCall = Number(env("ENQUEUE_PER_CALL", "1000"));
  const t0 = performance.now();
  for (let start = 0; start < jobs; start += perCall) {
    const specs = [];
    for (let j = start; j < Math.min(jobs, start + perCall); j++) specs.push(spec(j));
    await add(specs);
  }
  const seconds = (performance.now() - t0) / 1000;
  return { jobs, per_call: perCall, enqueued: await count(), enqueue_per_s: jobs / seconds };
}
