/** A JSON value: what a payload's `body` may hold. */
export type Json =
  null | boolean | number | string | readonly Json[] | { readonly [key: string]: Json | undefined };

/** A JSON object: the payload of an intent. */
export type JsonObject = { readonly [key: string]: Json | undefined };

/**
 * What to do: a kind and its payload, as the builders (`webhook`, `email`,
 * `charge`, `nats`, `amqp`, `kafka`) make them. A kind without a builder is written
 * as `{ kind: "…", payload: { … } }`.
 */
export interface Intent<K extends string = string, P extends JsonObject = JsonObject> {
  readonly kind: K;
  readonly payload: P;
  /** The configured endpoint a webhook without `url` goes to (`webhook({ destination })`). */
  readonly destination?: string | undefined;
}

/** The options of one intent, the optional parameters of `outbox.enqueue`. */
export interface EnqueueOptions {
  /** `p_destination`: a named endpoint (`[webhook.endpoints]`). */
  readonly destination?: string | undefined;
  /** `p_run_after`: not delivered before this time (default: now). */
  readonly runAfter?: Date | undefined;
  /** `p_ordering_key`: delivered after the intent before it with this key is done. */
  readonly orderingKey?: string | undefined;
  /** `p_source`: the enqueuing service's name (at most 128 characters). */
  readonly source?: string | undefined;
  /** `p_traceparent`: a W3C traceparent (default: the active OpenTelemetry span's). */
  readonly traceparent?: string | undefined;
  /** `p_tracestate`: the W3C tracestate that goes with `traceparent`. */
  readonly tracestate?: string | undefined;
}

/** How `enqueue`, `enqueueMany`, `publish` and `publishMany` run, apart from what they write. */
export interface CallOptions {
  /**
   * Strict mode: refuse (an `OutboxError` with SQLSTATE `OB428`, nothing
   * written) an enqueue in a transaction that has written nothing yet, as
   * on a bare pool or any connection outside `BEGIN`, where it would commit
   * on its own. The server's `outbox.require_transaction` decides, in the
   * enqueue's own statement.
   */
  readonly requireTransaction?: boolean | undefined;
}

/** One intent of `enqueueMany`: `{ key, intent, ...options }`. */
export interface Item extends EnqueueOptions {
  readonly key: string;
  readonly intent: Intent;
}

/**
 * One event for `publish` and `publishMany`: the intent of kind `event`
 * `{ type, tenant, data }` that the relay, after the commit, expands into one
 * webhook delivery per matching subscription.
 */
export interface NewEvent {
  /** The event's key: the same key and event again is a duplicate, another event under it a conflict. */
  readonly key: string;
  /** `p_event_type`: a dotted name (`order.paid`), at most 200 characters. */
  readonly type: string;
  /** `p_payload`: any JSON, the deliveries' `data` (`null` for none). */
  readonly data: Json;
  /** `p_tenant`: the tenant whose subscriptions receive it (1 to 200 characters); none by default. */
  readonly tenant?: string | null | undefined;
  /** `p_traceparent`: a W3C traceparent (default: the active OpenTelemetry span's). */
  readonly traceparent?: string | undefined;
}

/**
 * The answer for one intent. `id` is the `bigint` column `outbox.intents.id`
 * as a JavaScript `bigint`, exact beyond 2^53 (`String(id)` for JSON).
 */
export interface Enqueued {
  readonly id: bigint;
  /** True when the key was already enqueued with the same intent: nothing new was written. */
  readonly duplicate: boolean;
}

/** What a query answers: node-postgres's result, or anything with its `rows`. */
export interface QueryResultLike {
  readonly rows: readonly unknown[];
}

/**
 * A connection the client runs its one statement on: a node-postgres
 * `Client` or `PoolClient` (in your transaction), or any object with
 * node-postgres's `query(text, values)` ($1, $2, … placeholders).
 * `fromKnex` and `fromKysely` make one of a Knex or Kysely transaction.
 */
export interface Queryable {
  query(text: string, values?: unknown[]): PromiseLike<QueryResultLike>;
}
