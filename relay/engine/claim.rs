//! The claim loop: wake on NOTIFY (or the poll interval), claim due intents
//! in batches as claim permits free up, start their deliveries.
//!
//! A claim is one short statement that commits before any delivery starts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use crate::engine::budget::ClaimBudget;
use crate::engine::complete::BatchCounts;
use crate::engine::dispatch::Deliverer;
use crate::engine::standbys::Standbys;
use crate::store::listener::Listener;
use crate::store::{ClaimQuery, Claimed, Store};

/// The NOTIFY channel `outbox.enqueue` signals on.
pub const CHANNEL: &str = "outbox_intents";

/// How the claim loop ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The daemon: claim until the stop signal, sleeping when caught up.
    Serve,
    /// `run --once`: claim until nothing is due and every claim is done,
    /// then return (a retry due immediately after a failure is claimed
    /// too; one scheduled for later is left pending).
    Drain,
}

/// The claim loop: owns its statement and what it is handed.
pub struct Claimer {
    pub(super) store: Store,
    /// Built once: a claim takes at most `batch_size`.
    pub(super) query: ClaimQuery,
    /// Written on every claim.
    pub(super) owner: String,
    pub(super) lease: Duration,
    pub(super) poll_interval: Duration,
    /// Known kinds this relay has no provider for (for the next-due query).
    pub(super) unserved: Vec<String>,
    pub(super) budget: Arc<ClaimBudget>,
    pub(super) deliverer: Arc<Deliverer>,
    pub(super) batches: Arc<BatchCounts>,
    /// Held up while standbys lag (`relay.wait_for_standbys`).
    pub(super) standbys: Arc<Standbys>,
}

impl Claimer {
    /// Claim up to `n`, setting the congested destinations' intents
    /// aside; also whether any were (more may be behind them).
    async fn claim(&self, n: usize) -> Result<(Vec<Claimed>, bool), sqlx::Error> {
        let lease_ms = self.lease.as_millis() as i64;
        let aside = self.deliverer.aside();
        let claims = self
            .store
            .claim_setting_aside(&self.query, &self.owner, n as i64, lease_ms, &aside)
            .await?;
        let mut set_aside = false;
        for (name, &count) in aside.names.iter().zip(&claims.set_aside) {
            if count > 0 {
                set_aside = true;
                self.deliverer.set_aside(name, count);
                metrics::counter!("outbox_set_aside_total").increment(count);
            }
        }
        self.batches.claimed(claims.claimed.len());
        Ok((claims.claimed, set_aside))
    }

    /// How long to sleep when caught up: the poll interval, or less when a
    /// scheduled retry is due sooner.
    async fn idle_wait(&self) -> Duration {
        let poll = self.poll_interval;
        match self.store.next_due_in(&self.unserved).await {
            Ok(Some(secs)) if secs.is_finite() => {
                Duration::from_secs_f64(secs.max(0.0)).clamp(Duration::from_millis(5), poll)
            }
            _ => poll,
        }
    }

    /// Sleep for `wait`, or until an enqueue NOTIFY, or until the first
    /// retry or deferral of this relay's own comes due (one that arrives
    /// meanwhile included), whichever comes first; false on the stop.
    async fn sleep(&self, wait: Duration, wake: &Notify, stop: &mut watch::Receiver<bool>) -> bool {
        let poll = tokio::time::Instant::now() + wait;
        loop {
            let until = self.budget.due().next().map_or(poll, |due| due.min(poll));
            tokio::select! {
                _ = wake.notified() => return true,
                _ = tokio::time::sleep_until(until) => return true,
                _ = self.budget.due().sooner() => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Claim and dispatch as claim permits free up. In [`Mode::Serve`] until
    /// `stop` turns true (claim errors are retried with backoff); in
    /// [`Mode::Drain`] until nothing is claimable and no claim is held (a
    /// claim error ends it).
    pub async fn run(
        &self,
        wake: Arc<Notify>,
        mut stop: watch::Receiver<bool>,
        mode: Mode,
    ) -> Result<(), sqlx::Error> {
        let mut backoff = Duration::from_millis(100);
        let mut set_aside_last = false;
        loop {
            // claims taken while the standbys lag would only wait
            if !self.standbys.until_in_step(&mut stop).await {
                return Ok(());
            }
            let idle_before = self.budget.idle();
            let Some(mut permits) = self.budget.take(self.budget.batch_size(), &mut stop).await
            else {
                return Ok(());
            };
            // after a claim that set intents aside, more of them may be
            // in front of the next claimable ones: claim again at once,
            // without waiting for a batch of permits to gather
            if !set_aside_last {
                self.budget.gather(&mut permits, &mut stop).await;
            }
            if *stop.borrow() {
                return Ok(());
            }
            let wanted = permits.len();
            let (claims, set_aside) = match self.claim(wanted).await {
                Ok(claimed) => claimed,
                Err(err) if mode == Mode::Drain => return Err(err),
                Err(err) => {
                    drop(permits);
                    tracing::warn!(error = %err, retry_in = %humantime::format_duration(backoff), "claim failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(|s| *s) => return Ok(()),
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            };
            backoff = Duration::from_millis(100);
            set_aside_last = set_aside;
            let got = claims.len();
            if *stop.borrow() {
                self.deliverer.release(&claims).await;
                return Ok(());
            }
            for claim in claims {
                let permit = permits.pop().expect("one permit per claim");
                self.deliverer.spawn(claim, permit);
            }
            drop(permits);
            match mode {
                // intents set aside: others may be behind them
                _ if set_aside => {}
                Mode::Drain if got == 0 && idle_before => return Ok(()),
                // a delivery finishing may make a retry due at once
                Mode::Drain if got == 0 => self.budget.task_done().await,
                Mode::Drain => {}
                Mode::Serve if got < wanted => {
                    // Caught up: sleep until an enqueue NOTIFY, the next poll
                    // or, when nothing at all was due, the next scheduled
                    // retry, whichever comes first. (Asking for the next due
                    // time only when idle keeps that query off the busy path.)
                    let wait = if got == 0 {
                        self.idle_wait().await
                    } else {
                        self.poll_interval
                    };
                    if !self.sleep(wait, &wake, &mut stop).await {
                        return Ok(());
                    }
                }
                Mode::Serve => {}
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
pub async fn listen(
    store: Store,
    owner: String,
    enabled: bool,
    poll: Duration,
    wake: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    if !enabled {
        tracing::info!(poll_interval = %humantime::format_duration(poll), "relay.listen is false: delivering by polling");
        metrics::gauge!("outbox_listen_active").set(0.0);
        // a supervised task runs until the stop
        let _ = stop.wait_for(|s| *s).await;
        return;
    }
    let mut backoff = Duration::from_millis(200);
    let mut probed = false;
    let mut polling_said = false;
    'connect: loop {
        let mut listener = match store.listen(CHANNEL).await {
            Ok(l) => l,
            Err(err) => {
                tracing::warn!(error = %err, "LISTEN failed; polling meanwhile");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => { backoff = (backoff * 2).min(Duration::from_secs(10)); continue 'connect }
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        if !probed {
            match probe(&store, &owner, &mut listener, &wake).await {
                Ok(true) => {
                    probed = true;
                    metrics::gauge!("outbox_listen_active").set(1.0);
                    tracing::info!(
                        fallback_poll_interval = %humantime::format_duration(poll),
                        "LISTEN/NOTIFY works: enqueues wake the relay at once"
                    );
                }
                Ok(false) => {
                    metrics::gauge!("outbox_listen_active").set(0.0);
                    if !polling_said {
                        polling_said = true;
                        tracing::warn!(
                            poll_interval = %humantime::format_duration(poll),
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
                msg = listener.recv() => msg,
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
    store: &Store,
    owner: &str,
    listener: &mut Listener,
    wake: &Notify,
) -> Result<bool, String> {
    let token = format!("probe:{owner}:{:016x}", fastrand::u64(..));
    store
        .notify(CHANNEL, &token)
        .await
        .map_err(|e| e.to_string())?;
    let deadline = tokio::time::Instant::now() + PROBE_WAIT;
    loop {
        match tokio::time::timeout_at(deadline, listener.recv()).await {
            Err(_) => return Ok(false),
            Ok(Ok(Some(payload))) if payload == token => return Ok(true),
            Ok(Ok(Some(_))) => wake.notify_one(),
            Ok(Ok(None)) => return Err("the LISTEN connection was lost".into()),
            Ok(Err(e)) => return Err(e.to_string()),
        }
    }
}
