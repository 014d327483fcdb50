//! The services that run beside the engine, each on its own loop under the
//! supervisor: schedules, retention, destination health, the queue gauges,
//! and the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`, the lookup).
//! None of them knows the engine; the engine asks one of them, destination
//! health, before each attempt.

pub mod endpoint;
pub mod gauges;
pub mod health;
pub mod lookup;
pub mod retention;
pub mod schedule;
