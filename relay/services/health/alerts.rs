//! Operator alerts, enqueued as signed webhook intents to `[alerts]`: a
//! destination paused by hand, the summaries of alert windows that held
//! alerts back, and the dead count past `alerts.dead_threshold`. (Breaker
//! openings and closings are raised by the database functions that change
//! the breaker.)

use crate::config::HealthSettings;
use crate::store::Store;

/// The alerts of destinations paused by hand (each raised by one relay).
pub async fn raise_pause_alerts(store: &Store, settings: &HealthSettings) {
    let alerts = &settings.alerts;
    if alerts.url.is_none() && alerts.endpoint.is_none() {
        return;
    }
    if let Err(e) = store.raise_pause_alerts(alerts).await {
        tracing::warn!(error = %e, "cannot raise the pause alerts");
    }
}

/// The summaries of alert windows that held alerts back (schema 0015:
/// of each kind of destination event, 3 are raised one by one per five
/// minutes, the rest summed up in one `alerts.suppressed` after it).
pub async fn raise_alert_summaries(store: &Store, settings: &HealthSettings) {
    if let Err(e) = store.raise_alert_summaries(&settings.alerts).await {
        tracing::warn!(error = %e, "cannot raise the alert summaries");
    }
}

/// The dead-count alert, when configured: raised once per crossing of
/// `alerts.dead_threshold`.
pub async fn check_dead_alert(store: &Store, settings: &HealthSettings) {
    let Some(threshold) = settings.dead_threshold else {
        return;
    };
    let alerts = &settings.alerts;
    if alerts.url.is_none() && alerts.endpoint.is_none() {
        return;
    }
    if let Err(e) = store.check_dead_alert(threshold, alerts).await {
        tracing::warn!(error = %e, "cannot check the dead-intent alert");
    }
}
