// Every kind the relay delivers has a builder here, and what each builder
// makes is valid by its kind's JSON Schema (schema/kinds/<kind>.json in the
// repository, which the relay's own tests hold to its payload checks). A kind
// with a schema and no builder fails this test. The `event` kind has no
// builder: `publish` writes it, and what it writes, read back from the
// database, is checked instead.

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { Ajv2020 } from "ajv/dist/2020.js";

import {
  amqp,
  charge,
  email,
  kafka,
  nats,
  publish,
  publishMany,
  webhook,
  type Intent,
  type Json,
} from "../src/index.js";
import { connect, stored, unique } from "./harness.js";

// dist/test/ → the repository's schema/kinds
const schemas = join(dirname(fileURLToPath(import.meta.url)), "../../../../schema/kinds");

// each kind's builders, from the fewest fields to all of them
const built: Record<string, Intent[]> = {
  webhook: [
    webhook({ url: "https://h.example/in", body: { n: 1 } }),
    webhook({ destination: "partner", body: null, headers: { "x-tenant": "t1" } }),
  ],
  email: [
    email({ to: ["a@example.com"], subject: "Hi", text: "t" }),
    email({
      from: "Shop <shop@example.com>",
      to: ["a@example.com", "B <b@example.org>"],
      cc: ["c@example.com"],
      bcc: ["d@example.com"],
      reply_to: "help@example.com",
      subject: "Receipt",
      text: "plain",
      html: "<p>html</p>",
    }),
  ],
  charge: [
    charge({ amount: 1999, currency: "usd", payment_method: "pm_card_visa" }),
    charge({
      amount: 500,
      currency: "eur",
      payment_method: "pm_x",
      customer: "cus_1",
      description: "Order 42",
      metadata: { order: "42" },
    }),
  ],
  nats: [
    nats({ subject: "orders.created", body: { id: 1 } }),
    nats({ subject: "orders.created", body: [1], headers: { tenant: "t" } }),
  ],
  amqp: [
    amqp({ exchange: "", routing_key: "work", body: null }),
    amqp({ exchange: "orders", routing_key: "created", body: 1, headers: { v: 2, ok: true, t: "x" } }),
  ],
  kafka: [
    kafka({ topic: "orders.v1", body: null }),
    kafka({ topic: "orders.v1", key: "acct-1", body: { id: 1 }, headers: { source: "shop" }, partition: 2 }),
  ],
};

// the kinds written by a call of their own rather than by enqueue and a builder
const published = ["event"];

const kinds = readdirSync(schemas)
  .filter((f) => f.endsWith(".json"))
  .map((f) => f.slice(0, -".json".length))
  .sort();

function validator(kind: string) {
  const schema: unknown = JSON.parse(readFileSync(join(schemas, `${kind}.json`), "utf8"));
  // strict (an unknown keyword is an error), but union types and a "required" in
  // anyOf are plain JSON Schema
  const ajv = new Ajv2020({ strict: true, allowUnionTypes: true, strictRequired: false, allErrors: true });
  return ajv.compile(schema as object);
}

test("the schemas are found", () => {
  assert.ok(kinds.length > 0, `no schemas in ${schemas}`);
});

for (const kind of kinds.filter((k) => !published.includes(k))) {
  test(`the ${kind} builder's payloads are valid by its schema`, () => {
    const validate = validator(kind);
    const intents = built[kind];
    assert.ok(intents, `the TypeScript client has no builder for the ${JSON.stringify(kind)} kind`);
    for (const intent of intents) {
      assert.equal(intent.kind, kind);
      assert.ok(
        validate(intent.payload),
        `${kind} ${JSON.stringify(intent.payload)}: ${JSON.stringify(validate.errors)}`,
      );
    }
  });
}

test("no builder is for a kind without a schema", () => {
  assert.deepEqual([...Object.keys(built), ...published].sort(), kinds);
});

test("the events publish writes are valid by the event schema", async () => {
  const validate = validator("event");
  const data: Json[] = [{ order: 42, amount: 1999 }, null, [1, "two"], "text"];
  const keys = data.map((_, i) => unique(`schema:event:${i}`)) as [string, string, string, string];
  const db = await connect();
  try {
    await db.query("BEGIN");
    await publish(db, { key: keys[0], type: "order.paid", data: data[0] ?? null, tenant: "acme" });
    await publish(db, { key: keys[1], type: "invoice.created", data: data[1] ?? null });
    await publishMany(db, [
      { key: keys[2], type: "a_b-c.D9", data: data[2] ?? null, tenant: "t".repeat(200) },
      { key: keys[3], type: "x", data: data[3] ?? null },
    ]);
    await db.query("COMMIT");
  } finally {
    await db.end();
  }
  for (const [i, key] of keys.entries()) {
    const row = await stored(key);
    assert.equal(row?.kind, "event");
    assert.deepEqual((row?.payload as { data?: unknown } | undefined)?.data, data[i]);
    assert.ok(
      validate(row?.payload),
      `event ${JSON.stringify(row?.payload)}: ${JSON.stringify(validate.errors)}`,
    );
  }
});
