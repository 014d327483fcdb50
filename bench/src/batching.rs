//! `--batching-latency 1,10,50`: how long an intent waits for its first
//! attempt, and for its delivery, depending on how many intents the
//! application commits in one transaction. One `outbox-relay run` process
//! at the product's defaults (concurrency, batch_size, poll interval,
//! `webhook.max_in_flight_per_host`) serves the bench's receiver; for each
//! level the application commits `rate` intents a second, that many to a
//! transaction, for `seconds`. Times run from the moment the commit
//! returned to the application to the first attempt's start and to the
//! delivery, both as the relay recorded them (one machine, one clock).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_relay::store::Store;

use crate::receiver::receiver;
use crate::sql::{run_sql, wait_delivered, EMPTY_LOG};

/// What to run.
#[derive(Debug, Clone)]
pub struct BatchingArgs {
    /// Intents per transaction, one level each.
    pub levels: Vec<usize>,
    /// Intents committed per second at every level.
    pub rate: u32,
    pub seconds: u64,
    pub keep: bool,
    /// Another relay build to measure in the same run after this one (an
    /// `outbox-relay` or `outbox-relay-bench` binary), level for level.
    pub compare: Option<std::path::PathBuf>,
}

/// Percentiles of one leg, in milliseconds.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// One level: intents committed `per_transaction` to a transaction.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Level {
    /// The relay build: `this build` or the binary compared.
    pub relay: String,
    pub per_transaction: usize,
    pub intents: usize,
    /// The rate the application actually committed at.
    pub committed_per_s: f64,
    /// From the commit to the first attempt's start.
    pub to_first_attempt: Percentiles,
    /// From the commit to the delivery being recorded.
    pub to_delivered: Percentiles,
    /// Intents claimed more often than attempted: deferred at least once
    /// (destination busy or held back: no attempt spent) or handed back.
    pub deferred: i64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BatchingLatency {
    pub rate: u32,
    pub seconds: u64,
    pub levels: Vec<Level>,
}

pub async fn run(server_url: &str, args: BatchingArgs) -> anyhow::Result<BatchingLatency> {
    crate::scratch::with_database(server_url, "batching", 8, args.keep, |store| {
        measure(store, args)
    })
    .await
}

async fn measure(store: Store, args: BatchingArgs) -> anyhow::Result<BatchingLatency> {
    let (port, _receiver, _seen) = receiver()?;
    let hook = format!("http://127.0.0.1:{port}/hook");
    let url = crate::rounds::store_url(&store);
    let mut builds = vec![("this build".to_string(), std::env::current_exe()?)];
    if let Some(other) = &args.compare {
        builds.push((other.display().to_string(), other.clone()));
    }
    let mut levels = Vec::new();
    for (label, exe) in builds {
        let mut relay = start_relay(&exe, &url)?;
        // idle and listening before the work arrives
        tokio::time::sleep(Duration::from_secs(2)).await;
        if let Some(status) = relay.try_wait()? {
            anyhow::bail!("the bench relay {label} exited at start ({status}); run `outbox-relay run` by hand to see why");
        }
        for &per_tx in &args.levels {
            eprintln!(
                "bench: batching latency ({label}): {} intents/s committed {per_tx} to a transaction for {}s",
                args.rate, args.seconds
            );
            let level = one_level(&store, &hook, per_tx, &args, &label).await?;
            if let Some(status) = relay.try_wait()? {
                anyhow::bail!("the bench relay {label} exited during the run ({status})");
            }
            levels.push(level);
        }
        relay.kill().await.ok();
        let _ = relay.wait().await;
    }
    Ok(BatchingLatency {
        rate: args.rate,
        seconds: args.seconds,
        levels,
    })
}

/// The relay under measurement: `exe` (this binary, or the build compared)
/// as `outbox-relay run` at the product's defaults.
fn start_relay(exe: &std::path::Path, db_url: &str) -> anyhow::Result<tokio::process::Child> {
    let child = crate::relay_process::relay_process(exe, "run", db_url)
        .env("OUTBOX_RELAY__RELAY__NAME", "\"bench-batching\"")
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .env("RUST_LOG", "error")
        .spawn()?;
    Ok(child)
}

async fn one_level(
    store: &Store,
    hook: &str,
    per_tx: usize,
    args: &BatchingArgs,
    relay: &str,
) -> anyhow::Result<Level> {
    let prefix = format!("batch{per_tx}-");
    let transactions = (args.rate as u64 * args.seconds / per_tx as u64).max(1);
    let every = Duration::from_secs_f64(per_tx as f64 / args.rate as f64);
    // the application's own pool, as in its own process
    let app = Store::connect(&crate::rounds::store_url(store), 16).await?;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut commits = Vec::with_capacity(transactions as usize);
    for tx in 0..transactions {
        tick.tick().await;
        let app = app.clone();
        let prefix = prefix.clone();
        let hook = hook.to_string();
        commits.push(tokio::spawn(async move {
            // one statement, committed on its own: `per_tx` calls of
            // outbox.enqueue in one transaction
            sqlx::query(
                "SELECT count(*) FROM (
                    SELECT outbox.enqueue($1 || $2::text || '-' || g, 'webhook',
                           jsonb_build_object('url', $3::text, 'body', jsonb_build_object(
                               'event', 'order.created', 'order', $2::text, 'line', g)))
                      FROM generate_series(1, $4::int) g) e",
            )
            .bind(&prefix)
            .bind(tx.to_string())
            .bind(&hook)
            .bind(per_tx as i32)
            .execute(app.pool())
            .await
            .map(|_| (tx, SystemTime::now()))
        }));
    }
    let mut committed = HashMap::with_capacity(commits.len());
    for c in commits {
        let (tx, at) = c.await??;
        committed.insert(tx.to_string(), epoch_ms(at));
    }
    let committed_per_s = (transactions as usize * per_tx) as f64 / started.elapsed().as_secs_f64();
    app.pool().close().await;
    let n = transactions as usize * per_tx;
    wait_delivered(store, &prefix, n as i64).await?;
    let rows: Vec<(String, f64, f64, bool)> = sqlx::query_as(
        "SELECT split_part(substr(i.key, length($1) + 1), '-', 1),
                (extract(epoch FROM a.first_started) * 1000)::float8,
                (extract(epoch FROM i.delivered_at) * 1000)::float8,
                i.fence > a.attempts
           FROM outbox.intents i
           CROSS JOIN LATERAL (SELECT min(h.started_at) AS first_started, count(*) AS attempts
                                 FROM outbox.attempt_history h WHERE h.intent_id = i.id) a
          WHERE i.key LIKE $1 || '%'",
    )
    .bind(&prefix)
    .fetch_all(store.pool())
    .await?;
    let mut to_attempt = Vec::with_capacity(rows.len());
    let mut to_delivered = Vec::with_capacity(rows.len());
    let mut deferred = 0;
    for (tx, first, delivered, after_deferral) in rows {
        let Some(commit) = committed.get(&tx) else {
            anyhow::bail!("intent of transaction {tx:?} has no commit time");
        };
        to_attempt.push(first - commit);
        to_delivered.push(delivered - commit);
        deferred += i64::from(after_deferral);
    }
    run_sql(store, EMPTY_LOG).await?;
    Ok(Level {
        relay: relay.to_string(),
        per_transaction: per_tx,
        intents: n,
        committed_per_s,
        to_first_attempt: percentiles(&mut to_attempt),
        to_delivered: percentiles(&mut to_delivered),
        deferred,
    })
}

pub(crate) fn epoch_ms(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

/// Nearest-rank percentiles of `values` (sorted in place).
pub(crate) fn percentiles(values: &mut [f64]) -> Percentiles {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if values.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
        values[rank - 1]
    };
    Percentiles {
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        p999_ms: at(0.999),
        max_ms: at(1.0),
    }
}

pub fn print(r: &BatchingLatency) {
    println!(
        "batching latency: {} intents/s for {}s per level, one `outbox-relay run` at its defaults, receiver answering at once",
        r.rate, r.seconds
    );
    println!(
        "{:<14} {:>6} {:>8} {:>9} | {:>27} | {:>27} | {:>8}",
        "relay",
        "per tx",
        "intents",
        "commit/s",
        "to first attempt p50/p99/p99.9",
        "to delivered p50/p99/p99.9",
        "deferred"
    );
    let ms = |p: &Percentiles| format!("{:.1} / {:.1} / {:.1} ms", p.p50_ms, p.p99_ms, p.p999_ms);
    for l in &r.levels {
        println!(
            "{:<14} {:>6} {:>8} {:>9.0} | {:>27} | {:>27} | {:>8}",
            short(&l.relay),
            l.per_transaction,
            l.intents,
            l.committed_per_s,
            ms(&l.to_first_attempt),
            ms(&l.to_delivered),
            l.deferred
        );
    }
    for one in r.levels.iter().filter(|l| l.per_transaction == 1) {
        let others = r
            .levels
            .iter()
            .filter(|l| l.relay == one.relay && l.per_transaction != 1);
        for l in others {
            println!(
                "{}: p99 to first attempt, {} to a transaction over 1: {:.2}×",
                short(&l.relay),
                l.per_transaction,
                l.to_first_attempt.p99_ms / one.to_first_attempt.p99_ms
            );
        }
    }
}

/// A relay's label: its file name when it is a path.
fn short(label: &str) -> &str {
    label.rsplit('/').next().unwrap_or(label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=1000).rev().map(f64::from).collect();
        let p = percentiles(&mut v);
        assert_eq!(p.p50_ms, 500.0);
        assert_eq!(p.p99_ms, 990.0);
        assert_eq!(p.p999_ms, 999.0);
        assert_eq!(p.max_ms, 1000.0);
        assert!(percentiles(&mut []).p50_ms.is_nan());
    }
}
