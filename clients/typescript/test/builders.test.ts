// The builders make exactly each kind's payload (docs/guides/kinds.md,
// brokers.md), and Postgres stores exactly that.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import type pg from "pg";

import { amqp, charge, email, enqueueMany, kafka, nats, webhook, type Intent } from "../src/index.js";
import { connect, stored, unique } from "./harness.js";

let db: pg.Client;
before(async () => {
  db = await connect();
});
after(() => db.end());

const cases: [string, Intent, Intent][] = [
  [
    "webhook to a url",
    webhook({ url: "https://hooks.example.com/orders", body: { order: 42 }, headers: { "X-Tenant": "t1" } }),
    {
      kind: "webhook",
      payload: {
        url: "https://hooks.example.com/orders",
        body: { order: 42 },
        headers: { "X-Tenant": "t1" },
      },
    },
  ],
  [
    "webhook to a named endpoint",
    webhook({ destination: "billing", body: null }),
    { kind: "webhook", payload: { body: null }, destination: "billing" },
  ],
  [
    "email",
    email({ to: ["a@example.com"], subject: "Invoice", text: "Thanks", reply_to: "help@example.com" }),
    {
      kind: "email",
      payload: { to: ["a@example.com"], subject: "Invoice", text: "Thanks", reply_to: "help@example.com" },
    },
  ],
  [
    "email, every field",
    email({
      from: "Shop <shop@example.com>",
      to: ["a@example.com"],
      cc: ["c@example.com"],
      bcc: ["b@example.com"],
      reply_to: "help@example.com",
      subject: "Invoice",
      text: "Thanks",
      html: "<p>Thanks</p>",
    }),
    {
      kind: "email",
      payload: {
        from: "Shop <shop@example.com>",
        to: ["a@example.com"],
        cc: ["c@example.com"],
        bcc: ["b@example.com"],
        reply_to: "help@example.com",
        subject: "Invoice",
        text: "Thanks",
        html: "<p>Thanks</p>",
      },
    },
  ],
  [
    "charge",
    charge({
      amount: 1999,
      currency: "usd",
      payment_method: "pm_card_visa",
      customer: "cus_1",
      metadata: { order: "42" },
    }),
    {
      kind: "charge",
      payload: {
        amount: 1999,
        currency: "usd",
        payment_method: "pm_card_visa",
        customer: "cus_1",
        metadata: { order: "42" },
      },
    },
  ],
  [
    "nats",
    nats({ subject: "orders.created", body: { order: 42 }, headers: { "X-Tenant": "t1" } }),
    {
      kind: "nats",
      payload: { subject: "orders.created", body: { order: 42 }, headers: { "X-Tenant": "t1" } },
    },
  ],
  [
    "amqp",
    amqp({ exchange: "", routing_key: "orders", body: [1, "two"], headers: { n: 3, ok: true, t: "x" } }),
    {
      kind: "amqp",
      payload: { exchange: "", routing_key: "orders", body: [1, "two"], headers: { n: 3, ok: true, t: "x" } },
    },
  ],
  [
    "kafka",
    kafka({ topic: "orders.v1", key: "acct-1", body: { id: 1 }, headers: { source: "shop" }, partition: 2 }),
    {
      kind: "kafka",
      payload: {
        topic: "orders.v1",
        key: "acct-1",
        body: { id: 1 },
        headers: { source: "shop" },
        partition: 2,
      },
    },
  ],
];

test("each builder makes exactly its kind's payload, and that is what is stored", async () => {
  const keys = cases.map(([name]) => unique(name.replace(/ /g, "-")));
  for (const [name, built, expected] of cases) assert.deepEqual(built, expected, name);
  await enqueueMany(
    db,
    cases.map(([, intent], i) => ({ key: keys[i] ?? "", intent })),
  );
  for (const [i, [name, , expected]] of cases.entries()) {
    const row = await stored(keys[i] ?? "");
    assert.deepEqual(
      [row?.kind, row?.payload, row?.destination],
      [expected.kind, expected.payload, expected.destination ?? null],
      name,
    );
  }
});

test("a builder takes only its kind's fields and leaves out what is not given", () => {
  const extra = { url: "https://h.example/", body: 1, headers: undefined, secret: "x" } as Parameters<
    typeof webhook
  >[0];
  assert.deepEqual(webhook(extra).payload, { url: "https://h.example/", body: 1 });
  assert.deepEqual(nats({ subject: "a.b", body: null, headers: undefined }).payload, {
    subject: "a.b",
    body: null,
  });
  assert.deepEqual(
    Object.keys(email({ to: ["a@example.com"], subject: "s", html: "<p>h</p>", from: undefined }).payload),
    ["to", "subject", "html"],
  );
});

test("a builder refuses what its kind could never deliver, and so do its types", () => {
  const refuses = (f: () => unknown, pattern: RegExp) =>
    assert.throws(f, (e: unknown) => e instanceof TypeError && pattern.test(e.message));
  // @ts-expect-error: a url or a destination
  refuses(() => webhook({ body: 1 }), /a url or a destination/);
  // @ts-expect-error: not both
  refuses(() => webhook({ url: "https://h/", destination: "x", body: 1 }), /not both/);
  // @ts-expect-error: a body (null for none)
  refuses(() => webhook({ url: "https://h/" }), /webhook needs a body/);
  refuses(() => email({ to: [], subject: "s", text: "t" }), /at least one address/);
  // @ts-expect-error: text, html or both
  refuses(() => email({ to: ["a@example.com"], subject: "s" }), /text, html or both/);
  refuses(
    () => charge({ amount: 19.99, currency: "usd", payment_method: "pm" }),
    /whole number of minor units/,
  );
  refuses(() => charge({ amount: 0, currency: "usd", payment_method: "pm" }), /positive/);
  // @ts-expect-error: routing_key is required ("" for none)
  refuses(() => amqp({ exchange: "x", body: 1 }), /routing_key must be a string/);
  // @ts-expect-error: subject is required
  refuses(() => nats({ body: 1 }), /subject must be a string/);
  // @ts-expect-error: a webhook header is text
  refuses(() => webhook({ url: "https://h/", body: 1, headers: { n: 1 } }), /never/);
  refuses(() => kafka({ topic: "t", body: 1, partition: -1 }), /partition must be a whole number/);
  // @ts-expect-error: topic is required
  refuses(() => kafka({ body: 1 }), /topic must be a string/);
});
