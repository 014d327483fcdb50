// outbox-relay for TypeScript: write intents into the outbox, and publish
// events, inside your own Postgres transaction, typed. The SQL API
// (outbox.enqueue, outbox.enqueue_many, outbox.publish, outbox.publish_many)
// is the source of truth; this package only calls it.

export { enqueue, enqueueMany } from "./enqueue.js";
export { publish, publishMany } from "./publish.js";
export { amqp, charge, email, kafka, nats, webhook } from "./builders.js";
export type {
  AmqpPayload,
  AmqpSpec,
  ChargePayload,
  ChargeSpec,
  EmailPayload,
  EmailSpec,
  KafkaPayload,
  KafkaSpec,
  NatsPayload,
  NatsSpec,
  WebhookPayload,
  WebhookSpec,
} from "./builders.js";
export { OutboxConflict, OutboxError } from "./errors.js";
export { fromKnex, fromKysely } from "./adapters.js";
export type { CompiledRawQuery, KnexTransactionLike, KyselyTransactionLike } from "./adapters.js";
export type {
  CallOptions,
  EnqueueOptions,
  Enqueued,
  Intent,
  Item,
  Json,
  JsonObject,
  NewEvent,
  Queryable,
  QueryResultLike,
} from "./types.js";
