// Knex and Kysely transactions as a Queryable. Neither library is imported:
// each adapter uses only the public shape of the transaction it is given.

import { randomUUID } from "node:crypto";

import type { QueryResultLike, Queryable } from "./types.js";

/** The part of a Knex transaction (`knex.transaction(async trx => …)`) used: `trx.raw`. */
export interface KnexTransactionLike {
  raw(sql: string, bindings: readonly unknown[]): PromiseLike<unknown>;
}

/**
 * `enqueue(fromKnex(trx), …)` inside `knex.transaction(async (trx) => …)`,
 * with Knex's `pg` client: each statement runs as `trx.raw(…)`, so in the
 * transaction, and its result is node-postgres's. Knex writes the SQL in
 * front of a database error's message; the adapter gives the error its
 * server message back.
 */
export function fromKnex(trx: KnexTransactionLike): Queryable {
  if (typeof trx?.raw !== "function") throw new TypeError("fromKnex takes a Knex transaction (trx)");
  return {
    async query(text: string, values: unknown[] = []): Promise<QueryResultLike> {
      // Knex binds `?` in order: $n becomes ?, its value moved to its place,
      // and a literal ? is escaped as Knex spells it
      const bindings: unknown[] = [];
      const marker = `/* outbox-relay ${randomUUID()} */`;
      const sql =
        text.replace(/\?/g, "\\?").replace(/\$([0-9]+)/g, (_, n: string) => {
          bindings.push(values[Number(n) - 1]);
          return "?";
        }) + ` ${marker}`;
      let result: unknown;
      try {
        result = await trx.raw(sql, bindings);
      } catch (err) {
        throw withServerMessage(err, marker);
      }
      if (!Array.isArray((result as { rows?: unknown } | null)?.rows)) {
        throw new TypeError("fromKnex: trx.raw answered no rows: the Knex client must be pg");
      }
      return result as QueryResultLike;
    },
  };
}

/** Knex's message is "<the SQL, ending with the marker> - <the server's>". */
function withServerMessage(err: unknown, marker: string): unknown {
  if (err instanceof Error) {
    const at = err.message.lastIndexOf(`${marker} - `);
    if (at >= 0) err.message = err.message.slice(at + marker.length + 3);
  }
  return err;
}

/** Kysely's compiled query, as `executeQuery` takes it (a raw SQL text). */
export interface CompiledRawQuery {
  readonly sql: string;
  readonly parameters: readonly unknown[];
  readonly query: {
    readonly kind: "RawNode";
    readonly sqlFragments: readonly string[];
    readonly parameters: readonly never[];
  };
  readonly queryId: { readonly queryId: string };
}

/** The part of a Kysely transaction (`db.transaction().execute(async trx => …)`) used. */
export interface KyselyTransactionLike {
  executeQuery(query: CompiledRawQuery): Promise<{ readonly rows: readonly unknown[] }>;
}

/**
 * `enqueue(fromKysely(trx), …)` inside `db.transaction().execute(async (trx) => …)`
 * with Kysely's `PostgresDialect`: each statement is run by
 * `trx.executeQuery` as a raw compiled query (what `CompiledQuery.raw`
 * makes), on the transaction's connection.
 */
export function fromKysely(trx: KyselyTransactionLike): Queryable {
  if (typeof trx?.executeQuery !== "function") {
    throw new TypeError("fromKysely takes a Kysely transaction (trx)");
  }
  return {
    async query(text: string, values: unknown[] = []): Promise<QueryResultLike> {
      return trx.executeQuery({
        sql: text,
        parameters: values,
        query: { kind: "RawNode", sqlFragments: [text], parameters: [] },
        queryId: { queryId: randomUUID() },
      });
    },
  };
}
