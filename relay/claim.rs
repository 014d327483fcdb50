//! The claim loop: wake on NOTIFY (or the poll interval), claim due intents
//! in batches as claim permits free up, start their deliveries.
//!
//! A claim is one short statement that commits before any delivery starts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::dispatch;
use crate::engine::Ctx;

/// The NOTIFY channel `outbox.enqueue` signals on.
pub const CHANNEL: &str = "outbox_intents";

/// Wait for one free slot (or `None` on stop), then take up to `max` without waiting.
pub async fn take_permits(
    sem: &Arc<Semaphore>,
    max: usize,
    stop: &mut watch::Receiver<bool>,
) -> Option<Vec<OwnedSemaphorePermit>> {
    if *stop.borrow() {
        return None;
    }
    let first = tokio::select! {
        p = sem.clone().acquire_owned() => p.ok()?,
        _ = stop.wait_for(|s| *s) => return None,
    };
    let mut permits = vec![first];
    permits.extend(try_take(sem, max.saturating_sub(1)));
    Some(permits)
}

/// Up to `max` free slots, without waiting.
pub fn try_take(sem: &Arc<Semaphore>, max: usize) -> Vec<OwnedSemaphorePermit> {
    let mut permits = Vec::new();
    while permits.len() < max {
        match sem.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
    permits
}

/// Claim and dispatch until `stop` turns true.
pub async fn run(ctx: Arc<Ctx>, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    while let Some(mut permits) = take_permits(&ctx.claims, ctx.cfg.batch_size, &mut stop).await {
        // A claim of many rows costs the database far less per row than a
        // claim of few. While a round of claimed work is queued for the
        // delivery slots, let freed permits gather; claim them all at once
        // when the queue runs low.
        while permits.len() < ctx.cfg.batch_size && ctx.queue_full() {
            tokio::select! {
                p = ctx.claims.clone().acquire_owned() => {
                    permits.extend(p.ok());
                    permits.extend(try_take(&ctx.claims, ctx.cfg.batch_size - permits.len()));
                }
                _ = ctx.queue_low.notified() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        if *stop.borrow() {
            break;
        }
        let wanted = permits.len();
        match ctx.claim(wanted).await {
            Ok(claims) => {
                backoff = Duration::from_millis(100);
                let got = claims.len();
                if *stop.borrow() {
                    ctx.release(&claims).await;
                    break;
                }
                for claim in claims {
                    let permit = permits.pop().expect("one permit per claim");
                    dispatch::spawn(&ctx, claim, permit);
                }
                drop(permits);
                if got < wanted {
                    // Caught up: sleep until an enqueue NOTIFY, the next poll
                    // or, when nothing at all was due, the next scheduled
                    // retry, whichever comes first. (Asking for the next due
                    // time only when idle keeps that query off the busy path.)
                    let wait = if got == 0 {
                        ctx.idle_wait().await
                    } else {
                        ctx.cfg.poll_interval
                    };
                    tokio::select! {
                        _ = wake.notified() => {}
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|s| *s) => break,
                    }
                }
            }
            Err(err) => {
                drop(permits);
                tracing::warn!(error = %err, retry_in = ?backoff, "claim failed; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// LISTEN for enqueue notifications and wake the claim loop. Reconnects on
/// its own; a lost connection wakes the loop too, since notifications may
/// have been missed meanwhile.
///
/// After the first LISTEN the relay sends itself a NOTIFY. When that does
/// not arrive (a pooler in transaction mode such as PgBouncer passes LISTEN
/// through but never delivers notifications), it says so, drops the
/// connection and checks again every minute; meanwhile the claim loop's
/// poll interval does the waking.
pub async fn listen(ctx: Arc<Ctx>, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
    let poll = ctx.cfg.poll_interval;
    if !ctx.cfg.listen {
        tracing::info!(poll_interval = ?poll, "relay.listen is false: delivering by polling");
        metrics::gauge!("outbox_listen_active").set(0.0);
        // a supervised task runs until the stop
        let _ = stop.wait_for(|s| *s).await;
        return;
    }
    let mut backoff = Duration::from_millis(200);
    let mut probed = false;
    let mut polling_said = false;
    'connect: loop {
        let mut listener = match sqlx::postgres::PgListener::connect_with(ctx.store.pool()).await {
            Ok(l) => l,
            Err(err) => {
                tracing::warn!(error = %err, "LISTEN connection failed; polling meanwhile");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => { backoff = (backoff * 2).min(Duration::from_secs(10)); continue 'connect }
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        if let Err(err) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %err, "LISTEN failed; polling meanwhile");
            tokio::select! {
                _ = tokio::time::sleep(backoff) => { backoff = (backoff * 2).min(Duration::from_secs(10)); continue 'connect }
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        if !probed {
            match probe(&ctx, &mut listener, &wake).await {
                Ok(true) => {
                    probed = true;
                    metrics::gauge!("outbox_listen_active").set(1.0);
                    tracing::info!(
                        fallback_poll_interval = ?poll,
                        "LISTEN/NOTIFY works: enqueues wake the relay at once"
                    );
                }
                Ok(false) => {
                    metrics::gauge!("outbox_listen_active").set(0.0);
                    if !polling_said {
                        polling_said = true;
                        tracing::warn!(
                            poll_interval = ?poll,
                            "a NOTIFY sent to this relay did not arrive within {PROBE_WAIT:?}: the \
                             database connection goes through a pooler that does not deliver \
                             notifications (PgBouncer in transaction mode?). Delivering by polling \
                             instead (checking again every {REPROBE:?}); set relay.listen = false \
                             to skip this check"
                        );
                    }
                    wake.notify_one();
                    // a slow moment can miss the window too: look again later
                    drop(listener);
                    tokio::select! {
                        _ = tokio::time::sleep(REPROBE) => continue 'connect,
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "LISTEN check failed; polling meanwhile");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => { backoff = (backoff * 2).min(Duration::from_secs(10)); continue 'connect }
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }
        }
        backoff = Duration::from_millis(200);
        wake.notify_one();
        loop {
            let msg = tokio::select! {
                msg = listener.try_recv() => msg,
                _ = stop.wait_for(|s| *s) => return,
            };
            match msg {
                Ok(Some(_)) => wake.notify_one(),
                // connection lost; sqlx reconnects on the next call
                Ok(None) => wake.notify_one(),
                Err(err) => {
                    tracing::warn!(error = %err, "LISTEN connection lost; reconnecting");
                    wake.notify_one();
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => continue 'connect,
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }
        }
    }
}

/// How long the start-up check waits for its own NOTIFY.
const PROBE_WAIT: Duration = Duration::from_secs(3);

/// How often a relay that found notifications missing checks again.
const REPROBE: Duration = Duration::from_secs(60);

/// Send a NOTIFY with a unique payload through the pool and wait for it on
/// the LISTEN connection. Other notifications seen meanwhile still wake the
/// claim loop.
async fn probe(
    ctx: &Ctx,
    listener: &mut sqlx::postgres::PgListener,
    wake: &Notify,
) -> Result<bool, String> {
    let token = format!("probe:{}:{:016x}", ctx.cfg.owner, fastrand::u64(..));
    ctx.store
        .notify(CHANNEL, &token)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + PROBE_WAIT;
    loop {
        match tokio::time::timeout_at(deadline, listener.try_recv()).await {
            Err(_) => return Ok(false),
            Ok(Ok(Some(n))) if n.payload() == token => return Ok(true),
            Ok(Ok(Some(_))) => wake.notify_one(),
            Ok(Ok(None)) => return Err("the LISTEN connection was lost".into()),
            Ok(Err(e)) => return Err(e.to_string()),
        }
    }
}
