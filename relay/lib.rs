//! outbox-relay: a transactional-outbox relay for Postgres.
//!
//! Applications write intents with `outbox.enqueue(...)` inside their own
//! transaction; the relay claims them, performs each effect under a key
//! derived from the intent, and drives every intent to an inspectable state.
//!
//! Module map (find any behaviour by its noun):
//!
//! - [`config`]: TOML + environment configuration, validated once.
//! - [`store`]: every SQL statement: claims, fenced completions, operator
//!   reads and changes, the Rust enqueue helper.
//! - [`budget`]: the claim budget: permits, the queue for delivery slots, idle.
//! - [`claim`]: the claim loop (serve, or drain for `run --once`) and the
//!   LISTEN/NOTIFY wake-up.
//! - [`dispatch`]: performing one claimed intent's effect, settling its
//!   next state.
//! - [`state`]: `IntentState` and `AttemptOutcome`, with their SQL spelling.
//! - [`transition`]: outcome → next state, and backoff: pure functions.
//! - [`complete`]: batched, fenced, never-dropped completion writes.
//! - [`sweeper`]: expired leases → reconcile; duplicate-enqueue folding.
//! - [`reconcile`]: what to do when an attempt's outcome was lost.
//! - [`schedule`]: `[[schedule]]` ticks → intents, leaderless.
//! - [`retention`]: purging terminal intents into the ledger, and the ledger.
//! - [`engine`]: wiring, `run` and `run --once`, graceful shutdown.
//! - [`supervisor`]: every long-running task under one stop signal; a task
//!   that dies or gets stuck makes the relay unready and exits it.
//! - [`metrics`]: Prometheus metrics, queue gauges, /healthz and /readyz.
//! - [`lookup`]: `GET /v1/intents/{key}` on the metrics listener: by key
//!   only, optionally behind a bearer token.
//! - [`console`]: `outbox-relay console`, the operator web UI and its JSON API.
//! - [`cli`]: the `outbox-relay` command.
//! - [`telemetry`]: logging setup.
//!
//! Effects themselves live in the `outbox-providers` crate, which never
//! touches Postgres; this crate never builds an HTTP request. The benchmark
//! is a command of its own, `outbox-relay-bench` (bench/), built on this
//! crate's public API.

pub mod cli;
pub mod config;
pub mod console;
pub mod engine;
pub mod observe;
pub mod services;
pub mod state;
pub mod store;

pub use engine::{Engine, EngineConfig};
pub use store::Store;
