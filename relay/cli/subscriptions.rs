//! `subscriptions`: who receives the events applications publish. A
//! subscription's signing secret is printed once, when it is made or
//! rotated, and never again.

use clap::{Args, Subcommand};

use super::output::{clip, json, opt, table, time};
use super::{Failure, Outcome};
use crate::config::Config;
use crate::services::subscriptions::{self, Request};
use crate::store::subscriptions::Subscription;
use crate::store::{Store, StoreError};
use crate::units::parse_duration;

#[derive(Debug, Args)]
pub struct SubscriptionsArgs {
    #[command(subcommand)]
    action: SubscriptionAction,
}

#[derive(Debug, Subcommand)]
enum SubscriptionAction {
    /// Subscribe a webhook URL to events; prints the subscription's id and
    /// its signing secret (whsec_...), shown this once.
    Add {
        /// Where its deliveries are POSTed (http or https).
        #[arg(long)]
        url: String,
        /// The tenant whose events it receives; none: the events published
        /// without a tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Event types, comma-separated: exact names or `prefix.*`
        /// ('order.*,invoice.paid'); none: every type.
        #[arg(long, value_delimiter = ',')]
        event_types: Vec<String>,
        /// A header each delivery carries, `Name: value` (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        /// Deliveries at most, e.g. 50/s, 600/min.
        #[arg(long)]
        rate: Option<String>,
        /// What it is for.
        #[arg(long)]
        description: Option<String>,
    },
    /// The subscriptions, oldest first.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One subscription: its settings and its deliveries by state.
    Show {
        /// The subscription's id (sub_...).
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop expanding events to it; its pending deliveries are refused when
    /// their turn comes (`replay` sends them once it is enabled).
    Disable {
        /// The subscription to disable.
        id: String,
        /// Why, for the record.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Expand events to it again.
    Enable {
        /// The subscription to enable.
        id: String,
    },
    /// Delete it; its past deliveries stay.
    Remove {
        /// The subscription to delete.
        id: String,
    },
    /// Give it a new signing secret (printed once); during --grace every
    /// delivery is signed with the new and the old one.
    RotateSecret {
        /// The subscription whose secret is replaced.
        id: String,
        /// How long the old secret signs as well (e.g. 24h; 0s: not at all).
        #[arg(long, default_value = "24h")]
        grace: String,
    },
}

pub async fn subscriptions(store: &Store, config: &Config, args: SubscriptionsArgs) -> Outcome {
    match args.action {
        SubscriptionAction::Add {
            url,
            tenant,
            event_types,
            headers,
            rate,
            description,
        } => {
            let req = Request {
                url,
                tenant,
                event_types,
                headers,
                rate,
                description,
            };
            add(store, config, &req).await
        }
        SubscriptionAction::List {
            tenant,
            json: as_json,
        } => list(store, tenant.as_deref(), as_json).await,
        SubscriptionAction::Show { id, json: as_json } => {
            let s = store
                .subscription(&id)
                .await
                .map_err(StoreError::from)?
                .ok_or_else(|| not_found(&id))?;
            if as_json {
                json(&s);
                return Ok(());
            }
            show(&s);
            Ok(())
        }
        SubscriptionAction::Disable { id, reason } => {
            let reason = reason.unwrap_or_else(|| "disabled by an operator".into());
            if !store
                .set_subscription_disabled(&id, Some(&reason))
                .await
                .map_err(StoreError::from)?
            {
                return Err(not_found(&id));
            }
            println!("disabled {id}");
            Ok(())
        }
        SubscriptionAction::Enable { id } => {
            if !store
                .set_subscription_disabled(&id, None)
                .await
                .map_err(StoreError::from)?
            {
                return Err(not_found(&id));
            }
            println!("enabled {id}");
            Ok(())
        }
        SubscriptionAction::Remove { id } => {
            if !store
                .remove_subscription(&id)
                .await
                .map_err(StoreError::from)?
            {
                return Err(not_found(&id));
            }
            println!("removed {id}");
            Ok(())
        }
        SubscriptionAction::RotateSecret { id, grace } => rotate(store, config, &id, &grace).await,
    }
}

async fn list(store: &Store, tenant: Option<&str>, as_json: bool) -> Outcome {
    let list = store
        .subscriptions(tenant)
        .await
        .map_err(StoreError::from)?;
    if as_json {
        json(&list);
        return Ok(());
    }
    if list.is_empty() {
        println!("no subscriptions");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list.iter().map(row).collect();
    table(
        &[
            "ID",
            "TENANT",
            "EVENT TYPES",
            "URL",
            "STATE",
            "DELIVERED",
            "PENDING",
            "FAILED",
        ],
        &rows,
    );
    Ok(())
}

async fn add(store: &Store, config: &Config, req: &Request) -> Outcome {
    let (id, secret) = subscriptions::add(store, config, req)
        .await
        .map_err(usage_or_failure)?;
    println!("{id}");
    println!("{}", secret.expose());
    eprintln!(
        "subscription {id} made; its signing secret (the second line) is shown this once: \
         hand it to the receiver"
    );
    Ok(())
}

async fn rotate(store: &Store, config: &Config, id: &str, grace: &str) -> Outcome {
    let grace = parse_duration(grace).map_err(|e| Failure::usage(format!("--grace: {e}")))?;
    let secret = subscriptions::rotate(store, config, id, grace)
        .await
        .map_err(usage_or_failure)?
        .ok_or_else(|| not_found(id))?;
    println!("{}", secret.expose());
    eprintln!(
        "{id} has a new signing secret (shown this once); deliveries carry the old \
         one's signature as well for {}",
        humantime::format_duration(grace)
    );
    Ok(())
}

/// A refused request (a field, the missing key) is bad input, exit 2; the
/// database's failures keep their own codes.
fn usage_or_failure(e: anyhow::Error) -> Failure {
    if e.chain().any(|c| c.downcast_ref::<sqlx::Error>().is_some()) {
        Failure::from(e)
    } else {
        Failure::usage(format!("{e:#}"))
    }
}

fn not_found(id: &str) -> Failure {
    Failure::new(3, format!("no subscription has id {id:?}"))
}

fn state(s: &Subscription) -> String {
    match (&s.disabled_at, &s.failing_since) {
        (Some(_), _) => "disabled".into(),
        (None, _) if s.health == "paused" => "paused".into(),
        (None, Some(since)) => format!("failing since {}", time(*since)),
        (None, None) => "enabled".into(),
    }
}

fn types(s: &Subscription) -> String {
    if s.event_types.is_empty() {
        "(every type)".into()
    } else {
        s.event_types.join(",")
    }
}

fn row(s: &Subscription) -> Vec<String> {
    vec![
        s.id.clone(),
        opt(s.tenant.clone()),
        clip(&types(s), 40),
        clip(&outbox_providers::redact::urls_in(&s.url), 60),
        state(s),
        s.delivered.to_string(),
        s.pending.to_string(),
        s.failed.to_string(),
    ]
}

fn show(s: &Subscription) {
    let lines = [
        ("id", s.id.clone()),
        ("tenant", opt(s.tenant.clone())),
        ("event types", types(s)),
        ("url", outbox_providers::redact::urls_in(&s.url)),
        ("headers", s.header_names.join(", ")),
        ("rate", opt(s.rate.map(|r| format!("{r}/s")))),
        ("description", opt(s.description.clone())),
        ("state", state(s)),
        ("disabled reason", opt(s.disabled_reason.clone())),
        ("breaker", s.health.clone()),
        (
            "last error",
            opt(s
                .last_error
                .as_deref()
                .map(outbox_providers::redact::urls_in)),
        ),
        (
            "old secret signs until",
            opt(s.previous_secret_until.map(time)),
        ),
        ("created", time(s.created_at)),
        ("updated", time(s.updated_at)),
        (
            "deliveries",
            format!(
                "{} ({} delivered, {} pending, {} failed)",
                s.deliveries, s.delivered, s.pending, s.failed
            ),
        ),
    ];
    for (name, value) in lines {
        println!("{name:<24}{value}");
    }
}
