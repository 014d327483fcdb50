//! Retention: the daemon purges terminal intents into the ledger, and
//! forgets ledger keys after their own, longer retention.
//!
//! Both run in bounded batches, each one short statement with SKIP LOCKED, so
//! a purge never holds a lock the claim path needs for long.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::RetentionSection;
use crate::store::Store;

pub async fn run(store: Store, cfg: RetentionSection, mut stop: watch::Receiver<bool>) {
    if cfg.intents.0.is_zero() {
        tracing::info!("retention.intents is 0s: the daemon does not purge");
        // a supervised task runs until the stop
        let _ = stop.wait_for(|s| *s).await;
        return;
    }
    loop {
        match store
            .purge_paced(
                cfg.intents.0,
                cfg.include_dead,
                cfg.batch_size as i64,
                cfg.batch_pause.0,
            )
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(n, "purged terminal intents into the ledger"),
            Err(err) => tracing::warn!(error = %err, "purge failed; will try again"),
        }
        match store
            .purge_ledger(cfg.ledger.0, cfg.batch_size as i64)
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(n, "forgot ledger keys past retention.ledger"),
            Err(err) => tracing::warn!(error = %err, "ledger purge failed; will try again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval.0.max(Duration::from_secs(1))) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
