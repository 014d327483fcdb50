//! Retention: the daemon retires whole segments of the log, purges the
//! terminal intents that have rows into the ledger, and forgets ledger keys
//! after their own, longer retention.
//!
//! A segment's steps are short transactions that wait for a lock at most
//! 100 ms; the purges run in bounded batches, each one short statement with
//! SKIP LOCKED. None holds a lock the claim path needs for long.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::RetentionSection;
use crate::store::Store;

pub async fn run(store: Store, cfg: RetentionSection, mut stop: watch::Receiver<bool>) {
    let purging = !cfg.intents.0.is_zero();
    if !purging {
        tracing::info!("retention.intents is 0s: the daemon does not purge");
    }
    loop {
        match store
            .maintain_log_segments(cfg.segment.0, purging.then_some(cfg.intents.0))
            .await
        {
            Ok(pass) if pass.kept => tracing::warn!(
                "the oldest closed segment of the log holds an intent with neither its \
                 delivery nor a row; it is kept, and so are the segments after it \
                 (see outbox.log_segments and the database's log)"
            ),
            Ok(pass) if pass.changed() => tracing::info!(
                made = pass.made,
                opened = pass.opened,
                closed = pass.closed,
                copied = pass.copied,
                dropped = pass.dropped,
                busy = pass.busy,
                "rotated and retired segments of the log"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "segment step failed; will try again"),
        }
        if purging {
            purge(&store, &cfg).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval.0.max(Duration::from_secs(1))) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// The intents with rows, row by row, and the ledger's own retention.
async fn purge(store: &Store, cfg: &RetentionSection) {
    match store
        .purge_rows_paced(
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
}
