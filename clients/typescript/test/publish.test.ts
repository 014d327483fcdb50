// publish and publishMany: an event is one intent of kind `event`, written in
// the caller's transaction through outbox.enqueue (its duplicates and
// conflicts), with the payload { type, tenant, data }.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import knexFactory from "knex";
import { Kysely, PostgresDialect, sql } from "kysely";
import pg from "pg";

import {
  OutboxConflict,
  OutboxError,
  fromKnex,
  fromKysely,
  publish,
  publishMany,
  type Queryable,
} from "../src/index.js";
import { DATABASE_URL, businessTable, connect, rowsOf, stored, unique } from "./harness.js";

let db: pg.Client;

before(async () => {
  db = await connect();
});
after(async () => {
  await db.end();
});

/** The error a promise rejects with. */
async function failure(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => assert.fail("it succeeded"),
    (e: unknown) => e,
  );
}

test("an event commits with its business row, and a rollback leaves neither", async () => {
  const orders = await businessTable();
  const key = unique("order:paid");
  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (42, 1999)`);
  const r = await publish(db, { key, type: "order.paid", data: { order: 42, amount: 1999 } });
  assert.equal(await stored(key), undefined, "not before the commit");
  await db.query("COMMIT");

  assert.equal(typeof r.id, "bigint");
  assert.equal(r.duplicate, false);
  const row = await stored(key);
  assert.equal(row?.id, String(r.id));
  assert.equal(row?.kind, "event");
  assert.equal(row?.destination, null);
  assert.deepEqual(row?.payload, { type: "order.paid", tenant: null, data: { order: 42, amount: 1999 } });
  assert.equal(await rowsOf(orders), 1);

  const gone = unique("order:paid");
  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (43, 500)`);
  await publish(db, { key: gone, type: "order.paid", data: { order: 43 } });
  await db.query("ROLLBACK");
  assert.equal(await stored(gone), undefined);
  assert.equal(await rowsOf(orders), 1);
});

test("the same event again is a duplicate with the same id; another under its key is OutboxConflict", async () => {
  const orders = await businessTable();
  const key = unique("invoice");
  const first = await publish(db, { key, type: "invoice.created", data: { invoice: 7, lines: [1, 2] } });
  // another object, keys in another order: compared as jsonb
  const again = await publish(db, { data: { lines: [1, 2], invoice: 7 }, type: "invoice.created", key });
  assert.equal(first.duplicate, false);
  assert.deepEqual(again, { id: first.id, duplicate: true });

  await db.query("BEGIN");
  await db.query(`INSERT INTO ${orders} (id, total) VALUES (44, 2500)`);
  const err = await failure(publish(db, { key, type: "invoice.created", data: { invoice: 8 } }));
  assert.ok(err instanceof OutboxConflict, String(err));
  assert.ok(err instanceof OutboxError);
  assert.equal(err.key, key);
  assert.equal(err.sqlstate, "OB409");
  assert.equal(err.message, `outbox.enqueue: key ${key} was already used for a different intent`);
  const commit = await db.query("COMMIT");
  assert.equal(commit.command, "ROLLBACK");
  assert.equal(await rowsOf(orders), 0);

  const type = await failure(publish(db, { key, type: "invoice.paid", data: { invoice: 7, lines: [1, 2] } }));
  assert.ok(type instanceof OutboxConflict, String(type));
  assert.deepEqual((await stored(key))?.payload, {
    type: "invoice.created",
    tenant: null,
    data: { invoice: 7, lines: [1, 2] },
  });
});

test("a bad event type or tenant is refused with the server's reason, and nothing is written", async () => {
  const orders = await businessTable();
  const key = unique("bad");
  for (const type of ["order paid", "order..paid", ".order", "", "x".repeat(201)]) {
    await db.query("BEGIN");
    await db.query(`INSERT INTO ${orders} (id, total) VALUES (1, 1)`);
    const err = await failure(publish(db, { key, type, data: { order: 1 } }));
    await db.query("ROLLBACK");
    assert.ok(err instanceof OutboxError && !(err instanceof OutboxConflict), String(err));
    assert.equal(err.sqlstate, "22023");
    assert.match(err.message, /^outbox\.publish: event type .* is not a dotted name/);
  }
  for (const tenant of ["", "t".repeat(201)]) {
    const err = await failure(publish(db, { key, type: "order.paid", data: 1, tenant }));
    assert.ok(err instanceof OutboxError, String(err));
    assert.equal(err.sqlstate, "22023");
    assert.match(err.message, /tenant must be 1 to 200 characters/);
  }
  const fine = unique("fine");
  const many = await failure(
    publishMany(db, [
      { key: fine, type: "order.paid", data: 1 },
      { key, type: "order paid", data: 2 },
    ]),
  );
  assert.ok(many instanceof OutboxError, String(many));
  assert.equal(many.sqlstate, "22023");
  assert.match(many.message, new RegExp(`event 2 \\(key '${key}'\\)`));
  assert.equal(await stored(key), undefined);
  assert.equal(await stored(fine), undefined);
  assert.equal(await rowsOf(orders), 0);

  await assert.rejects(publish(db, { key, type: 1 as unknown as string, data: 1 }), TypeError);
  await assert.rejects(
    publish(db, { key, type: "order.paid", data: undefined as unknown as null }),
    /null for none/,
  );
  await assert.rejects(publish({} as Queryable, { key, type: "order.paid", data: 1 }), /fromKnex\(trx\)/);
});

test("publishMany answers in input order, new and duplicate events mixed, in one statement", async () => {
  const [a, b, c] = ["a", "b", "c"].map((n) => unique(`batch:${n}`)) as [string, string, string];
  const earlier = await publish(db, { key: b, type: "order.shipped", data: { n: 2 }, tenant: "acme" });
  const seen: string[] = [];
  const logging: Queryable = { query: (text, values) => (seen.push(text), db.query(text, values)) };
  await db.query("BEGIN");
  const answers = await publishMany(logging, [
    { key: a, type: "order.created", data: { n: 1 } },
    { key: b, type: "order.shipped", data: { n: 2 }, tenant: "acme" },
    { key: c, type: "order.paid", data: null, tenant: "acme" },
    { key: a, type: "order.created", data: { n: 1 } },
  ]);
  await db.query("COMMIT");

  assert.equal(seen.length, 1, "one statement");
  assert.match(seen[0] ?? "", /outbox\.publish_many\(/);
  assert.doesNotMatch(seen[0] ?? "", /BEGIN|COMMIT|ROLLBACK|SAVEPOINT/i);
  assert.deepEqual(
    answers.map((r) => r.duplicate),
    [false, true, false, true],
  );
  assert.equal(answers[1]?.id, earlier.id);
  assert.equal(answers[3]?.id, answers[0]?.id);
  assert.ok((answers[0]?.id ?? 0n) < (answers[2]?.id ?? 0n), "new ids are drawn in input order");
  for (const [i, key] of [a, b, c].entries()) {
    assert.equal(String(answers[i]?.id), (await stored(key))?.id, key);
  }
  assert.deepEqual(await Promise.all([a, b, c].map(async (k) => (await stored(k))?.payload)), [
    { type: "order.created", tenant: null, data: { n: 1 } },
    { type: "order.shipped", tenant: "acme", data: { n: 2 } },
    { type: "order.paid", tenant: "acme", data: null },
  ]);
  assert.deepEqual(await publishMany(db, []), []);

  const d = unique("batch:d");
  const clash = await failure(
    publishMany(db, [
      { key: d, type: "order.paid", data: 1 },
      { key: b, type: "order.shipped", data: { n: 3 }, tenant: "acme" },
    ]),
  );
  assert.ok(clash instanceof OutboxConflict, String(clash));
  assert.equal(clash.key, b);
  assert.equal(await stored(d), undefined);
});

test("a tenant, or none, is part of the event", async () => {
  const [none, acme] = [unique("tenant:none"), unique("tenant:acme")];
  const n = await publish(db, { key: none, type: "user.created", data: { user: 1 } });
  const t = await publish(db, { key: acme, type: "user.created", data: { user: 1 }, tenant: "acme" });
  assert.notEqual(n.id, t.id);
  assert.deepEqual((await stored(none))?.payload, { type: "user.created", tenant: null, data: { user: 1 } });
  assert.deepEqual((await stored(acme))?.payload, {
    type: "user.created",
    tenant: "acme",
    data: { user: 1 },
  });
  // null is none: the same event
  assert.deepEqual(await publish(db, { key: none, type: "user.created", data: { user: 1 }, tenant: null }), {
    id: n.id,
    duplicate: true,
  });
  // another tenant is another event
  const err = await failure(
    publish(db, { key: none, type: "user.created", data: { user: 1 }, tenant: "acme" }),
  );
  assert.ok(err instanceof OutboxConflict, String(err));
});

test("strict mode refuses an event that would commit on its own", async () => {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 2 });
  const [one, many, ok] = [unique("strict:one"), unique("strict:many"), unique("strict:ok")];
  try {
    for (const [call, fn] of [
      [
        () => publish(pool, { key: one, type: "order.paid", data: 1 }, { requireTransaction: true }),
        "outbox.publish",
      ],
      [
        () => publishMany(pool, [{ key: many, type: "order.paid", data: 1 }], { requireTransaction: true }),
        "outbox.publish_many",
      ],
    ] as const) {
      const err = await failure(call());
      assert.ok(err instanceof OutboxError, String(err));
      assert.equal(err.sqlstate, "OB428");
      assert.ok(err.message.startsWith(`${fn}: nothing has been written`), err.message);
    }
    const orders = await businessTable();
    await db.query("BEGIN");
    await db.query(`INSERT INTO ${orders} (id, total) VALUES (1, 1)`);
    await publish(db, { key: ok, type: "order.paid", data: 1 }, { requireTransaction: true });
    await db.query("COMMIT");
  } finally {
    await pool.end();
  }
  assert.equal(await stored(one), undefined);
  assert.equal(await stored(many), undefined);
  assert.equal((await stored(ok))?.kind, "event");
});

test("Knex and Kysely transactions publish too", async () => {
  const orders = await businessTable();
  const knex = knexFactory({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 1 } });
  const kysely = new Kysely<Record<string, never>>({
    dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: DATABASE_URL, max: 1 }) }),
  });
  const [k1, k2] = [unique("knex:event"), unique("kysely:event")];
  try {
    const viaKnex = await knex.transaction(async (trx) => {
      await trx(orders).insert({ id: 1, total: 1 });
      return publish(fromKnex(trx), { key: k1, type: "order.paid", data: { via: "knex?" }, tenant: "t1" });
    });
    const [dup, fresh] = await kysely.transaction().execute(async (trx) => {
      await sql`INSERT INTO ${sql.table(orders)} (id, total) VALUES (${2}, ${2})`.execute(trx);
      return publishMany(fromKysely(trx), [
        { key: k1, type: "order.paid", data: { via: "knex?" }, tenant: "t1" },
        { key: k2, type: "order.paid", data: { via: "kysely" } },
      ]);
    });
    assert.deepEqual(dup, { id: viaKnex.id, duplicate: true });
    assert.equal(fresh?.duplicate, false);
    const clash = await failure(
      knex.transaction((trx) =>
        publish(fromKnex(trx), { key: k2, type: "order.paid", data: { via: "knex" } }),
      ),
    );
    assert.ok(clash instanceof OutboxConflict, String(clash));
    assert.equal(clash.message, `outbox.enqueue: key ${k2} was already used for a different intent`);
  } finally {
    await knex.destroy();
    await kysely.destroy();
  }
  assert.equal(await rowsOf(orders), 2);
  assert.deepEqual((await stored(k1))?.payload, { type: "order.paid", tenant: "t1", data: { via: "knex?" } });
});
