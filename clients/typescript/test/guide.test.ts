// The guide's first example (docs/guides/client-typescript.md) runs as it is
// written: copied into the package (so that `import … from "outbox-relay"`
// is the package itself), with an `orders` table of a schema of its own; so
// does its example of publishing an event.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile, writeFile } from "node:fs/promises";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { DATABASE_URL, look, stored, unique } from "./harness.js";

const GUIDE = new URL("../../../../docs/guides/client-typescript.md", import.meta.url);

test("the guide's ten-line example runs as written", async () => {
  const page = await readFile(GUIDE, "utf8");
  const example = /```ts\n([\s\S]*?)```/.exec(page)?.[1];
  assert.ok(example !== undefined, "the guide has a ts block");
  const file = fileURLToPath(new URL("../guide-example.mjs", import.meta.url));
  await writeFile(file, example);

  const schema = unique("guide");
  await look(
    `CREATE SCHEMA ${schema}; CREATE TABLE ${schema}.orders (id bigint PRIMARY KEY, total bigint NOT NULL)`,
  );
  const before = await stored("order:46:confirmation");
  const { stdout } = await promisify(execFile)(process.execPath, [file], {
    env: { ...process.env, DATABASE_URL, PGOPTIONS: `-c search_path=${schema}` },
    timeout: 20_000,
  });

  const intent = await stored("order:46:confirmation");
  assert.equal(stdout.trim(), `${intent?.id}n ${before !== undefined}`);
  assert.deepEqual(intent?.payload, {
    url: "http://127.0.0.1:48080/orders",
    body: { order: 46, total: 3100 },
  });
  assert.deepEqual(await look(`SELECT id::int, total::int FROM ${schema}.orders`), [{ id: 46, total: 3100 }]);
});

test("the guide's example of publishing an event runs as written", async () => {
  const page = await readFile(GUIDE, "utf8");
  const section = page.split("## Publishing events")[1] ?? "";
  const example = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(example !== undefined, "the section has a ts block");
  const file = fileURLToPath(new URL("../guide-publish.mjs", import.meta.url));
  await writeFile(file, example);

  const schema = unique("guide");
  await look(
    `CREATE SCHEMA ${schema}; CREATE TABLE ${schema}.orders (id bigint PRIMARY KEY, total bigint NOT NULL)`,
  );
  const before = await stored("order:48:paid");
  const { stdout } = await promisify(execFile)(process.execPath, [file], {
    env: { ...process.env, DATABASE_URL, PGOPTIONS: `-c search_path=${schema}` },
    timeout: 20_000,
  });

  const event = await stored("order:48:paid");
  assert.equal(stdout.trim(), `${event?.id}n ${before !== undefined}`);
  assert.equal(event?.kind, "event");
  assert.deepEqual(event?.payload, { type: "order.paid", tenant: "acme", data: { order: 48, total: 1999 } });
  assert.deepEqual(await look(`SELECT id::int, total::int FROM ${schema}.orders`), [{ id: 48, total: 1999 }]);
});
