//! Room at a destination: the deliveries a provider lets be in flight to
//! one destination at once ([`outbox_providers::Provider::in_flight_limit`],
//! `webhook.max_in_flight_per_host`), waited for before a delivery takes
//! one of the relay's slots.
//!
//! A transaction that commits fifty intents for one receiver makes fifty
//! claims at once. Over the bound, a delivery queues here for a moment (a
//! fast receiver frees its room within milliseconds) instead of being
//! deferred to a later claim. A slow receiver's queue holds no delivery
//! slot and is bounded twice: as many deliveries may wait as may be in
//! flight, or one claim's worth where that is more, and one more only
//! while room there is handed on at least every [`OVER_BOUND_PATIENCE`]
//! (the claim loop runs up to three claims ahead of the slots, which a
//! fast receiver takes within milliseconds; at a slow one the next is
//! deferred soon, so its backlog cannot take the relay's claims from the
//! others); and a wait lasts at most [`PATIENCE`]. A deferral spends no
//! attempt, as when the provider itself defers.
//!
//! A destination where a delivery waited the whole patience for room is
//! *congested*: it cannot take more than its limit per patience, so its
//! backlog would otherwise be claimed and deferred over and over, ahead
//! of every other destination's intents. Until it has gone
//! [`CONGESTION_MEMORY`] without a deferral, its intents are set aside:
//! a deferral, and a claim of the log that meets its intents (see
//! [`Rooms::aside`]), gives each a turn at most its limit per second, so
//! they come due no faster than it can take them and the claims reach
//! the other destinations' intents behind them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_providers::InFlightLimit;

pub use crate::store::Aside;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The longest a delivery waits for room before it is deferred.
pub const PATIENCE: Duration = Duration::from_secs(1);

/// Destinations kept beyond those with deliveries in flight.
const KEEP: usize = 4096;

/// How long a destination stays congested after its last deferral.
pub const CONGESTION_MEMORY: Duration = Duration::from_secs(10);

/// A delivery that finds as many waiting as may wait still waits while
/// the destination hands out room at least once per this long: behind a
/// fast receiver's queue room comes within milliseconds (a deferral would
/// cost a write, and a claim again, for an intent the receiver takes at
/// once), while at a slow one it is deferred after this long and its
/// claim is not held from the other destinations.
pub const OVER_BOUND_PATIENCE: Duration = Duration::from_millis(100);

/// The soonest a deferred delivery is tried again.
pub const NO_ROOM_RETRY: Duration = Duration::from_millis(500);

/// Names of one destination as `outbox.destination_of` gives them (a named
/// endpoint and the URLs of its origin share a room) kept per room.
const NAMES_KEPT: usize = 8;

/// Room per destination, shared by one relay's deliveries.
#[derive(Debug, Default)]
pub struct Rooms {
    by_destination: Mutex<HashMap<String, Arc<Room>>>,
    /// Deliveries that may wait at one destination however low its limit
    /// ([`Rooms::with_min_waiting`]); otherwise as many as may be in flight.
    min_waiting: usize,
    /// The rooms that turned congested (those no longer so are dropped
    /// when next read): what a claim reads, not every room.
    congested: Mutex<Vec<Arc<Room>>>,
}

/// One destination's room: its slots, how many deliveries wait for one,
/// and its congestion.
#[derive(Debug)]
struct Room {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Room handed out so far: whether the queue moves.
    handed: AtomicU64,
    /// One turn per `1 / limit` seconds, for the deliveries it defers.
    turn: Duration,
    congestion: Mutex<Option<Congestion>>,
}

/// A congested destination's deferrals: when it last deferred, the turn
/// after the last one given, and its names in the database.
#[derive(Debug)]
struct Congestion {
    last: Instant,
    horizon: Instant,
    names: Vec<String>,
}

impl Room {
    fn congestion(&self) -> std::sync::MutexGuard<'_, Option<Congestion>> {
        self.congestion.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Note a deferral (`waited`: after the whole patience, which makes the
    /// destination congested; otherwise it only keeps it so) of an intent
    /// the database names `name()`; the delay of its next try, and whether
    /// the destination turned congested with it.
    fn defer(&self, waited: bool, name: impl FnOnce() -> Option<String>) -> (Duration, bool) {
        let now = Instant::now();
        let mut congestion = self.congestion();
        let live = congestion
            .as_ref()
            .is_some_and(|c| c.last.elapsed() < CONGESTION_MEMORY);
        if !live && !waited {
            return (NO_ROOM_RETRY, false);
        }
        let c = congestion.get_or_insert_with(|| Congestion {
            last: now,
            horizon: now,
            names: Vec::new(),
        });
        if !live {
            c.horizon = now;
            c.names.clear();
        }
        c.last = now;
        if c.names.len() < NAMES_KEPT {
            if let Some(name) = name() {
                if !c.names.contains(&name) {
                    c.names.push(name);
                }
            }
        }
        let due = c.horizon.max(now + NO_ROOM_RETRY);
        c.horizon = due + self.turn;
        (due - now, !live)
    }

    /// Give `n` turns from the next.
    fn turns(&self, n: u64) {
        let now = Instant::now();
        if let Some(c) = self.congestion().as_mut() {
            let due = c.horizon.max(now + NO_ROOM_RETRY);
            c.horizon = due + self.turn * n.min(u32::MAX as u64) as u32;
        }
    }

    /// Wait in the room's queue for at most `patience` and, with `stall`,
    /// only while room is handed out at least once per `stall` (over the
    /// bound, [`OVER_BOUND_PATIENCE`]). `Err(true)` when the patience ran
    /// out, `Err(false)` when the queue stood still first.
    async fn wait(
        &self,
        patience: Duration,
        stall: Option<Duration>,
    ) -> Result<OwnedSemaphorePermit, bool> {
        let deadline = tokio::time::Instant::now() + patience;
        // one acquire for the whole wait: its place in the queue is kept
        let acquire = self.slots.clone().acquire_owned();
        tokio::pin!(acquire);
        let mut seen = self.handed.load(Ordering::Relaxed);
        loop {
            let tick = stall.map_or(deadline, |s| {
                (tokio::time::Instant::now() + s).min(deadline)
            });
            tokio::select! {
                biased;
                permit = &mut acquire => {
                    let permit = permit.map_err(|_| true)?;
                    self.handed.fetch_add(1, Ordering::Relaxed);
                    return Ok(permit);
                }
                _ = tokio::time::sleep_until(tick) => {
                    if tick >= deadline {
                        return Err(true);
                    }
                    let now = self.handed.load(Ordering::Relaxed);
                    if now == seen {
                        return Err(false);
                    }
                    seen = now;
                }
            }
        }
    }

    fn congested(&self) -> bool {
        self.congestion()
            .as_ref()
            .is_some_and(|c| c.last.elapsed() < CONGESTION_MEMORY)
    }
}

/// Why a delivery found no room, and when to try it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoRoom {
    pub reason: String,
    pub retry_after: Duration,
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
    /// the receiver would have taken within milliseconds). A destination
    /// whose queue stands still holds at most its limit and one claim's
    /// worth of the relay's claims, each for at most the patience; more
    /// wait only while its queue moves ([`OVER_BOUND_PATIENCE`]).
    pub fn with_min_waiting(n: usize) -> Rooms {
        Rooms {
            min_waiting: n,
            ..Rooms::default()
        }
    }

    /// Room for one delivery under `limit`, waiting at most `patience`;
    /// `Err` with the reason a deferral gives when none came in time, and
    /// its delay. `name`: the intent's destination as the database names
    /// it, set aside by the claims while the destination is congested
    /// (asked for only at a deferral).
    pub async fn enter(
        &self,
        limit: &InFlightLimit,
        patience: Duration,
        name: impl FnOnce() -> Option<String>,
    ) -> Result<OwnedSemaphorePermit, NoRoom> {
        let room = self.room(limit);
        if let Ok(permit) = room.slots.clone().try_acquire_owned() {
            room.handed.fetch_add(1, Ordering::Relaxed);
            return Ok(permit);
        }
        let busy = |waited: &str| {
            format!(
                "{} deliveries to {} already in flight ({}){waited}",
                limit.limit, limit.destination, limit.setting
            )
        };
        let may_wait = limit.limit.max(self.min_waiting).max(1);
        let over = room.waiting.fetch_add(1, Ordering::SeqCst) >= may_wait;
        let _waiting = Waiting(&room.waiting);
        let stall = over.then_some(OVER_BOUND_PATIENCE);
        room.wait(patience, stall).await.map_err(|whole| NoRoom {
            reason: busy(&if !over {
                format!(" for {patience:?}")
            } else if may_wait == limit.limit {
                " and as many waiting".to_string()
            } else {
                format!(" and {may_wait} waiting")
            }),
            // a wait as long as the patience makes the destination
            // congested; one cut short by the lease, or by a queue that
            // stood still, says nothing of the room
            retry_after: self.defer(&room, whole && patience >= PATIENCE, name),
        })
    }

    /// A deferral at `room` (see [`Room::defer`]): its delay.
    fn defer(
        &self,
        room: &Arc<Room>,
        waited: bool,
        name: impl FnOnce() -> Option<String>,
    ) -> Duration {
        let (delay, turned) = room.defer(waited, name);
        if turned {
            // (a room congested again before any read dropped it is there)
            let mut rooms = self.congested_rooms();
            if !rooms.iter().any(|r| Arc::ptr_eq(r, room)) {
                rooms.push(room.clone());
            }
        }
        delay
    }

    /// The congested rooms, those no longer so dropped.
    fn congested_rooms(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Room>>> {
        let mut rooms = self.congested.lock().unwrap_or_else(|p| p.into_inner());
        rooms.retain(|r| r.congested());
        rooms
    }

    /// The congested destinations, by their names in the database, with
    /// their next turns: what a claim of the log sets aside.
    pub fn aside(&self) -> Aside {
        let now = Instant::now();
        let mut aside = Aside::default();
        for room in self.congested_rooms().iter() {
            let congestion = room.congestion();
            let Some(c) = congestion.as_ref() else {
                continue;
            };
            let first = c.horizon.max(now + NO_ROOM_RETRY) - now;
            for name in &c.names {
                aside.names.push(name.clone());
                aside.first_ms.push(first.as_secs_f64() * 1000.0);
                aside.turn_ms.push(room.turn.as_secs_f64() * 1000.0);
            }
        }
        aside
    }

    /// A claim set `n` intents named `name` aside: their turns are given.
    pub fn set_aside(&self, name: &str, n: u64) {
        let rooms = self.congested_rooms();
        let named = rooms.iter().find(|r| {
            r.congestion()
                .as_ref()
                .is_some_and(|c| c.names.iter().any(|x| x == name))
        });
        if let Some(room) = named {
            room.turns(n);
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
                Arc::strong_count(room) > 1
                    || Arc::strong_count(&room.slots) > 1
                    || room.congested()
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
                    handed: AtomicU64::new(0),
                    turn: Duration::from_secs(1) / limit.limit.clamp(1, u32::MAX as usize) as u32,
                    congestion: Mutex::new(None),
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
        let first = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let _second = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let waiting = tokio::spawn({
            let rooms = rooms.clone();
            let a = a.clone();
            async move {
                rooms
                    .enter(&a, Duration::from_secs(30), || None)
                    .await
                    .is_ok()
            }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the third waits while two are in flight"
        );
        // another destination has room of its own
        assert!(rooms
            .enter(&limit("http://b:80", 2), Duration::ZERO, || None)
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
            rooms.enter(&a, PATIENCE, || None).await.unwrap(),
            rooms.enter(&a, PATIENCE, || None).await.unwrap(),
        );
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let (rooms, a) = (rooms.clone(), a.clone());
                tokio::spawn(async move {
                    rooms
                        .enter(&a, Duration::from_secs(30), || None)
                        .await
                        .is_ok()
                })
            })
            .collect();
        while rooms.room(&a).waiting.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let started = std::time::Instant::now();
        let err = rooms
            .enter(&a, Duration::from_secs(30), || None)
            .await
            .unwrap_err()
            .reason;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "deferred at once"
        );
        assert!(err.contains("as many waiting"), "{err}");
        for w in waiters {
            w.abort();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn over_the_bound_a_delivery_waits_while_the_queue_moves() {
        let rooms = Arc::new(Rooms::default());
        let a = limit("http://fast:80", 1);
        let held = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let enter = |rooms: Arc<Rooms>, a: InFlightLimit| {
            tokio::spawn(async move { rooms.enter(&a, Duration::from_secs(30), || None).await })
        };
        let waiter = enter(rooms.clone(), a.clone());
        while rooms.room(&a).waiting.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        // as many wait as may: this one is over the bound
        let over = enter(rooms.clone(), a.clone());
        while rooms.room(&a).waiting.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let started = tokio::time::Instant::now();
        // room is handed on within each OVER_BOUND_PATIENCE, twice
        tokio::time::sleep(OVER_BOUND_PATIENCE / 2).await;
        drop(held);
        let second = waiter
            .await
            .unwrap()
            .expect("the waiter within the bound gets room");
        tokio::time::sleep(OVER_BOUND_PATIENCE * 3 / 4).await;
        drop(second);
        assert!(
            over.await.unwrap().is_ok(),
            "the delivery over the bound got room while the queue moved"
        );
        assert!(
            started.elapsed() > OVER_BOUND_PATIENCE,
            "it waited past one tick"
        );
    }

    #[tokio::test]
    async fn a_wait_given_up_is_no_longer_counted() {
        let rooms = Rooms::default();
        let a = limit("http://a:80", 1);
        let _held = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            rooms.enter(&a, Duration::from_secs(30), || None),
        )
        .await;
        assert!(gave_up.is_err());
        assert_eq!(rooms.room(&a).waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn no_room_within_the_patience_is_a_deferral_naming_the_setting() {
        let rooms = Rooms::default();
        let a = limit("http://a:80", 1);
        let _held = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let err = rooms
            .enter(&a, Duration::from_millis(20), || None)
            .await
            .unwrap_err()
            .reason;
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
                    .enter(&limit(&format!("http://h{n}:80"), 1), PATIENCE, || None)
                    .await,
            );
        }
        // the last of those found more than KEEP and forgot them all
        assert_eq!(rooms.by_destination.lock().unwrap().len(), 1);
        let held = rooms
            .enter(&limit("http://busy:80", 1), PATIENCE, || None)
            .await;
        for n in 0..KEEP {
            drop(
                rooms
                    .enter(&limit(&format!("http://g{n}:80"), 1), PATIENCE, || None)
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

    #[tokio::test]
    async fn a_destination_that_kept_a_delivery_waiting_its_patience_is_set_aside() {
        let rooms = Rooms::default();
        let a = limit("sub_slow0000", 4);
        let _held: Vec<_> = futures_util::future::join_all(
            (0..4).map(|_| rooms.enter(&a, PATIENCE, || Some("sub_slow0000".into()))),
        )
        .await;
        assert!(
            rooms.aside().is_empty(),
            "a full room alone is no congestion"
        );
        let first = rooms
            .enter(&a, PATIENCE, || Some("sub_slow0000".into()))
            .await
            .unwrap_err();
        assert!(first.retry_after >= NO_ROOM_RETRY, "{first:?}");
        let aside = rooms.aside();
        assert_eq!(aside.names, ["sub_slow0000"]);
        assert_eq!(aside.turn_ms, [250.0], "four a second");
        // the next deferral's turn comes one turn later, and turns given
        // to a claim's intents push the following ones back
        let second = rooms
            .enter(&a, Duration::ZERO, || Some("sub_slow0000".into()))
            .await
            .unwrap_err();
        assert!(
            second.retry_after >= first.retry_after + Duration::from_millis(200),
            "{first:?} then {second:?}"
        );
        let before = rooms.aside().first_ms[0];
        rooms.set_aside("sub_slow0000", 40);
        let after = rooms.aside().first_ms[0];
        assert!(after - before >= 9_900.0, "{before} then {after}");
    }

    #[tokio::test]
    async fn deferrals_at_once_of_an_uncongested_destination_set_nothing_aside() {
        let rooms = Arc::new(Rooms::default());
        let a = limit("http://busy:80", 1);
        let _held = rooms.enter(&a, PATIENCE, || None).await.unwrap();
        let waiter = tokio::spawn({
            let (rooms, a) = (rooms.clone(), a.clone());
            async move {
                rooms
                    .enter(&a, Duration::from_secs(30), || None)
                    .await
                    .is_ok()
            }
        });
        while rooms.room(&a).waiting.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
        let at_once = rooms
            .enter(&a, Duration::from_secs(30), || Some("http://busy".into()))
            .await
            .unwrap_err();
        assert_eq!(at_once.retry_after, NO_ROOM_RETRY);
        assert!(rooms.aside().is_empty());
        waiter.abort();
    }
}
