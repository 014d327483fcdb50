// publish and publishMany: one statement each (outbox.publish,
// outbox.publish_many) on the caller's connection, inside the caller's
// transaction. An event is an intent of kind `event`, written through
// outbox.enqueue: its duplicates, conflicts and limits are enqueue's.

import { Args, checkClient, enqueued, run } from "./enqueue.js";
import { activeTraceContext } from "./trace.js";
import type { CallOptions, Enqueued, NewEvent, Queryable } from "./types.js";

/**
 * Publish one event in the transaction open on `client`: once that
 * transaction commits, the relay delivers it to every matching
 * subscription; never if it rolls back. The same key with the same event
 * again answers the existing id with `duplicate: true`; with another event
 * it throws `OutboxConflict`. An event type that is not a dotted name, or a
 * tenant of 0 or over 200 characters, is an `OutboxError` with SQLSTATE
 * `22023`. `requireTransaction` is strict mode (`CallOptions`).
 */
export async function publish(
  client: Queryable,
  event: NewEvent,
  options: CallOptions = {},
): Promise<Enqueued> {
  checkClient(client);
  const row = rowOf(event);
  const args = new Args();
  args.addKey("p_key", event.key, "::text", "outbox.publish", options.requireTransaction === true);
  args.add("p_event_type", row.type, "::text");
  args.add("p_payload", row.data, "::text::jsonb");
  args.addIf("p_tenant", row.tenant, "::text");
  args.addIf("p_traceparent", row.traceparent ?? (await activeTraceContext())?.traceparent ?? null, "::text");
  const rows = await run(
    client,
    `SELECT id::text AS id, duplicate FROM outbox.publish(${args.sql()})`,
    args.values,
    [event.key],
  );
  const [answer] = rows;
  if (rows.length !== 1 || answer === undefined) {
    throw new Error(`outbox.publish answered ${rows.length} rows, not 1`);
  }
  return enqueued(answer);
}

/**
 * Publish many events in one statement (`outbox.publish_many`); the answers
 * are in the order of `events`, each as `publish` would answer it. One
 * refused event refuses them all. `requireTransaction` is strict mode
 * (`CallOptions`).
 */
export async function publishMany(
  client: Queryable,
  events: readonly NewEvent[],
  options: CallOptions = {},
): Promise<Enqueued[]> {
  checkClient(client);
  if (!Array.isArray(events))
    throw new TypeError("publishMany takes an array of { key, type, data, tenant? }");
  if (events.length === 0) return [];
  const rows = events.map(rowOf);
  const trace = rows.some((r) => r.traceparent === null) ? await activeTraceContext() : undefined;
  const keys = events.map((e) => e.key);
  const args = new Args();
  args.addKey("p_keys", keys, "::text[]", "outbox.publish_many", options.requireTransaction === true);
  args.add(
    "p_event_types",
    rows.map((r) => r.type),
    "::text[]",
  );
  args.add(
    "p_payloads",
    rows.map((r) => r.data),
    "::text[]::jsonb[]",
  );
  args.addColumn(
    "p_tenants",
    rows.map((r) => r.tenant),
    "::text[]",
  );
  args.addColumn(
    "p_traceparents",
    rows.map((r) => r.traceparent ?? trace?.traceparent ?? null),
    "::text[]",
  );
  const answers = await run(
    client,
    `SELECT ord, id::text AS id, duplicate FROM outbox.publish_many(${args.sql()}) ORDER BY ord`,
    args.values,
    keys,
  );
  if (answers.length !== events.length) {
    throw new Error(`outbox.publish_many answered ${answers.length} rows for ${events.length} events`);
  }
  return answers.map((answer, i) => {
    const ord = Number((answer as { ord?: unknown }).ord);
    if (ord !== i + 1) throw new Error(`outbox.publish_many answered row ${ord} in place ${i + 1}`);
    return enqueued(answer);
  });
}

/** One event as the SQL parameters take it (null: not given). */
interface Row {
  type: string;
  data: string;
  tenant: string | null;
  traceparent: string | null;
}

function rowOf(event: NewEvent): Row {
  if (typeof event !== "object" || event === null) {
    throw new TypeError("an event is { key, type, data, tenant? }");
  }
  const { key, type, data, tenant, traceparent } = event;
  if (typeof key !== "string") throw new TypeError("the key must be a string");
  if (typeof type !== "string") throw new TypeError(`the event type of ${key} must be a string`);
  if (data === undefined) throw new TypeError(`the event ${key} has no data (null for none)`);
  if (tenant !== undefined && tenant !== null && typeof tenant !== "string") {
    throw new TypeError(`the tenant of ${key} must be a string, or null for none`);
  }
  return {
    type,
    data: JSON.stringify(data),
    tenant: tenant ?? null,
    traceparent: traceparent ?? null,
  };
}
