//! What the relay tells the people running it: logs (`logs`), trace spans
//! of its attempts (`trace`), and the
//! Prometheus recorder with its labels and descriptions (`metrics`,
//! `destination_gauges`). Everything above may record; nothing here reads
//! the database or serves a request.

pub mod destination_gauges;
pub mod logs;
pub mod metrics;
pub mod readiness;
pub mod trace;
