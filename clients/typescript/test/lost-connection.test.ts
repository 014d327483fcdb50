// A connection the server ends while an enqueue runs (pg_terminate_backend,
// SQLSTATE 57P01) is thrown as the driver threw it, never as an OutboxError:
// with a pg Client, a pool's client, Knex and Kysely.

import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";

import knexFactory from "knex";
import { Kysely, PostgresDialect, sql } from "kysely";
import pg from "pg";

import { outboxErrorOf } from "../src/errors.js";
import { OutboxError, enqueue, fromKnex, fromKysely, webhook, type Queryable } from "../src/index.js";
import { DATABASE_URL, connect, unique } from "./harness.js";

const hook = webhook({ url: "http://127.0.0.1:9/lost", body: { lost: true } });

/**
 * Runs `call` (an enqueue of `key` on backend `pid`) while another
 * transaction holds `key` uncommitted, so that the enqueue waits; as soon as
 * it waits on that lock, the backend is terminated. Answers what `call` threw.
 */
async function terminatedWhileWaiting(
  key: string,
  pid: number,
  call: () => Promise<unknown>,
): Promise<unknown> {
  const holder = await connect();
  const admin = await connect();
  try {
    await holder.query("BEGIN");
    await enqueue(holder, key, hook);
    const watch = (async () => {
      for (const deadline = Date.now() + 20_000; Date.now() < deadline; await sleep(20)) {
        const { rows } = await admin.query<{ w: string | null }>(
          "SELECT wait_event_type AS w FROM pg_stat_activity WHERE pid = $1",
          [pid],
        );
        if (rows[0]?.w === "Lock") {
          await admin.query("SELECT pg_terminate_backend($1)", [pid]);
          return true;
        }
      }
      return false;
    })();
    const thrown = await call().then(
      () => undefined,
      (err: unknown) => err,
    );
    assert.equal(await watch, true, `backend ${pid} never waited for the held key`);
    return thrown;
  } finally {
    await holder.query("ROLLBACK");
    await holder.end();
    await admin.end();
  }
}

/** The driver's own error for the terminated backend: no OutboxError, 57P01 kept. */
function assertDriversOwn(err: unknown): void {
  assert.ok(err instanceof Error, `expected the driver's error, got ${String(err)}`);
  assert.ok(!(err instanceof OutboxError), `a lost connection became an OutboxError: ${err.message}`);
  const code = (err as { code?: unknown }).code;
  assert.ok(code === "57P01" || code === undefined, `unexpected code ${String(code)}`);
}

/** Ends a client whose backend may be gone (end() then never settles). */
async function endQuietly(client: pg.Client): Promise<void> {
  await Promise.race([client.end().catch(() => {}), sleep(1000)]);
}

async function pidOf(q: Queryable): Promise<number> {
  const { rows } = await q.query("SELECT pg_backend_pid() AS pid");
  return Number((rows[0] as { pid: number }).pid);
}

test("a pg Client: the terminated backend's error is node-postgres's own", async () => {
  const client = await connect();
  client.on("error", () => {}); // the client reports the closed socket too
  try {
    await client.query("BEGIN");
    const key = unique("lost:client");
    const err = await terminatedWhileWaiting(key, await pidOf(client), () => enqueue(client, key, hook));
    assertDriversOwn(err);
  } finally {
    await endQuietly(client);
  }
});

test("a pool's client: the terminated backend's error is node-postgres's own", async () => {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  pool.on("error", () => {});
  const client = await pool.connect();
  client.on("error", () => {});
  try {
    await client.query("BEGIN");
    const key = unique("lost:pool");
    const err = await terminatedWhileWaiting(key, await pidOf(client), () => enqueue(client, key, hook));
    assertDriversOwn(err);
    client.release(err instanceof Error ? err : true);
  } finally {
    await Promise.race([pool.end().catch(() => {}), sleep(1000)]);
  }
});

test("a Knex transaction: the terminated backend's error is the driver's own", async () => {
  const knex = knexFactory({ client: "pg", connection: DATABASE_URL, pool: { min: 0, max: 1 } });
  try {
    const key = unique("lost:knex");
    let thrown: unknown;
    await knex
      .transaction(async (trx) => {
        const pid = await pidOf(fromKnex(trx));
        thrown = await terminatedWhileWaiting(key, pid, () => enqueue(fromKnex(trx), key, hook));
        throw thrown;
      })
      .catch(() => {}); // Knex's rollback fails too, on the closed connection
    assertDriversOwn(thrown);
  } finally {
    await knex.destroy();
  }
});

test("a Kysely transaction: the terminated backend's error is the driver's own", async () => {
  const pool = new pg.Pool({ connectionString: DATABASE_URL, max: 1 });
  pool.on("error", () => {});
  pool.on("connect", (c) => c.on("error", () => {})); // the closed socket, reported to the client
  const db = new Kysely<Record<string, never>>({ dialect: new PostgresDialect({ pool }) });
  try {
    const key = unique("lost:kysely");
    let thrown: unknown;
    await db
      .transaction()
      .execute(async (trx) => {
        const { rows } = await sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`.execute(trx);
        const pid = Number(rows[0]?.pid);
        thrown = await terminatedWhileWaiting(key, pid, () => enqueue(fromKysely(trx), key, hook));
        throw thrown;
      })
      .catch(() => {}); // Kysely's rollback fails too, on the closed connection
    assertDriversOwn(thrown);
  } finally {
    await Promise.race([db.destroy().catch(() => {}), sleep(1000)]);
  }
});

test("every connection and operator-intervention SQLSTATE is left to the driver", () => {
  for (const code of ["08006", "08003", "57P01", "57P02", "57P03", "57P05", "57014", "25P03", "25P04"]) {
    const err = Object.assign(new Error("terminating connection"), { code, severity: "FATAL" });
    assert.equal(outboxErrorOf(err, ["k"]), err, code);
  }
  const refused = Object.assign(new Error("bad key"), { code: "22023", severity: "ERROR" });
  assert.ok(outboxErrorOf(refused, ["k"]) instanceof OutboxError);
});
