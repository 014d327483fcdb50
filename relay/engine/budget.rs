//! The claim budget: how many claims a relay may hold, how many wait for a
//! delivery slot, and when the engine is idle.
//!
//! One permit per intent this relay holds a claim on, from the claim until
//! its completion is written. The budget is `concurrency + 3 × batch_size`:
//! the effects in flight, one claim's worth queued for a slot, one waiting
//! for the completer and one being written, so claiming, delivering and
//! completing overlap while the number of claims held stays bounded. (With
//! only one batch of room, completions waiting to be written held the
//! permits the next claim needed, and claims shrank to a fraction of a
//! batch.) The sweeper has a few permits of its own (`batch_size / 4`, at
//! least 1): under a steady backlog the claim loop takes every freed claim
//! permit first, and the leases of a relay that died must not wait for the
//! backlog.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};

use crate::engine::due::Due;

/// One claim held: dropped when its completion is written (or the claim is
/// handed back).
pub type Permit = OwnedSemaphorePermit;

/// The budget of one relay. Shared by the claim loop, the sweeper and the
/// delivery tasks; nothing else.
#[derive(Debug)]
pub struct ClaimBudget {
    claims: Arc<Semaphore>,
    claim_budget: usize,
    recovery: Arc<Semaphore>,
    recovery_budget: usize,
    /// Claims waiting for a delivery slot.
    queued: AtomicUsize,
    /// Signalled when `queued` falls below `concurrency`: deliveries are
    /// about to run out of work, claim now.
    queue_low: Notify,
    /// Signalled whenever a delivery task finishes.
    task_done: Notify,
    concurrency: usize,
    batch_size: usize,
    /// When the retries and deferrals of this relay's deliveries come due.
    due: Due,
}

impl ClaimBudget {
    pub fn new(concurrency: usize, batch_size: usize) -> ClaimBudget {
        let claim_budget = concurrency + 3 * batch_size;
        let recovery_budget = (batch_size / 4).max(1);
        ClaimBudget {
            claims: Arc::new(Semaphore::new(claim_budget)),
            claim_budget,
            recovery: Arc::new(Semaphore::new(recovery_budget)),
            recovery_budget,
            queued: AtomicUsize::new(0),
            queue_low: Notify::new(),
            task_done: Notify::new(),
            concurrency,
            batch_size,
            due: Due::default(),
        }
    }

    /// When the retries and deferrals of this relay's deliveries come due:
    /// written by the delivery tasks, read by the claim loop.
    pub fn due(&self) -> &Due {
        &self.due
    }

    /// The most intents one claim takes.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Wait for one free claim permit (or `None` on stop), then take up to
    /// `max` without waiting.
    pub async fn take(&self, max: usize, stop: &mut watch::Receiver<bool>) -> Option<Vec<Permit>> {
        if *stop.borrow() {
            return None;
        }
        let first = tokio::select! {
            p = self.claims.clone().acquire_owned() => p.ok()?,
            _ = stop.wait_for(|s| *s) => return None,
        };
        let mut permits = vec![first];
        permits.extend(self.try_take(max.saturating_sub(1)));
        Some(permits)
    }

    /// Up to `max` free claim permits, without waiting.
    pub fn try_take(&self, max: usize) -> Vec<Permit> {
        take_now(&self.claims, max)
    }

    /// What the sweeper may take now: its own permits first, then free
    /// claim permits, up to one batch.
    pub fn take_for_recovery(&self) -> Vec<Permit> {
        let mut permits = take_now(&self.recovery, self.recovery_budget);
        permits.extend(self.try_take(self.batch_size.saturating_sub(permits.len())));
        permits
    }

    /// While a round of claimed work is queued for the delivery slots, let
    /// freed permits gather (a claim of many rows costs the database far
    /// less per row than a claim of few), until a batch is together, the
    /// queue runs low, or the stop.
    pub async fn gather(&self, permits: &mut Vec<Permit>, stop: &mut watch::Receiver<bool>) {
        while permits.len() < self.batch_size && self.queue_full() {
            tokio::select! {
                p = self.claims.clone().acquire_owned() => {
                    permits.extend(p.ok());
                    permits.extend(self.try_take(self.batch_size - permits.len()));
                }
                _ = self.queue_low.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// At least `concurrency` claims wait for a delivery slot: claim no more
    /// until the queue runs low, so at most `concurrency + batch_size` wait
    /// with their lease running.
    pub fn queue_full(&self) -> bool {
        self.queued.load(Ordering::SeqCst) >= self.concurrency
    }

    /// A claim starts waiting for a delivery slot.
    pub fn queue(&self) {
        self.queued.fetch_add(1, Ordering::SeqCst);
    }

    /// A claim stopped waiting for a slot (it got one, or was handed back).
    pub fn dequeue(&self) {
        if self.queued.fetch_sub(1, Ordering::SeqCst) <= self.concurrency {
            self.queue_low.notify_one();
        }
    }

    /// A delivery task finished (its permit is dropped by then).
    pub fn task_finished(&self) {
        self.task_done.notify_one();
    }

    /// Resolves when a delivery task finishes.
    pub async fn task_done(&self) {
        self.task_done.notified().await
    }

    /// No claim held by anyone (claim loop, sweeper, deliveries).
    pub fn idle(&self) -> bool {
        self.claims.available_permits() == self.claim_budget
            && self.recovery.available_permits() == self.recovery_budget
    }

    /// How many claims are still held.
    pub fn held(&self) -> usize {
        (self.claim_budget - self.claims.available_permits())
            + (self.recovery_budget - self.recovery.available_permits())
    }

    /// Resolves once every claim is back (all deliveries done and written).
    pub async fn all_back(&self) {
        let _ = self.claims.acquire_many(self.claim_budget as u32).await;
        let _ = self
            .recovery
            .acquire_many(self.recovery_budget as u32)
            .await;
    }
}

fn take_now(sem: &Arc<Semaphore>, max: usize) -> Vec<Permit> {
    let mut permits = Vec::new();
    while permits.len() < max {
        match sem.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
    permits
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_concurrency_plus_three_batches() {
        let b = ClaimBudget::new(4, 10);
        let (_tx, mut stop) = watch::channel(false);
        let first = b.take(10, &mut stop).await.unwrap();
        assert_eq!(first.len(), 10);
        let rest = b.try_take(1000);
        assert_eq!(rest.len(), 4 + 3 * 10 - 10);
        assert!(b.try_take(1).is_empty(), "the budget is spent");
        assert_eq!(b.held(), 34);
        // the sweeper still has its own
        assert_eq!(b.take_for_recovery().len(), 2);
        drop((first, rest));
        assert_eq!(b.held(), 0);
        assert!(b.idle());
    }

    #[tokio::test(start_paused = true)]
    async fn take_waits_for_a_permit_and_stops_on_the_signal() {
        let b = Arc::new(ClaimBudget::new(1, 1));
        let (tx, mut stop) = watch::channel(false);
        let all = b.try_take(100);
        assert_eq!(all.len(), 4);
        let waiter = {
            let b = b.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move { b.take(5, &mut stop).await.map(|p| p.len()) })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "no permit free yet");
        drop(all);
        assert_eq!(
            waiter.await.unwrap(),
            Some(4),
            "one waited for, the rest taken at once"
        );
        let _ = tx.send(true);
        assert!(b.take(1, &mut stop).await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_runs_full_at_concurrency_and_low_wakes_the_gatherer() {
        let b = Arc::new(ClaimBudget::new(2, 5));
        let (_tx, stop) = watch::channel(false);
        b.queue();
        b.queue();
        assert!(b.queue_full());
        // every permit but one is held by claims in progress
        let held = b.try_take(2 + 3 * 5 - 1);
        let permits = b.try_take(1);
        assert_eq!(permits.len(), 1);
        let gatherer = {
            let b = b.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut permits = permits;
                b.gather(&mut permits, &mut stop).await;
                permits.len()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!gatherer.is_finished(), "waits while the queue is full");
        // permits freed meanwhile are gathered, up to a batch
        drop(held);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(gatherer.is_finished(), "a whole batch is together");
        assert_eq!(gatherer.await.unwrap(), 5);

        // the queue running low ends the wait with what there is
        let held = b.try_take(100);
        let gatherer = {
            let b = b.clone();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                let mut permits = Vec::new();
                b.gather(&mut permits, &mut stop).await;
                permits.len()
            })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!gatherer.is_finished());
        b.dequeue();
        assert!(!b.queue_full());
        assert_eq!(gatherer.await.unwrap(), 0);
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn all_back_waits_for_every_claim() {
        let b = Arc::new(ClaimBudget::new(2, 2));
        let held = b.try_take(3);
        let recovering = b.take_for_recovery();
        let back = {
            let b = b.clone();
            tokio::spawn(async move { b.all_back().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!back.is_finished());
        drop(held);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!back.is_finished(), "the sweeper's claims are not back yet");
        drop(recovering);
        back.await.unwrap();
    }
}
