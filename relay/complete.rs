//! The completer: writes completions in batches, fenced, and never drops one.
//!
//! Delivery tasks send their completion here and wait for the write. Whatever
//! has arrived since the last write goes out in one statement, so under load
//! one round trip completes many intents. A write that fails (database
//! restarting, network blip) is retried with backoff: an effect that happened
//! is recorded once the database is back, never forgotten.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::engine::BatchCounts;
use crate::store::{Completion, Store};

/// A completion and the channel that tells its task whether it was accepted.
pub type Pending = (Completion, oneshot::Sender<bool>);

pub async fn run(
    store: Store,
    owner: String,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    max_batch: usize,
    batches: Arc<BatchCounts>,
) {
    let mut batch: Vec<Pending> = Vec::with_capacity(max_batch);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (completions, acks): (Vec<Completion>, Vec<_>) = batch.drain(..).unzip();
        let accepted: HashMap<i64, _> = write(&store, &owner, &completions)
            .await
            .into_iter()
            .map(|a| (a.id, a.created_at))
            .collect();
        batches.written(completions.len());
        let now = chrono::Utc::now();
        for (c, ack) in completions.iter().zip(acks) {
            let created_at = accepted.get(&c.id).copied();
            record_metrics(c, created_at.is_some(), now, created_at);
            let _ = ack.send(created_at.is_some());
        }
    }
}

/// Write until it succeeds. Fenced and idempotent, so a retry after an
/// unknown commit result is harmless.
async fn write(
    store: &Store,
    owner: &str,
    completions: &[Completion],
) -> Vec<crate::store::claims::Accepted> {
    let mut delay = Duration::from_millis(50);
    let mut failures = 0u32;
    loop {
        match store.complete(owner, completions).await {
            Ok(accepted) => {
                if failures > 0 {
                    tracing::info!(
                        failures,
                        n = completions.len(),
                        "completions written after the database came back"
                    );
                }
                return accepted;
            }
            Err(err) => {
                failures += 1;
                if failures == 1 || failures % 20 == 0 {
                    tracing::warn!(error = %err, n = completions.len(), failures, "cannot write completions; retrying");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

fn record_metrics(
    c: &Completion,
    accepted: bool,
    now: chrono::DateTime<chrono::Utc>,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
) {
    let kind = c.kind.clone();
    if c.uncounted {
        metrics::counter!("outbox_deferrals_total", "kind" => kind).increment(1);
        return;
    }
    metrics::counter!("outbox_attempts_total", "kind" => kind.clone(), "outcome" => c.outcome)
        .increment(1);
    if !accepted {
        metrics::counter!("outbox_fencing_rejections_total").increment(1);
        tracing::warn!(
            intent = c.id,
            fence = c.fence,
            outcome = c.outcome,
            "completion refused: the lease had moved on (stale worker); the attempt is kept with accepted = false"
        );
        return;
    }
    if c.replayed {
        metrics::counter!("outbox_replays_total", "kind" => kind.clone(), "source" => "provider")
            .increment(1);
    }
    if c.operator_replay {
        metrics::counter!("outbox_replays_total", "kind" => kind.clone(), "source" => "operator")
            .increment(1);
    }
    if matches!(c.state, "delivered" | "rejected") && c.status.is_some_and(|s| s >= 500) {
        metrics::counter!("outbox_invariant_violations_total", "kind" => kind.clone()).increment(1);
        tracing::error!(intent = c.id, status = ?c.status, state = c.state,
            "invariant violated: a 5xx answer was stored as terminal");
    }
    if c.state == "delivered" && !c.delivered_before {
        metrics::counter!("outbox_delivered_total", "kind" => kind.clone()).increment(1);
        if let Some(created) = created_at {
            let latency = (now - created).to_std().unwrap_or_default();
            metrics::histogram!("outbox_delivery_latency_seconds", "kind" => kind)
                .record(latency.as_secs_f64());
        }
    }
}
