//! The destinations listing, as `outbox-relay destinations` and the
//! console show it: every destination with a row, a limit or a backlog.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::config::HealthSettings;
use crate::store::destinations::DestinationRow;
use crate::store::Store;

/// One destination, as `destinations --json` prints it: its row (closed
/// and healthy when it has none), its backlog and its limit.
#[derive(Debug, Serialize)]
pub struct Destination {
    #[serde(flatten)]
    pub health: DestinationRow,
    /// Intents pending or claimed for it.
    pub pending: i64,
    /// Its `[limits]` rate.
    pub limit: Option<String>,
    /// When its row last changed (its last failure, or the success that
    /// reset its failures or closed its breaker): the age of `last_error`.
    pub changed_at: Option<chrono::DateTime<chrono::Utc>>,
}

impl Destination {
    /// Closed with no failure since: its `last_error` is from before it
    /// recovered.
    pub fn recovered(&self) -> bool {
        self.health.state == "closed" && self.health.failures == 0
    }
}

/// Every destination that has a row, a limit or a backlog.
pub async fn list(
    store: &Store,
    settings: &HealthSettings,
) -> Result<Vec<Destination>, sqlx::Error> {
    let (rows, changed) = store.destination_rows().await?;
    let backlog = store.destination_backlogs().await?;
    let entry = |mut health: DestinationRow| {
        // the last error as every shown URL is shown
        // (`outbox_providers::redact`), one written before the rule included
        health.last_error = health
            .last_error
            .take()
            .map(|e| outbox_providers::redact::urls_in(&e));
        Destination {
            limit: settings.limits.get(&health.name).map(|r| r.text.clone()),
            changed_at: changed.get(&health.name).copied(),
            health,
            pending: 0,
        }
    };
    let healthy = DestinationRow::healthy;
    let mut out: BTreeMap<String, Destination> = rows
        .into_iter()
        .map(|r| (r.name.clone(), entry(r)))
        .collect();
    for name in settings.limits.keys() {
        out.entry(name.clone())
            .or_insert_with(|| entry(healthy(name)));
    }
    for (name, count) in backlog {
        let Some(name) = name else { continue };
        // a named endpoint counts under its origin
        let name = settings.endpoints.get(&name).cloned().unwrap_or(name);
        out.entry(name.clone())
            .or_insert_with(|| entry(healthy(&name)))
            .pending += count;
    }
    Ok(out.into_values().collect())
}
