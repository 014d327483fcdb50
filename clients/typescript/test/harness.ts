// What the tests share: the database (DATABASE_URL, migrated), the relay
// (OUTBOX_RELAY_BIN, run with `run --once`), a webhook receiver on
// 127.0.0.1, a business table per test and keys no other test uses.

import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { promisify } from "node:util";

import pg from "pg";

function env(name: string): string {
  const v = process.env[name];
  if (v === undefined || v === "")
    throw new Error(`${name} must be set (clients/typescript/check.sh sets it)`);
  return v;
}

export const DATABASE_URL = env("DATABASE_URL");
const RELAY_BIN = env("OUTBOX_RELAY_BIN");

/** A connected node-postgres client; the caller ends it. */
export async function connect(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: DATABASE_URL });
  await client.connect();
  return client;
}

/** One query on a connection of its own, outside every test's transaction. */
export async function look<R extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<R[]> {
  const client = await connect();
  try {
    return (await client.query<R>(text, values)).rows;
  } finally {
    await client.end();
  }
}

/** A key (and a table name) no other test or run uses. */
export function unique(prefix: string): string {
  return `${prefix}_${randomBytes(6).toString("hex")}`;
}

/** A business table of the test's own: `orders_…(id bigint PRIMARY KEY, total bigint)`. */
export async function businessTable(): Promise<string> {
  const name = unique("orders");
  await look(`CREATE TABLE ${name} (id bigint PRIMARY KEY, total bigint NOT NULL)`);
  return name;
}

export async function rowsOf(table: string): Promise<number> {
  const [row] = await look<{ n: number }>(`SELECT count(*)::int AS n FROM ${table}`);
  return row?.n ?? -1;
}

/** The stored intent of a key, or undefined. */
export interface Stored {
  id: string;
  kind: string;
  destination: string | null;
  payload: unknown;
  state: string;
  run_after: Date;
  ordering_key: string | null;
  source: string | null;
  traceparent: string | null;
  tracestate: string | null;
}

export async function stored(key: string): Promise<Stored | undefined> {
  const [row] = await look<Stored & pg.QueryResultRow>(
    `SELECT id::text AS id, kind, destination, payload, state, run_after, ordering_key, source,
            traceparent, tracestate
       FROM outbox.intents WHERE key = $1`,
    [key],
  );
  return row;
}

export interface Received {
  path: string;
  headers: http.IncomingHttpHeaders;
  body: unknown;
}

/** A webhook receiver on 127.0.0.1 that answers 200 and records each request. */
export interface Receiver {
  url: string;
  requests: Received[];
  close(): Promise<void>;
}

export async function receiver(): Promise<Receiver> {
  const requests: Received[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      requests.push({
        path: req.url ?? "",
        headers: req.headers,
        body: text === "" ? null : JSON.parse(text),
      });
      res.writeHead(200, { "content-type": "text/plain" }).end("ok");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    requests,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/** `outbox-relay run --once`: delivers everything due, webhooks to loopback allowed. */
export async function deliver(): Promise<void> {
  try {
    await promisify(execFile)(RELAY_BIN, ["run", "--once"], {
      env: {
        ...process.env,
        DATABASE_URL,
        OUTBOX_RELAY__WEBHOOK__ALLOWED_NETWORKS: '["127.0.0.0/8"]',
      },
      timeout: 30_000,
    });
  } catch (err) {
    const { stdout, stderr } = err as { stdout?: string; stderr?: string };
    throw new Error(`outbox-relay run --once failed: ${String(err)}\n${stdout ?? ""}\n${stderr ?? ""}`);
  }
}

/** The requests for one key's webhook: its body names the key. */
export function requestsFor(r: Receiver, key: string): Received[] {
  return r.requests.filter((q) => (q.body as { key?: unknown } | null)?.key === key);
}
