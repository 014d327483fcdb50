//! `enqueue`, `list`, `show`.

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;

use super::output::{clip, clip_middle, json, opt, table, time};
use super::{Failure, Outcome};
use crate::config::Config;
use crate::kinds::Kind;
use crate::store::operator::{Attempt, Intent, Known, LedgerEntry};
use crate::store::{NewIntent, Store, StoreError, STATES};

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// The intent's idempotency key, e.g. order:42:confirmation.
    #[arg(long)]
    key: String,
    /// webhook, email, charge, nats, amqp or kafka.
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
    /// A W3C traceparent (00-<trace-id>-<parent-id>-<flags>) to store with the
    /// intent; a malformed one is not stored.
    #[arg(long)]
    traceparent: Option<String>,
    /// The W3C tracestate that goes with --traceparent (stored only with a
    /// valid one).
    #[arg(long)]
    tracestate: Option<String>,
    /// Print the result as JSON (id, duplicate).
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
        traceparent: a.traceparent,
        tracestate: a.tracestate,
        ..NewIntent::new(a.key, a.kind, serde_json::Value::Null)
    };
    let r = store.enqueue(&intent).await.map_err(StoreError::from)?;
    if let Some(warning) = kind_warning(store, &intent.kind).await {
        eprintln!("warning: {warning}");
    }
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

/// Why an intent of `kind` will not be delivered as things stand, when it
/// will not: a kind no live relay knows is rejected when claimed, and one
/// they know but none delivers waits. With no live relay, the kinds this
/// build knows are the measure.
async fn kind_warning(store: &Store, kind: &str) -> Option<String> {
    let (known, delivered) = store.live_kinds().await.ok()?;
    kind_verdict(kind, &known, &delivered)
}

fn kind_verdict(kind: &str, known: &[String], delivered: &[String]) -> Option<String> {
    let (known, whose): (Vec<&str>, &str) = if known.is_empty() {
        (Kind::names(), "this relay knows")
    } else {
        (
            known.iter().map(String::as_str).collect(),
            "the live relays know",
        )
    };
    if !known.contains(&kind) {
        let near = known
            .iter()
            .find(|k| edit_distance(k, kind) <= 2)
            .map(|k| format!(" (did you mean {k}?)"))
            .unwrap_or_default();
        return Some(format!(
            "no kind {kind:?}{near}: {whose} {}; a relay will reject this intent when it claims it",
            known.join(", ")
        ));
    }
    if !delivered.is_empty() && !delivered.iter().any(|k| k == kind) {
        return Some(format!(
            "no live relay delivers {kind} intents (they deliver {}); this one waits until one does",
            delivered.join(", ")
        ));
    }
    None
}

/// Levenshtein distance, for "did you mean" on a handful of short names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only intents in this state.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    /// Only intents of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// At most this many intents.
    #[arg(long, default_value_t = 50)]
    limit: i64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn list(store: &Store, a: ListArgs) -> Outcome {
    if a.limit < 1 {
        return Err(Failure::usage("--limit must be at least 1"));
    }
    let rows: Vec<_> = store
        .list(a.state.as_deref(), a.kind.as_deref(), a.limit)
        .await?
        .into_iter()
        .map(shown)
        .collect();
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

/// `intent` with its webhook's URL and its last error as every shown URL
/// is shown (`outbox_providers::redact`), an error written before the rule
/// included.
fn shown(mut intent: Intent) -> Intent {
    if Kind::parse(&intent.kind) == Some(Kind::Webhook) {
        if let Some(serde_json::Value::String(url)) = intent.payload.0.get_mut("url") {
            *url = outbox_providers::redact::urls_in(url);
        }
    }
    intent.last_error = intent
        .last_error
        .map(|e| outbox_providers::redact::urls_in(&e));
    intent
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// An intent id or key; `id:N` or `key:K` says which (a number that is
    /// one intent's id and another's key is refused).
    reference: String,
    /// Print JSON instead of text.
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
                print_ledger_entry(&entry);
            }
            return Ok(());
        }
    };
    let intent = shown(intent);
    let attempts = store.attempts(intent.id).await?;
    let actions = store.actions(intent.id).await?;
    // an event: which subscriptions got it, and when
    let deliveries = match crate::kinds::Kind::parse(&intent.kind) {
        Some(crate::kinds::Kind::Event) => Some(
            store
                .event_deliveries(intent.id)
                .await
                .map_err(crate::store::StoreError::from)?,
        ),
        _ => None,
    };
    if a.json {
        let mut shown = json!({"source": "live", "intent": intent, "attempts": attempts, "operator_actions": actions});
        if let Some(d) = &deliveries {
            shown["deliveries"] = json!(d);
        }
        json(&shown);
        return Ok(());
    }
    print_intent(&intent);
    println!();
    print_attempts(&attempts);
    if let Some(d) = &deliveries {
        println!();
        print_deliveries(d);
    }
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

/// An event's deliveries, one line per subscription.
fn print_deliveries(deliveries: &[crate::store::subscriptions::EventDelivery]) {
    if deliveries.is_empty() {
        println!("deliveries: none (no subscription matched when it was expanded)");
        return;
    }
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|d| {
            vec![
                d.subscription_id.clone(),
                d.intent_id.to_string(),
                d.state.clone().unwrap_or_else(|| "purged".into()),
                opt(d.attempts),
                opt(d.delivered_at.map(time)),
                clip(d.last_error.as_deref().unwrap_or(""), 50),
            ]
        })
        .collect();
    table(
        &[
            "SUBSCRIPTION",
            "DELIVERY",
            "STATE",
            "ATTEMPTS",
            "DELIVERED",
            "LAST ERROR",
        ],
        &rows,
    );
}

/// A purged intent, as the ledger remembers it.
fn print_ledger_entry(entry: &LedgerEntry) {
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
    match entry.effect() {
        Some(at) if entry.happened_anyway() => println!(
            "{:<15} happened at {}, although the intent ended {}: a provider answered success to one of its attempts",
            "effect",
            time(at),
            entry.state
        ),
        Some(at) => println!("{:<15} happened at {}", "effect", time(at)),
        None => println!("{:<15} none known", "effect"),
    }
    println!("\n(purged: answered from the ledger; the payload and attempts are gone)");
}

/// A live intent's fields, and an effect that happened although it did
/// not end delivered.
fn print_intent(intent: &Intent) {
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
        (
            "trace",
            match &intent.traceparent {
                Some(parent) => format!("{} (traceparent {parent})", intent.trace_id()),
                None => format!("{} (derived from the key)", intent.trace_id()),
            },
        ),
        ("created", time(intent.created_at)),
        ("updated", time(intent.updated_at)),
        ("delivered", opt(intent.delivered_at.map(time))),
    ];
    for (name, value) in fields {
        println!("{name:<15} {value}");
    }
    if let Some(at) = intent.effect_at.filter(|_| intent.happened_anyway()) {
        let why = if intent.effect_accepted == Some(true) {
            format!(
                "it was delivered (the accepted delivered attempt below), then an operator retried it and it became {}",
                intent.state
            )
        } else {
            format!(
                "a provider answered success to a request in flight when it became {} (the delivered attempt below, not accepted)",
                intent.state
            )
        };
        println!(
            "{:<15} happened at {}, although the intent is {}: {why}",
            "effect",
            time(at),
            intent.state,
        );
    }
}

/// An intent's attempts, as a table.
fn print_attempts(attempts: &[Attempt]) {
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
}

#[derive(Debug, Args)]
pub struct SchedulesArgs {
    /// How many upcoming fire times to show.
    #[arg(long, default_value_t = 3)]
    next: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn schedules(store: &Store, config: &Config, a: SchedulesArgs) -> Outcome {
    let schedules = config
        .schedules()
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let watermarks = store.schedule_watermarks().await.unwrap_or_default();
    let now = Utc::now();
    let mut rows: Vec<serde_json::Value> = Vec::new();
    // relays that run another configuration of a schedule than this file's
    let mut disagreements: Vec<String> = Vec::new();
    for s in &schedules {
        let last = watermarks
            .iter()
            .find(|(n, _)| *n == s.name)
            .map(|(_, t)| *t);
        let live = store
            .schedule_configs(&s.name, now)
            .await
            .unwrap_or_default();
        let mine = s.fingerprint();
        let others: Vec<&_> = live.iter().filter(|c| c.fingerprint != mine).collect();
        if !others.is_empty() {
            let winner = &live[0];
            let verdict = if winner.fingerprint == mine {
                "this file's".to_string()
            } else {
                format!("not this file's {} [{mine}]", s.definition())
            };
            disagreements.push(format!(
                "schedule {}: relays run {} configuration(s); the newest wins: {} [{}], {verdict}",
                s.name,
                live.len(),
                winner.definition,
                winner.fingerprint,
            ));
        }
        rows.push(json!({
            "name": s.name, "cron": s.expression, "kind": s.kind, "destination": s.destination,
            "catch_up": s.catch_up, "last_tick": last,
            "next": s.upcoming(now, a.next),
            "fingerprint": mine,
            "winning": live.first().map(|c| c.fingerprint.clone()),
            "configurations": live.iter().map(|c| json!({
                "fingerprint": c.fingerprint, "definition": c.definition,
                "seen_by": c.seen_by, "first_seen": c.first_seen,
            })).collect::<Vec<_>>(),
        }));
    }
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
    for line in &disagreements {
        println!("! {line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{edit_distance, kind_verdict};

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_misspelt_kind_is_named_with_its_nearest_known_kind() {
        let w = kind_verdict("emial", &[], &[]).expect("a warning");
        assert!(w.contains("did you mean email?"), "{w}");
        assert!(w.contains("this relay knows webhook, email"), "{w}");
        let w = kind_verdict("fax", &v(&["email", "webhook"]), &v(&["webhook"])).unwrap();
        assert!(
            w.starts_with("no kind \"fax\": the live relays know email, webhook"),
            "{w}"
        );
    }

    #[test]
    fn a_known_kind_no_live_relay_delivers_is_said_to_wait() {
        let w = kind_verdict("email", &v(&["email", "webhook"]), &v(&["webhook"])).unwrap();
        assert!(w.contains("no live relay delivers email"), "{w}");
        assert_eq!(
            kind_verdict("webhook", &v(&["email", "webhook"]), &v(&["webhook"])),
            None
        );
        assert_eq!(kind_verdict("email", &[], &[]), None);
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        for (a, b, d) in [
            ("email", "emial", 2),
            ("email", "email", 0),
            ("", "abc", 3),
            ("nats", "nat", 1),
            ("amqp", "kafka", 4),
        ] {
            assert_eq!(edit_distance(a, b), d, "{a} {b}");
        }
    }
}
