//! Subscriptions that keep failing are disabled: one whose breaker has
//! been open for `[subscriptions] disable_after` is, with an alert and the
//! event `outbox.subscription.disabled`.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::health::AlertTarget;
use crate::store::Store;

/// How often the check runs: a tenth of `after`, within 1 s to 1 min.
pub fn period(after: Duration) -> Duration {
    (after / 10).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

pub async fn run(
    store: Store,
    after: Duration,
    alerts: AlertTarget,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match store.disable_failing_subscriptions(after, &alerts).await {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                n,
                after = %humantime::format_duration(after),
                "disabled subscriptions whose deliveries failed for subscriptions.disable_after"
            ),
            Err(err) => {
                tracing::warn!(error = %err, "checking for failing subscriptions failed; will try again")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(period(after)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_runs_a_tenth_as_often_within_bounds() {
        assert_eq!(
            period(Duration::from_secs(5 * 86400)),
            Duration::from_secs(60)
        );
        assert_eq!(period(Duration::from_secs(100)), Duration::from_secs(10));
        assert_eq!(period(Duration::from_secs(2)), Duration::from_secs(1));
    }
}
