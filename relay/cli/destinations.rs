//! `destinations`: each destination's health (breaker state, failures,
//! next probe, backlog, rate limit), and the manual overrides `pause` and
//! `resume`, recorded in `outbox.destination_events`.

use clap::{Args, Subcommand};

use super::output::{clip, json, opt, table, time};
use super::{Failure, Outcome};
use crate::config::Config;
use crate::services::health;
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
        /// smtp, charge, nats, amqp, kafka.
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
            let list = health::list(store, &settings)
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
