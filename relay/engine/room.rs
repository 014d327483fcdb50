//! Room at a destination: the deliveries a provider lets be in flight to
//! one destination at once ([`outbox_providers::Provider::in_flight_limit`],
//! `webhook.max_in_flight_per_host`), waited for before a delivery takes
//! one of the relay's slots.
//!
//! A transaction that commits fifty intents for one receiver makes fifty
//! claims at once. Over the bound, a delivery queues here for a moment (a
//! fast receiver frees its room within milliseconds) instead of being
//! deferred to a later claim. A slow receiver's queue holds no delivery
//! slot, and a wait is bounded by [`PATIENCE`]: past it the delivery is
//! deferred, no attempt spent, as the provider itself would defer it.

use std::collections::HashMap;
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
    by_destination: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Rooms {
    /// Room for one delivery under `limit`, waiting at most `patience`;
    /// `Err` with the reason a deferral gives when none came in time.
    pub async fn enter(
        &self,
        limit: &InFlightLimit,
        patience: Duration,
    ) -> Result<OwnedSemaphorePermit, String> {
        let room = self.room(limit);
        let waited = match room.clone().try_acquire_owned() {
            Ok(permit) => return Ok(permit),
            Err(_) => tokio::time::timeout(patience, room.acquire_owned()).await,
        };
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(format!(
                "{} deliveries to {} already in flight ({}) for {patience:?}",
                limit.limit, limit.destination, limit.setting
            )),
        }
    }

    fn room(&self, limit: &InFlightLimit) -> Arc<Semaphore> {
        let mut rooms = self
            .by_destination
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if rooms.len() > KEEP {
            // forget destinations with nothing in flight, so the map stays
            // bounded (a destination's limit is its provider's, the same
            // for every delivery, so forgetting loses no count)
            rooms.retain(|_, room| Arc::strong_count(room) > 1);
        }
        rooms
            .entry(limit.destination.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(limit.limit.max(1))))
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
