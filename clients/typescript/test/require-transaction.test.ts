// Strict mode: `requireTransaction: true`, or the setting
// outbox.require_transaction, refuses (SQLSTATE OB428) an enqueue that would
// commit on its own (a bare pool, a client outside BEGIN, a Knex or Kysely
// instance rather than its transaction), and writes nothing.

import assert from "node:assert/strict";
import { test } from "node:test";

import knexFactory from "knex";
import { Kysely, PostgresDialect } from "kysely";
import pg from "pg";

import { OutboxError, enqueue, enqueueMany, fromKnex, fromKysely, webhook } from "../src/index.js";
import { DATABASE_URL, businessTable, connect, stored, unique } from "./harness.js";

const hook = (key: string) => webhook({ url: "http://127.0.0.1:9/strict", body: { key } });

async function refused(call: Promise<unknown>, fn: string): Promise<void> {
  await assert.rejects(call, (err: unknown) => {
    assert.ok(err instanceof OutboxError, String(err));
    assert.equal(err.sqlstate, "OB428");
    assert.ok(err.message.startsWith(`${fn}: nothing has been written`), err.message);
    assert.match(err.hint ?? "", /BEGIN/);
    return true;
  });
}

test("a pool and a client outside BEGIN are refused in strict mode, and write without it", async () => {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  const client = await connect();
  try {
    const [a, b, c, loose] = [
      unique("strict:pool"),
      unique("strict:many"),
      unique("strict:client"),
      unique("loose"),
    ];
    await refused(enqueue(pool, a, hook(a), { requireTransaction: true }), "outbox.enqueue");
    await refused(
      enqueueMany(pool, [{ key: b, intent: hook(b) }], { requireTransaction: true }),
      "outbox.enqueue_many",
    );
    await refused(enqueue(client, c, hook(c), { requireTransaction: true }), "outbox.enqueue");
    for (const key of [a, b, c]) assert.equal(await stored(key), undefined, key);
    await enqueue(pool, loose, hook(loose)); // the default: committed by the statement itself
    assert.notEqual(await stored(loose), undefined);
  } finally {
    await client.end();
    await pool.end();
  }
});

test("strict mode passes after the business rows, inside BEGIN", async () => {
  const orders = await businessTable();
  const client = await connect();
  try {
    const [one, many, first] = [unique("strict:one"), unique("strict:many"), unique("strict:first")];
    await client.query("BEGIN");
    await client.query(`INSERT INTO ${orders} (id, total) VALUES (1, 100)`);
    await enqueue(client, one, hook(one), { requireTransaction: true });
    await enqueueMany(client, [{ key: many, intent: hook(many) }], { requireTransaction: true });
    await client.query("COMMIT");
    assert.notEqual(await stored(one), undefined);
    assert.notEqual(await stored(many), undefined);
    // a transaction that has written nothing yet is refused too
    await client.query("BEGIN");
    await refused(enqueue(client, first, hook(first), { requireTransaction: true }), "outbox.enqueue");
    await client.query("ROLLBACK");
  } finally {
    await client.end();
  }
});

test("a Knex or Kysely instance, not its transaction, is refused in strict mode", async () => {
  const knex = knexFactory({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 1 } });
  const db = new Kysely<Record<string, never>>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL, max: 1 }) }),
  });
  try {
    const [k, y] = [unique("strict:knex"), unique("strict:kysely")];
    await refused(enqueue(fromKnex(knex), k, hook(k), { requireTransaction: true }), "outbox.enqueue");
    await refused(enqueue(fromKysely(db), y, hook(y), { requireTransaction: true }), "outbox.enqueue");
    assert.equal(await stored(k), undefined);
    assert.equal(await stored(y), undefined);
  } finally {
    await knex.destroy();
    await db.destroy();
  }
});

test("the setting outbox.require_transaction makes every enqueue of the session strict", async () => {
  const client = new pg.Client({
    connectionString: DATABASE_URL,
    options: "-c outbox.require_transaction=on",
  });
  await client.connect();
  try {
    const key = unique("strict:setting");
    await refused(enqueue(client, key, hook(key)), "outbox.enqueue");
    assert.equal(await stored(key), undefined);
  } finally {
    await client.end();
  }
});
