//! Room at a destination: the deliveries a provider lets be in flight to
//! one destination at once ([`outbox_providers::Provider::in_flight_limit`],
//! `webhook.max_in_flight_per_host`), waited for before a delivery takes
//! one of the relay's slots.
//!
//! A transaction that commits fifty intents for one receiver makes fifty
//! claims at once. Over the bound, a delivery queues here for a moment (a
//! fast receiver frees its room within milliseconds) instead of being
//! deferred to a later claim. A slow receiver's queue holds no delivery
//! slot and is bounded twice: at most as many deliveries wait as may be in
//! flight, or one claim's worth where that is more (the next one is
//! deferred at once, so a slow destination's backlog cannot take the
//! relay's claims from the others), and a wait lasts at most
//! [`PATIENCE`]. A deferral spends no attempt, as when the provider itself
//! defers.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_providers::InFlightLimit;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The longest a delivery waits for room before it is deferred.
pub const PATIENCE: Duration = Duration::from_secs(1);

/// Destinations kept beyond those with deliveries in flight.
const KEEP: usize = 4096;

/// Room per destination, shared by one relay's deliveries.
#[derive(Debug, Default)]
pub struct Rooms {
    by_destination: Mutex<HashMap<String, Arc<Room>>>,
    /// Deliveries that may wait at one destination however low its limit
    /// ([`Rooms::with_min_waiting`]); otherwise as many as may be in flight.
    min_waiting: usize,
}

/// One destination's room: its slots and how many deliveries wait for one.
#[derive(Debug)]
struct Room {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// Counts a delivery as waiting while it lives (a wait given up midway,
/// at the stop, included).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Rooms {
    /// Rooms where at least `n` deliveries may wait at one destination: a
    /// relay lets one claim's worth (`batch_size`) wait, so that a claim of
    /// many intents for one receiver is not mostly deferred the moment it
    /// arrives (each deferral is a write, and a claim again, for an intent
    /// the receiver would have taken within milliseconds). A slow
    /// destination still holds at most its limit and one claim's worth of
    /// the relay's claims, each for at most the patience.
    pub fn with_min_waiting(n: usize) -> Rooms {
        Rooms {
            min_waiting: n,
            ..Rooms::default()
        }
    }

    /// Room for one delivery under `limit`, waiting at most `patience`;
    /// `Err` with the reason a deferral gives when none came in time.
    pub async fn enter(
        &self,
        limit: &InFlightLimit,
        patience: Duration,
    ) -> Result<OwnedSemaphorePermit, String> {
        let room = self.room(limit);
        if let Ok(permit) = room.slots.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let busy = |waited: &str| {
            format!(
                "{} deliveries to {} already in flight ({}){waited}",
                limit.limit, limit.destination, limit.setting
            )
        };
        let may_wait = limit.limit.max(self.min_waiting).max(1);
        if room.waiting.fetch_add(1, Ordering::SeqCst) >= may_wait {
            room.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(busy(&if may_wait == limit.limit {
                " and as many waiting".to_string()
            } else {
                format!(" and {may_wait} waiting")
            }));
        }
        let _waiting = Waiting(&room.waiting);
        match tokio::time::timeout(patience, room.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(busy(&format!(" for {patience:?}"))),
        }
    }

    fn room(&self, limit: &InFlightLimit) -> Arc<Room> {
        let mut rooms = self
            .by_destination
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if rooms.len() > KEEP {
            // forget destinations with nothing in flight, so the map stays
            // bounded (a destination's limit is its provider's, the same
            // for every delivery, so forgetting loses no count)
            rooms.retain(|_, room| {
                Arc::strong_count(room) > 1 || Arc::strong_count(&room.slots) > 1
            });
        }
        if let Some(room) = rooms.get(&limit.destination) {
            return room.clone();
        }
        rooms
            .entry(limit.destination.clone())
            .or_insert_with(|| {
                Arc::new(Room {
                    slots: Arc::new(Semaphore::new(limit.limit.max(1))),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(destination: &str, n: usize) -> InFlightLimit {
        InFlightLimit {
            destination: destination.into(),
            limit: n,
            setting: "webhook.max_in_flight_per_host",
        }
    }

    #[tokio::test]
    async fn a_delivery_over_the_limit_waits_for_room_then_gets_it() {
        let rooms = Arc::new(Rooms::default());
        let a = limit("http://a:80", 2);
        let first = rooms.enter(&a, PATIENCE).await.unwrap();
        let _second = rooms.enter(&a, PATIENCE).await.unwrap();
        let waiting = tokio::spawn({
            let rooms = rooms.clone();
            let a = a.clone();
            async move { rooms.enter(&a, Duration::from_secs(30)).await.is_ok() }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the third waits while two are in flight"
        );
        // another destination has room of its own
        assert!(rooms
            .enter(&limit("http://b:80", 2), Duration::ZERO)
            .await
            .is_ok());
        drop(first);
        assert!(waiting.await.unwrap(), "room freed is handed to the waiter");
    }

    #[tokio::test]
    async fn no_more_wait_than_may_be_in_flight_the_next_is_deferred_at_once() {
        let rooms = Arc::new(Rooms::default());
        let a = limit("http://slow:80", 2);
        let _in_flight = (
            rooms.enter(&a, PATIENCE).await.unwrap(),
            rooms.enter(&a, PATIENCE).await.unwrap(),
        );
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (rooms, a) = (rooms.clone(), a.clone());
                tokio::spawn(async move { rooms.enter(&a, Duration::from_secs(30)).await.is_ok() })
            })
            .collect();
        while rooms.room(&a).waiting.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let started = std::time::Instant::now();
        let err = rooms.enter(&a, Duration::from_secs(30)).await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "deferred at once"
        );
        assert!(err.contains("as many waiting"), "{err}");
        for w in waiters {
            w.abort();
        }
    }

    #[tokio::test]
    async fn a_wait_given_up_is_no_longer_counted() {
        let rooms = Rooms::default();
        let a = limit("http://a:80", 1);
        let _held = rooms.enter(&a, PATIENCE).await.unwrap();
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            rooms.enter(&a, Duration::from_secs(30)),
        )
        .await;
        assert!(gave_up.is_err());
        assert_eq!(rooms.room(&a).waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn no_room_within_the_patience_is_a_deferral_naming_the_setting() {
        let rooms = Rooms::default();
        let a = limit("http://a:80", 1);
        let _held = rooms.enter(&a, PATIENCE).await.unwrap();
        let err = rooms
            .enter(&a, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(
            err.contains("http://a:80") && err.contains("webhook.max_in_flight_per_host"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn idle_destinations_are_forgotten_past_the_bound() {
        let rooms = Rooms::default();
        for n in 0..=KEEP + 1 {
            drop(
                rooms
                    .enter(&limit(&format!("http://h{n}:80"), 1), PATIENCE)
                    .await,
            );
        }
        // the last of those found more than KEEP and forgot them all
        assert_eq!(rooms.by_destination.lock().unwrap().len(), 1);
        let held = rooms.enter(&limit("http://busy:80", 1), PATIENCE).await;
        for n in 0..KEEP {
            drop(
                rooms
                    .enter(&limit(&format!("http://g{n}:80"), 1), PATIENCE)
                    .await,
            );
        }
        // forgetting again keeps the destination with a delivery in flight
        let kept = rooms.by_destination.lock().unwrap();
        assert!(
            kept.contains_key("http://busy:80") && kept.len() == 2,
            "{}",
            kept.len()
        );
        drop(kept);
        drop(held);
    }
}
