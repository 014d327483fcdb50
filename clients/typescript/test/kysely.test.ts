// Inside a Kysely transaction: fromKysely(trx), with Kysely's PostgresDialect.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Kysely, PostgresDialect, sql } from "kysely";
import pg from "pg";

import { OutboxConflict, enqueue, enqueueMany, fromKysely, webhook } from "../src/index.js";
import {
  DATABASE_URL,
  businessTable,
  deliver,
  receiver,
  requestsFor,
  rowsOf,
  stored,
  unique,
  type Receiver,
} from "./harness.js";

let hooks: Receiver;
let db: Kysely<Record<string, never>>;

before(async () => {
  hooks = await receiver();
  db = new Kysely({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL, max: 2 }) }),
  });
});
after(async () => {
  await db.destroy();
  await hooks.close();
});

test("db.transaction().execute: the order and its intents commit together and are delivered", async () => {
  const orders = await businessTable();
  const [key, other] = [unique("kysely:one"), unique("kysely:many")];
  const answers = await db.transaction().execute(async (trx) => {
    await sql`INSERT INTO ${sql.table(orders)} (id, total) VALUES (${1}, ${1999})`.execute(trx);
    const one = await enqueue(fromKysely(trx), key, webhook({ url: hooks.url, body: { key } }));
    const many = await enqueueMany(fromKysely(trx), [
      { key, intent: webhook({ url: hooks.url, body: { key } }) },
      { key: other, intent: webhook({ url: hooks.url, body: { key: other } }) },
    ]);
    return [one, ...many];
  });
  assert.deepEqual(
    answers.map((r) => [typeof r.id, r.duplicate]),
    [
      ["bigint", false],
      ["bigint", true],
      ["bigint", false],
    ],
  );
  assert.equal(answers[1]?.id, answers[0]?.id);
  assert.equal(String(answers[2]?.id), (await stored(other))?.id);

  await deliver();
  assert.equal(await rowsOf(orders), 1);
  for (const k of [key, other])
    assert.match(String(requestsFor(hooks, k)[0]?.headers["webhook-id"]), /^msg_/);
});

test("db.transaction().execute: a throw rolls back both", async () => {
  const orders = await businessTable();
  const key = unique("kysely:rollback");
  await assert.rejects(
    db.transaction().execute(async (trx) => {
      await sql`INSERT INTO ${sql.table(orders)} (id, total) VALUES (${2}, ${1})`.execute(trx);
      await enqueue(fromKysely(trx), key, webhook({ url: hooks.url, body: { key } }));
      throw new Error("out of stock");
    }),
    /out of stock/,
  );
  assert.equal(await rowsOf(orders), 0);
  assert.equal(await stored(key), undefined);
});

test("db.transaction().execute: a conflict is OutboxConflict, and nothing commits", async () => {
  const orders = await businessTable();
  const key = unique("kysely:conflict");
  await db
    .transaction()
    .execute((trx) => enqueue(fromKysely(trx), key, webhook({ url: hooks.url, body: 1 })));

  const err = await db
    .transaction()
    .execute(async (trx) => {
      await sql`INSERT INTO ${sql.table(orders)} (id, total) VALUES (${3}, ${3})`.execute(trx);
      await enqueue(fromKysely(trx), key, webhook({ url: hooks.url, body: 2 }));
    })
    .catch((e: unknown) => e);
  assert.ok(err instanceof OutboxConflict, String(err));
  assert.equal(err.key, key);
  assert.equal(err.message, `outbox.enqueue: key ${key} was already used for a different intent`);
  assert.equal(await rowsOf(orders), 0);
});
