//! `--drain-rounds N`: only the relay's webhook drain, N times: one
//! `outbox-relay run` process, the receiver answering at once, as beside
//! the peers. Each round reports its drain rate and what it cost per
//! intent: the machine's CPU, the relay process's, the Postgres server's
//! and the WAL it wrote, and, where the server loads `pg_stat_statements`,
//! the statements' own execution time. Alternating rounds of two builds
//! (`bench/compare-builds.sh`) compare forms of the storage.

use std::time::Duration;

use outbox_relay::store::Store;
use sqlx::ConnectOptions;

use crate::bench::BenchArgs;
use crate::drains::scale_out_drain;
use crate::receiver::receiver;
use crate::report::ScaleOut;
use crate::sql::run_sql;

/// One statement's share of a round (`pg_stat_statements`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StatementCost {
    /// The statement's first 200 characters, whitespace folded.
    pub statement: String,
    pub calls: i64,
    /// How many times it was planned (counted only where the server sets
    /// `pg_stat_statements.track_planning`): as many as its calls when
    /// Postgres plans it afresh each time.
    pub plans: i64,
    /// Rows it returned or changed, per call.
    pub rows_per_call: f64,
    /// Its execution time, microseconds per intent drained.
    pub exec_us_per_intent: f64,
    /// Its planning time, microseconds per intent drained.
    pub plan_us_per_intent: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Round {
    #[serde(flatten)]
    pub drain: ScaleOut,
    /// The costliest statements of the round (empty without
    /// `pg_stat_statements`).
    pub statements: Vec<StatementCost>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DrainRounds {
    pub intents: usize,
    pub in_flight: usize,
    pub batch_size: u32,
    pub rounds: Vec<Round>,
}

pub async fn run(
    server_url: &str,
    args: &BenchArgs,
    rounds: usize,
    setup_sql: Option<&str>,
) -> anyhow::Result<DrainRounds> {
    let connections = (args.in_flight as u32 / 4).max(4) + 4;
    crate::scratch::with_database(server_url, "rounds", connections, args.keep, |store| {
        drain_rounds(store, args, rounds, setup_sql)
    })
    .await
}

async fn drain_rounds(
    store: Store,
    args: &BenchArgs,
    rounds: usize,
    setup_sql: Option<&str>,
) -> anyhow::Result<DrainRounds> {
    if let Some(sql) = setup_sql {
        sqlx::raw_sql(sql)
            .execute(store.pool())
            .await
            .map_err(|e| anyhow::anyhow!("--setup-sql: {e}"))?;
    }
    let (port, _receiver, seen) = receiver()?;
    let hook = format!("http://127.0.0.1:{port}/hook");
    let url = store_url(&store);
    let tracked = run_sql(&store, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .await
        .is_ok()
        && reset_statements(&store).await;
    let mut out = Vec::new();
    for r in 1..=rounds {
        eprintln!(
            "bench: drain round {r} of {rounds}: {} webhooks, one relay process, {} in flight",
            args.intents, args.in_flight
        );
        if tracked {
            reset_statements(&store).await;
        }
        let drain = scale_out_drain(&store, args, &url, &hook, 1, &seen, None).await?;
        anyhow::ensure!(
            drain.duplicate_requests == 0,
            "round {r}: {} requests arrived twice",
            drain.duplicate_requests
        );
        let statements = if tracked {
            statement_costs(&store, args.intents).await?
        } else {
            Vec::new()
        };
        out.push(Round { drain, statements });
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(DrainRounds {
        intents: args.intents,
        in_flight: args.in_flight,
        batch_size: args.relay_batch_size,
        rounds: out,
    })
}

/// The URL the bench's relays connect with: the store's own.
pub(crate) fn store_url(store: &Store) -> String {
    let options = store.pool().connect_options();
    options.to_url_lossy().to_string()
}

/// Zero `pg_stat_statements`; false when the server does not load it.
async fn reset_statements(store: &Store) -> bool {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(store.pool())
        .await
        .is_ok()
}

/// The ten statements of this database that took longest since the reset.
async fn statement_costs(store: &Store, intents: usize) -> anyhow::Result<Vec<StatementCost>> {
    let rows: Vec<(String, i64, i64, i64, f64, f64)> = sqlx::query_as(
        "SELECT regexp_replace(left(query, 200), '\\s+', ' ', 'g'), calls, plans, rows,
                total_exec_time, total_plan_time
           FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          ORDER BY total_exec_time + total_plan_time DESC LIMIT 10",
    )
    .fetch_all(store.pool())
    .await?;
    let per = |ms: f64| ms * 1e3 / intents as f64;
    Ok(rows
        .into_iter()
        .map(
            |(statement, calls, plans, rows, exec, plan)| StatementCost {
                statement,
                calls,
                plans,
                rows_per_call: rows as f64 / calls.max(1) as f64,
                exec_us_per_intent: per(exec),
                plan_us_per_intent: per(plan),
            },
        )
        .collect())
}

pub fn print(r: &DrainRounds) {
    println!(
        "drain rounds: {} webhooks each, one `outbox-relay run` process, {} in flight, batch_size {}, receiver answering at once",
        r.intents, r.in_flight, r.batch_size
    );
    println!(
        "{:>5} {:>9} {:>11} {:>9} {:>10} {:>9} {:>6}",
        "round", "drain/s", "machine", "relay", "Postgres", "WAL", "busy"
    );
    for (i, round) in r.rounds.iter().enumerate() {
        let d = &round.drain;
        let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} µs"));
        let c = d.cpu.as_ref();
        println!(
            "{:>5} {:>9.0} {:>11} {:>9} {:>10} {:>9} {:>6}",
            i + 1,
            d.drain_per_s,
            us(c.map(|c| c.machine_us_per_job)),
            us(c.and_then(|c| c.relay_us_per_job)),
            us(c.and_then(|c| c.postgres_us_per_job)),
            c.and_then(|c| c.wal_bytes_per_job)
                .map_or("-".into(), |b| format!("{b:.0} B")),
            c.map_or("-".into(), |c| format!("{:.0}%", c.busy_share * 100.0)),
        );
    }
    println!("(per intent drained: machine, all processes; relay, its process; Postgres, the server's processes; WAL, what the server wrote)");
    for (i, round) in r.rounds.iter().enumerate() {
        let Some(roles) = round
            .drain
            .cpu
            .as_ref()
            .and_then(|c| c.postgres_us_by_role.as_ref())
        else {
            continue;
        };
        let parts: Vec<String> = roles
            .iter()
            .map(|(role, us)| format!("{role} {us:.1} µs"))
            .collect();
        println!(
            "round {}: Postgres by process, per intent: {}",
            i + 1,
            parts.join(", ")
        );
    }
    for (i, round) in r.rounds.iter().enumerate() {
        if round.statements.is_empty() {
            continue;
        }
        println!(
            "round {}: statements by execution time (pg_stat_statements), per intent",
            i + 1
        );
        for s in &round.statements {
            println!(
                "  {:>6.1} µs exec {:>5.1} µs plan {:>7} calls {:>7} plans {:>6.1} rows/call  {}",
                s.exec_us_per_intent,
                s.plan_us_per_intent,
                s.calls,
                s.plans,
                s.rows_per_call,
                s.statement.chars().take(90).collect::<String>()
            );
        }
    }
}
