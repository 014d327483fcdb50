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
pub mod subscriptions;

use std::time::Duration;

/// The share of its time a periodic read that counts the backlog may take:
/// after a read that took `d`, the next waits at least `d` times this.
/// Beside a large backlog such a read runs less often rather than spending
/// more of the server (1.0–1.8 s a read beside 1,000,000 pending intents,
/// `bench/pgbench/periodic-work.sh`, 2026-12-04).
const READ_SPACING: u32 = 20;

/// How long to wait before a periodic read whose last run took `took`:
/// its usual `period`, or longer after a slow read.
pub fn spaced(period: Duration, took: Duration) -> Duration {
    period.max(took.saturating_mul(READ_SPACING))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_refresh_spaces_out_the_next() {
        let every = Duration::from_secs(5);
        assert_eq!(spaced(every, Duration::from_millis(30)), every);
        assert_eq!(
            spaced(every, Duration::from_millis(900)),
            Duration::from_secs(18)
        );
    }
}
