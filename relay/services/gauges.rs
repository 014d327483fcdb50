//! The queue gauges (`outbox_intents`, `outbox_oldest_due_seconds`, the
//! ordering-key gauges), refreshed from one cheap query every few seconds,
//! and what holds back the database's xmin horizon.

use std::time::Duration;

use super::spaced;
use crate::kinds::Kind;
use crate::observe::metrics::kind_label;
use crate::state::IntentState;
use crate::store::Store;

/// The states `outbox_intents` reports (terminal history is counted by the
/// counters, not rescanned every few seconds).
pub const GAUGED_STATES: [IntentState; 4] = [
    IntentState::Pending,
    IntentState::Claimed,
    IntentState::Ambiguous,
    IntentState::Dead,
];

/// The holders of the xmin horizon the gauges report, as `holder` labels
/// (see [`crate::store::stats::XminHolder`]); the first two have a start
/// time.
pub const XMIN_HOLDERS: [&str; 4] = ["transaction", "prepared", "replication_slot", "standby"];

/// Refresh the queue gauges from one cheap query. Kinds seen before keep
/// being reported (at 0) after they drain.
pub async fn refresh_gauges(store: &Store) -> Result<(), sqlx::Error> {
    let s = store.stats_for_gauges().await?;
    metrics::gauge!("outbox_blocked_ordering_keys").set(s.blocked as f64);
    metrics::gauge!("outbox_stranded_ordering_intents").set(s.stranded as f64);
    // known kinds by name, every other kind summed as `other`
    let labels = Kind::names().into_iter().chain(["other"]);
    for label in labels {
        for state in GAUGED_STATES {
            let n: i64 = s
                .counts
                .iter()
                .filter(|r| kind_label(&r.0) == label && r.1 == state.as_sql())
                .map(|r| r.2)
                .sum();
            metrics::gauge!("outbox_intents", "kind" => label, "state" => state.as_sql())
                .set(n as f64);
        }
        let oldest = s
            .oldest
            .iter()
            .filter(|r| kind_label(&r.0) == label)
            .map(|r| r.1)
            .fold(0.0, f64::max);
        metrics::gauge!("outbox_oldest_due_seconds", "kind" => label).set(oldest);
    }
    // last: the other gauges are set even where these views are refused
    let held = store.xmin_horizon().await?;
    for holder in XMIN_HOLDERS {
        let h = held.iter().find(|h| h.holder == holder);
        metrics::gauge!("outbox_oldest_xmin_age_transactions", "holder" => holder)
            .set(h.map_or(0.0, |h| h.age_transactions as f64));
        if holder == "transaction" || holder == "prepared" {
            // 0 also while every holder's start is hidden from this role
            metrics::gauge!("outbox_oldest_xmin_age_seconds", "holder" => holder)
                .set(h.and_then(|h| h.age_seconds).unwrap_or(0.0));
        }
    }
    Ok(())
}

/// Refresh the gauges every `every` (longer after a slow refresh, see
/// [`spaced`]) until `stop` turns true.
pub async fn gauges_loop(
    store: Store,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let started = std::time::Instant::now();
        if let Err(err) = refresh_gauges(&store).await {
            tracing::debug!(error = %err, "gauge refresh failed");
        }
        tokio::select! {
            _ = tokio::time::sleep(spaced(every, started.elapsed())) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
