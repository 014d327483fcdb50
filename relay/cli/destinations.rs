//! `destinations`: each destination's health (breaker state, failures,
//! next probe, backlog, rate limit), and the manual overrides `pause` and
//! `resume`, recorded in `outbox.destination_events`.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::output::{clip, json, opt, table, time};
use super::{Failure, Outcome};
use crate::config::Config;
use crate::health::{self, DestinationRow, HealthSettings};
use crate::store::Store;

#[derive(Debug, Args)]
pub struct DestinationsArgs {
    #[command(subcommand)]
    action: Option<DestinationAction>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DestinationAction {
    /// Attempt nothing for a destination until it is resumed (its intents
    /// wait, pending, spending no attempt). Recorded with your database role
    /// and raised as an alert.
    Pause {
        /// An origin (https://host[:port]), a webhook endpoint name, or
        /// smtp, charge, nats, amqp.
        destination: String,
        /// Why, for the record and the alert.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resume a paused destination, or close its open breaker now.
    Resume {
        /// The destination as `pause` named it (any spelling of its origin).
        destination: String,
    },
}

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
    let rows: Vec<DestinationRow> = sqlx::query_as(
        "SELECT name, state, failures, last_error, opened_at, next_probe_at, probe_until,
                paused_by, paused_at, CASE WHEN slow_until > now() THEN slow_until END AS slow_until
           FROM outbox.destinations ORDER BY name",
    )
    .fetch_all(store.pool())
    .await?;
    let changed: BTreeMap<String, chrono::DateTime<chrono::Utc>> =
        sqlx::query_as("SELECT name, updated_at FROM outbox.destinations")
            .fetch_all(store.pool())
            .await?
            .into_iter()
            .collect();
    let backlog: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(store.pool())
    .await?;
    let entry = |health: DestinationRow| Destination {
        limit: settings.limits.get(&health.name).map(|r| r.text.clone()),
        changed_at: changed.get(&health.name).copied(),
        health,
        pending: 0,
    };
    let healthy = |name: &str| DestinationRow {
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
    };
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

pub async fn destinations(store: &Store, config: &Config, args: DestinationsArgs) -> Outcome {
    let settings = config
        .health()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    match args.action {
        Some(DestinationAction::Pause {
            destination,
            reason,
        }) => {
            let dest = health::pause(store, &settings, &destination, reason.as_deref())
                .await
                .map_err(|e| Failure::new(1, format!("{e:#}")))?;
            println!(
                "paused {dest}: its intents wait until `outbox-relay destinations resume {dest}`"
            );
            Ok(())
        }
        Some(DestinationAction::Resume { destination }) => {
            let (dest, resumed) = health::resume(store, &settings, &destination)
                .await
                .map_err(|e| Failure::new(1, format!("{e:#}")))?;
            if resumed {
                println!("resumed {dest}");
            } else {
                println!("{dest} was neither paused nor open: nothing to resume");
            }
            Ok(())
        }
        None => {
            let list = list(store, &settings)
                .await
                .map_err(crate::store::StoreError::from)?;
            if args.json {
                json(&list);
                return Ok(());
            }
            if list.is_empty() {
                println!("no destination has a limit, a failure, a pause or a backlog");
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|d| {
                    let h = &d.health;
                    vec![
                        h.name.clone(),
                        match (&h.state[..], &h.paused_by) {
                            ("paused", Some(by)) => format!("paused by {by}"),
                            (s, _) => s.to_string(),
                        },
                        h.failures.to_string(),
                        opt(h.opened_at.map(time)),
                        opt(h.next_probe_at.map(time)),
                        d.pending.to_string(),
                        opt(d.limit.clone()),
                        clip(h.last_error.as_deref().unwrap_or(""), 60),
                    ]
                })
                .collect();
            table(
                &[
                    "DESTINATION",
                    "STATE",
                    "FAILURES",
                    "OPENED",
                    "NEXT PROBE",
                    "PENDING",
                    "LIMIT",
                    "LAST ERROR",
                ],
                &rows,
            );
            Ok(())
        }
    }
}
