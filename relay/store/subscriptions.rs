//! Subscriptions (`outbox.subscriptions`).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::FromRow;

use super::Store;

/// A subscription as `list` and `show` print it: never its secret, and of
/// its headers only their names (a header may carry a credential).
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct Subscription {
    pub id: String,
    pub tenant: Option<String>,
    pub event_types: Vec<String>,
    pub url: String,
    pub header_names: Vec<String>,
    /// Deliveries per second at most.
    pub rate: Option<f64>,
    pub description: Option<String>,
    pub disabled_at: Option<DateTime<Utc>>,
    pub disabled_reason: Option<String>,
    /// Its destination's breaker state (closed, open, half_open, paused).
    pub health: String,
    /// Since when its deliveries fail (its breaker opened).
    pub failing_since: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Until when deliveries carry the replaced secret's signature too.
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Its deliveries, by state.
    pub deliveries: i64,
    pub delivered: i64,
    pub pending: i64,
    pub failed: i64,
}

/// One delivery of an event: which subscription, and what became of it.
#[derive(Debug, Clone, Serialize, FromRow)]
pub struct EventDelivery {
    pub subscription_id: String,
    pub intent_id: i64,
    pub key: String,
    /// None when the delivery was purged (its key is in the ledger).
    pub state: Option<String>,
    pub attempts: Option<i32>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// When the expansion (or a replay) made it.
    pub made_at: DateTime<Utc>,
}

/// A subscription to create; `secret` and `headers_sealed` are already
/// sealed.
#[derive(Debug, Clone)]
pub struct NewSubscription {
    pub id: String,
    pub tenant: Option<String>,
    pub event_types: Vec<String>,
    pub url: String,
    /// The names of its headers, in order.
    pub header_names: Vec<String>,
    /// Its headers (a JSON object), sealed; none when it has none.
    pub headers_sealed: Option<Vec<u8>>,
    pub rate: Option<f64>,
    pub description: Option<String>,
    pub secret: Vec<u8>,
}

/// A subscription's sealed values.
#[derive(Debug, Clone, FromRow)]
pub struct Sealed {
    pub id: String,
    /// Its secret, and the replaced one while it signs.
    pub secrets: Vec<Vec<u8>>,
    /// Its headers; none when it has none.
    pub headers: Option<Vec<u8>>,
}

/// What a delivery to a subscription needs of its row.
#[derive(Debug, Clone, FromRow)]
pub struct TargetRow {
    pub url: String,
    /// Its headers, sealed; none when it has none.
    pub headers_sealed: Option<Vec<u8>>,
    /// Its headers are still in clear (a row older than their sealing that
    /// no relay with the key has started on since): not read.
    pub headers_in_clear: bool,
    pub secret: Vec<u8>,
    /// The replaced secret, while its grace window lasts.
    pub previous_secret: Option<Vec<u8>>,
    pub disabled_at: Option<DateTime<Utc>>,
    pub disabled_reason: Option<String>,
}

/// A subscription's target row, as [`TargetRow`] has it.
const TARGET_SELECT: &str = "SELECT id, url, headers_sealed,
        coalesce(headers <> '{}'::jsonb, false) AS headers_in_clear, secret,
        CASE WHEN previous_until > now() THEN previous_secret END AS previous_secret,
        disabled_at, disabled_reason
   FROM outbox.subscriptions";

#[derive(FromRow)]
struct IdTarget {
    id: String,
    #[sqlx(flatten)]
    target: TargetRow,
}

const SELECT: &str = "
    SELECT s.id, s.tenant, s.event_types, s.url,
           s.header_names,
           s.rate, s.description, s.disabled_at, s.disabled_reason,
           coalesce(h.state, 'closed') AS health,
           CASE WHEN h.state IN ('open', 'half_open') THEN h.opened_at END AS failing_since,
           h.last_error,
           s.previous_until AS previous_secret_until, s.created_at, s.updated_at,
           coalesce(d.deliveries, 0) AS deliveries, coalesce(d.delivered, 0) AS delivered,
           coalesce(d.pending, 0) AS pending, coalesce(d.failed, 0) AS failed
      FROM outbox.subscriptions s
      LEFT JOIN outbox.destinations h ON h.name = s.id
      LEFT JOIN LATERAL (
           SELECT count(*) AS deliveries,
                  count(*) FILTER (WHERE i.state = 'delivered') AS delivered,
                  count(*) FILTER (WHERE i.state IN ('pending', 'claimed')) AS pending,
                  count(*) FILTER (WHERE i.state IN ('dead', 'rejected', 'ambiguous')) AS failed
             FROM outbox.event_deliveries e JOIN outbox.intents i ON i.id = e.intent_id
            WHERE e.subscription_id = s.id) d ON true";

impl Store {
    pub async fn add_subscription(&self, s: &NewSubscription) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO outbox.subscriptions
                 (id, tenant, event_types, url, headers, header_names, headers_sealed, rate,
                  description, secret)
             VALUES ($1, $2, $3, $4, CASE WHEN $6::bytea IS NULL THEN '{}'::jsonb END, $5, $6,
                     $7, $8, $9)",
        )
        .bind(&s.id)
        .bind(&s.tenant)
        .bind(&s.event_types)
        .bind(&s.url)
        .bind(&s.header_names)
        .bind(&s.headers_sealed)
        .bind(s.rate)
        .bind(&s.description)
        .bind(&s.secret)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every subscription (of one tenant, when given), oldest first.
    pub async fn subscriptions(
        &self,
        tenant: Option<&str>,
    ) -> Result<Vec<Subscription>, sqlx::Error> {
        sqlx::query_as(&format!(
            "{SELECT} WHERE $1::text IS NULL OR s.tenant = $1 ORDER BY s.created_at, s.id"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await
    }

    pub async fn subscription(&self, id: &str) -> Result<Option<Subscription>, sqlx::Error> {
        sqlx::query_as(&format!("{SELECT} WHERE s.id = $1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
    }

    /// Disable (with the reason) or enable a subscription; false when there
    /// is none with this id.
    pub async fn set_subscription_disabled(
        &self,
        id: &str,
        disabled: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE outbox.subscriptions
                SET disabled_at = CASE WHEN $2::text IS NULL THEN NULL
                                       ELSE coalesce(disabled_at, now()) END,
                    disabled_reason = $2,
                    updated_at = now()
              WHERE id = $1",
        )
        .bind(id)
        .bind(disabled)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Remove a subscription; its deliveries stay, and those still pending
    /// are refused when their turn comes. False when there is none.
    pub async fn remove_subscription(&self, id: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query("DELETE FROM outbox.subscriptions WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Replace a subscription's secret by `sealed`; for `grace`, the
    /// replaced one signs as well. False when there is none with this id.
    pub async fn rotate_subscription_secret(
        &self,
        id: &str,
        sealed: &[u8],
        grace: Duration,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE outbox.subscriptions
                SET previous_secret = CASE WHEN $3 > 0 THEN secret END,
                    previous_until = CASE WHEN $3 > 0
                                          THEN now() + make_interval(secs => $3) END,
                    secret = $2, updated_at = now()
              WHERE id = $1",
        )
        .bind(id)
        .bind(sealed)
        .bind(grace.as_secs_f64())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// What deliveries to every subscription need, at most `limit` of
    /// them, in one statement.
    pub async fn every_subscription_target(
        &self,
        limit: i64,
    ) -> Result<Vec<(String, TargetRow)>, sqlx::Error> {
        let rows: Vec<IdTarget> = sqlx::query_as(&format!("{TARGET_SELECT} LIMIT $1"))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.target)).collect())
    }

    /// What deliveries to these subscriptions need, by id, in one
    /// statement; a removed one is missing.
    pub async fn subscription_targets(
        &self,
        ids: &[String],
    ) -> Result<Vec<(String, TargetRow)>, sqlx::Error> {
        let rows: Vec<IdTarget> = sqlx::query_as(&format!("{TARGET_SELECT} WHERE id = ANY($1)"))
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|r| (r.id, r.target)).collect())
    }

    /// Disable the subscriptions whose breaker has been open for `after`,
    /// raising an alert and publishing `outbox.subscription.disabled` for
    /// each; how many.
    pub async fn disable_failing_subscriptions(
        &self,
        after: Duration,
        alerts: &crate::config::health::AlertTarget,
    ) -> Result<i32, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT outbox.disable_failing_subscriptions(make_interval(secs => $1), $2, $3)",
        )
        .bind(after.as_secs_f64())
        .bind(&alerts.url)
        .bind(&alerts.endpoint)
        .fetch_one(&self.pool)
        .await
    }

    /// "Did it happen?" for an event: each delivery made of it, by
    /// subscription.
    pub async fn event_deliveries(&self, event_id: i64) -> Result<Vec<EventDelivery>, sqlx::Error> {
        sqlx::query_as(
            "SELECT d.subscription_id, d.intent_id, i.key, i.state, i.attempts, i.delivered_at,
                    i.last_error, d.at AS made_at
               FROM outbox.event_deliveries d
               -- the log, or the row of one that outlived its segment
               JOIN outbox.intents i ON i.id = d.intent_id
              WHERE d.event_id = $1
              ORDER BY d.subscription_id",
        )
        .bind(event_id)
        .fetch_all(&self.pool)
        .await
    }

    /// The rate of each enabled subscription that has one (per second).
    pub async fn subscription_rates(&self) -> Result<Vec<(String, f64)>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, rate FROM outbox.subscriptions
              WHERE rate IS NOT NULL AND disabled_at IS NULL",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Every subscription's sealed values (its secret, the replaced one
    /// while it signs, its headers): to check at start-up that the
    /// configured key opens them.
    pub async fn sealed_values(&self) -> Result<Vec<Sealed>, sqlx::Error> {
        sqlx::query_as(
            "SELECT id, array_remove(ARRAY[secret,
                                           CASE WHEN previous_until > now()
                                                THEN previous_secret END], NULL) AS secrets,
                    headers_sealed AS headers
               FROM outbox.subscriptions ORDER BY id",
        )
        .fetch_all(&self.pool)
        .await
    }

    /// Seal the headers still held in clear (rows older than their
    /// sealing), each with `seal`, and clear `headers`, in one transaction;
    /// how many subscriptions' headers it sealed. Relays starting together
    /// seal each row once: the first locks the rows, and the others find
    /// them sealed.
    pub async fn seal_clear_headers(
        &self,
        seal: impl Fn(&str, &serde_json::Map<String, Value>) -> Vec<u8>,
    ) -> Result<usize, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let clear: Vec<(String, sqlx::types::Json<serde_json::Map<String, Value>>)> =
            sqlx::query_as(
                "SELECT id, headers FROM outbox.subscriptions
                  WHERE headers <> '{}'::jsonb ORDER BY id FOR UPDATE",
            )
            .fetch_all(&mut *tx)
            .await?;
        for (id, headers) in &clear {
            let names: Vec<&str> = headers.0.keys().map(String::as_str).collect();
            sqlx::query(
                "UPDATE outbox.subscriptions
                    SET headers = NULL, header_names = $2, headers_sealed = $3
                  WHERE id = $1",
            )
            .bind(id)
            .bind(names)
            .bind(seal(id, &headers.0))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(clear.len())
    }
}
