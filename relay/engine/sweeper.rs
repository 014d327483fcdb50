//! The sweeper: resolves claims whose lease expired, and folds duplicate
//! enqueues into their intents.
//!
//! An expired lease means a relay died, hung, or lost the database while it
//! held the claim. The sweeper reclaims the intent under a new fencing token
//! (so the old owner's late completion is refused) and hands it to dispatch
//! marked as recovered: dispatch asks the provider what happened before it
//! does anything else (see `reconcile`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::engine::budget::ClaimBudget;
use crate::engine::dispatch::Deliverer;
use crate::observe::metrics::{client_label, kind_label};
use crate::store::Store;

/// Noted ordering keys looked at per transaction (each holds a share lock
/// on the live intents ahead it finds until it commits).
const RECHECK_BATCH: i32 = 500;

/// The sweeper: owns its settings and is handed the budget and deliverer.
pub struct Sweeper {
    pub(super) store: Store,
    /// Written on every reclaim.
    pub(super) owner: String,
    pub(super) lease: Duration,
    /// Known kinds this relay has no provider for: left for other relays.
    pub(super) unserved: Vec<String>,
    pub(super) interval: Duration,
    pub(super) budget: Arc<ClaimBudget>,
    pub(super) deliverer: Arc<Deliverer>,
}

impl Sweeper {
    /// One pass. Returns how many expired claims were taken over.
    pub async fn tick(&self) -> Result<usize, sqlx::Error> {
        for (kind, source, n) in self.store.fold_duplicates(10_000).await? {
            let label = kind_label(&kind);
            metrics::counter!("outbox_replays_total", "kind" => label, "source" => "enqueue")
                .increment(n as u64);
            let client = client_label(source.as_deref());
            metrics::counter!("outbox_duplicate_enqueues_total", "kind" => label, "client" => client)
                .increment(n as u64);
            tracing::debug!(
                kind,
                source = source.as_deref().unwrap_or("-"),
                n,
                "duplicate enqueues"
            );
        }
        // intents a race left waiting with nothing live ahead: only the keys
        // noted since the last pass are looked at
        match self.store.promote_stranded_heads(RECHECK_BATCH).await {
            Ok(r) if r.promoted > 0 => tracing::info!(
                keys = r.keys,
                promoted = r.promoted,
                "promoted ordering-key intents left waiting with nothing live ahead"
            ),
            Ok(_) => {}
            Err(err) => {
                tracing::warn!(error = %err, "could not promote waiting ordering-key heads")
            }
        }
        let mut permits = self.budget.take_for_recovery();
        if permits.is_empty() {
            return Ok(0);
        }
        let claims = self
            .store
            .claim_expired(
                &self.owner,
                permits.len() as i64,
                self.lease.as_millis() as i64,
                &self.unserved,
            )
            .await?;
        let n = claims.len();
        for claim in claims {
            metrics::counter!("outbox_leases_expired_total", "kind" => kind_label(&claim.kind))
                .increment(1);
            tracing::warn!(
                intent = claim.id,
                key = %claim.key,
                previous_owner = claim.recovered_from.as_deref().unwrap_or("?"),
                "lease expired; reconciling"
            );
            let permit = permits.pop().expect("one permit per claim");
            self.deliverer.spawn(claim, permit);
        }
        Ok(n)
    }

    /// A pass every `interval` until `stop` turns true.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        loop {
            if let Err(err) = self.tick().await {
                tracing::warn!(error = %err, "sweep failed; will try again");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }
}
