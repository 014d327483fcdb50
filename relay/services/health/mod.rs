//! Destination health: rate limits held across relays, circuit breakers
//! that recover by themselves, manual pauses, and the operator alerts they
//! raise (schema 0007).
//!
//! A *destination* is where a kind's effects go: a webhook's origin
//! (`scheme://host[:port]`, also for a named endpoint), `smtp`, `charge`,
//! `nats`, `amqp`, `kafka`. Before an attempt the relay asks the [`Gate`]:
//!
//! - paused by an operator, breaker open (no probe due), a 429 still in
//!   force, no token of its rate limit: the intent is *deferred* (pending
//!   again, no attempt spent, `last_error` saying why) until it may go;
//! - an open breaker whose cooldown has passed lets exactly one attempt
//!   through, the probe, claimed in the database by one relay.
//!
//! After the attempt the gate records what the destination did: a
//! transient failure or an ambiguous outcome counts towards opening the
//! breaker; an answer (delivered, or refused on purpose) resets the count
//! and, for the probe, closes it; a 429 or `Retry-After` slows the whole
//! destination. The healthy path costs no database work: the gate reads
//! the few unhealthy destinations every half second and writes only when
//! one fails or recovers, and rate-limited destinations take tokens from
//! their shared bucket in batches of about 50 ms worth.
//!
//! The parts: [`gate`] (asked before each attempt), [`bucket`] (shared
//! rate limits), [`breaker`] (what an outcome tells, and the probe),
//! [`alerts`], [`gauges`], and [`listing`] (what `destinations` and the
//! console show). The settings are `config::health`; the SQL is
//! `store::destinations`.

pub mod alerts;
pub mod breaker;
pub mod bucket;
pub mod gate;
pub mod gauges;
pub mod listing;

use std::time::{Duration, Instant};

use anyhow::Context;

pub use alerts::{check_dead_alert, raise_alert_summaries, raise_pause_alerts};
pub use gate::{Admit, Gate};
pub use gauges::{refresh_backlog_gauges, refresh_gauges};
pub use listing::{list, Destination};

use crate::config::destinations::canonical;
use crate::config::HealthSettings;
use crate::store::Store;

/// The most unhealthy destinations the gate reads and keeps: the paused
/// ones first, then open breakers and slowed destinations, then those that
/// failed lately, the latest first. (Past it, a closed destination's count
/// may miss a reset by a success: it starts anew after the failure window.)
pub const VIEW_MAX: i64 = 10_000;
/// How long a deferred intent waits at least, at most.
const MIN_WAIT: Duration = Duration::from_millis(100);
const MAX_WAIT: Duration = Duration::from_secs(60);

/// How long destination events and idle closed destinations are kept.
const HISTORY: Duration = Duration::from_secs(30 * 24 * 3600);

/// When the backlog read after one that ended at `now` and took `took` may
/// run: its usual period, or longer after a slow read
/// ([`crate::services::spaced`]).
fn next_backlog_read(now: Instant, period: Duration, took: Duration) -> Instant {
    now + crate::services::spaced(period, took)
}

/// The destination gauges and the dead-count alert, every `every` until
/// `stop` turns true (the backlog gauges every third time, and less often
/// when a read is slow: they scan the pending intents).
pub async fn run(
    store: Store,
    settings: HealthSettings,
    owner: String,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut reported = std::collections::HashSet::new();
    let mut backlogs = std::collections::HashSet::new();
    let mut backlog_due = Instant::now();
    for tick in 0u64.. {
        check_dead_alert(&store, &settings).await;
        raise_pause_alerts(&store, &settings).await;
        raise_alert_summaries(&store, &settings).await;
        // about every minute at a 5 s tick: failures past the window
        if tick % 12 == 2 {
            if let Err(e) = store.forget_stale_failures(settings.failure_window()).await {
                tracing::debug!(error = %e, "cannot forget stale destination failures");
            }
        }
        // about hourly at a 5 s tick
        if tick % 720 == 1 {
            if let Err(e) = store.prune_destinations(HISTORY).await {
                tracing::debug!(error = %e, "cannot prune destination history");
            }
        }
        if let Err(e) = refresh_gauges(&store, &settings, &mut reported).await {
            tracing::debug!(error = %e, "destination gauge refresh failed");
        }
        if Instant::now() >= backlog_due {
            let started = Instant::now();
            if let Err(e) = refresh_backlog_gauges(&store, &settings, &owner, &mut backlogs).await {
                tracing::debug!(error = %e, "destination backlog gauge refresh failed");
            }
            // three ticks, less a little so that the read keeps to every
            // third tick while it is quick
            let period = (every * 3).saturating_sub(every / 2);
            backlog_due = next_backlog_read(Instant::now(), period, started.elapsed());
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// `pause ORIGIN` / `resume ORIGIN`, from the CLI: the name an operator
/// gave, made canonical.
pub async fn pause(
    store: &Store,
    settings: &HealthSettings,
    name: &str,
    reason: Option<&str>,
) -> anyhow::Result<String> {
    let dest = canonical(name, &settings.endpoints).map_err(anyhow::Error::msg)?;
    store
        .pause_destination(&dest, reason)
        .await
        .context("pausing the destination")?;
    Ok(dest)
}

pub async fn resume(
    store: &Store,
    settings: &HealthSettings,
    name: &str,
) -> anyhow::Result<(String, bool)> {
    let dest = canonical(name, &settings.endpoints).map_err(anyhow::Error::msg)?;
    let resumed = store
        .resume_destination(&dest)
        .await
        .context("resuming the destination")?;
    Ok((dest, resumed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_backlog_read_spaces_out_the_next() {
        let now = Instant::now();
        let period = Duration::from_millis(12_500);
        // quick: the usual period
        assert_eq!(
            next_backlog_read(now, period, Duration::from_millis(40)),
            now + period
        );
        // 1.2 s: twenty times that, so at most a twentieth of the time
        assert_eq!(
            next_backlog_read(now, period, Duration::from_millis(1_200)),
            now + Duration::from_secs(24)
        );
    }
}
