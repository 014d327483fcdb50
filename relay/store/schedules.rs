//! Schedule watermarks (which tick of each schedule was enqueued last) and
//! the configurations the relays run for each schedule.

use chrono::{DateTime, Utc};

use super::{enqueue, NewIntent, Store, StoreError};

/// A configuration is live while some relay evaluated it this recently;
/// one gone longer that reappears counts as new (a rollback wins again).
pub const LIVE_FOR: std::time::Duration = std::time::Duration::from_secs(15);

/// Configurations not evaluated for this long are forgotten.
const FORGET_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// One configuration of a schedule, as the relays recorded it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ScheduleConfig {
    pub fingerprint: String,
    /// Cron, kind, destination, catch_up and a digest of the payload.
    pub definition: String,
    /// The relay that evaluated it last.
    pub seen_by: Option<String>,
    pub first_seen: DateTime<Utc>,
}

/// What one evaluation of a schedule did.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    /// Another relay was evaluating the schedule: nothing done (the
    /// scheduler tries again within the second).
    Busy,
    /// This relay's configuration wins: it enqueued `enqueued` ticks.
    /// `live` holds every configuration relays run, the winner first.
    Fired {
        enqueued: usize,
        live: Vec<ScheduleConfig>,
    },
    /// Another configuration, the newer, wins (the first of `live`): this
    /// relay enqueued nothing and left the watermark alone.
    StoodAside { live: Vec<ScheduleConfig> },
}

/// This relay's configuration of one schedule.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation<'a> {
    pub name: &'a str,
    pub fingerprint: &'a str,
    pub definition: &'a str,
    pub relay: &'a str,
    pub now: DateTime<Utc>,
}

fn seconds(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

impl Store {
    /// Evaluate a schedule once, in one short transaction (no network
    /// call): record that this relay runs its configuration; if this
    /// configuration wins — the one that appeared most recently among the
    /// live ones; a relay whose configuration loses stands aside without
    /// locking anything — and no other relay is evaluating the schedule
    /// right now (its row is locked, then skipped: [`Turn::Busy`], for the
    /// caller to try again shortly), let `due` turn the last tick enqueued
    /// (None for a schedule never seen) into the intents to enqueue and the
    /// new watermark, enqueue them and move the watermark.
    pub async fn fire_schedule(
        &self,
        at: Evaluation<'_>,
        due: impl FnOnce(Option<DateTime<Utc>>) -> (Vec<NewIntent>, DateTime<Utc>),
    ) -> Result<Turn, StoreError> {
        let mut tx = self.pool.begin().await?;
        // recorded even when another relay holds the schedule: a relay that
        // keeps losing the race for the row is still running its version
        sqlx::query(
            "INSERT INTO outbox.schedule_configs AS c
                    (name, fingerprint, definition, first_seen, last_seen, seen_by)
             VALUES ($1, $2, $3, $4, $4, $5)
             ON CONFLICT (name, fingerprint) DO UPDATE
                SET first_seen = CASE WHEN c.last_seen < $4 - make_interval(secs => $6)
                                      THEN excluded.first_seen ELSE c.first_seen END,
                    last_seen = greatest(c.last_seen, excluded.last_seen),
                    definition = excluded.definition,
                    seen_by = excluded.seen_by",
        )
        .bind(at.name)
        .bind(at.fingerprint)
        .bind(at.definition)
        .bind(at.now)
        .bind(at.relay)
        .bind(seconds(LIVE_FOR))
        .execute(&mut *tx)
        .await?;
        // a relay whose configuration loses stands aside without taking
        // the row: the winner must not find it busy
        let live = live_configs(&mut tx, at.name, at.now).await?;
        if live
            .first()
            .is_some_and(|w| w.fingerprint != at.fingerprint)
        {
            tx.commit().await?;
            return Ok(Turn::StoodAside { live });
        }
        let row: Option<(DateTime<Utc>,)> = sqlx::query_as(
            "SELECT last_tick FROM outbox.schedules WHERE name = $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(at.name)
        .fetch_optional(&mut *tx)
        .await?;
        let watermark = match row {
            Some((t,)) => Some(t),
            None => {
                let exists: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM outbox.schedules WHERE name = $1)",
                )
                .bind(at.name)
                .fetch_one(&mut *tx)
                .await?;
                if exists {
                    tx.commit().await?;
                    return Ok(Turn::Busy); // another relay is evaluating it
                }
                None
            }
        };
        let (intents, new_watermark) = due(watermark);
        for intent in &intents {
            enqueue(&mut *tx, intent).await?;
        }
        sqlx::query(
            "INSERT INTO outbox.schedules (name, last_tick, fingerprint) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE
                SET last_tick = greatest(schedules.last_tick, excluded.last_tick),
                    fingerprint = excluded.fingerprint, updated_at = now()",
        )
        .bind(at.name)
        .bind(new_watermark)
        .bind(at.fingerprint)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "DELETE FROM outbox.schedule_configs
              WHERE name = $1 AND last_seen < $2 - make_interval(secs => $3)",
        )
        .bind(at.name)
        .bind(at.now)
        .bind(seconds(FORGET_AFTER))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Turn::Fired {
            enqueued: intents.len(),
            live,
        })
    }

    /// The last tick enqueued per schedule.
    pub async fn schedule_watermarks(&self) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
        Ok(
            sqlx::query_as("SELECT name, last_tick FROM outbox.schedules ORDER BY name")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// The configurations relays run for schedule `name` at `now`, the
    /// winning one first.
    pub async fn schedule_configs(
        &self,
        name: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<ScheduleConfig>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        live_configs(&mut conn, name, now).await
    }
}

/// The live configurations of a schedule, the winner first: the one that
/// appeared most recently (ties broken by fingerprint, so every relay
/// names the same winner).
async fn live_configs(
    conn: &mut sqlx::PgConnection,
    name: &str,
    now: DateTime<Utc>,
) -> Result<Vec<ScheduleConfig>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT fingerprint, definition, seen_by, first_seen
           FROM outbox.schedule_configs
          WHERE name = $1 AND last_seen >= $2 - make_interval(secs => $3)
          ORDER BY first_seen DESC, fingerprint DESC",
    )
    .bind(name)
    .bind(now)
    .bind(seconds(LIVE_FOR))
    .fetch_all(&mut *conn)
    .await?)
}
