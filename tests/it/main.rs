//! The integration suite, one test binary: each module is a feature tested
//! through the real engine or the real `outbox-relay` binary, against a real
//! Postgres and real peers (an HTTP receiver, an SMTP server, the Stripe
//! fake). `common` is the harness: a database per test, dropped with it.
//!
//! Run it all with `tests/run.sh`; one module with
//! `tests/run.sh -E 'test(/^delivery::/)'` (nextest) or
//! `cargo test --test it delivery::`.

mod common;

mod amqp;
mod attempt_history;
mod bad_input;
mod batching;
mod book;
mod chaos;
mod charge;
mod cli;
mod clients_python;
mod clients_rust;
mod clients_rust_publish;
mod clients_typescript;
mod console;
mod console_browser;
mod console_bulk;
mod console_pages;
mod delivery;
mod email;
mod enqueue;
mod enqueue_many;
mod enqueue_many_equivalence;
mod events;
mod failover;
mod first_steps;
mod fleet;
mod generic_plans;
mod getting_started;
mod guides;
mod health;
mod intent_keys;
mod intent_log;
mod kafka;
mod kafka_drill;
mod kind_schemas;
mod layout;
mod lifecycle;
mod log_segments;
mod lookup;
mod metrics;
mod migrate_retry;
mod nats;
mod ordering;
mod outage;
mod periodic_reads;
mod pooler;
mod privileges;
mod recovery;
mod reference;
mod retention;
mod runbooks;
mod schedules;
mod secrets;
mod standbys;
mod tallies;
mod tls;
mod trace_context;
mod traces;
mod upgrade;
