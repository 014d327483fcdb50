// With @opentelemetry/api installed and a span active, the intent carries the
// span's traceparent, and the relay (exporting nothing) forwards it unchanged
// to the receiver.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { cp, mkdir, rm, writeFile } from "node:fs/promises";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { context, trace, type Span } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider } from "@opentelemetry/sdk-trace-base";
import type pg from "pg";

import { enqueue, enqueueMany, publish, publishMany, webhook } from "../src/index.js";
import {
  DATABASE_URL,
  connect,
  deliver,
  receiver,
  requestsFor,
  stored,
  unique,
  type Receiver,
} from "./harness.js";

let hooks: Receiver;
let db: pg.Client;
const tracer = () => trace.getTracer("checkout");

before(async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(new BasicTracerProvider());
  hooks = await receiver();
  db = await connect();
});
after(async () => {
  await db.end();
  await hooks.close();
  trace.disable();
  context.disable();
});

function traceparentOf(span: Span): string {
  const { traceId, spanId } = span.spanContext();
  return `00-${traceId}-${spanId}-01`;
}

test("an active span's trace id arrives at the receiver", async () => {
  const key = unique("traced");
  const expected = await tracer().startActiveSpan("POST /orders", async (span) => {
    try {
      await db.query("BEGIN");
      await enqueue(db, key, webhook({ url: hooks.url, body: { key } }));
      await db.query("COMMIT");
      return traceparentOf(span);
    } finally {
      span.end();
    }
  });
  assert.equal((await stored(key))?.traceparent, expected);

  await deliver();
  const [got] = requestsFor(hooks, key);
  assert.equal(got?.headers["traceparent"], expected);
  assert.equal(String(got?.headers["traceparent"]).split("-")[1], expected.split("-")[1]);
});

test("an explicit traceparent wins over the span's; enqueueMany attaches the span's to the others", async () => {
  const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const [one, two, three] = [unique("t1"), unique("t2"), unique("t3")];
  const spans = await tracer().startActiveSpan("batch", async (span) => {
    try {
      await enqueue(db, one, webhook({ url: hooks.url, body: { key: one } }), { traceparent: explicit });
      await enqueueMany(db, [
        { key: two, intent: webhook({ url: hooks.url, body: { key: two } }) },
        { key: three, intent: webhook({ url: hooks.url, body: { key: three } }), traceparent: explicit },
      ]);
      return traceparentOf(span);
    } finally {
      span.end();
    }
  });
  assert.equal((await stored(one))?.traceparent, explicit);
  assert.equal((await stored(two))?.traceparent, spans);
  assert.equal((await stored(three))?.traceparent, explicit);
});

test("an event takes the active span's traceparent, unless it has its own", async () => {
  const explicit = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const [one, two, three, four] = [unique("e1"), unique("e2"), unique("e3"), unique("e4")];
  const spans = await tracer().startActiveSpan("POST /orders", async (span) => {
    try {
      await publish(db, { key: one, type: "order.paid", data: 1 });
      await publish(db, { key: two, type: "order.paid", data: 2, traceparent: explicit });
      await publishMany(db, [
        { key: three, type: "order.paid", data: 3 },
        { key: four, type: "order.paid", data: 4, traceparent: explicit },
      ]);
      return traceparentOf(span);
    } finally {
      span.end();
    }
  });
  assert.deepEqual(
    await Promise.all([one, two, three, four].map(async (k) => (await stored(k))?.traceparent)),
    [spans, explicit, spans, explicit],
  );
  const none = unique("e5");
  await publish(db, { key: none, type: "order.paid", data: 5 });
  assert.equal((await stored(none))?.traceparent, null);
});

test("without an active span the intent carries no trace context", async () => {
  const key = unique("untraced");
  await enqueue(db, key, webhook({ url: hooks.url, body: { key } }));
  assert.equal((await stored(key))?.traceparent, null);
});

test("without @opentelemetry/api installed, enqueue works and attaches nothing", async () => {
  // the built package alone, where no node_modules can be found
  const dir = fileURLToPath(new URL("../../../../target/clients/typescript-without-otel/", import.meta.url));
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  await cp(fileURLToPath(new URL("../src/", import.meta.url)), `${dir}src`, { recursive: true });
  await writeFile(`${dir}package.json`, '{ "type": "module" }');
  const pgPath = fileURLToPath(new URL("../../node_modules/pg/lib/index.js", import.meta.url));
  const key = unique("without-otel");
  await writeFile(
    `${dir}main.js`,
    `import pg from ${JSON.stringify(pgPath)};
     import { enqueue, webhook } from "./src/index.js";
     const otel = await import("@opentelemetry/api").then(() => "present", () => "absent");
     const db = new pg.Client({ connectionString: process.env.DATABASE_URL });
     await db.connect();
     const r = await enqueue(db, ${JSON.stringify(key)}, webhook({ url: "https://h.example/", body: 1 }));
     await db.end();
     console.log(otel, String(r.id));`,
  );
  const { stdout } = await promisify(execFile)(process.execPath, [`${dir}main.js`], {
    env: { ...process.env, DATABASE_URL },
  });
  const row = await stored(key);
  assert.equal(stdout.trim(), `absent ${row?.id}`);
  assert.equal(row?.traceparent, null);
});
