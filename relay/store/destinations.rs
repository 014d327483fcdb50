//! Destination health's SQL (`outbox.destinations`, schema 0007 and 0015):
//! the gate's reread of the unhealthy destinations, the shared token
//! buckets and probes, what an attempt tells about its destination, the
//! operator alerts, the gauges' reads, pauses and the listing.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;

use super::Store;
use crate::config::health::{AlertTarget, BreakerSettings};

/// A destination's row in `outbox.destinations`.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct DestinationRow {
    pub name: String,
    pub state: String,
    pub failures: i32,
    pub last_error: Option<String>,
    pub opened_at: Option<DateTime<Utc>>,
    pub next_probe_at: Option<DateTime<Utc>>,
    #[serde(skip)]
    pub probe_until: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub paused_at: Option<DateTime<Utc>>,
    pub slow_until: Option<DateTime<Utc>>,
}

impl DestinationRow {
    /// A destination with no row: closed, never failed.
    pub fn healthy(name: &str) -> DestinationRow {
        DestinationRow {
            name: name.to_string(),
            state: "closed".into(),
            failures: 0,
            last_error: None,
            opened_at: None,
            next_probe_at: None,
            probe_until: None,
            paused_by: None,
            paused_at: None,
            slow_until: None,
        }
    }
}

/// The gate's reread ($1 the failure window, $2 the most rows).
pub const UNHEALTHY_SQL: &str =
    "SELECT name, state, failures, last_error, opened_at, next_probe_at,
        probe_until, paused_by, paused_at, slow_until
   FROM outbox.destinations
  WHERE (state <> 'closed' OR failures > 0 OR slow_until IS NOT NULL)
    AND (state <> 'closed' OR slow_until > now()
         OR (failures > 0 AND updated_at > now() - $1::interval))
  ORDER BY state = 'paused' DESC, state = 'closed', updated_at DESC
  LIMIT $2";

/// A duration as a Postgres interval.
pub fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros().min(i64::MAX as u128) as i64,
    }
}

impl Store {
    /// The destinations the gate keeps in view: paused, breaker not
    /// closed, slowed down, or failed within `window`; at most `max`, the
    /// paused first, then the others not closed, then the latest failures.
    /// Read through the partial index `destinations_unhealthy` (schema
    /// 0015): the healthy rows (every destination ever limited or failed)
    /// are not read.
    pub async fn read_unhealthy(
        &self,
        window: Duration,
        max: i64,
    ) -> Result<Vec<DestinationRow>, sqlx::Error> {
        sqlx::query_as(UNHEALTHY_SQL)
            .bind(interval(window))
            .bind(max)
            .fetch_all(self.pool())
            .await
    }

    /// Up to `batch` tokens of `dest`'s shared bucket; how many it gave.
    pub async fn take_tokens(
        &self,
        dest: &str,
        per_second: f64,
        burst: f64,
        batch: i32,
    ) -> Result<i32, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.take_tokens($1, $2, $3, $4)")
            .bind(dest)
            .bind(per_second)
            .bind(burst)
            .bind(batch)
            .fetch_one(self.pool())
            .await
    }

    /// The one probe of an open breaker, for `owner`, held for `hold`.
    pub async fn take_probe(
        &self,
        dest: &str,
        owner: &str,
        hold: Duration,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.take_probe($1, $2, $3)")
            .bind(dest)
            .bind(owner)
            .bind(interval(hold))
            .fetch_one(self.pool())
            .await
    }

    /// A probe that learned nothing: the next intent probes.
    pub async fn release_probe(&self, dest: &str, owner: &str) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.release_probe($1, $2)")
            .bind(dest)
            .bind(owner)
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// A 429 or a `Retry-After`: the whole destination waits `wait`.
    pub async fn slow_destination(&self, dest: &str, wait: Duration) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.slow_destination($1, $2)")
            .bind(dest)
            .bind(interval(wait))
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// A failure of `dest` (a probe's, when `probe`); its state after.
    pub async fn destination_failed(
        &self,
        dest: &str,
        reason: Option<&str>,
        probe: bool,
        owner: &str,
        breaker: BreakerSettings,
        alerts: &AlertTarget,
    ) -> Result<String, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.destination_failed($1, $2, $3, $4, $5, $6, $7, $8, $9)")
            .bind(dest)
            .bind(reason)
            .bind(probe)
            .bind(owner)
            .bind(breaker.failures as i32)
            .bind(interval(breaker.cooldown))
            .bind(interval(breaker.max_cooldown))
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .fetch_one(self.pool())
            .await
    }

    /// An answer from `dest` after failures (or its probe's); its state
    /// after.
    pub async fn destination_succeeded(
        &self,
        dest: &str,
        probe: bool,
        owner: &str,
        alerts: &AlertTarget,
    ) -> Result<String, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.destination_succeeded($1, $2, $3, $4, $5)")
            .bind(dest)
            .bind(probe)
            .bind(owner)
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .fetch_one(self.pool())
            .await
    }

    /// The alerts of destinations paused by hand (each raised once).
    pub async fn raise_pause_alerts(&self, alerts: &AlertTarget) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.raise_pause_alerts($1, $2)")
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// The summaries of alert windows that held alerts back.
    pub async fn raise_alert_summaries(&self, alerts: &AlertTarget) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.raise_alert_summaries($1, $2)")
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// The dead-count alert, raised once per crossing of `threshold`.
    pub async fn check_dead_alert(
        &self,
        threshold: u64,
        alerts: &AlertTarget,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.check_dead_alert($1, $2, $3)")
            .bind(threshold.min(i64::MAX as u64) as i64)
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// The destinations whose breaker is not closed, with their state, the
    /// longest open first.
    pub async fn destinations_not_closed(&self) -> Result<Vec<(String, String)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT name, state FROM outbox.destinations WHERE state <> 'closed'
              ORDER BY opened_at NULLS LAST, name",
        )
        .fetch_all(self.pool())
        .await
    }

    /// Intents pending or claimed, per destination (None: the payload names
    /// none), from the tallies folded first ([`super::tallies`]): the read
    /// does not grow with the backlog.
    pub async fn destination_backlogs(&self) -> Result<Vec<(Option<String>, i64)>, sqlx::Error> {
        self.fold_tallies().await?;
        self.tallied_backlogs().await
    }

    /// Open breakers a minute past their due probe.
    pub async fn overdue_open_breakers(&self) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT name FROM outbox.destinations
              WHERE state = 'open' AND next_probe_at < clock_timestamp() - interval '1 minute'",
        )
        .fetch_all(self.pool())
        .await
    }

    /// Close the breaker of a destination with nothing left to send;
    /// whether it closed it.
    pub async fn close_idle_breaker(
        &self,
        dest: &str,
        owner: &str,
        alerts: &AlertTarget,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.close_idle_breaker($1, $2, $3, $4)")
            .bind(dest)
            .bind(owner)
            .bind(&alerts.url)
            .bind(&alerts.endpoint)
            .fetch_one(self.pool())
            .await
    }

    /// Failure counts older than `window` start anew.
    pub async fn forget_stale_failures(&self, window: Duration) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.forget_stale_failures($1)")
            .bind(interval(window))
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// Destination events and idle closed destinations older than `history`
    /// go.
    pub async fn prune_destinations(&self, history: Duration) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.prune_destinations($1)")
            .bind(interval(history))
            .execute(self.pool())
            .await
            .map(drop)
    }

    pub async fn pause_destination(
        &self,
        dest: &str,
        reason: Option<&str>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT outbox.pause_destination($1, $2)")
            .bind(dest)
            .bind(reason)
            .execute(self.pool())
            .await
            .map(drop)
    }

    /// Whether it was paused.
    pub async fn resume_destination(&self, dest: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT outbox.resume_destination($1)")
            .bind(dest)
            .fetch_one(self.pool())
            .await
    }

    /// Every destination's row, by name (a slow-down only while it lasts),
    /// and when each last changed.
    pub async fn destination_rows(
        &self,
    ) -> Result<(Vec<DestinationRow>, BTreeMap<String, DateTime<Utc>>), sqlx::Error> {
        let rows = sqlx::query_as(
            "SELECT name, state, failures, last_error, opened_at, next_probe_at, probe_until,
                    paused_by, paused_at,
                    CASE WHEN slow_until > now() THEN slow_until END AS slow_until
               FROM outbox.destinations ORDER BY name",
        )
        .fetch_all(self.pool())
        .await?;
        let changed = sqlx::query_as("SELECT name, updated_at FROM outbox.destinations")
            .fetch_all(self.pool())
            .await?
            .into_iter()
            .collect();
        Ok((rows, changed))
    }
}
