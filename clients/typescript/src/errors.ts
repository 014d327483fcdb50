/**
 * Postgres refused the enqueue: `sqlstate` is its SQLSTATE (`22023` bad
 * input, `OB413` payload over 1 MiB, `22P02` not JSON, `40001` / `40P01`
 * retry the whole transaction, …) and `message` the server's own message.
 * The driver's error is the `cause`. The transaction it ran in is aborted:
 * roll it back (a `COMMIT` would roll it back too).
 */
export class OutboxError extends Error {
  override name = "OutboxError";
  readonly sqlstate: string;
  readonly detail: string | undefined;
  readonly hint: string | undefined;

  constructor(sqlstate: string, message: string, options: ErrorFields = {}) {
    super(message, { cause: options.cause });
    this.sqlstate = sqlstate;
    this.detail = options.detail;
    this.hint = options.hint;
  }
}

/**
 * SQLSTATE `OB409`: `key` was already used for another intent (another
 * kind, destination or payload). Use a new key for a new operation.
 */
export class OutboxConflict extends OutboxError {
  override name = "OutboxConflict";
  readonly key: string;

  constructor(key: string, message: string, options: ErrorFields = {}) {
    super("OB409", message, options);
    this.key = key;
  }
}

interface ErrorFields {
  readonly detail?: string | undefined;
  readonly hint?: string | undefined;
  readonly cause?: unknown;
}

/**
 * A session or statement ended from outside rather than a refusal: class 08
 * (connection exception), class 57 (operator intervention: terminated,
 * cancelled, shut down, the database dropped, an idle session timed out),
 * and the server's transaction timeouts that close the session (25P03,
 * 25P04).
 */
function endedFromOutside(sqlstate: string): boolean {
  return /^(08|57)/.test(sqlstate) || sqlstate === "25P03" || sqlstate === "25P04";
}

/**
 * The typed error for a driver's error that carries a SQLSTATE (node-postgres's
 * `DatabaseError`, as thrown through Knex and Kysely too); any other error
 * (a connection lost or ended by the server, a cancelled statement, a bug)
 * is returned as it is. `keys` are the keys of the call, one of which an
 * `OB409` message names.
 */
export function outboxErrorOf(err: unknown, keys: readonly string[]): unknown {
  if (typeof err !== "object" || err === null) return err;
  const { code, message, detail, hint, severity } = err as Record<string, unknown>;
  // a server's error has a severity; node's own (EPIPE, EBADF) look like
  // a SQLSTATE but are not one
  if (
    typeof code !== "string" ||
    !/^[0-9A-Z]{5}$/.test(code) ||
    typeof message !== "string" ||
    typeof severity !== "string" ||
    endedFromOutside(code)
  ) {
    return err;
  }
  const fields = { detail: text(detail), hint: text(hint), cause: err };
  if (code === "OB409") {
    return new OutboxConflict(conflictingKey(message, keys), message, fields);
  }
  return new OutboxError(code, message, fields);
}

function text(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

/** The key an OB409 message names ("… key K was already used for a different intent"). */
function conflictingKey(message: string, keys: readonly string[]): string {
  // the longest that fits: "key x key b was …" names "x key b", not "b"
  const named = keys
    .filter((k) => message.includes(`key ${k} was already used`))
    .sort((a, b) => b.length - a.length)[0];
  if (named !== undefined) return named;
  const m = /key (.*) was already used/s.exec(message);
  return m?.[1] ?? keys[0] ?? "";
}
