//! `replay`: send a subscription the events of a time window again.

use chrono::{DateTime, Utc};
use clap::Args;

use super::output::json;
use super::{Failure, Outcome};
use crate::services::subscriptions::replay;
use crate::store::replay::Window;
use crate::store::{Store, StoreError};
use crate::units::parse_duration;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The subscription (sub_...).
    #[arg(long)]
    subscription: String,
    /// The window's start: an RFC 3339 time, or a duration ago (2h).
    #[arg(long)]
    since: String,
    /// The window's end (excluded): an RFC 3339 time, or a duration ago;
    /// default now. A dry run prints the one to pass so that the replay
    /// acts on exactly what it counted.
    #[arg(long)]
    until: Option<String>,
    /// Only events of this type, or of this `prefix.*` pattern.
    #[arg(long)]
    event_type: Option<String>,
    /// Count what would be sent, send nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// An RFC 3339 time, or a duration before `now`.
fn time(flag: &str, text: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>, Failure> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text).map_err(|_| {
        Failure::usage(format!(
            "{flag} {text:?} is neither an RFC 3339 time (2026-12-04T10:00:00Z) nor a duration ago (2h)"
        ))
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| Failure::usage(format!("{flag} {text:?} is too far back")))
}

pub async fn replay(store: &Store, a: ReplayArgs) -> Outcome {
    let now = Utc::now();
    let window = Window {
        subscription: a.subscription.clone(),
        since: time("--since", &a.since, now)?,
        until: match &a.until {
            Some(t) => time("--until", t, now)?,
            None => now,
        },
        event_type: a.event_type.clone(),
    };
    let plan =
        replay::plan(store, window)
            .await
            .map_err(|e| match e.downcast_ref::<StoreError>() {
                Some(StoreError::NotFound(id)) => {
                    Failure::new(3, format!("no subscription has id {id:?}"))
                }
                Some(_) => Failure::from(e),
                None => Failure::usage(format!("{e:#}")),
            })?;
    let until = plan
        .until
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    if a.dry_run {
        if a.json {
            json(&serde_json::json!({"dry_run": true, "plan": plan}));
        } else {
            println!(
                "would replay {} event(s) to {}: {} first deliveries, {} sent again under the same webhook-id (replays), {} on their way already (left as they are) (dry run)",
                plan.events, plan.subscription, plan.first_deliveries, plan.sent_again, plan.on_their_way
            );
            println!("to act on exactly these, pass --until {until}");
        }
        return Ok(());
    }
    let (made, again) = replay::apply(store, &plan).await?;
    tracing::info!(
        action = "replay",
        subscription = %plan.subscription,
        since = %plan.since,
        until = %until,
        first = made,
        again,
        "operator replay"
    );
    if a.json {
        json(&serde_json::json!({"plan": plan, "first_deliveries": made, "sent_again": again}));
    } else {
        println!(
            "replayed {} event(s) to {} up to {until}: {made} first deliveries, {again} sent again",
            plan.events, plan.subscription
        );
        let skipped = (plan.first_deliveries + plan.sent_again) as u64 - made - again;
        if skipped > 0 {
            println!("skipped {skipped} that changed after they were counted");
        }
    }
    Ok(())
}
