//! The sweeper: resolves claims whose lease expired, and folds duplicate
//! enqueues into their intents.
//!
//! An expired lease means a relay died, hung, or lost the database while it
//! held the claim. The sweeper reclaims the intent under a new fencing token
//! (so the old owner's late completion is refused) and hands it to dispatch
//! marked as recovered: dispatch asks the provider what happened before it
//! does anything else (see `reconcile`).

use std::sync::Arc;

use tokio::sync::watch;

use crate::claim;
use crate::dispatch;
use crate::engine::Ctx;
use crate::metrics::{client_label, kind_label};

/// One pass. Returns how many expired claims were taken over.
pub async fn tick(ctx: &Arc<Ctx>) -> Result<usize, sqlx::Error> {
    for (kind, source, n) in ctx.store.fold_duplicates(10_000).await? {
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
    // heads of ordering keys that a race left waiting outside the claim index
    match ctx.store.promote_stranded_heads(1000).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(n, "promoted ordering-key heads left waiting"),
        Err(err) => tracing::warn!(error = %err, "could not promote waiting ordering-key heads"),
    }
    // its own permits first, then any free claim permits
    let mut permits = claim::try_take(&ctx.recovery, ctx.recovery_budget);
    permits.extend(claim::try_take(
        &ctx.claims,
        ctx.cfg.batch_size.saturating_sub(permits.len()),
    ));
    if permits.is_empty() {
        return Ok(0);
    }
    let claims = ctx
        .store
        .claim_expired(
            &ctx.cfg.owner,
            permits.len() as i64,
            ctx.lease_ms(),
            &ctx.unserved,
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
        dispatch::spawn(ctx, claim, permit);
    }
    Ok(n)
}

pub async fn run(ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    loop {
        if let Err(err) = tick(&ctx).await {
            tracing::warn!(error = %err, "sweep failed; will try again");
        }
        tokio::select! {
            _ = tokio::time::sleep(ctx.cfg.sweep_interval) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
