//! Scheduled intents: each tick of a `[[schedule]]` becomes one intent with
//! the key `schedule:<name>:<RFC 3339 tick in UTC>`.
//!
//! Any number of relays evaluate the same schedules with no leader: the key
//! makes a tick one intent, and relays take turns on the schedule's row, so a
//! tick is normally enqueued once rather than once per relay; a relay that
//! finds the row taken tries again for up to half a second. After downtime
//! at most `catch_up` missed ticks (the most recent) are enqueued; a new
//! schedule starts from now.
//!
//! Relays may disagree about a schedule (a rolling deploy that changes its
//! cron or payload). Each records its configuration's fingerprint beside
//! the watermark; the configuration that appeared most recently among those
//! still evaluated wins and alone moves the watermark, so none of its ticks
//! is skipped; relays with another configuration stand aside without
//! locking the schedule's row, enqueue nothing for it, and say so (a warning naming both configurations, the
//! gauges `outbox_schedule_configurations` and
//! `outbox_schedule_standing_aside`).

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use tokio::sync::watch;

use crate::config::Schedule;
use crate::store::schedules::{Evaluation, ScheduleConfig, Turn};
use crate::store::{NewIntent, Store};

impl Schedule {
    /// `schedule:<name>:<tick>`, the tick as RFC 3339 UTC with seconds.
    pub fn key(&self, tick: DateTime<Utc>) -> String {
        format!(
            "schedule:{}:{}",
            self.name,
            tick.format("%Y-%m-%dT%H:%M:%SZ")
        )
    }

    /// The ticks to enqueue at `now` after `watermark` (the last tick
    /// enqueued), and the new watermark. Pure.
    pub fn due(
        &self,
        watermark: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> (Vec<DateTime<Utc>>, DateTime<Utc>) {
        let anchor = now.trunc_subsecs(0) + chrono::Duration::seconds(1);
        let mut past = self.cron.after(&anchor).rev();
        let Some(watermark) = watermark else {
            // a schedule seen for the first time starts from now
            return (
                Vec::new(),
                past.next().unwrap_or(now).max(now.trunc_subsecs(0)),
            );
        };
        let mut ticks: Vec<DateTime<Utc>> = past
            .take_while(|t| *t > watermark)
            .take(self.catch_up)
            .collect();
        ticks.reverse();
        let new_watermark = ticks.last().copied().unwrap_or(watermark).max(watermark);
        (ticks, new_watermark)
    }

    /// What relays must agree on for a schedule to be one, readably: the
    /// cron, kind, destination, catch_up and a digest of the payload.
    pub fn definition(&self) -> String {
        use sha2::{Digest, Sha256};
        let payload = Sha256::digest(self.payload.to_string().as_bytes());
        format!(
            "cron {:?}, kind {}, destination {}, catch_up {}, payload sha256:{}",
            self.expression,
            self.kind,
            self.destination.as_deref().unwrap_or("-"),
            self.catch_up,
            &hex::encode(payload)[..12]
        )
    }

    /// A short hash of [`Schedule::definition`]: equal for relays that
    /// agree about the schedule.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(self.definition().as_bytes()))[..16].to_string()
    }

    /// The next `n` fire times after `now`.
    pub fn upcoming(&self, now: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        self.cron.after(&now).take(n).collect()
    }

    fn intent(&self, tick: DateTime<Utc>) -> NewIntent {
        NewIntent {
            destination: self.destination.clone(),
            source: Some("schedule".into()),
            ..NewIntent::new(self.key(tick), self.kind.clone(), self.payload.clone())
        }
    }
}

/// How long a relay keeps trying a schedule whose row another relay holds
/// (within the second between evaluations), and how often.
const BUSY_RETRY_FOR: Duration = Duration::from_millis(500);
const BUSY_RETRY_EVERY: Duration = Duration::from_millis(20);

/// One relay's schedules, evaluated together, and what it last said about
/// relays that disagree with it.
pub struct Scheduler {
    store: Store,
    relay: String,
    schedules: Vec<Schedule>,
    /// Per schedule, the disagreement last logged ("" when none).
    reported: HashMap<String, String>,
}

impl Scheduler {
    pub fn new(store: Store, relay: &str, schedules: Vec<Schedule>) -> Scheduler {
        Scheduler {
            store,
            relay: relay.to_string(),
            schedules,
            reported: HashMap::new(),
        }
    }

    /// Evaluate every schedule once at `now`; how many intents were
    /// enqueued, and each schedule's turn (None when it could not be
    /// evaluated).
    pub async fn tick(&mut self, now: DateTime<Utc>) -> (usize, Vec<Option<Turn>>) {
        let mut enqueued = 0;
        let mut turns = Vec::with_capacity(self.schedules.len());
        for s in &self.schedules {
            let (fingerprint, definition) = (s.fingerprint(), s.definition());
            let at = Evaluation {
                name: &s.name,
                fingerprint: &fingerprint,
                definition: &definition,
                relay: &self.relay,
                now,
            };
            // another relay of the winning configuration holds the row for
            // a moment: try again, so that no tick waits for the next second
            let started = std::time::Instant::now();
            let turn = loop {
                let turn = self
                    .store
                    .fire_schedule(at, |watermark| {
                        let (ticks, new_watermark) = s.due(watermark, now);
                        (
                            ticks.into_iter().map(|t| s.intent(t)).collect(),
                            new_watermark,
                        )
                    })
                    .await;
                if !matches!(turn, Ok(Turn::Busy)) || started.elapsed() >= BUSY_RETRY_FOR {
                    break turn;
                }
                tokio::time::sleep(BUSY_RETRY_EVERY).await;
            };
            match &turn {
                Ok(Turn::Fired { enqueued: n, live }) => {
                    if *n > 0 {
                        tracing::info!(schedule = %s.name, n, "schedule fired");
                    }
                    enqueued += n;
                    report(&mut self.reported, s, &fingerprint, live);
                }
                Ok(Turn::StoodAside { live }) => {
                    report(&mut self.reported, s, &fingerprint, live);
                }
                Ok(Turn::Busy) => tracing::debug!(
                    schedule = %s.name,
                    "another relay held the schedule throughout; its next evaluation catches up"
                ),
                Err(err) => {
                    tracing::warn!(schedule = %s.name, error = %err, "schedule could not fire; will try again")
                }
            }
            turns.push(turn.ok());
        }
        (enqueued, turns)
    }
}

/// Say, once per change, that relays disagree about schedule `s` and which
/// configuration wins; keep the gauges current.
fn report(
    reported: &mut HashMap<String, String>,
    s: &Schedule,
    mine: &str,
    live: &[ScheduleConfig],
) {
    let standing_aside = live.first().is_some_and(|w| w.fingerprint != mine);
    metrics::gauge!("outbox_schedule_configurations", "schedule" => s.name.clone())
        .set(live.len().max(1) as f64);
    metrics::gauge!("outbox_schedule_standing_aside", "schedule" => s.name.clone())
        .set(if standing_aside { 1.0 } else { 0.0 });
    let others: Vec<&ScheduleConfig> = live.iter().filter(|c| c.fingerprint != mine).collect();
    let said = reported.entry(s.name.clone()).or_default();
    let now_saying = others
        .iter()
        .map(|c| c.fingerprint.as_str())
        .collect::<Vec<_>>()
        .join(",");
    if *said == now_saying {
        return;
    }
    *said = now_saying;
    let describe = |c: &ScheduleConfig| {
        format!(
            "{} [{}] (relay {})",
            c.definition,
            c.fingerprint,
            c.seen_by.as_deref().unwrap_or("?")
        )
    };
    let this = format!("{} [{mine}]", s.definition());
    match (standing_aside, others.is_empty()) {
        (_, true) => tracing::info!(
            schedule = %s.name,
            "relays agree about the schedule again: {this}"
        ),
        (true, false) => tracing::warn!(
            schedule = %s.name,
            "relays disagree about this schedule; the newer configuration wins and this relay \
             enqueues none of its ticks. Winning: {}. This relay's: {this}",
            describe(others[0])
        ),
        (false, false) => tracing::warn!(
            schedule = %s.name,
            "relays disagree about this schedule; this relay's configuration, the newer, wins \
             and alone enqueues its ticks. Winning: {this}. Standing aside: {}",
            others
                .iter()
                .map(|c| describe(c))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// Evaluate the schedules at every second boundary until `stop`.
pub async fn run(
    store: Store,
    relay: String,
    schedules: Vec<Schedule>,
    mut stop: watch::Receiver<bool>,
) {
    if schedules.is_empty() {
        // nothing to do, but a supervised task runs until the stop
        let _ = stop.wait_for(|s| *s).await;
        return;
    }
    let mut scheduler = Scheduler::new(store, &relay, schedules);
    loop {
        scheduler.tick(Utc::now()).await;
        let now = Utc::now();
        let next_second = now.trunc_subsecs(0) + chrono::Duration::seconds(1);
        let wait = (next_second - now)
            .to_std()
            .unwrap_or(Duration::from_millis(100))
            + Duration::from_millis(5);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ScheduleEntry;
    use chrono::TimeZone;

    fn every(expr: &str, catch_up: u32) -> Schedule {
        Schedule::from_entry(&ScheduleEntry {
            name: "t".into(),
            cron: expr.into(),
            kind: "webhook".into(),
            destination: None,
            payload: serde_json::json!({}),
            catch_up,
        })
        .unwrap()
    }

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, h, m, s).unwrap()
    }

    #[test]
    fn keys_name_the_tick_in_utc() {
        assert_eq!(
            every("0 0 9 * * *", 1).key(at(9, 0, 0)),
            "schedule:t:2026-01-01T09:00:00Z"
        );
    }

    #[test]
    fn a_new_schedule_starts_from_now() {
        let s = every("0 * * * * *", 1);
        let (ticks, w) = s.due(None, at(10, 0, 30));
        assert!(ticks.is_empty());
        assert_eq!(w, at(10, 0, 30));
    }

    #[test]
    fn each_tick_fires_once_in_order() {
        let s = every("* * * * * *", 5);
        let (ticks, w) = s.due(Some(at(10, 0, 0)), at(10, 0, 3));
        assert_eq!(ticks, [at(10, 0, 1), at(10, 0, 2), at(10, 0, 3)]);
        assert_eq!(w, at(10, 0, 3));
        let (again, w2) = s.due(Some(w), at(10, 0, 3));
        assert!(again.is_empty());
        assert_eq!(w2, w);
    }

    #[test]
    fn catch_up_is_bounded_to_the_most_recent_ticks() {
        let hourly = every("0 0 * * * *", 1);
        let (ticks, w) = hourly.due(Some(at(1, 0, 0)), at(9, 30, 0));
        assert_eq!(ticks, [at(9, 0, 0)], "only the most recent missed tick");
        assert_eq!(w, at(9, 0, 0));
        let three = every("0 0 * * * *", 3);
        let (ticks, _) = three.due(Some(at(1, 0, 0)), at(9, 30, 0));
        assert_eq!(ticks, [at(7, 0, 0), at(8, 0, 0), at(9, 0, 0)]);
        // a year of per-second downtime is not iterated
        let secondly = every("* * * * * *", 2);
        let (ticks, _) = secondly.due(Some(at(0, 0, 0) - chrono::Duration::days(365)), at(9, 0, 0));
        assert_eq!(ticks, [at(8, 59, 59), at(9, 0, 0)]);
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let entry = |name: &str, cron: &str| ScheduleEntry {
            name: name.into(),
            cron: cron.into(),
            kind: "email".into(),
            destination: None,
            payload: serde_json::json!({}),
            catch_up: 1,
        };
        assert!(Schedule::from_entry(&entry("ok", "0 0 9 * * *")).is_ok());
        assert!(Schedule::from_entry(&entry("bad name!", "0 0 9 * * *"))
            .unwrap_err()
            .contains("name"));
        assert!(Schedule::from_entry(&entry("x", "every day"))
            .unwrap_err()
            .contains("invalid"));
        assert!(Schedule::from_entry(&entry("x", "0 0 9 31 2 * 2020"))
            .unwrap_err()
            .contains("never fires"));
    }
}
