// enqueue and enqueueMany: one statement each (outbox.enqueue,
// outbox.enqueue_many) on the caller's connection, inside the caller's
// transaction. Nothing here begins, commits or rolls back.

import { outboxErrorOf } from "./errors.js";
import { activeTraceContext, type TraceContext } from "./trace.js";
import type { CallOptions, EnqueueOptions, Enqueued, Intent, Item, Queryable } from "./types.js";

/**
 * Record one intent under `key` in the transaction open on `client`: it is
 * delivered once that transaction commits, and never if it rolls back.
 * The same key with the same intent again answers the existing id with
 * `duplicate: true`; with another intent it throws `OutboxConflict`; any
 * other refusal is an `OutboxError` with its SQLSTATE. `requireTransaction`
 * is strict mode (`CallOptions`).
 */
export async function enqueue(
  client: Queryable,
  key: string,
  intent: Intent,
  options: EnqueueOptions & CallOptions = {},
): Promise<Enqueued> {
  checkClient(client);
  const row = rowOf(key, intent, options);
  const trace = row.traceparent === null ? await activeTraceContext() : undefined;
  const args = new Args();
  args.addKey("p_key", key, "::text", "outbox.enqueue", options.requireTransaction === true);
  args.add("p_kind", row.kind);
  args.add("p_payload", row.payload, "::text::jsonb");
  args.addIf("p_destination", row.destination);
  args.addIf("p_run_after", row.runAfter, "::timestamptz");
  args.addIf("p_ordering_key", row.orderingKey);
  args.addIf("p_source", options.source ?? null);
  args.addIf("p_traceparent", row.traceparent ?? trace?.traceparent ?? null);
  args.addIf("p_tracestate", row.traceparent === null ? (trace?.tracestate ?? null) : row.tracestate);
  const rows = await run(
    client,
    `SELECT id::text AS id, duplicate FROM outbox.enqueue(${args.sql()})`,
    args.values,
    [key],
  );
  const [answer] = rows;
  if (rows.length !== 1 || answer === undefined) {
    throw new Error(`outbox.enqueue answered ${rows.length} rows, not 1`);
  }
  return enqueued(answer);
}

/**
 * Record many intents in one statement (`outbox.enqueue_many`); the answers
 * are in the order of `items`, each as `enqueue` would answer it. One
 * refused item refuses them all. `source` is one value per call: items
 * naming different sources are refused with a `TypeError` before any SQL.
 * `requireTransaction` is strict mode (`CallOptions`).
 */
export async function enqueueMany(
  client: Queryable,
  items: readonly Item[],
  options: CallOptions = {},
): Promise<Enqueued[]> {
  checkClient(client);
  if (!Array.isArray(items)) throw new TypeError("enqueueMany takes an array of { key, intent, ...options }");
  if (items.length === 0) return [];
  const rows = items.map((item) => rowOf(item.key, item.intent, item));
  const sources = new Set(items.map((item) => item.source ?? null));
  if (sources.size > 1) {
    throw new TypeError(
      `enqueueMany: one source per call (outbox.enqueue_many takes one p_source); these items name ${[
        ...sources,
      ]
        .map((s) => JSON.stringify(s))
        .join(", ")}: split them into one call per source`,
    );
  }
  const trace = rows.some((r) => r.traceparent === null) ? await activeTraceContext() : undefined;
  const traced = rows.map((r): TraceContext | null =>
    r.traceparent !== null
      ? { traceparent: r.traceparent, tracestate: r.tracestate ?? undefined }
      : (trace ?? null),
  );
  const args = new Args();
  const keys = items.map((item) => item.key);
  args.addKey("p_keys", keys, "::text[]", "outbox.enqueue_many", options.requireTransaction === true);
  args.add(
    "p_kinds",
    rows.map((r) => r.kind),
    "::text[]",
  );
  args.add(
    "p_payloads",
    rows.map((r) => r.payload),
    "::text[]::jsonb[]",
  );
  args.addColumn(
    "p_destinations",
    rows.map((r) => r.destination),
    "::text[]",
  );
  args.addColumn(
    "p_run_afters",
    rows.map((r) => r.runAfter),
    "::timestamptz[]",
  );
  args.addColumn(
    "p_ordering_keys",
    rows.map((r) => r.orderingKey),
    "::text[]",
  );
  args.addIf("p_source", [...sources][0] ?? null);
  args.addColumn(
    "p_traceparents",
    traced.map((t) => t?.traceparent ?? null),
    "::text[]",
  );
  args.addColumn(
    "p_tracestates",
    traced.map((t) => t?.tracestate ?? null),
    "::text[]",
  );
  const answers = await run(
    client,
    `SELECT ord, id::text AS id, duplicate FROM outbox.enqueue_many(${args.sql()}) ORDER BY ord`,
    args.values,
    keys,
  );
  if (answers.length !== items.length) {
    throw new Error(`outbox.enqueue_many answered ${answers.length} rows for ${items.length} items`);
  }
  return answers.map((answer, i) => {
    const ord = Number((answer as { ord?: unknown }).ord);
    if (ord !== i + 1) throw new Error(`outbox.enqueue_many answered row ${ord} in place ${i + 1}`);
    return enqueued(answer);
  });
}

/** One intent as the SQL parameters take it (null: not given). */
interface Row {
  kind: string;
  payload: string;
  destination: string | null;
  runAfter: Date | null;
  orderingKey: string | null;
  traceparent: string | null;
  tracestate: string | null;
}

function rowOf(key: string, intent: Intent, options: EnqueueOptions): Row {
  if (typeof key !== "string") throw new TypeError("the key must be a string");
  if (typeof intent !== "object" || intent === null || typeof intent.kind !== "string") {
    throw new TypeError(`the intent of ${key} must be { kind, payload }, as a builder makes it`);
  }
  if (typeof intent.payload !== "object" || intent.payload === null || Array.isArray(intent.payload)) {
    throw new TypeError(`the payload of ${key} must be a JSON object`);
  }
  const { destination, runAfter } = options;
  if (destination !== undefined && intent.destination !== undefined && destination !== intent.destination) {
    throw new TypeError(
      `${key}: the intent names destination ${JSON.stringify(intent.destination)} and the options ${JSON.stringify(destination)}`,
    );
  }
  if (runAfter !== undefined && !(runAfter instanceof Date && !Number.isNaN(runAfter.getTime()))) {
    throw new TypeError(`${key}: runAfter must be a valid Date`);
  }
  return {
    kind: intent.kind,
    payload: JSON.stringify(intent.payload),
    destination: destination ?? intent.destination ?? null,
    runAfter: runAfter ?? null,
    orderingKey: options.orderingKey ?? null,
    traceparent: options.traceparent ?? null,
    tracestate: options.tracestate ?? null,
  };
}

/**
 * Named arguments ($1, $2, … in order); an optional one is sent only when
 * given, so a call without a trace context runs on a schema before it too.
 */
export class Args {
  readonly values: unknown[] = [];
  private readonly named: string[] = [];

  add(name: string, value: unknown, cast = ""): void {
    this.values.push(value);
    this.named.push(`${name} => $${this.values.length}${cast}`);
  }

  /**
   * The key argument. In strict mode it goes through
   * `outbox.require_transaction`, which the server runs before the call (an
   * argument is evaluated first) and which refuses, with SQLSTATE OB428, a
   * transaction that has written nothing yet.
   */
  addKey(name: string, value: unknown, cast: string, fn: string, strict: boolean): void {
    this.values.push(value);
    const arg = `$${this.values.length}${cast}`;
    this.named.push(
      `${name} => ${strict ? `CASE WHEN outbox.require_transaction('${fn}') THEN ${arg} END` : arg}`,
    );
  }

  addIf(name: string, value: unknown, cast = ""): void {
    if (value !== null) this.add(name, value, cast);
  }

  /** An array argument, sent when any element is given. */
  addColumn(name: string, values: readonly unknown[], cast: string): void {
    if (values.some((v) => v !== null)) this.add(name, values, cast);
  }

  sql(): string {
    return this.named.join(", ");
  }
}

export function checkClient(client: Queryable): void {
  if (typeof (client as Partial<Queryable> | null)?.query !== "function") {
    throw new TypeError(
      "outbox-relay needs a connection with query(text, values): a pg Client or PoolClient; " +
        "for a Knex transaction fromKnex(trx), for a Kysely one fromKysely(trx)",
    );
  }
}

export async function run(
  client: Queryable,
  text: string,
  values: unknown[],
  keys: readonly string[],
): Promise<readonly unknown[]> {
  let result;
  try {
    result = await client.query(text, values);
  } catch (err) {
    throw outboxErrorOf(err, keys);
  }
  const rows: unknown = (result as { rows?: unknown } | null)?.rows;
  if (!Array.isArray(rows)) throw new TypeError("the connection's query() answered no rows array");
  return rows;
}

export function enqueued(answer: unknown): Enqueued {
  const { id, duplicate } = answer as { id?: unknown; duplicate?: unknown };
  if (typeof id !== "string" || !/^[0-9]+$/.test(id)) {
    throw new TypeError(`outbox.enqueue answered id ${String(id)}, not a number`);
  }
  return { id: BigInt(id), duplicate: duplicate === true || duplicate === "t" };
}
