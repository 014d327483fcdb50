//! `--soak DURATION --rate N`: one relay process under a steady offered
//! load of mixed kinds for a long time, against receivers that flap, with
//! retention purging, the console and a scraper polling; sampled every
//! `--soak-sample` (10 s) into a CSV and drawn as a PNG (crate::plot).
//!
//! The load: webhooks to a steady receiver (40%), webhooks to a flapping
//! one (30%: it answers 503 for the sixth minute of every ten), and events
//! to a JetStream stream of the bench's own (30%; webhooks to the steady
//! receiver instead when no NATS server answers). Both receivers answer
//! 500 to 1% of requests. The relay retries past a minute's outage, so
//! nothing should end dead or ambiguous.
//!
//! What each sample holds is [`Sample`]; the targets [`Verdict`] checks are
//! those of docs/performance.md's soak section.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay::store::Store;
use serde::Serialize;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use crate::relay_process::relay_process;
use crate::scratch::with_database;

#[derive(Debug, Clone)]
pub(crate) struct SoakArgs {
    pub duration: Duration,
    pub rate: u32,
    pub sample: Duration,
    pub out_dir: PathBuf,
    pub nats_url: String,
    pub in_flight: usize,
    pub keep: bool,
}

/// The flapping receiver's cycle: down (503) for its sixth minute.
const FLAP_CYCLE_S: f64 = 600.0;

/// One row of the CSV.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Sample {
    pub t_s: f64,
    pub relay_rss_mb: f64,
    pub relay_fds: u64,
    pub pg_connections: i64,
    pub enqueued: u64,
    pub delivered_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub backlog: i64,
    pub intents_mb: f64,
    pub attempts_mb: f64,
    pub ledger_mb: f64,
    pub dead: i64,
    pub ambiguous: i64,
    pub console_ms: f64,
}

const CSV_HEADER: &str = "t_s,relay_rss_mb,relay_fds,pg_connections,enqueued,delivered_per_s,p50_ms,p99_ms,backlog,intents_mb,attempts_mb,ledger_mb,dead,ambiguous,console_ms";

impl Sample {
    fn csv(&self) -> String {
        format!(
            "{:.0},{:.1},{},{},{},{:.1},{:.1},{:.1},{},{:.2},{:.2},{:.2},{},{},{:.1}",
            self.t_s,
            self.relay_rss_mb,
            self.relay_fds,
            self.pg_connections,
            self.enqueued,
            self.delivered_per_s,
            self.p50_ms,
            self.p99_ms,
            self.backlog,
            self.intents_mb,
            self.attempts_mb,
            self.ledger_mb,
            self.dead,
            self.ambiguous,
            self.console_ms
        )
    }
}

/// The soak's targets, each with what was measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Verdict {
    /// Relay RSS at the end of the warm-up (the first ten minutes, one
    /// flapping cycle; a tenth of a shorter run) and its highest after it.
    pub rss_after_warmup_mb: f64,
    pub rss_max_mb: f64,
    /// p99 of enqueue → delivered over each block of the warm-up's length.
    pub block_p99_ms: Vec<f64>,
    /// Table sizes (intents + attempts + ledger, MB): highest over the
    /// middle third of the run and over the last third.
    pub tables_middle_mb: f64,
    pub tables_last_mb: f64,
    pub dead: i64,
    pub ambiguous: i64,
    pub rss_ok: bool,
    pub p99_ok: bool,
    pub tables_ok: bool,
    pub nothing_dead: bool,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct SoakReport {
    pub duration_s: f64,
    pub rate: u32,
    pub enqueued: u64,
    pub kinds: Vec<String>,
    pub steady_requests: u64,
    pub flapping_requests: u64,
    pub scrapes: u64,
    pub scrape_errors: u64,
    pub csv: PathBuf,
    pub png: PathBuf,
    pub verdict: Verdict,
}

/// A webhook receiver on its own thread: 1% of answers 500 and, when
/// `flaps`, 503 for the sixth minute of every ten.
fn flapping_receiver(flaps: bool, started: Instant) -> anyhow::Result<(u16, Arc<AtomicU64>)> {
    let requests = Arc::new(AtomicU64::new(0));
    let count = requests.clone();
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::Relaxed);
        let minute = started.elapsed().as_secs() / 60 % (FLAP_CYCLE_S as u64 / 60);
        let status = if flaps && minute == 5 {
            503
        } else if fastrand::u32(..100) < 1 {
            500
        } else {
            200
        };
        async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            axum::http::StatusCode::from_u16(status).unwrap_or(axum::http::StatusCode::OK)
        }
    });
    let (port, _thread) = crate::receiver::serve_on_thread("soak-receiver", app)?;
    Ok((port, requests))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// VmRSS of a process, in MB.
fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

pub(crate) async fn run(server_url: &str, args: SoakArgs) -> anyhow::Result<SoakReport> {
    std::fs::create_dir_all(&args.out_dir)?;
    // an hour of updates without autovacuum measures bloat and stale
    // statistics, not the relay
    let mut conn: sqlx::PgConnection = sqlx::Connection::connect(server_url).await?;
    let autovacuum: String = sqlx::query_scalar("SELECT current_setting('autovacuum')")
        .fetch_one(&mut conn)
        .await?;
    sqlx::Connection::close(conn).await?;
    if autovacuum != "on" && args.duration > Duration::from_secs(60) {
        anyhow::bail!(
            "autovacuum is off on this server: a soak without it measures dead rows piling up \
             and stale statistics, not the relay. Run it against a server with autovacuum on \
             (for instance a private one: tests/peers/pg-cluster.sh start soak)"
        );
    }
    with_database(server_url, "soak", 4, args.keep, |store| async move {
        let admin: PgConnectOptions = server_url.parse()?;
        let db_name: String = sqlx::query_scalar("SELECT current_database()")
            .fetch_one(store.pool())
            .await?;
        let db_url = admin.database(&db_name).to_url_lossy().to_string();
        soak(&store, &db_url, &db_name, &args).await
    })
    .await
}

async fn soak(
    store: &Store,
    db_url: &str,
    db_name: &str,
    args: &SoakArgs,
) -> anyhow::Result<SoakReport> {
    let started = Instant::now();
    let (steady_port, steady) = flapping_receiver(false, started)?;
    let (flapping_port, flapping) = flapping_receiver(true, started)?;
    let nats = match async_nats::connect(&args.nats_url).await {
        Ok(client) => {
            let js = async_nats::jetstream::new(client);
            let _ = js.delete_stream("OUTBOX_SOAK").await;
            js.create_stream(async_nats::jetstream::stream::Config {
                name: "OUTBOX_SOAK".into(),
                subjects: vec!["outbox-soak.>".into()],
                // bounded like the database: the stream keeps ten minutes
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .map_err(|e| anyhow::anyhow!("creating the soak's JetStream stream: {e}"))?;
            Some(js)
        }
        Err(e) => {
            eprintln!(
                "soak: no NATS server at {} ({e}): webhooks to the steady receiver instead",
                args.nats_url
            );
            None
        }
    };

    let exe = std::env::current_exe()?;
    let metrics_port = free_port()?;
    let console_port = free_port()?;
    let mut relay = relay_process(&exe, "run", db_url);
    relay
        .env("RUST_LOG", "warn")
        .env("OUTBOX_RELAY__RELAY__NAME", "\"soak\"")
        .env(
            "OUTBOX_RELAY__RELAY__CONCURRENCY",
            args.in_flight.to_string(),
        )
        .env(
            "OUTBOX_RELAY__RELAY__METRICS_ADDR",
            format!("\"127.0.0.1:{metrics_port}\""),
        )
        .env("OUTBOX_RELAY__WEBHOOK__TIMEOUT", "\"5s\"")
        .env("OUTBOX_RELAY__NATS__URL", format!("\"{}\"", args.nats_url))
        // retries outlast a minute's outage
        .env("OUTBOX_RELAY__RETRY__MAX_ATTEMPTS", "30")
        .env(
            "OUTBOX_RELAY__RETRY__SCHEDULE",
            "[\"1s\", \"2s\", \"5s\", \"10s\", \"20s\"]",
        )
        // retention as a deployment would set it, shortened to the run
        .env("OUTBOX_RELAY__RETENTION__INTENTS", "\"10m\"")
        .env("OUTBOX_RELAY__RETENTION__LEDGER", "\"15m\"")
        .env("OUTBOX_RELAY__RETENTION__INTERVAL", "\"1m\"");
    let mut relay = relay.spawn()?;
    let relay_pid = relay.id().unwrap_or(0);
    let mut console = relay_process(&exe, "console", db_url);
    console.env("RUST_LOG", "warn").env(
        "OUTBOX_RELAY__CONSOLE__ADDR",
        format!("\"127.0.0.1:{console_port}\""),
    );
    let mut console = console.spawn()?;

    // the application: rate/10 intents every 100 ms, one statement each
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let enqueued = Arc::new(AtomicU64::new(0));
    let app = {
        let pool = store.pool().clone();
        let (stop, enqueued) = (stop.clone(), enqueued.clone());
        let with_nats = nats.is_some();
        let per_tick = (args.rate as f64 / 10.0).max(1.0);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut owed = 0.0;
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                tick.tick().await;
                owed += per_tick;
                let n = owed.floor() as u64;
                owed -= n as f64;
                let mut keys = Vec::new();
                let mut kinds = Vec::new();
                let mut payloads = Vec::new();
                for _ in 0..n {
                    let (kind, payload) = match i % 10 {
                        0..=3 => (
                            "webhook",
                            serde_json::json!({"url": format!("http://127.0.0.1:{steady_port}/orders"), "body": {"i": i}}),
                        ),
                        4..=6 => (
                            "webhook",
                            serde_json::json!({"url": format!("http://127.0.0.1:{flapping_port}/partner"), "body": {"i": i}}),
                        ),
                        _ if with_nats => (
                            "nats",
                            serde_json::json!({"subject": "outbox-soak.events", "body": {"i": i}}),
                        ),
                        _ => (
                            "webhook",
                            serde_json::json!({"url": format!("http://127.0.0.1:{steady_port}/events"), "body": {"i": i}}),
                        ),
                    };
                    keys.push(format!("soak-{i}"));
                    kinds.push(kind.to_string());
                    payloads.push(payload);
                    i += 1;
                }
                let done = sqlx::query("SELECT 1 FROM outbox.enqueue_many($1, $2, $3)")
                    .bind(&keys)
                    .bind(&kinds)
                    .bind(&payloads)
                    .execute(&pool)
                    .await;
                match done {
                    Ok(_) => {
                        enqueued.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => eprintln!("soak: an enqueue failed: {e}"),
                }
            }
        })
    };

    // sample until the duration is up; the scraper polls /metrics and the
    // console's overview at each sample
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let csv_path = args.out_dir.join("soak.csv");
    let mut csv = vec![CSV_HEADER.to_string()];
    let mut samples: Vec<Sample> = Vec::new();
    let (mut scrapes, mut scrape_errors) = (0u64, 0u64);
    let mut last_at: chrono::DateTime<chrono::Utc> = chrono::Utc::now();
    while started.elapsed() < args.duration {
        tokio::time::sleep(args.sample).await;
        let metrics = http
            .get(format!("http://127.0.0.1:{metrics_port}/metrics"))
            .send()
            .await;
        scrapes += 1;
        if !metrics.is_ok_and(|r| r.status().is_success()) {
            scrape_errors += 1;
        }
        let t = Instant::now();
        let page = http
            .get(format!("http://127.0.0.1:{console_port}/"))
            .send()
            .await;
        let console_ms = t.elapsed().as_secs_f64() * 1e3;
        scrapes += 1;
        if !page.is_ok_and(|r| r.status().is_success()) {
            scrape_errors += 1;
        }
        let now = chrono::Utc::now();
        let s = sample(store, db_name, last_at, now).await?;
        let s = Sample {
            t_s: started.elapsed().as_secs_f64(),
            relay_rss_mb: rss_mb(relay_pid),
            relay_fds: fds(relay_pid),
            enqueued: enqueued.load(Ordering::Relaxed),
            console_ms,
            ..s
        };
        last_at = now;
        eprintln!("soak: {}", s.csv());
        csv.push(s.csv());
        std::fs::write(&csv_path, csv.join("\n") + "\n")?;
        samples.push(s);
        if let Ok(Some(status)) = relay.try_wait() {
            anyhow::bail!("the soak's relay exited: {status}");
        }
    }
    stop.store(true, Ordering::SeqCst);
    app.await?;
    let _ = console.start_kill();
    let _ = relay.start_kill();
    let _ = relay.wait().await;

    let png = args.out_dir.join("soak.png");
    crate::plot::draw(&samples, &png)?;
    let verdict = judge(store, &samples).await?;
    let mut kinds = vec![
        "webhook (steady)".to_string(),
        "webhook (flapping)".to_string(),
    ];
    if nats.is_some() {
        kinds.push("nats".into());
    }
    Ok(SoakReport {
        duration_s: started.elapsed().as_secs_f64(),
        rate: args.rate,
        enqueued: enqueued.load(Ordering::Relaxed),
        kinds,
        steady_requests: steady.load(Ordering::Relaxed),
        flapping_requests: flapping.load(Ordering::Relaxed),
        scrapes,
        scrape_errors,
        csv: csv_path,
        png,
        verdict,
    })
}

/// The database's side of a sample: what was delivered between `since`
/// and `now` (a rate, and its latency), backlog, sizes, connections, dead
/// and ambiguous.
async fn sample(
    store: &Store,
    db_name: &str,
    since: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<Sample> {
    let (delivered, p50, p99): (i64, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT count(*),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at)),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))
           FROM outbox.intents WHERE delivered_at > $1",
    )
    .bind(since)
    .fetch_one(store.pool())
    .await?;
    let (backlog, dead, ambiguous): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state IN ('pending', 'claimed')),
                count(*) FILTER (WHERE state = 'dead'),
                count(*) FILTER (WHERE state = 'ambiguous')
           FROM outbox.intents WHERE state IN ('pending', 'claimed', 'dead', 'ambiguous')",
    )
    .fetch_one(store.pool())
    .await?;
    let (intents, attempts, ledger): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(pg_total_relation_size(p.relid))::int8
                   FROM pg_partition_tree('outbox.intent_log') p)
                  + pg_total_relation_size('outbox.intent_rows')
                  + (SELECT sum(pg_total_relation_size(p.relid))::int8
                       FROM pg_partition_tree('outbox.log_outcomes') p)
                  + pg_total_relation_size('outbox.log_batches'),
                pg_total_relation_size('outbox.attempts'),
                pg_total_relation_size('outbox.ledger')",
    )
    .fetch_one(store.pool())
    .await?;
    let connections: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
            .bind(db_name)
            .fetch_one(store.pool())
            .await?;
    let mb = |b: i64| b as f64 / 1048576.0;
    Ok(Sample {
        pg_connections: connections,
        delivered_per_s: delivered as f64 * 1e3 / (now - since).num_milliseconds().max(1) as f64,
        p50_ms: p50.unwrap_or(0.0) * 1e3,
        p99_ms: p99.unwrap_or(0.0) * 1e3,
        backlog,
        intents_mb: mb(intents),
        attempts_mb: mb(attempts),
        ledger_mb: mb(ledger),
        dead,
        ambiguous,
        ..Sample::default()
    })
}

/// Check the targets over the samples, and count what ended dead or
/// ambiguous.
async fn judge(store: &Store, samples: &[Sample]) -> anyhow::Result<Verdict> {
    let total = samples.last().map_or(0.0, |s| s.t_s);
    // blocks as long as the flapping cycle (ten minutes), so that each
    // holds one outage; a run shorter than two cycles uses tenths
    let warmup = if total >= 2.0 * FLAP_CYCLE_S {
        FLAP_CYCLE_S
    } else {
        (total / 10.0).max(1.0)
    };
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t_s > warmup).collect();
    let rss_after_warmup_mb = after.first().map_or(f64::NAN, |s| s.relay_rss_mb);
    let rss_max_mb = after
        .iter()
        .map(|s| s.relay_rss_mb)
        .fold(f64::NAN, f64::max);
    // each block's worst per-sample p99: the database has purged the
    // early blocks' rows by the end
    let mut block_p99_ms = Vec::new();
    let mut b = 0.0;
    while b < total {
        let block: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.t_s > b && s.t_s <= b + warmup)
            .collect();
        if !block.is_empty() {
            let worst = block.iter().map(|s| s.p99_ms).fold(0.0, f64::max);
            block_p99_ms.push(worst);
        }
        b += warmup;
    }
    let tables = |s: &&Sample| s.intents_mb + s.attempts_mb + s.ledger_mb;
    let third = |from: f64, to: f64| {
        samples
            .iter()
            .filter(|s| s.t_s > from && s.t_s <= to)
            .map(|s| tables(&s))
            .fold(0.0, f64::max)
    };
    let tables_middle_mb = third(total / 3.0, 2.0 * total / 3.0);
    let tables_last_mb = third(2.0 * total / 3.0, total);
    let (dead, ambiguous): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'dead'), count(*) FILTER (WHERE state = 'ambiguous')
           FROM outbox.intents",
    )
    .fetch_one(store.pool())
    .await?;
    let first = block_p99_ms.first().copied().unwrap_or(0.0);
    Ok(Verdict {
        rss_ok: rss_max_mb < rss_after_warmup_mb * 1.10,
        p99_ok: block_p99_ms.iter().all(|p| *p <= 2.0 * first.max(1.0)),
        tables_ok: tables_last_mb <= tables_middle_mb * 1.20,
        nothing_dead: dead == 0 && ambiguous == 0,
        rss_after_warmup_mb,
        rss_max_mb,
        block_p99_ms,
        tables_middle_mb,
        tables_last_mb,
        dead,
        ambiguous,
    })
}

pub(crate) fn print(r: &SoakReport) {
    let v = &r.verdict;
    let mark = |ok: bool| if ok { "ok" } else { "MISSED" };
    println!(
        "soak: {:.0} s at {}/s offered ({} enqueued; kinds: {}); receivers: {} steady, {} flapping requests; {} scrapes, {} failed",
        r.duration_s,
        r.rate,
        r.enqueued,
        r.kinds.join(", "),
        r.steady_requests,
        r.flapping_requests,
        r.scrapes,
        r.scrape_errors
    );
    println!(
        "  relay RSS after warm-up {:.1} MB, highest after {:.1} MB (target < +10%): {}",
        v.rss_after_warmup_mb,
        v.rss_max_mb,
        mark(v.rss_ok)
    );
    let p99: Vec<String> = v.block_p99_ms.iter().map(|p| format!("{p:.0}")).collect();
    println!(
        "  worst 10 s p99 enqueue→delivered per block, ms: {} (target each ≤ 2× the first): {}",
        p99.join(", "),
        mark(v.p99_ok)
    );
    println!(
        "  intents + attempts + ledger: {:.1} MB at most over the middle third, {:.1} MB over the last (target ≤ +20%): {}",
        v.tables_middle_mb,
        v.tables_last_mb,
        mark(v.tables_ok)
    );
    println!(
        "  dead {}, ambiguous {} (target 0: the flapping is retried past): {}",
        v.dead,
        v.ambiguous,
        mark(v.nothing_dead)
    );
    println!("  samples: {}", r.csv.display());
    println!("  plot:    {}", r.png.display());
}

/// Where the soak writes by default.
pub(crate) fn default_out() -> PathBuf {
    Path::new("target").join("soak")
}
