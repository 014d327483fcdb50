//! `enqueue`, `list`, `show`.

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;

use super::output::{clip, clip_middle, json, opt, table, time};
use super::{Failure, Outcome};
use crate::config::Config;
use crate::store::operator::Known;
use crate::store::{enqueue as store_enqueue, NewIntent, Store, StoreError, STATES};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The intent's idempotency key, e.g. order:42:confirmation.
    #[arg(long)]
    key: String,
    /// webhook, email or charge.
    #[arg(long)]
    kind: String,
    /// The payload as JSON; @FILE reads a file, @- reads standard input.
    #[arg(long)]
    payload: String,
    /// A configured destination (e.g. a named webhook endpoint).
    #[arg(long)]
    destination: Option<String>,
    /// Not before: an RFC 3339 time, or a delay like "5m".
    #[arg(long, value_parser = parse_time)]
    run_after: Option<DateTime<Utc>>,
    /// Intents sharing an ordering key are delivered one at a time, in order.
    #[arg(long)]
    ordering_key: Option<String>,
    /// The enqueuing client or service, for per-source duplicate rates.
    #[arg(long)]
    source: Option<String>,
    #[arg(long)]
    json: bool,
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let d = crate::config::parse_duration(text)
        .map_err(|_| format!("{text:?} is neither an RFC 3339 time nor a delay like \"5m\""))?;
    Ok(Utc::now() + chrono::Duration::from_std(d).map_err(|e| e.to_string())?)
}

fn read_payload(arg: &str) -> Result<serde_json::Value, Failure> {
    let text = match arg.strip_prefix('@') {
        Some("-") => std::io::read_to_string(std::io::stdin()).map_err(|e| {
            Failure::usage(format!("cannot read the payload from standard input: {e}"))
        })?,
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("cannot read the payload file {path}: {e}")))?,
        None => arg.to_string(),
    };
    serde_json::from_str(&text)
        .map_err(|e| Failure::usage(format!("--payload is not valid JSON: {e}")))
}

pub async fn enqueue(store: &Store, a: EnqueueArgs) -> Outcome {
    let intent = NewIntent {
        payload: read_payload(&a.payload)?,
        destination: a.destination,
        run_after: a.run_after,
        ordering_key: a.ordering_key,
        source: a.source,
        ..NewIntent::new(a.key, a.kind, serde_json::Value::Null)
    };
    let r = store_enqueue(store.pool(), &intent)
        .await
        .map_err(StoreError::from)?;
    if a.json {
        json(&r);
    } else if r.duplicate {
        println!(
            "intent {} already exists with this payload (duplicate, nothing new enqueued)",
            r.id
        );
    } else {
        println!("enqueued intent {}", r.id);
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    #[arg(long, default_value_t = 50)]
    limit: i64,
    #[arg(long)]
    json: bool,
}

pub async fn list(store: &Store, a: ListArgs) -> Outcome {
    if a.limit < 1 {
        return Err(Failure::usage("--limit must be at least 1"));
    }
    let rows = store
        .list(a.state.as_deref(), a.kind.as_deref(), a.limit)
        .await?;
    if a.json {
        json(&rows);
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.id.to_string(),
                clip(&i.key, 40),
                i.kind.clone(),
                i.state.to_string(),
                i.attempts.to_string(),
                time(i.updated_at),
                clip(&opt(i.provider_ref.as_deref()), 36),
                clip_middle(&opt(i.last_error.as_deref()), 80),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "KEY",
            "KIND",
            "STATE",
            "ATTEMPTS",
            "UPDATED",
            "PROVIDER REF",
            "LAST ERROR",
        ],
        &cells,
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// An intent id or key.
    reference: String,
    #[arg(long)]
    json: bool,
}

pub async fn show(store: &Store, a: ShowArgs) -> Outcome {
    let intent = match store.lookup(&a.reference).await? {
        Known::Live(i) => *i,
        Known::Ledger(entry) => {
            if a.json {
                json(&Known::Ledger(entry));
            } else {
                for (name, value) in [
                    ("key", entry.key.clone()),
                    ("id", entry.intent_id.to_string()),
                    ("kind", entry.kind.clone()),
                    ("state", entry.state.to_string()),
                    ("provider ref", opt(entry.provider_ref.as_deref())),
                    ("last error", opt(entry.last_error.as_deref())),
                    ("created", time(entry.created_at)),
                    ("completed", time(entry.completed_at)),
                    ("purged", time(entry.purged_at)),
                ] {
                    println!("{name:<15} {value}");
                }
                println!("\n(purged: answered from the ledger; the payload and attempts are gone)");
            }
            return Ok(());
        }
    };
    let attempts = store.attempts(intent.id).await?;
    let actions = store.actions(intent.id).await?;
    if a.json {
        json(
            &json!({"source": "live", "intent": intent, "attempts": attempts, "operator_actions": actions}),
        );
        return Ok(());
    }
    let fields = [
        ("id", intent.id.to_string()),
        ("key", intent.key.clone()),
        ("kind", intent.kind.clone()),
        ("destination", opt(intent.destination.as_deref())),
        ("state", intent.state.to_string()),
        ("attempts", intent.attempts.to_string()),
        ("run after", time(intent.run_after)),
        ("ordering key", opt(intent.ordering_key.as_deref())),
        ("provider ref", opt(intent.provider_ref.as_deref())),
        ("last error", opt(intent.last_error.as_deref())),
        ("response", opt(intent.response.as_ref())),
        ("owner", opt(intent.owner.as_deref())),
        ("lease expires", opt(intent.lease_expires_at.map(time))),
        ("key generation", intent.key_generation.to_string()),
        ("duplicates", intent.duplicates.to_string()),
        ("source", opt(intent.source.as_deref())),
        ("created", time(intent.created_at)),
        ("updated", time(intent.updated_at)),
        ("delivered", opt(intent.delivered_at.map(time))),
    ];
    for (name, value) in fields {
        println!("{name:<15} {value}");
    }
    if let Some(at) = intent.effect_at.filter(|_| intent.happened_anyway()) {
        println!(
            "{:<15} happened at {}, although the intent is {}: a provider answered success to a request in flight when it became {} (the attempt below, not accepted)",
            "effect",
            time(at),
            intent.state,
            intent.state
        );
    }
    println!();
    let cells: Vec<Vec<String>> = attempts
        .iter()
        .map(|t| {
            vec![
                t.attempt.to_string(),
                time(t.started_at),
                t.finished_at
                    .map(|f| format!("{}ms", (f - t.started_at).num_milliseconds()))
                    .unwrap_or_else(|| "-".into()),
                t.outcome.clone(),
                opt(t.status),
                if t.replayed {
                    "yes".into()
                } else {
                    "no".into()
                },
                if t.accepted {
                    "yes".into()
                } else {
                    "no (stale)".into()
                },
                clip(&t.owner, 28),
                clip_middle(&opt(t.error.as_deref().or(t.provider_ref.as_deref())), 80),
            ]
        })
        .collect();
    table(
        &[
            "#",
            "STARTED",
            "TOOK",
            "OUTCOME",
            "STATUS",
            "REPLAY",
            "ACCEPTED",
            "OWNER",
            "ERROR / REF",
        ],
        &cells,
    );
    for act in actions {
        println!(
            "{}  {} by {}: {}",
            time(act.at),
            act.action,
            act.actor,
            opt(act.detail)
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// How many upcoming fire times to show.
    #[arg(long, default_value_t = 3)]
    next: usize,
    #[arg(long)]
    json: bool,
}

pub async fn schedules(store: &Store, config: &Config, a: SchedulesArgs) -> Outcome {
    let schedules = config
        .schedules()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let watermarks = store.schedule_watermarks().await.unwrap_or_default();
    let now = Utc::now();
    let rows: Vec<serde_json::Value> = schedules
        .iter()
        .map(|s| {
            let last = watermarks
                .iter()
                .find(|(n, _)| *n == s.name)
                .map(|(_, t)| *t);
            json!({
                "name": s.name, "cron": s.expression, "kind": s.kind, "destination": s.destination,
                "catch_up": s.catch_up, "last_tick": last,
                "next": s.upcoming(now, a.next),
            })
        })
        .collect();
    if a.json {
        json(&rows);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no schedules configured ([[schedule]] in the config file)");
        return Ok(());
    }
    let cells: Vec<Vec<String>> = schedules
        .iter()
        .zip(&rows)
        .map(|(s, r)| {
            vec![
                s.name.clone(),
                s.expression.clone(),
                s.kind.clone(),
                r["last_tick"].as_str().unwrap_or("-").to_string(),
                s.upcoming(now, a.next)
                    .iter()
                    .map(|t| time(*t))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect();
    table(&["NAME", "CRON", "KIND", "LAST TICK", "NEXT"], &cells);
    Ok(())
}
