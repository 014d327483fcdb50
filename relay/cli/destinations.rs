//! `destinations`: each destination's health (breaker state, failures,
//! next probe, backlog, rate limit), and the manual overrides `pause` and
//! `resume`, recorded in `outbox.destination_events`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
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
    Resume { destination: String },
}

/// One destination, as `destinations --json` prints it.
#[derive(Debug, Serialize)]
pub struct Destination {
    pub name: String,
    pub state: String,
    pub failures: i32,
    pub last_error: Option<String>,
    pub opened_at: Option<DateTime<Utc>>,
    pub next_probe_at: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub paused_at: Option<DateTime<Utc>>,
    pub slow_until: Option<DateTime<Utc>>,
    /// Intents pending or claimed for it.
    pub pending: i64,
    /// Its `[limits]` rate.
    pub limit: Option<String>,
}

/// Every destination that has a row, a limit or a backlog.
pub async fn list(
    store: &Store,
    settings: &HealthSettings,
) -> Result<Vec<Destination>, sqlx::Error> {
    let rows: Vec<DestinationRow> = sqlx::query_as(
        "SELECT name, state, failures, last_error, opened_at, next_probe_at, probe_until,
                paused_by, paused_at, slow_until
           FROM outbox.destinations ORDER BY name",
    )
    .fetch_all(store.pool())
    .await?;
    let backlog: Vec<(Option<String>, i64)> = sqlx::query_as(
        "SELECT outbox.destination_of(kind, destination, payload), count(*)
           FROM outbox.intents WHERE state IN ('pending', 'claimed') GROUP BY 1",
    )
    .fetch_all(store.pool())
    .await?;
    let mut out: BTreeMap<String, Destination> = BTreeMap::new();
    let blank = |name: &str| Destination {
        name: name.to_string(),
        state: "closed".into(),
        failures: 0,
        last_error: None,
        opened_at: None,
        next_probe_at: None,
        paused_by: None,
        paused_at: None,
        slow_until: None,
        pending: 0,
        limit: settings.limits.get(name).map(|r| r.text.clone()),
    };
    for r in rows {
        let mut d = blank(&r.name);
        d.state = r.state;
        d.failures = r.failures;
        d.last_error = r.last_error;
        d.opened_at = r.opened_at;
        d.next_probe_at = r.next_probe_at;
        d.paused_by = r.paused_by;
        d.paused_at = r.paused_at;
        d.slow_until = r.slow_until.filter(|t| *t > Utc::now());
        out.insert(d.name.clone(), d);
    }
    for name in settings.limits.keys() {
        out.entry(name.clone()).or_insert_with(|| blank(name));
    }
    for (name, count) in backlog {
        let Some(name) = name else { continue };
        // a named endpoint counts under its origin
        let name = settings.endpoints.get(&name).cloned().unwrap_or(name);
        out.entry(name.clone())
            .or_insert_with(|| blank(&name))
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
                    vec![
                        d.name.clone(),
                        match (&d.state[..], &d.paused_by) {
                            ("paused", Some(by)) => format!("paused by {by}"),
                            (s, _) => s.to_string(),
                        },
                        d.failures.to_string(),
                        opt(d.opened_at.map(time)),
                        opt(d.next_probe_at.map(time)),
                        d.pending.to_string(),
                        opt(d.limit.clone()),
                        clip(d.last_error.as_deref().unwrap_or(""), 60),
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
