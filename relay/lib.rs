//! outbox-relay: a transactional-outbox relay for Postgres.
//!
//! Applications write intents with `outbox.enqueue(...)` inside their own
//! transaction; the relay claims them, performs each effect under a key
//! derived from the intent, and drives every intent to an inspectable state.
//!
//! The modules, by role, lowest first; each imports only those before it
//! (`tests/it/layout/` keeps it so):
//!
//! - [`state`]: `IntentState` and `AttemptOutcome`, with their SQL spelling.
//! - [`units`]: durations as the configuration writes them.
//! - [`kinds`]: the delivery kinds, one module each (the payload's check and
//!   JSON Schema, its destination, the key its provider sees, its provider's
//!   constructor, its configuration section) and the one list of them; the
//!   rest of the crate names a kind only through `Kind`.
//! - [`observe`]: logs, the Prometheus recorder and its labels, readiness.
//! - [`config`]: TOML + environment configuration, one file per section
//!   (each kind's section is in its module under [`kinds`]), validated
//!   once; it imports no feature.
//! - [`store`]: every SQL statement: claims, fenced completions, operator
//!   reads and changes, destination health, the Rust enqueue helper.
//! - [`services`]: what runs beside the engine without knowing it:
//!   destination health, schedules, retention, the queue gauges, the
//!   `/metrics` listener and the lookup.
//! - [`engine`]: the hot path (claim → dispatch → complete, the sweeper,
//!   reconcile, the claim budget) under one supervisor.
//! - [`console`]: `outbox-relay console`, the operator web UI and its JSON API.
//! - [`cli`]: the `outbox-relay` command, which starts all of the above;
//!   `cli/run.rs` builds the daemon from the configuration and hands each
//!   task and service its parts through constructors.
//!
//! Effects themselves live in the `outbox-providers` crate, which never
//! touches Postgres; this crate never builds an HTTP request. The benchmark
//! is a command of its own, `outbox-relay-bench` (bench/), built on this
//! crate's public API.

pub mod cli;
pub mod config;
pub mod console;
pub mod engine;
pub mod kinds;
pub mod observe;
pub mod services;
pub mod state;
pub mod store;
pub mod units;

pub use engine::{Engine, EngineConfig};
pub use store::Store;
