//! `retry`, `cancel`, `resolve`, `stats`, `purge`.
//!
//! Every change an operator makes is logged once at info level (the action,
//! which intent or how many, the new state), besides being recorded in
//! `outbox.operator_actions`; payloads and reasons are not logged.

use std::io::IsTerminal;

use clap::Args;
use serde_json::json;

use super::output::{json, opt, table};
use super::{Failure, Outcome};
use crate::store::operator::{Filter, Resolution, RetryOptions, RESEND_DELIVERED};
use crate::store::{IntentState, Store, STATES};

#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Intent ids or keys.
    #[arg(conflicts_with = "state", required_unless_present = "state")]
    references: Vec<String>,
    /// Retry every intent in this state instead.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(STATES))]
    state: Option<String>,
    /// With --state: only this kind.
    #[arg(long, requires = "state")]
    kind: Option<String>,
    /// Say what would be retried, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Perform the effect again as a NEW operation (bumps the key
    /// generation, so the provider will not dedupe it against the old one),
    /// e.g. to charge again after a decline. Recorded.
    #[arg(long)]
    new_effect: bool,
    /// Re-send delivered intents too. Under the same key a provider that
    /// dedupes replays its first answer; one that does not (and any, with
    /// --new-effect) performs the effect again.
    #[arg(long)]
    force: bool,
    /// Print JSON: what was changed, skipped or would be.
    #[arg(long)]
    json: bool,
}

pub async fn retry(store: &Store, a: RetryArgs) -> Outcome {
    let how = RetryOptions {
        new_effect: a.new_effect,
        force: a.force,
    };
    match &a.state {
        Some(state) => retry_by_state(store, &a, how, state).await,
        None => retry_each(store, &a, how).await,
    }
}

/// `retry --state S [--kind K]`: the intents counted, and only those.
async fn retry_by_state(store: &Store, a: &RetryArgs, how: RetryOptions, state: &str) -> Outcome {
    let filter = Filter {
        // clap accepts only the state names; a usage error all the same
        state: IntentState::parse(state)
            .ok_or_else(|| Failure::usage(format!("--state {state:?} is not a state")))?,
        kind: a.kind.clone(),
    };
    let total = store.count_matching(&filter).await?;
    let needs_force = filter.state == IntentState::Delivered && !a.force;
    if a.dry_run {
        if a.json {
            json(&json!({
                "would_retry": if needs_force { 0 } else { total },
                "matched": total, "needs_force": needs_force, "dry_run": true,
            }));
        } else if needs_force {
            println!("{total} delivered intent(s) match; retrying them needs --force (dry run)");
        } else {
            println!("would retry {total} {} intent(s) (dry run)", filter.state);
        }
        return Ok(());
    }
    if needs_force {
        return Err(Failure::new(
            4,
            format!(
                "{total} delivered intent(s) match: for each, {}",
                RESEND_DELIVERED.replace("re-send it", "re-send them")
            ),
        ));
    }
    // the intents counted are the only ones retried: one that joins the
    // filter while the retry runs is left for the next run
    let ids = store.select_matching(&filter, how).await?;
    let total = ids.len();
    let tty = std::io::stderr().is_terminal();
    let done = store
        .retry_selected(&filter, &ids, how, 1000, |done| {
            if tty {
                eprint!("\rretrying: {done}/{total}");
            } else {
                eprintln!("retrying: {done}/{total}");
            }
        })
        .await?;
    if tty {
        eprintln!();
    }
    let skipped = total as u64 - done;
    tracing::info!(
        action = "retry",
        count = done,
        skipped,
        from = %filter.state,
        kind = filter.kind.as_deref().unwrap_or("any"),
        state = %IntentState::Pending,
        new_effect = a.new_effect,
        force = a.force,
        "operator retry: {done} intent(s)"
    );
    if a.json {
        json(&json!({"retried": done, "skipped": skipped, "new_effect": a.new_effect}));
    } else {
        println!(
            "retried {done} intent(s){}",
            if a.new_effect { " as new effects" } else { "" }
        );
        if skipped > 0 {
            println!("skipped {skipped} that left the filter after they were counted");
        }
    }
    Ok(())
}

/// `retry REF...`: each intent named.
async fn retry_each(store: &Store, a: &RetryArgs, how: RetryOptions) -> Outcome {
    let mut results = Vec::new();
    let mut first_error = None;
    for r in &a.references {
        if a.dry_run {
            match store.find(r).await {
                Ok(i) => {
                    let needs_force = i.state == IntentState::Delivered && !a.force;
                    let would = i.state != IntentState::Claimed && !needs_force;
                    results.push(json!({"id": i.id, "key": i.key, "state": i.state,
                                        "would_retry": would, "needs_force": needs_force}));
                }
                Err(e) => first_error = first_error.or(Some(Failure::from(e))),
            }
            continue;
        }
        match store.retry(r, how).await {
            Ok(i) => {
                tracing::info!(
                    action = "retry",
                    intent = i.id,
                    key = %i.key,
                    state = %i.state,
                    new_effect = a.new_effect,
                    force = a.force,
                    "operator retry"
                );
                results.push(json!({"id": i.id, "key": i.key, "state": i.state, "key_generation": i.key_generation}));
            }
            Err(e) => {
                eprintln!("error: {e}");
                first_error = first_error.or(Some(Failure::from(e)));
            }
        }
    }
    if a.json {
        json(&results);
    } else {
        for r in &results {
            let (id, key, state) = (
                &r["id"],
                r["key"].as_str().unwrap_or(""),
                r["state"].as_str().unwrap_or(""),
            );
            if !a.dry_run {
                println!("retried intent {id} ({key}): now {state}");
            } else if r["would_retry"] == true {
                println!("would retry intent {id} ({key}): now {state}");
            } else if r["needs_force"] == true {
                println!("would not retry intent {id} ({key}): it is delivered, and re-sending it needs --force");
            } else {
                println!(
                    "would not retry intent {id} ({key}): it is {state} (a delivery is in flight)"
                );
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Intent ids or keys.
    #[arg(required = true)]
    references: Vec<String>,
    /// Print JSON: what was cancelled and what was not.
    #[arg(long)]
    json: bool,
}

pub async fn cancel(store: &Store, a: CancelArgs) -> Outcome {
    let mut results = Vec::new();
    let mut first_error = None;
    for r in &a.references {
        match store.cancel(r).await {
            Ok(i) => {
                tracing::info!(action = "cancel", intent = i.id, key = %i.key, state = %i.state, "operator cancel");
                results.push(json!({"id": i.id, "key": i.key, "state": i.state}));
            }
            Err(e) => {
                eprintln!("error: {e}");
                first_error = first_error.or(Some(Failure::from(e)));
            }
        }
    }
    if a.json {
        json(&results);
    } else {
        for r in &results {
            println!(
                "cancelled intent {} ({})",
                r["id"],
                r["key"].as_str().unwrap_or("")
            );
        }
    }
    first_error.map_or(Ok(()), Err)
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["delivered", "redeliver", "reject"])))]
pub struct ResolveArgs {
    /// An intent id or key; `id:N` or `key:K` says which (a number that is
    /// one intent's id and another's key is refused).
    reference: String,
    /// The effect did happen (you checked at the provider).
    #[arg(long)]
    delivered: bool,
    /// With --delivered: the provider's reference for the effect.
    #[arg(long = "ref", requires = "delivered")]
    reference_at_provider: Option<String>,
    /// Deliver again under the same idempotency key.
    #[arg(long)]
    redeliver: bool,
    /// It must not happen: reject with this reason.
    #[arg(long, value_name = "REASON")]
    reject: Option<String>,
    /// Print JSON: the intent as settled.
    #[arg(long)]
    json: bool,
}

pub async fn resolve(store: &Store, a: ResolveArgs) -> Outcome {
    let how = if a.delivered {
        Resolution::Delivered {
            reference: a.reference_at_provider,
        }
    } else if a.redeliver {
        Resolution::Redeliver
    } else {
        let reason = a.reject.unwrap_or_default();
        if reason.trim().is_empty() {
            return Err(Failure::usage("--reject needs a reason"));
        }
        Resolution::Reject { reason }
    };
    let i = store.resolve(&a.reference, &how).await?;
    let resolution = match how {
        Resolution::Delivered { .. } => "delivered",
        Resolution::Redeliver => "redeliver",
        Resolution::Reject { .. } => "reject",
    };
    tracing::info!(
        action = "resolve",
        resolution,
        intent = i.id,
        key = %i.key,
        state = %i.state,
        "operator resolve"
    );
    if a.json {
        json(&json!({"id": i.id, "key": i.key, "state": i.state, "provider_ref": i.provider_ref}));
    } else {
        println!("intent {} ({}) is now {}", i.id, i.key, i.state);
    }
    Ok(())
}

pub async fn stats(store: &Store, as_json: bool) -> Outcome {
    let s = store.stats().await?;
    if as_json {
        json(&s);
        return Ok(());
    }
    let mut kinds: Vec<&str> = s.by_state.iter().map(|r| r.kind.as_str()).collect();
    kinds.dedup();
    let rows: Vec<Vec<String>> = kinds
        .iter()
        .map(|k| {
            let mut row = vec![k.to_string()];
            for st in STATES {
                let n = s
                    .by_state
                    .iter()
                    .find(|r| r.kind == *k && r.state.as_sql() == st)
                    .map_or(0, |r| r.count);
                row.push(n.to_string());
            }
            let due = s.due.iter().find(|d| d.kind == *k);
            row.push(due.map_or(0, |d| d.due).to_string());
            row.push(opt(due.map(|d| format!("{:.1}s", d.oldest_due_seconds))));
            row
        })
        .collect();
    let mut header = vec!["KIND"];
    header.extend(STATES.iter().copied());
    header.extend(["DUE", "OLDEST DUE"]);
    let header: Vec<String> = header.iter().map(|h| h.to_uppercase()).collect();
    table(
        &header.iter().map(String::as_str).collect::<Vec<_>>(),
        &rows,
    );
    println!();
    println!("expired leases awaiting the sweeper: {}", s.expired_leases);
    println!(
        "duplicate enqueues (all time):       {}",
        s.duplicate_enqueues
    );
    println!(
        "ordering keys blocked by a dead or ambiguous head: {}",
        s.blocked_ordering_keys
    );
    println!(
        "intents waiting with nothing live ahead (the next sweep promotes them): {}",
        s.stranded_ordering_intents
    );
    println!(
        "purged keys remembered by the ledger: {}{}",
        if s.ledger_keys_estimated {
            "about "
        } else {
            ""
        },
        s.ledger_keys
    );
    for u in &s.unserved_kinds {
        let why = if u.known_by.is_empty() {
            "no live relay knows this kind; a relay that does not know it rejects it as unknown"
                .to_string()
        } else {
            format!(
                "known to {} but no live relay is configured for it",
                u.known_by.join(", ")
            )
        };
        println!("waiting: {} pending {} intent(s): {why}", u.pending, u.kind);
    }
    if let Some(longest) = s
        .standby_waits
        .iter()
        .map(|w| w.behind_seconds)
        .reduce(f64::max)
    {
        // while held up a relay claims nothing: every due intent waits too
        let due: i64 = s.due.iter().map(|d| d.due).sum();
        let claimed: i64 = s.standby_waits.iter().map(|w| i64::from(w.waiting)).sum();
        println!(
            "held back: {} intent(s) wait for the standbys (relay.wait_for_standbys): \
             {due} due and not claimed, {claimed} claimed; held up for {longest:.0}s",
            due + claimed
        );
    }
    for w in &s.standby_waits {
        println!("waiting: {}", w.describe());
    }
    // what makes vacuum keep dead rows, once it has for a minute or 100,000
    // transactions (production.md, long transactions and replication slots)
    let held: Vec<String> = s
        .xmin_horizon
        .iter()
        .filter(|h| h.age_seconds.is_some_and(|s| s >= 60.0) || h.age_transactions >= 100_000)
        .map(|h| h.describe())
        .collect();
    if !held.is_empty() {
        println!("xmin horizon held back by: {}", held.join("; "));
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// Delete delivered, rejected and cancelled intents last changed longer
    /// ago than this ("30d", "12h", "0s").
    #[arg(long, value_parser = crate::config::parse_duration)]
    older_than: std::time::Duration,
    /// Also delete dead intents.
    #[arg(long)]
    include_dead: bool,
    /// Count, delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON: what was (or would be) purged.
    #[arg(long)]
    json: bool,
}

pub async fn purge(store: &Store, a: PurgeArgs) -> Outcome {
    let n = store
        .purge(a.older_than, a.include_dead, a.dry_run, 1000)
        .await?;
    if !a.dry_run {
        tracing::info!(
            action = "purge",
            count = n,
            older_than = %humantime::format_duration(a.older_than),
            include_dead = a.include_dead,
            state = "purged (kept in the ledger)",
            "operator purge: {n} intent(s)"
        );
    }
    if a.json {
        json(&json!({"purged": if a.dry_run { 0 } else { n }, "matched": n, "dry_run": a.dry_run}));
    } else if a.dry_run {
        println!("would purge {n} intent(s) (dry run)");
    } else {
        println!("purged {n} intent(s)");
    }
    Ok(())
}
