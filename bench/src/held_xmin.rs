//! `--held-xmin SECONDS`: what a long transaction on the relay's database
//! costs the relay. One `outbox-relay run` process at the product's
//! defaults serves the bench's receiver while the application commits
//! `rate` intents a second, one to a transaction, for SECONDS; twice, each
//! in a fresh scratch database: plainly, and with a `REPEATABLE READ`
//! transaction on a connection of its own that took its snapshot (a read
//! of `outbox.intents`) before the relay started and stays open until the
//! run's figures are read, then rolls back. While it is open, no row
//! version that died after its snapshot can be removed, neither by
//! `VACUUM` nor by the pruning of a page in passing, and no index entry
//! pointing at one can be marked dead: every claim and completion of an
//! intent leaves a version, and index entries, that later claims step
//! over. Optionally `backlog` pending intents are loaded before each run
//! (before the snapshot and the relay).
//!
//! Per run: commit to delivered of the intents that arrived (p50, p99,
//! max, and of their last fifth; the delivery as the relay recorded it,
//! the commit as it returned to the application: one machine, one clock),
//! the intents delivered, the open (pending or claimed) intents when the
//! arrivals stopped and the most seen by a once-a-second sample, the
//! oldest transaction in the scratch database at those samples
//! (`age(backend_xmin)`, its age in seconds and who held it); each `outbox`
//! table's `n_dead_tup`, `n_live_tup` and (HOT) updates from
//! `pg_stat_user_tables` after the relay has stopped (its backends flush
//! their statistics as they exit) and a short wait, its size and, where the
//! server has `pgstattuple`, the dead versions still in its heap; and what
//! a claim of 100 on the then empty queue reads (`EXPLAIN (ANALYZE,
//! BUFFERS)`, the held transaction still open). Then held against plain:
//! the p99's ratio, against the targets at most 2× and under 1 s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use outbox_relay::store::Store;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::batching::{epoch_ms, percentiles, Percentiles};
use crate::receiver::receiver;
use crate::sql::{enqueue_many_statements, wait_delivered};

/// The targets: held p99 at most this many times the plain one ...
const TARGET_RATIO: f64 = 2.0;
/// ... and under this, in ms.
const TARGET_P99_MS: f64 = 1_000.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct HeldXminArgs {
    /// How long the intents arrive, each run.
    pub seconds: u64,
    /// Intents committed per second, one to a transaction.
    pub rate: u32,
    /// Pending intents loaded before each run.
    pub backlog: u64,
    pub keep: bool,
}

/// One `outbox` table at the end of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TableStats {
    pub table: String,
    pub n_live_tup: i64,
    pub n_dead_tup: i64,
    pub n_tup_upd: i64,
    /// Of those, the updates that wrote no index entry.
    pub n_tup_hot_upd: i64,
    /// `pg_total_relation_size`: the heap, its indexes and TOAST.
    pub bytes: i64,
    /// Dead row versions still taking room in the heap (`pgstattuple`'s
    /// `dead_tuple_count`, before the held transaction ends), where the
    /// server has the extension: `n_dead_tup` counts versions made dead
    /// until a `VACUUM`, whether pruning could free them or not.
    pub dead_present: Option<i64>,
}

/// One run: plain, or beside the held transaction.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Run {
    pub held: bool,
    /// Intents committed while the run lasted.
    pub arrivals: usize,
    /// The rate the application actually committed at.
    pub committed_per_s: f64,
    /// Intents delivered, the backlog included.
    pub delivered: i64,
    /// From the commit of each arrival to its delivery.
    pub to_delivered: Percentiles,
    /// The same for the last fifth of the arrivals.
    pub to_delivered_last_fifth: Percentiles,
    /// Intents claimed more often than attempted: deferred at least once
    /// (destination busy: no attempt spent) or handed back.
    pub deferred: i64,
    /// Intents open (pending or claimed) when the arrivals stopped.
    pub open_at_end: i64,
    /// The most open at a once-a-second sample.
    pub open_max: i64,
    /// From the arrivals' end until every intent was delivered.
    pub drained_after_s: f64,
    /// Whether the drain kept up: less than a second of arrivals open at
    /// their end.
    pub kept_up: bool,
    /// The oldest transaction in the scratch database at the samples:
    /// `max(age(backend_xmin))`, in transaction ids ...
    pub oldest_xmin_age: i64,
    /// ... and the longest-running one holding an xmin, in seconds.
    pub oldest_xact_s: f64,
    /// Who held the oldest xmin at the sample that saw it oldest: its
    /// application name, state and statement.
    pub oldest_xmin_by: Option<String>,
    /// A claim of 100 on the empty queue after the run (the relay
    /// stopped, the held transaction still open), `EXPLAIN (ANALYZE,
    /// BUFFERS)`: the buffers it touched ...
    pub claim_buffers_at_end: u64,
    /// ... and its execution time, in ms.
    pub claim_ms_at_end: f64,
    /// Every table in schema `outbox`, by name.
    pub tables: Vec<TableStats>,
}

/// Held against plain.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// Held p99 over plain p99.
    pub p99_ratio: f64,
    /// The ratio at most 2×.
    pub within_ratio: bool,
    /// Held p99 under 1 s.
    pub under_limit: bool,
    pub met: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct HeldXmin {
    pub rate: u32,
    pub seconds: u64,
    pub backlog: u64,
    /// Plain, then held.
    pub runs: Vec<Run>,
    pub verdict: Verdict,
}

pub async fn run(server_url: &str, args: HeldXminArgs) -> anyhow::Result<HeldXmin> {
    let (port, _receiver, _seen) = receiver()?;
    let hook = format!("http://127.0.0.1:{port}/hook");
    let mut runs = Vec::with_capacity(2);
    for held in [false, true] {
        let what = if held { "xmin_held" } else { "xmin_plain" };
        eprintln!(
            "bench: held xmin ({}): {} intents/s for {}s{}",
            if held {
                "a REPEATABLE READ transaction held open"
            } else {
                "plain"
            },
            args.rate,
            args.seconds,
            loaded_before(args.backlog)
        );
        let hook = hook.clone();
        let a = args.clone();
        let run = crate::scratch::with_database(server_url, what, 8, args.keep, |store| {
            one_run(store, hook, a, held)
        })
        .await?;
        runs.push(run);
    }
    let verdict = verdict(&runs[0].to_delivered, &runs[1].to_delivered);
    Ok(HeldXmin {
        rate: args.rate,
        seconds: args.seconds,
        backlog: args.backlog,
        runs,
        verdict,
    })
}

/// Held against plain, on the targets.
pub fn verdict(plain: &Percentiles, held: &Percentiles) -> Verdict {
    let p99_ratio = held.p99_ms / plain.p99_ms;
    let within_ratio = p99_ratio <= TARGET_RATIO;
    let under_limit = held.p99_ms < TARGET_P99_MS;
    Verdict {
        p99_ratio,
        within_ratio,
        under_limit,
        met: within_ratio && under_limit,
    }
}

/// The drain kept up when less than a second of arrivals was open as they
/// stopped.
pub fn kept_up(open_at_end: i64, rate: u32) -> bool {
    open_at_end < i64::from(rate)
}

/// What the once-a-second samples saw.
#[derive(Debug, Default, Clone)]
struct Samples {
    open_max: i64,
    oldest_xmin_age: i64,
    oldest_xact_s: f64,
    oldest_xmin_by: Option<String>,
}

/// The buffers (shared hit + read) of a plan's top node and its execution
/// time in ms, from `EXPLAIN (ANALYZE, BUFFERS)` lines.
pub fn plan_cost(plan: &[String]) -> (u64, f64) {
    let number = |line: &str, after: &str| -> Option<f64> {
        let at = line.find(after)? + after.len();
        line[at..]
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()?
            .parse()
            .ok()
    };
    let buffers = plan
        .iter()
        .find(|l| l.trim_start().starts_with("Buffers: shared"))
        .map_or(0, |l| {
            (number(l, "hit=").unwrap_or(0.0) + number(l, "read=").unwrap_or(0.0)) as u64
        });
    let ms = plan
        .iter()
        .find_map(|l| number(l, "Execution Time: "))
        .unwrap_or(f64::NAN);
    (buffers, ms)
}

async fn one_run(
    store: Store,
    hook: String,
    args: HeldXminArgs,
    held: bool,
) -> anyhow::Result<Run> {
    let url = crate::rounds::store_url(&store);
    let payload =
        |j: usize| serde_json::json!({"url": hook, "body": {"event": "order.created", "order": j}});
    if args.backlog > 0 {
        enqueue_many_statements(&store, args.backlog as usize, 1_000, "backlog", &payload).await?;
    }
    // the long transaction: its snapshot taken before the relay starts
    let mut holder = if held {
        let options: PgConnectOptions = url.parse()?;
        let mut conn = options
            .application_name("bench-held-xmin")
            .connect()
            .await?;
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            .await?;
        let _: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.intents")
            .fetch_one(&mut conn)
            .await?;
        Some(conn)
    } else {
        None
    };
    let mut relay = crate::relay_process::relay_process(&std::env::current_exe()?, "run", &url)
        .env("OUTBOX_RELAY__RELAY__NAME", "\"bench-held-xmin\"")
        .env("OUTBOX_RELAY__RELAY__METRICS_ADDR", "\"127.0.0.1:0\"")
        .env("RUST_LOG", "error")
        .spawn()?;
    // idle and listening before the arrivals start
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(status) = relay.try_wait()? {
        anyhow::bail!(
            "the bench relay exited at start ({status}); run `outbox-relay run` by hand to see why"
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample(store.clone(), stop.clone()));
    let (committed, committed_per_s) = arrivals(&url, &hook, &args).await?;
    let arrived = Instant::now();
    let open_at_end = open(&store).await?;
    let total = committed.len() as i64 + args.backlog as i64;
    wait_delivered(&store, "", total).await?;
    let drained_after_s = arrived.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await??;
    if let Some(status) = relay.try_wait()? {
        anyhow::bail!("the bench relay exited during the run ({status})");
    }

    let rows: Vec<(String, f64)> = sqlx::query_as(
        "SELECT substr(key, 5), (extract(epoch FROM delivered_at) * 1000)::float8
           FROM outbox.intents WHERE key LIKE 'arr-%'",
    )
    .fetch_all(store.pool())
    .await?;
    let mut to_delivered = Vec::with_capacity(rows.len());
    let mut last_fifth = Vec::with_capacity(rows.len() / 5 + 1);
    let late = committed.len() - committed.len() / 5;
    for (n, delivered) in rows {
        let i = n.parse::<usize>().ok();
        let Some(commit) = i.and_then(|i| committed.get(i)) else {
            anyhow::bail!("intent arr-{n} has no commit time");
        };
        to_delivered.push(delivered - commit);
        if i >= Some(late) {
            last_fifth.push(delivered - commit);
        }
    }
    let (delivered, deferred): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE i.state = 'delivered'),
                count(*) FILTER (WHERE i.fence > (SELECT count(*) FROM outbox.attempt_history h
                                                   WHERE h.intent_id = i.id))
           FROM outbox.intents i",
    )
    .fetch_one(store.pool())
    .await?;

    // the relay's backends flush their statistics as they exit
    relay.kill().await.ok();
    let _ = relay.wait().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tables = table_stats(&store).await?;
    let (claim_buffers_at_end, claim_ms_at_end) = plan_cost(&store.explain_claim(100).await?);
    if let Some(mut conn) = holder.take() {
        conn.execute("ROLLBACK").await?;
        conn.close().await.ok();
    }
    Ok(Run {
        held,
        arrivals: committed.len(),
        committed_per_s,
        delivered,
        to_delivered: percentiles(&mut to_delivered),
        to_delivered_last_fifth: percentiles(&mut last_fifth),
        deferred,
        open_at_end,
        open_max: samples.open_max.max(open_at_end),
        drained_after_s,
        kept_up: kept_up(open_at_end, args.rate),
        oldest_xmin_age: samples.oldest_xmin_age,
        oldest_xact_s: samples.oldest_xact_s,
        oldest_xmin_by: samples.oldest_xmin_by,
        claim_buffers_at_end,
        claim_ms_at_end,
        tables,
    })
}

/// The application: `rate` intents a second for `seconds`, each
/// `outbox.enqueue` a transaction of its own, keys `arr-N`; each one's
/// commit time (epoch ms) by N, and the rate achieved.
async fn arrivals(url: &str, hook: &str, args: &HeldXminArgs) -> anyhow::Result<(Vec<f64>, f64)> {
    let n = (u64::from(args.rate) * args.seconds).max(1);
    let every = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    // the application's own pool, as in its own process; patient, so that
    // a slow database shows as latency, not as a failed run
    let app = PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(600))
        .connect_with(url.parse::<PgConnectOptions>()?)
        .await?;
    // its connections open before the clock starts
    let mut warm = Vec::with_capacity(16);
    for _ in 0..16 {
        warm.push(app.acquire().await?);
    }
    drop(warm);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let started = Instant::now();
    let mut commits = Vec::with_capacity(n as usize);
    for i in 0..n {
        tick.tick().await;
        let app = app.clone();
        let hook = hook.to_string();
        commits.push(tokio::spawn(async move {
            sqlx::query(
                "SELECT outbox.enqueue('arr-' || $1::bigint, 'webhook',
                        jsonb_build_object('url', $2::text, 'body', jsonb_build_object(
                            'event', 'order.created', 'order', $1::bigint)))",
            )
            .bind(i as i64)
            .bind(&hook)
            .execute(&app)
            .await
            .map(|_| SystemTime::now())
        }));
    }
    let mut committed = Vec::with_capacity(commits.len());
    for c in commits {
        committed.push(epoch_ms(c.await??));
    }
    let per_s = committed.len() as f64 / started.elapsed().as_secs_f64();
    app.close().await;
    Ok((committed, per_s))
}

/// Intents pending or claimed.
async fn open(store: &Store) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM outbox.intents WHERE state IN ('pending', 'claimed')",
    )
    .fetch_one(store.pool())
    .await?)
}

/// Once a second until `stop`: the open intents and the oldest transaction
/// in this database.
async fn sample(store: Store, stop: Arc<AtomicBool>) -> anyhow::Result<Samples> {
    let mut seen = Samples::default();
    while !stop.load(Ordering::Relaxed) {
        let (open, age, secs, by): (i64, Option<i32>, Option<f64>, Option<String>) =
            sqlx::query_as(
                "WITH a AS (SELECT * FROM pg_stat_activity
                             WHERE datname = current_database() AND backend_xmin IS NOT NULL
                               AND pid <> pg_backend_pid())
                 SELECT (SELECT count(*) FROM outbox.intents WHERE state IN ('pending', 'claimed')),
                        (SELECT max(age(backend_xmin)) FROM a),
                        (SELECT max(extract(epoch FROM now() - xact_start))::float8 FROM a),
                        (SELECT application_name || ' (' || coalesce(state, '?') || '): '
                                || left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 60)
                           FROM a ORDER BY age(backend_xmin) DESC LIMIT 1)",
            )
            .fetch_one(store.pool())
            .await?;
        seen.open_max = seen.open_max.max(open);
        let age = i64::from(age.unwrap_or(0));
        if age > seen.oldest_xmin_age {
            seen.oldest_xmin_age = age;
            seen.oldest_xmin_by = by;
        }
        seen.oldest_xact_s = seen.oldest_xact_s.max(secs.unwrap_or(0.0));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(seen)
}

/// A table's name, live and dead tuples, updates, HOT ones, size, dead
/// versions present.
type TableRow = (String, i64, i64, i64, i64, i64, Option<i64>);

/// `pg_stat_user_tables` for every table in schema `outbox`, read afresh,
/// with each one's dead versions still in its heap where `pgstattuple`
/// can be had (the scratch database is the bench's own).
async fn table_stats(store: &Store) -> anyhow::Result<Vec<TableStats>> {
    let mut conn = store.pool().acquire().await?;
    let counted = sqlx::query("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        .execute(&mut *conn)
        .await
        .is_ok();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    let rows: Vec<TableRow> = sqlx::query_as(&format!(
        "SELECT s.relname::text, s.n_live_tup, s.n_dead_tup, s.n_tup_upd, s.n_tup_hot_upd,
                pg_total_relation_size(s.relid), {}
           FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
          WHERE s.schemaname = 'outbox' ORDER BY s.relname",
        // a partitioned table has no heap of its own (its partitions are
        // listed with theirs), and pgstattuple refuses it
        if counted {
            "CASE WHEN c.relkind <> 'p' THEN (pgstattuple(s.relid::regclass)).dead_tuple_count END"
        } else {
            "NULL::bigint"
        }
    ))
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(table, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, bytes, dead_present)| {
                TableStats {
                    table,
                    n_live_tup,
                    n_dead_tup,
                    n_tup_upd,
                    n_tup_hot_upd,
                    bytes,
                    dead_present,
                }
            },
        )
        .collect())
}

pub fn print(r: &HeldXmin) {
    println!(
        "held xmin: {} intents/s, one to a transaction, for {}s a run{}; one `outbox-relay run` at its defaults, receiver answering at once; a fresh database each run",
        r.rate,
        r.seconds,
        loaded_before(r.backlog)
    );
    println!(
        "{:<6} {:>8} {:>8} {:>9} | {:>30} | {:>8} {:>8} {:>8} {:>7} | {:>10} {:>9}",
        "run",
        "arrivals",
        "commit/s",
        "delivered",
        "commit→delivered p50/p99/max",
        "open end",
        "open max",
        "drained",
        "kept up",
        "xmin age",
        "oldest tx"
    );
    for run in &r.runs {
        let p = &run.to_delivered;
        println!(
            "{:<6} {:>8} {:>8.0} {:>9} | {:>30} | {:>8} {:>8} {:>7.1}s {:>7} | {:>10} {:>8.1}s",
            label(run),
            run.arrivals,
            run.committed_per_s,
            run.delivered,
            format!("{:.1} / {:.1} / {:.1} ms", p.p50_ms, p.p99_ms, p.max_ms),
            run.open_at_end,
            run.open_max,
            run.drained_after_s,
            if run.kept_up { "yes" } else { "no" },
            run.oldest_xmin_age,
            run.oldest_xact_s
        );
    }
    for run in &r.runs {
        let p = &run.to_delivered_last_fifth;
        println!(
            "{}: last fifth of the arrivals {:.1} / {:.1} / {:.1} ms; {} deferred; a claim of 100 on the empty queue at the end: {} buffers, {:.2} ms; oldest xmin held by {}",
            label(run),
            p.p50_ms,
            p.p99_ms,
            p.max_ms,
            run.deferred,
            run.claim_buffers_at_end,
            run.claim_ms_at_end,
            run.oldest_xmin_by.as_deref().unwrap_or("-")
        );
    }
    println!(
        "outbox tables at the end: n_dead_tup / n_live_tup, dead versions in the heap (pgstattuple), HOT updates / updates, total size:"
    );
    print!("{:<20}", "table");
    for run in &r.runs {
        print!(" {:>46}", label(run));
    }
    println!();
    if let Some(first) = r.runs.first() {
        for (i, t) in first.tables.iter().enumerate() {
            print!("{:<20}", t.table);
            for run in &r.runs {
                let cell = run.tables.get(i).filter(|s| s.table == t.table).map(|s| {
                    format!(
                        "{} / {}, {}, {} / {}, {:.1} MB",
                        s.n_dead_tup,
                        s.n_live_tup,
                        s.dead_present.map_or("-".into(), |d| d.to_string()),
                        s.n_tup_hot_upd,
                        s.n_tup_upd,
                        s.bytes as f64 / 1_048_576.0
                    )
                });
                print!(" {:>46}", cell.unwrap_or_else(|| "-".into()));
            }
            println!();
        }
    }
    let v = &r.verdict;
    let yes = |b: bool| if b { "met" } else { "NOT met" };
    if let [plain, held] = r.runs.as_slice() {
        println!(
            "held / plain p99: {:.1} / {:.1} ms = {:.2}× (target at most {TARGET_RATIO}×: {}); held p99 under {} ms: {}",
            held.to_delivered.p99_ms,
            plain.to_delivered.p99_ms,
            v.p99_ratio,
            yes(v.within_ratio),
            TARGET_P99_MS,
            yes(v.under_limit)
        );
    }
}

fn label(run: &Run) -> &'static str {
    if run.held {
        "held"
    } else {
        "plain"
    }
}

/// ", N pending intents loaded before" for a backlog, or nothing.
fn loaded_before(backlog: u64) -> String {
    if backlog > 0 {
        format!(", {backlog} pending intents loaded before")
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p99(ms: f64) -> Percentiles {
        Percentiles {
            p50_ms: ms / 4.0,
            p99_ms: ms,
            p999_ms: ms,
            max_ms: ms,
        }
    }

    #[test]
    fn the_verdict_takes_the_ratio_of_the_p99s_and_the_limit() {
        let v = verdict(&p99(20.0), &p99(40.0));
        assert_eq!(v.p99_ratio, 2.0);
        assert!(v.within_ratio && v.under_limit && v.met);
        let v = verdict(&p99(20.0), &p99(41.0));
        assert!(!v.within_ratio && v.under_limit && !v.met);
        // within 2× but not under a second
        let v = verdict(&p99(600.0), &p99(1_000.0));
        assert!(v.within_ratio && !v.under_limit && !v.met);
        // no plain figure: no ratio to meet
        assert!(!verdict(&p99(f64::NAN), &p99(10.0)).met);
    }

    #[test]
    fn a_plans_cost_is_its_top_buffers_and_execution_time() {
        let plan: Vec<String> = [
            "Update on intents  (cost=0.42..8.45 rows=1 width=6) (actual time=12.001..12.002 rows=0 loops=1)",
            "  Buffers: shared hit=1520 read=12 dirtied=3",
            "  ->  Index Scan using intents_due on intents",
            "        Buffers: shared hit=1500",
            "Planning Time: 0.210 ms",
            "Execution Time: 12.345 ms",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(plan_cost(&plan), (1532, 12.345));
        let (buffers, ms) = plan_cost(&[]);
        assert_eq!(buffers, 0);
        assert!(ms.is_nan());
    }

    #[test]
    fn the_drain_kept_up_with_less_than_a_second_of_arrivals_open() {
        assert!(kept_up(0, 800));
        assert!(kept_up(799, 800));
        assert!(!kept_up(800, 800));
        assert!(!kept_up(100_000, 800));
    }
}
