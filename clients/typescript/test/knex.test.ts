// Inside a Knex transaction: fromKnex(trx), with Knex's pg client.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import knexFactory, { type Knex } from "knex";

import { OutboxConflict, OutboxError, enqueue, enqueueMany, fromKnex, webhook } from "../src/index.js";
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
let knex: Knex;

before(async () => {
  hooks = await receiver();
  knex = knexFactory({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 2 } });
});
after(async () => {
  await knex.destroy();
  await hooks.close();
});

test("knex.transaction: the order and its intents commit together and are delivered", async () => {
  const orders = await businessTable();
  const [key, other] = [unique("knex:one"), unique("knex:many")];
  const answers = await knex.transaction(async (trx) => {
    await trx(orders).insert({ id: 1, total: 1999 });
    const one = await enqueue(
      fromKnex(trx),
      key,
      webhook({ url: hooks.url, body: { key, note: "what? - a ? mark" } }),
    );
    const many = await enqueueMany(fromKnex(trx), [
      {
        key: other,
        intent: webhook({ url: hooks.url, body: { key: other } }),
        runAfter: new Date(Date.now() - 1000),
      },
      { key, intent: webhook({ url: hooks.url, body: { key, note: "what? - a ? mark" } }) },
    ]);
    return [one, ...many];
  });
  assert.deepEqual(
    answers.map((r) => [typeof r.id, r.duplicate]),
    [
      ["bigint", false],
      ["bigint", false],
      ["bigint", true],
    ],
  );
  assert.equal(answers[2]?.id, answers[0]?.id);
  assert.equal(String(answers[0]?.id), (await stored(key))?.id);

  await deliver();
  assert.equal(await rowsOf(orders), 1);
  assert.deepEqual(requestsFor(hooks, key)[0]?.body, { key, note: "what? - a ? mark" });
  assert.match(String(requestsFor(hooks, other)[0]?.headers["webhook-id"]), /^msg_/);
});

test("knex.transaction: a throw rolls back both", async () => {
  const orders = await businessTable();
  const key = unique("knex:rollback");
  await assert.rejects(
    knex.transaction(async (trx) => {
      await trx(orders).insert({ id: 2, total: 1 });
      await enqueue(fromKnex(trx), key, webhook({ url: hooks.url, body: { key } }));
      throw new Error("payment declined");
    }),
    /payment declined/,
  );
  assert.equal(await rowsOf(orders), 0);
  assert.equal(await stored(key), undefined);
});

test("knex.transaction: a conflict is OutboxConflict with the server's message, and nothing commits", async () => {
  const orders = await businessTable();
  const key = unique("knex:conflict");
  await knex.transaction((trx) => enqueue(fromKnex(trx), key, webhook({ url: hooks.url, body: 1 })));

  const err = await knex
    .transaction(async (trx) => {
      await trx(orders).insert({ id: 3, total: 3 });
      await enqueue(fromKnex(trx), key, webhook({ url: hooks.url, body: 2 }));
    })
    .catch((e: unknown) => e);
  assert.ok(err instanceof OutboxConflict, String(err));
  assert.equal(err.key, key);
  assert.equal(err.message, `outbox.enqueue: key ${key} was already used for a different intent`);
  assert.equal(await rowsOf(orders), 0);

  const empty = await knex
    .transaction((trx) => enqueue(fromKnex(trx), "", webhook({ url: hooks.url, body: 1 })))
    .catch((e: unknown) => e);
  assert.ok(empty instanceof OutboxError, String(empty));
  assert.equal(empty.sqlstate, "22023");
  assert.equal(empty.message, "outbox.enqueue: key must not be empty");
});
