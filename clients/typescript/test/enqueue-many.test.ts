// enqueueMany: one statement, answers in input order, delivered by the relay.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type pg from "pg";

import { OutboxConflict, OutboxError, enqueue, enqueueMany, webhook, type Item } from "../src/index.js";
import {
  businessTable,
  connect,
  deliver,
  receiver,
  requestsFor,
  rowsOf,
  stored,
  unique,
  type Receiver,
} from "./harness.js";

let hooks: Receiver;
let db: pg.Client;

before(async () => {
  hooks = await receiver();
  db = await connect();
});
after(async () => {
  await db.end();
  await hooks.close();
});

test("enqueueMany answers in input order, new and duplicate items mixed", async () => {
  const orders = await businessTable();
  const [a, b, c, d] = ["a", "b", "c", "d"].map((n) => unique(`batch:${n}`)) as [
    string,
    string,
    string,
    string,
  ];
  const hook = (key: string) => webhook({ url: hooks.url, body: { key } });
  const earlier = await enqueue(db, b, hook(b));
  const later = new Date(Date.now() + 3_600_000);

  const seen: string[] = [];
  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (7, 700)`);
  const answers = await enqueueMany({ query: (text, values) => (seen.push(text), db.query(text, values)) }, [
    { key: a, intent: hook(a), orderingKey: "customer:1" },
    { key: b, intent: hook(b) },
    { key: c, intent: hook(c), runAfter: later },
    { key: a, intent: hook(a), orderingKey: "customer:1" },
    { key: d, intent: hook(d) },
  ]);
  await db.query("COMMIT");

  assert.equal(seen.length, 1, "one statement");
  assert.deepEqual(
    answers.map((r) => r.duplicate),
    [false, true, false, true, false],
  );
  assert.equal(answers[1]?.id, earlier.id);
  assert.equal(answers[3]?.id, answers[0]?.id);
  for (const [i, key] of [a, b, c, a, d].entries()) {
    assert.equal(String(answers[i]?.id), (await stored(key))?.id, key);
  }
  // new ids are drawn in input order
  assert.ok(
    (answers[0]?.id ?? 0n) < (answers[2]?.id ?? 0n) && (answers[2]?.id ?? 0n) < (answers[4]?.id ?? 0n),
  );
  assert.equal((await stored(a))?.ordering_key, "customer:1");
  assert.equal((await stored(c))?.run_after.getTime(), later.getTime());

  await deliver();
  assert.equal(await rowsOf(orders), 1);
  for (const key of [a, d]) assert.equal(requestsFor(hooks, key).length, 1, key);
  assert.equal(requestsFor(hooks, c).length, 0, "run_after in an hour: not yet");
});

test("one conflicting item refuses the batch as OutboxConflict naming its key", async () => {
  const orders = await businessTable();
  const taken = unique("batch:taken");
  await enqueue(db, taken, webhook({ url: hooks.url, body: { v: 1 } }));
  const fresh = unique("batch:fresh");

  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (8, 800)`);
  const err = await enqueueMany(db, [
    { key: fresh, intent: webhook({ url: hooks.url, body: { v: 1 } }) },
    { key: taken, intent: webhook({ url: hooks.url, body: { v: 2 } }) },
  ]).catch((e: unknown) => e);
  await db.query("ROLLBACK");

  assert.ok(err instanceof OutboxConflict, String(err));
  assert.equal(err.key, taken);
  assert.equal(err.sqlstate, "OB409");
  assert.equal(await stored(fresh), undefined);
  assert.equal(await rowsOf(orders), 0);
});

test("a refused item is OutboxError with its SQLSTATE; an empty list writes nothing", async () => {
  const err = await enqueueMany(db, [
    { key: unique("ok"), intent: webhook({ url: hooks.url, body: 1 }) },
    { key: "", intent: webhook({ url: hooks.url, body: 2 }) },
  ]).catch((e: unknown) => e);
  assert.ok(err instanceof OutboxError && !(err instanceof OutboxConflict), String(err));
  assert.equal(err.sqlstate, "22023");
  assert.equal(err.message, "outbox.enqueue: key must not be empty");

  assert.deepEqual(await enqueueMany(db, []), []);
});

test("one source per call: items naming two sources are refused before any SQL", async () => {
  const seen: string[] = [];
  const items: Item[] = [
    { key: unique("s1"), intent: webhook({ url: hooks.url, body: 1 }), source: "checkout" },
    { key: unique("s2"), intent: webhook({ url: hooks.url, body: 2 }), source: "billing" },
  ];
  await assert.rejects(
    enqueueMany({ query: (text, values) => (seen.push(text), db.query(text, values)) }, items),
    (e: unknown) => e instanceof TypeError && /one source per call/.test(e.message),
  );
  assert.deepEqual(seen, []);

  const same = items.map((item) => ({ ...item, source: "checkout" }));
  await enqueueMany(db, same);
  for (const item of same) assert.equal((await stored(item.key))?.source, "checkout");
});
