// One builder per kind the relay delivers. Each takes the payload's own field
// names and returns exactly the payload the kind accepts (docs/guides/kinds.md
// and brokers.md): only its fields, the optional ones only when given.

import type { Intent, Json } from "./types.js";

type Headers = Readonly<Record<string, string>>;

/** `{"url", "body", "headers"?}`, or no `url` when the intent names a destination. */
export type WebhookPayload = { url?: string; body: Json; headers?: Headers };
/** A webhook to a `url`, or to a configured endpoint named by `destination`. */
export type WebhookSpec =
  | { url: string; destination?: never; body: Json; headers?: Headers | undefined }
  | { destination: string; url?: never; body: Json; headers?: Headers | undefined };

export function webhook(spec: WebhookSpec): Intent<"webhook", WebhookPayload> {
  const { url, destination } = spec as { url?: unknown; destination?: unknown };
  if ((url === undefined) === (destination === undefined)) {
    throw new TypeError("webhook needs a url or a destination, not both");
  }
  const payload = optional(
    url === undefined
      ? { body: need(spec, "webhook", "body") }
      : { url: str(url, "webhook url"), body: need(spec, "webhook", "body") },
    { headers: headers(spec.headers, "webhook", ["string"]) },
  );
  return destination === undefined
    ? { kind: "webhook", payload }
    : { kind: "webhook", payload, destination: str(destination, "webhook destination") };
}

/** `{"from"?, "to", "cc"?, "bcc"?, "reply_to"?, "subject", "text"?, "html"?}`. */
export type EmailPayload = {
  from?: string;
  to: readonly string[];
  cc?: readonly string[];
  bcc?: readonly string[];
  reply_to?: string;
  subject: string;
  text?: string;
  html?: string;
};
type Maybe<T> = { [K in keyof T]?: T[K] | undefined };
/** An email: `to` at least one address, and `text`, `html` or both. */
export type EmailSpec = Maybe<Pick<EmailPayload, "from" | "cc" | "bcc" | "reply_to">> &
  Pick<EmailPayload, "to" | "subject"> &
  ({ text: string; html?: string | undefined } | { html: string; text?: string | undefined });

export function email(spec: EmailSpec): Intent<"email", EmailPayload> {
  const to = spec.to as unknown;
  if (!Array.isArray(to) || to.length === 0) {
    throw new TypeError("email needs to: a list of at least one address");
  }
  if (spec.text === undefined && spec.html === undefined) {
    throw new TypeError("email needs text, html or both");
  }
  const payload: EmailPayload = optional(
    { to: [...(to as string[])], subject: str(spec.subject, "email subject") },
    {
      from: spec.from,
      cc: spec.cc && [...spec.cc],
      bcc: spec.bcc && [...spec.bcc],
      reply_to: spec.reply_to,
      text: spec.text,
      html: spec.html,
    },
  );
  return { kind: "email", payload };
}

/** `{"amount", "currency", "payment_method", "customer"?, "description"?, "metadata"?}`. */
export type ChargePayload = {
  amount: number;
  currency: string;
  payment_method: string;
  customer?: string;
  description?: string;
  metadata?: Readonly<Record<string, string>>;
};
/** A charge of `amount` minor units (an integer: 1999 is 19.99) in `currency` ("usd"). */
export type ChargeSpec = Pick<ChargePayload, "amount" | "currency" | "payment_method"> &
  Maybe<Pick<ChargePayload, "customer" | "description" | "metadata">>;

export function charge(spec: ChargeSpec): Intent<"charge", ChargePayload> {
  if (!Number.isSafeInteger(spec.amount) || spec.amount < 1) {
    throw new TypeError(
      `charge amount must be a positive whole number of minor units, not ${String(spec.amount)}`,
    );
  }
  const payload: ChargePayload = optional(
    {
      amount: spec.amount,
      currency: str(spec.currency, "charge currency"),
      payment_method: str(spec.payment_method, "charge payment_method"),
    },
    { customer: spec.customer, description: spec.description, metadata: spec.metadata },
  );
  return { kind: "charge", payload };
}

/** `{"subject", "body", "headers"?}`, published to JetStream. */
export type NatsPayload = { subject: string; body: Json; headers?: Headers };
export type NatsSpec = Pick<NatsPayload, "subject" | "body"> & Maybe<Pick<NatsPayload, "headers">>;

export function nats(spec: NatsSpec): Intent<"nats", NatsPayload> {
  const payload: NatsPayload = optional(
    { subject: str(spec.subject, "nats subject"), body: need(spec, "nats", "body") },
    { headers: headers(spec.headers, "nats", ["string"]) },
  );
  return { kind: "nats", payload };
}

/** `{"exchange", "routing_key", "body", "headers"?}`; `""` is the default exchange. */
export type AmqpPayload = {
  exchange: string;
  routing_key: string;
  body: Json;
  headers?: Readonly<Record<string, string | number | boolean>>;
};
export type AmqpSpec = Pick<AmqpPayload, "exchange" | "routing_key" | "body"> &
  Maybe<Pick<AmqpPayload, "headers">>;

export function amqp(spec: AmqpSpec): Intent<"amqp", AmqpPayload> {
  const payload: AmqpPayload = optional(
    {
      exchange: str(spec.exchange, "amqp exchange"),
      routing_key: str(spec.routing_key, "amqp routing_key"),
      body: need(spec, "amqp", "body"),
    },
    { headers: headers(spec.headers, "amqp", ["string", "number", "boolean"]) },
  );
  return { kind: "amqp", payload };
}

/**
 * `{"topic", "key"?, "body", "headers"?, "partition"?}`, a Kafka record. Without
 * `key`, the record's key is the intent's ordering key, if any; without
 * `partition`, the producer's partitioner chooses.
 */
export type KafkaPayload = {
  topic: string;
  key?: string;
  body: Json;
  headers?: Headers;
  partition?: number;
};
export type KafkaSpec = Pick<KafkaPayload, "topic" | "body"> &
  Maybe<Pick<KafkaPayload, "key" | "headers" | "partition">>;

export function kafka(spec: KafkaSpec): Intent<"kafka", KafkaPayload> {
  const { partition } = spec;
  if (
    partition !== undefined &&
    !(Number.isInteger(partition) && partition >= 0 && partition <= 2147483647)
  ) {
    throw new TypeError(`kafka partition must be a whole number from 0 to 2147483647, never ${partition}`);
  }
  const payload: KafkaPayload = optional(
    { topic: str(spec.topic, "kafka topic"), body: need(spec, "kafka", "body") },
    {
      key: spec.key === undefined ? undefined : str(spec.key, "kafka key"),
      headers: headers(spec.headers, "kafka", ["string"]),
      partition,
    },
  );
  return { kind: "kafka", payload };
}

/** `required` with each field of `optional` that is not undefined. */
function optional<R extends object, O extends object>(
  required: R,
  optionalFields: O,
): R & { [K in keyof O]?: Exclude<O[K], undefined> } {
  const out: Record<string, unknown> = { ...(required as Record<string, unknown>) };
  for (const [k, v] of Object.entries(optionalFields)) {
    if (v !== undefined) out[k] = v;
  }
  return out as R & { [K in keyof O]?: Exclude<O[K], undefined> };
}

function str(v: unknown, what: string): string {
  if (typeof v !== "string") throw new TypeError(`${what} must be a string`);
  return v;
}

/** Headers: an object whose values are of the kind's types. */
function headers<H extends object>(h: H | undefined, kind: string, types: readonly string[]): H | undefined {
  if (h === undefined) return undefined;
  if (typeof h !== "object" || h === null || Array.isArray(h))
    throw new TypeError(`${kind} headers must be an object`);
  for (const [name, value] of Object.entries(h)) {
    if (!types.includes(typeof value)) {
      throw new TypeError(
        `${kind} header ${JSON.stringify(name)} must be ${types.join(" or ")}, never ${typeof value}`,
      );
    }
  }
  return h;
}

/** The `body` field: required, JSON null allowed. */
function need(spec: object, kind: string, field: "body"): Json {
  const v = (spec as { body?: Json }).body;
  if (v === undefined) throw new TypeError(`${kind} needs a ${field} (null for an empty one)`);
  return v;
}
