// enqueue with node-postgres: a Client and a pool's client, in the caller's
// transaction, delivered by the real relay to a real receiver.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import pg from "pg";

import { OutboxConflict, OutboxError, enqueue, webhook, type Queryable } from "../src/index.js";
import {
  DATABASE_URL,
  businessTable,
  connect,
  deliver,
  look,
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

test("a business row and its intent committed together are delivered", async () => {
  const orders = await businessTable();
  const key = unique("order:confirmation");
  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (42, 1999)`);
  const r = await enqueue(db, key, webhook({ url: hooks.url, body: { key, order: 42 } }));
  await db.query("COMMIT");

  assert.equal(typeof r.id, "bigint");
  assert.equal(r.duplicate, false);
  assert.equal(String(r.id), (await stored(key))?.id);
  await deliver();
  const [got, ...more] = requestsFor(hooks, key);
  assert.deepEqual(got?.body, { key, order: 42 });
  assert.match(String(got?.headers["webhook-id"]), /^msg_[0-9a-f]{32}$/);
  assert.equal(more.length, 0);
  assert.equal((await stored(key))?.state, "delivered");
  assert.equal(await rowsOf(orders), 1);
});

test("a rollback leaves neither the business row nor the intent", async () => {
  const orders = await businessTable();
  const key = unique("order:confirmation");
  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (43, 500)`);
  await enqueue(db, key, webhook({ url: hooks.url, body: { key } }));
  await db.query("ROLLBACK");

  await deliver();
  assert.equal(await rowsOf(orders), 0);
  assert.equal(await stored(key), undefined);
  assert.deepEqual(requestsFor(hooks, key), []);
});

test("the same key and intent again is a duplicate with the same id", async () => {
  const key = unique("order:invoice");
  const intent = webhook({ url: hooks.url, body: { key, lines: [1, 2] } });
  const first = await enqueue(db, key, intent);
  // another object, keys in another order: compared as jsonb
  const again = await enqueue(db, key, webhook({ body: { lines: [1, 2], key }, url: hooks.url }));
  assert.deepEqual(first.duplicate, false);
  assert.deepEqual(again, { id: first.id, duplicate: true });
});

test("the same key with another payload is OutboxConflict, and the business row is not committed", async () => {
  const orders = await businessTable();
  const key = unique("order:charge");
  await enqueue(db, key, webhook({ url: hooks.url, body: { key, total: 1999 } }));

  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (44, 2500)`);
  const err = await enqueue(db, key, webhook({ url: hooks.url, body: { key, total: 2500 } })).then(
    () => assert.fail("a conflicting enqueue succeeded"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof OutboxConflict, String(err));
  assert.ok(err instanceof OutboxError);
  assert.equal(err.key, key);
  assert.equal(err.sqlstate, "OB409");
  assert.equal(err.message, `outbox.enqueue: key ${key} was already used for a different intent`);
  assert.match(err.detail ?? "", /differs in payload/);
  assert.equal((err.cause as { code?: string }).code, "OB409");
  // the caller's COMMIT cannot commit an aborted transaction: Postgres rolls it back
  const commit = await db.query("COMMIT");
  assert.equal(commit.command, "ROLLBACK");
  assert.equal(await rowsOf(orders), 0);
  assert.deepEqual((await stored(key))?.payload, { url: hooks.url, body: { key, total: 1999 } });
});

test("any other refusal is OutboxError with the SQLSTATE and the server's message", async () => {
  const empty = await enqueue(db, "", webhook({ url: hooks.url, body: null })).catch((e: unknown) => e);
  assert.ok(empty instanceof OutboxError && !(empty instanceof OutboxConflict), String(empty));
  assert.equal(empty.sqlstate, "22023");
  assert.equal(empty.message, "outbox.enqueue: key must not be empty");
  assert.equal(empty.name, "OutboxError");

  const key = unique("too:large");
  const large = await enqueue(db, key, webhook({ url: hooks.url, body: "x".repeat(1_100_000) })).catch(
    (e: unknown) => e,
  );
  assert.ok(large instanceof OutboxError, String(large));
  assert.equal(large.sqlstate, "OB413");
  assert.match(
    large.message,
    new RegExp(`payload for key ${key} is [0-9]+ bytes; the limit is 1048576 bytes`),
  );
  assert.match(large.hint ?? "", /store large content elsewhere/);

  const kind = await enqueue(db, unique("bad:kind"), { kind: "Web Hook", payload: {} }).catch(
    (e: unknown) => e,
  );
  assert.ok(kind instanceof OutboxError, String(kind));
  assert.equal(kind.sqlstate, "22023");
  assert.match(kind.message, /kind 'Web Hook' is not a valid kind name/);
});

test("an id above 2^53 comes back exact, as a bigint", async () => {
  await look(
    `SELECT setval(seq, 9007199254740992)
       FROM (SELECT pg_get_serial_sequence('outbox.intents', 'id')::regclass AS seq) s
      WHERE coalesce(pg_sequence_last_value(seq), 0) < 9007199254740992`,
  );
  const ids: bigint[] = [];
  for (const n of [1, 2]) {
    const key = unique(`big:${n}`);
    const r = await enqueue(db, key, webhook({ url: hooks.url, body: { key } }));
    assert.equal(String(r.id), (await stored(key))?.id);
    assert.ok(r.id > 2n ** 53n, String(r.id));
    ids.push(r.id);
  }
  assert.equal(ids[1], (ids[0] ?? 0n) + 1n);
  // one of two consecutive ids above 2^53 has no exact double: a number would have lost it
  assert.ok(
    ids.some((id) => BigInt(Number(id)) !== id),
    String(ids),
  );
});

test("the options are the intent's columns", async () => {
  const key = unique("order:reminder");
  const runAfter = new Date(Date.now() + 3_600_000);
  await enqueue(db, key, webhook({ url: hooks.url, body: { key } }), {
    runAfter,
    orderingKey: "customer:7",
    source: "checkout",
    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    tracestate: "rojo=00f067aa0ba902b7",
  });
  const row = await stored(key);
  assert.equal(row?.run_after.getTime(), runAfter.getTime());
  assert.equal(row?.ordering_key, "customer:7");
  assert.equal(row?.source, "checkout");
  assert.equal(row?.traceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
  assert.equal(row?.tracestate, "rojo=00f067aa0ba902b7");
  // not due: run --once leaves it pending
  await deliver();
  assert.equal((await stored(key))?.state, "pending");
  assert.deepEqual(requestsFor(hooks, key), []);

  const named = unique("named");
  await enqueue(db, named, webhook({ destination: "billing", body: null }));
  assert.deepEqual(await stored(named).then((r) => [r?.destination, r?.payload]), [
    "billing",
    { body: null },
  ]);
  await assert.rejects(
    enqueue(db, unique("k"), webhook({ destination: "a", body: 1 }), { destination: "b" }),
    TypeError,
  );
  await assert.rejects(
    enqueue(db, unique("k"), webhook({ url: hooks.url, body: 1 }), { runAfter: new Date("x") }),
    TypeError,
  );
});

test("a pool's client, in a transaction of its own, is delivered", async () => {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  const orders = await businessTable();
  const key = unique("pooled");
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    await client.query(`INSERT INTO ${orders} (id, total) VALUES (1, 100)`);
    await enqueue(client, key, webhook({ url: hooks.url, body: { key } }));
    await client.query("COMMIT");
  } finally {
    client.release();
    await pool.end();
  }
  await deliver();
  assert.equal(requestsFor(hooks, key).length, 1);
  assert.equal(await rowsOf(orders), 1);
});

test("any query(text, values) works, and the client runs exactly one statement: no BEGIN, COMMIT or ROLLBACK", async () => {
  const seen: string[] = [];
  const logging: Queryable = {
    query: (text, values) => {
      seen.push(text);
      return db.query(text, values);
    },
  };
  const key = unique("logged");
  await db.query("BEGIN");
  const r = await enqueue(logging, key, webhook({ url: hooks.url, body: { key } }));
  assert.equal(seen.length, 1);
  assert.match(seen[0] ?? "", /^SELECT id::text AS id, duplicate FROM outbox\.enqueue\(/);
  assert.doesNotMatch(seen[0] ?? "", /BEGIN|COMMIT|ROLLBACK|SAVEPOINT/i);
  // still the caller's transaction: another session does not see it yet
  assert.equal(await stored(key), undefined);
  await db.query("COMMIT");
  assert.equal((await stored(key))?.id, String(r.id));

  await assert.rejects(
    enqueue({} as Queryable, key, webhook({ url: hooks.url, body: 1 })),
    /fromKnex\(trx\)/,
  );
});
